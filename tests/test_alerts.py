"""Alerts as code (monitoring/prometheus/dsv4-alerts.yml, with the acceptance floors of
dsv4-acceptance-floors.yml): `promtool check rules`, then `promtool test rules` with input
series under which each alert fires for the broken pair or node and stays quiet for the
healthy ones and the look-alikes. The acceptance alerts see pairs of every healthy shape
(prose at 2.1 tokens per step, agent, code, uniformly hard traffic, an easy first token and
hard later ones) that must stay quiet, each broken signature (dropped draft weights, a grammar
rejecting every draft past position 1, a position-0 collapse) that must fire, and too few
drafts to judge. Every alert names dashboard panels that plot its metrics; names are vLLM
0.33's; the memory thresholds (swap included) are pairctl/contracts/__init__.py's bands.

promtool comes from Debian's `prometheus` package (scripts/ensure_system_deps.sh): the tests
needing it skip on a laptop without it and fail in CI (CI=true), as tests/conftest.py does
for every requirement.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pairctl.contracts import MEM_CRIT_FRACTION, MEM_WARN_FRACTION, SWAP_WARN_KIB
from pairctl.fleet import alertfloors
from tests.conftest import require

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "monitoring" / "prometheus" / "dsv4-alerts.yml"
FLOORS = REPO / alertfloors.DEFAULT_OUTPUT
DASHBOARD = REPO / "monitoring" / "grafana" / "dsv4-fleet.json"
METRIC = re.compile(r"\b(?:vllm:[a-z_]+|node_memory_[A-Za-z_]+|dsv4:[a-z_:]+|up(?=\{))")
PAIRS = 'job="dsv4-pairs", fleet="f"'
ACCEPTANCE = ("DSv4AcceptanceLow", "DSv4FirstDraftPositionLow", "DSv4LateDraftPositionsCollapsed")


def rules() -> dict[str, dict[str, Any]]:
    """alert name -> rule, from the rules file."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def promtool() -> str:
    path = shutil.which("promtool")
    require(
        path is not None,
        "promtool not installed (Debian package prometheus; scripts/ensure_system_deps.sh)",
    )
    assert path is not None
    return path


def recorded() -> dict[str, str]:
    """recorded series -> expression, from the floors file."""
    doc = yaml.safe_load(FLOORS.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def test_promtool_check_rules() -> None:
    for path, n in ((RULES, len(rules())), (FLOORS, len(recorded()))):
        p = subprocess.run(
            [promtool(), "check", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"SUCCESS: {n} rules found" in p.stdout


def counter(name: str, labels: str, per_min: float, minutes: int = 60) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"0+{per_min:g}x{minutes}"}


def const(name: str, labels: str, value: float, minutes: int = 60) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"{value:g}x{minutes}"}


def pair(name: str) -> str:
    return f'{PAIRS}, pair="{name}"'


# (alert, input series, eval time, labels of the alerts expected then: the rest stay quiet)
CASES: list[tuple[str, list[dict[str, str]], str, list[dict[str, str]]]] = [
    (
        "DSv4PairDown",
        [
            {"series": f'up{{{pair("a")}, instance="s1:8000"}}', "values": "1 1 0x10"},
            {"series": f'up{{{pair("b")}, instance="s3:8000"}}', "values": "1x12"},
        ],
        "6m",
        [{"job": "dsv4-pairs", "fleet": "f", "pair": "a", "instance": "s1:8000"}],
    ),
    (
        "DSv4EngineStalled",
        [
            # a: requests stay "running" while no token is processed: a wedged engine
            const("vllm:num_requests_running", pair("a"), 2, 30),
            {"series": f"vllm:generation_tokens_total{{{pair('a')}}}", "values": "0+50x5 250x25"},
            {"series": f"vllm:prompt_tokens_total{{{pair('a')}}}", "values": "0+100x5 500x25"},
            # b: busy and making progress
            const("vllm:num_requests_running", pair("b"), 2, 30),
            counter("vllm:generation_tokens_total", pair("b"), 50, 30),
            counter("vllm:prompt_tokens_total", pair("b"), 100, 30),
            # c: idle (nothing running, counters still): not a stall
            const("vllm:num_requests_running", pair("c"), 0, 30),
            const("vllm:generation_tokens_total", pair("c"), 100, 30),
            const("vllm:prompt_tokens_total", pair("c"), 100, 30),
        ],
        "20m",
        [{"fleet": "f", "pair": "a"}],
    ),
    (
        "DSv4TTFTHigh",
        [
            # a: half the first tokens take 20-40 s: p95 ~38 s
            counter("vllm:time_to_first_token_seconds_bucket", pair("a") + ', le="1"', 0, 30),
            counter("vllm:time_to_first_token_seconds_bucket", pair("a") + ', le="20"', 10, 30),
            counter("vllm:time_to_first_token_seconds_bucket", pair("a") + ', le="40"', 20, 30),
            counter("vllm:time_to_first_token_seconds_bucket", pair("a") + ', le="+Inf"', 20, 30),
            # b: all under a second
            *[
                counter(
                    "vllm:time_to_first_token_seconds_bucket", pair("b") + f', le="{le}"', 20, 30
                )
                for le in ("1", "20", "40", "+Inf")
            ],
        ],
        "20m",
        [{"fleet": "f", "pair": "a"}],
    ),
    (
        "DSv4KVCacheNearFull",
        [
            const("vllm:kv_cache_usage_perc", pair("a") + ', engine="0"', 0.97, 20),
            const("vllm:kv_cache_usage_perc", pair("b") + ', engine="0"', 0.5, 20),
        ],
        "10m",
        [{"fleet": "f", "pair": "a"}],
    ),
]

# Acceptance profiles: P(draft position k accepted) = A_k / drafts, k = 0..4 (vLLM's
# per-position acceptance rate), as vLLM's counters move for them (observe_draft in
# vllm/v1/spec_decode/metrics.py): per minute, D drafts, D x tokens-per-draft draft tokens,
# D x sum(per_pos) accepted, D x per_pos[k] at position k.


def geometric(first: float, then: float) -> tuple[float, ...]:
    """Position 0 accepted with ``first``, each later one with ``then`` after the one before."""
    return tuple(first * then**k for k in range(5))


# name: (per_pos, drafts per second, draft tokens per draft, the acceptance alerts it fires)
PROFILES: dict[str, tuple[tuple[float, ...], float, float, set[str]]] = {
    # healthy, every shape: must stay quiet
    "prose": (geometric(0.600, 0.467), 10, 5, set()),  # mean length 2.10
    "agent": ((0.816, 0.623, 0.460, 0.332, 0.240), 10, 5, set()),  # MiaAI agent doc, 3.47
    "code": (geometric(0.950, 0.880), 10, 5, set()),  # 4.65
    "uniform-35": (geometric(0.35, 0.35), 10, 5, set()),  # uniformly hard: 1.54
    "uniform-46": (geometric(0.46, 0.46), 10, 5, set()),  # 1.83
    "easy-first": (geometric(0.90, 0.30), 10, 5, set()),  # tool-call-like: 2.28
    # broken: must fire
    # dropped draft weights: position 0 from 60% to 26%, the later ones with it (1.35)
    "dropped": (geometric(0.26, 0.26), 10, 5, {"DSv4AcceptanceLow", "DSv4FirstDraftPositionLow"}),
    # a grammar rejecting every draft past position 1 (the field's profile; the grammar cuts
    # each draft to the tokens it allows, so about 2 draft tokens per draft): mean length
    # 2.14, as healthy prose
    "grammar": ((0.914, 0.224, 0.0, 0.0, 0.0), 10, 2, {"DSv4LateDraftPositionsCollapsed"}),
    # position 0 collapsed, the later conditionals intact (1.12)
    "collapse-0": (
        geometric(0.05, 0.60),
        10,
        5,
        {"DSv4AcceptanceLow", "DSv4FirstDraftPositionLow"},
    ),
    # too few drafts to judge (2.5 draft tokens/s): quiet, broken or not
    "trickle-dropped": (geometric(0.26, 0.26), 0.5, 5, set()),
    "trickle-grammar": ((0.914, 0.224, 0.0, 0.0, 0.0), 1, 2, set()),
}


def acceptance_series() -> list[dict[str, str]]:
    out = []
    for name, (per_pos, per_s, tokens, _fires) in PROFILES.items():
        labels, d = pair(name), per_s * 60
        out.append(counter("vllm:spec_decode_num_drafts_total", labels, d))
        out.append(counter("vllm:spec_decode_num_draft_tokens_total", labels, d * tokens))
        out.append(counter("vllm:spec_decode_num_accepted_tokens_total", labels, d * sum(per_pos)))
        out += [
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                labels + f', position="{k}"',
                d * p,
            )
            for k, p in enumerate(per_pos)
        ]
    # an idle pair: counters standing still
    idle = pair("idle")
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        out.append(const(f"vllm:spec_decode_num_{name}_total", idle, 0))
    out += [
        const("vllm:spec_decode_num_accepted_tokens_per_pos_total", idle + f', position="{k}"', 0)
        for k in range(5)
    ]
    return out


CASES += [
    (
        alert,
        acceptance_series(),
        "40m",
        [{"fleet": "f", "pair": n} for n, prof in PROFILES.items() if alert in prof[3]],
    )
    for alert in ACCEPTANCE
]
# With the floors loaded, the alarm about missing floors stays quiet.
CASES.append(("DSv4AcceptanceFloorsMissing", acceptance_series()[:3], "30m", []))

GIB = 1 << 30
_NODES = [
    # s1: 9.2% available (warning band); s2: 4.2% (critical); s3: 50% (fine); none swaps
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s1:9100"', 11e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s1:9100"', 120e9, 10),
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s2:9100"', 5e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s2:9100"', 120e9, 10),
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s3:9100"', 60e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s3:9100"', 120e9, 10),
    *[
        const(f"node_memory_Swap{k}_bytes", f'job="node", instance="s{i}:9100"', 0, 10)
        for i in (1, 2, 3)
        for k in ("Total", "Free")
    ],
    # s4: half its memory available, but swap filling (0.5 GiB more each minute)
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s4:9100"', 60e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s4:9100"', 120e9, 10),
    const("node_memory_SwapTotal_bytes", 'job="node", instance="s4:9100"', 16 * GIB, 10),
    {
        "series": 'node_memory_SwapFree_bytes{job="node", instance="s4:9100"}',
        "values": f"{16 * GIB}-{GIB // 2}x10",
    },
    # s5: 200 MiB swapped out long ago, standing: under the band, quiet
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s5:9100"', 60e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s5:9100"', 120e9, 10),
    const("node_memory_SwapTotal_bytes", 'job="node", instance="s5:9100"', 16 * GIB, 10),
    const(
        "node_memory_SwapFree_bytes", 'job="node", instance="s5:9100"', 16 * GIB - 200 * 2**20, 10
    ),
]
CASES += [
    (
        "DSv4NodeMemoryPressure",
        _NODES,
        "5m",
        [
            {"job": "node", "instance": "s1:9100"},
            {"job": "node", "instance": "s2:9100"},
            {"job": "node", "instance": "s4:9100"},
        ],
    ),
    ("DSv4NodeMemoryCritical", _NODES, "5m", [{"job": "node", "instance": "s2:9100"}]),
]


def render(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it: ``{{ $labels.x }}`` replaced (no other
    template is used in the rules file; the test fails if one is)."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    assert "{{" not in out, f"unrendered template in {text!r}"
    return out


def unit_tests() -> dict[str, Any]:
    """promtool's unit-test document: per case, the alert firing at the eval time for the
    expected series only, and at the start for none of them yet (``for`` still pending)."""
    by_name = rules()
    tests = []
    for alert, series, at, fired in CASES:
        rule = by_name[alert]
        exp = [
            {
                "exp_labels": {**labels, **rule["labels"]},
                "exp_annotations": {k: render(v, labels) for k, v in rule["annotations"].items()},
            }
            for labels in fired
        ]
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "0m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": at, "alertname": alert, "exp_alerts": exp},
                ],
            }
        )
    return {"rule_files": [str(RULES), str(FLOORS)], "evaluation_interval": "1m", "tests": tests}


def run_unit_tests(doc: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess:
    spec = tmp_path / "dsv4-alerts.test.yml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_alert_has_a_case() -> None:
    assert {c[0] for c in CASES} == set(rules())


def test_every_broken_signature_fires_an_acceptance_alert_and_no_healthy_one_does() -> None:
    """The table itself covers what it must: each shape of healthy traffic, each broken one."""
    healthy = {"prose", "agent", "code", "uniform-35", "uniform-46", "easy-first"}
    broken = {"dropped", "grammar", "collapse-0"}
    assert {n for n, prof in PROFILES.items() if prof[3]} == broken
    assert healthy <= {n for n, prof in PROFILES.items() if not prof[3]}
    prose = PROFILES["prose"][0]
    assert 2.05 < 1 + sum(prose) < 2.15  # the healthy low class at ~2.1 tokens per step
    assert 1 + sum(PROFILES["grammar"][0]) > 2.1  # looks like prose by its mean length


def test_promtool_unit_tests_fire_for_the_broken_and_stay_quiet_for_the_rest(
    tmp_path: Path,
) -> None:
    p = run_unit_tests(unit_tests(), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_the_unit_tests_catch_a_rule_that_never_fires(tmp_path: Path) -> None:
    """The harness is not vacuous: a rules file whose memory alert cannot fire fails it."""
    broken = tmp_path / "dsv4-alerts.yml"
    broken.write_text(RULES.read_text().replace("MemTotal_bytes < 0.05", "MemTotal_bytes < 0.0"))
    doc = unit_tests()
    doc["rule_files"] = [str(broken), str(FLOORS)]
    p = run_unit_tests(doc, tmp_path)
    assert p.returncode != 0 and "DSv4NodeMemoryCritical" in p.stdout + p.stderr


def test_the_seeds_threshold_fires_on_healthy_prose(tmp_path: Path) -> None:
    """The unit tests catch the old floor: a mean-length floor of 2.5 (the seed's) fires on
    the healthy prose pair, and the test says so."""
    old = tmp_path / "floors.yml"
    text = FLOORS.read_text()
    assert "expr: vector(1.5)" in text
    old.write_text(text.replace("expr: vector(1.5)", "expr: vector(2.5)", 1))
    doc = unit_tests()
    doc["rule_files"] = [str(RULES), str(old)]
    p = run_unit_tests(doc, tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "DSv4AcceptanceLow" in out and 'pair="prose"' in out, out


def test_without_the_floors_the_acceptance_alerts_say_they_cannot_fire(tmp_path: Path) -> None:
    """Loaded alone, the alerts file cannot judge acceptance (every floor is absent): the
    broken pairs stay quiet, and DSv4AcceptanceFloorsMissing fires instead."""
    rule = rules()["DSv4AcceptanceFloorsMissing"]
    test = {
        "interval": "1m",
        "input_series": acceptance_series(),
        "alert_rule_test": [
            {"eval_time": "40m", "alertname": a, "exp_alerts": []} for a in ACCEPTANCE
        ]
        + [
            {
                "eval_time": "40m",
                "alertname": "DSv4AcceptanceFloorsMissing",
                "exp_alerts": [
                    {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
                ],
            }
        ],
    }
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [test]}
    p = run_unit_tests(doc, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_floors_file_is_generated_from_the_published_classes() -> None:
    """monitoring's floors file is what `fleet alert-floors` writes (never edited by hand),
    and every floor an alert compares against is recorded there."""
    assert FLOORS.read_text() == alertfloors.render(alertfloors.ANCHOR, alertfloors.ANCHOR_SOURCE)
    used = {m for r in rules().values() for m in metrics_of(r["expr"]) if m.startswith("dsv4:")}
    assert used == set(recorded()) == set(alertfloors.floors(alertfloors.ANCHOR).series())


def panel_exprs() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: "\n".join(t["expr"] for t in p["targets"]) for p in panels}


def metrics_of(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def test_every_alert_has_a_panel_plotting_its_metrics() -> None:
    """The panels an alert names (annotation `panel`, titles separated by "; ") plot every
    metric and floor its expression reads, the volume guards' included."""
    panels = panel_exprs()
    for name, rule in rules().items():
        titles = rule["annotations"]["panel"].split("; ")
        for title in titles:
            assert title in panels, f"{name}: no dashboard panel titled {title!r}"
        used = metrics_of(rule["expr"])
        assert used, f"{name}: no metric found in {rule['expr']!r}"
        plotted = set().union(*(metrics_of(panels[t]) for t in titles))
        missing = used - plotted
        assert not missing, f"{name}: panels {titles} do not plot {sorted(missing)}"


def test_every_acceptance_alert_has_a_draft_volume_guard() -> None:
    """An acceptance alert judges a pair only while drafts flow: its expression requires the
    draft-token rate at or over the recorded minimum."""
    guard = re.compile(
        r"rate\(vllm:spec_decode_num_draft_tokens_total\{[^}]*\}\[15m\]\)\)\s*>=\s*"
        r"scalar\(dsv4:acceptance_floor:min_draft_tokens_per_s\)"
    )
    for name in ACCEPTANCE:
        assert guard.search(rules()[name]["expr"]), name


@pytest.mark.needs_vllm
def test_alert_metric_names_are_vllm_0_33s() -> None:
    from tests.support.vllm_src import site_packages, string_constants

    root = site_packages() / "vllm"
    defined: set[str] = set()
    for rel in ("v1/metrics/loggers.py", "v1/spec_decode/metrics.py"):
        defined |= {s for s in string_constants(root / rel) if s.startswith("vllm:")}
    for name, rule in rules().items():
        for metric in metrics_of(rule["expr"]):
            if metric.startswith("vllm:"):
                base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
                assert base in defined, f"{name}: {metric} is not a vLLM 0.33 metric"


def test_memory_alerts_use_the_contract_bands() -> None:
    r = rules()
    for alert, fraction in (
        ("DSv4NodeMemoryPressure", MEM_WARN_FRACTION),
        ("DSv4NodeMemoryCritical", MEM_CRIT_FRACTION),
    ):
        m = re.search(r"MemTotal_bytes < ([0-9.]+)$", r[alert]["expr"].strip().splitlines()[0])
        assert m and float(m.group(1)) == fraction, alert
    # swap in use is the warning band on its own (pairctl/nodes/pressure.py's band())
    m = re.search(
        r"\(node_memory_SwapTotal_bytes - node_memory_SwapFree_bytes\) >= ([0-9]+)$",
        r["DSv4NodeMemoryPressure"]["expr"].strip(),
    )
    assert m and int(m.group(1)) == SWAP_WARN_KIB * 1024


def test_ci_installs_promtool() -> None:
    script = (REPO / "scripts" / "ensure_system_deps.sh").read_text()
    packages = re.search(r"PACKAGES=\(([^)]*)\)", script)
    assert packages and "prometheus" in packages.group(1).split()
