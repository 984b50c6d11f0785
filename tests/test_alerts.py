"""Alerts as code (monitoring/prometheus/dsv4-alerts.yml): `promtool check rules`, then
`promtool test rules` with input series under which each alert fires for the broken pair or
node and stays quiet for the healthy one (and for the look-alike: an idle pair, a traffic-mix
change); every alert names a dashboard panel that plots its metrics; names are vLLM 0.33's;
the memory thresholds are pairctl/contracts/__init__.py's bands.

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

from pairctl.contracts import MEM_CRIT_FRACTION, MEM_WARN_FRACTION
from tests.conftest import require

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "monitoring" / "prometheus" / "dsv4-alerts.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "dsv4-fleet.json"
METRIC = re.compile(r"\b(vllm:[a-z_]+|node_memory_[A-Za-z_]+|up)\b(?=\s*\{|\s*/|\s*[<>=]|\s*$)")
PAIRS = 'job="dsv4-pairs", fleet="f"'


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


def test_promtool_check_rules() -> None:
    p = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules())} rules found" in p.stdout


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
        "DSv4AcceptanceLow",
        [
            # a: 1 draft/s, 1.3 accepted per draft: length 2.3 (lost draft weights)
            counter("vllm:spec_decode_num_drafts_total", pair("a"), 60),
            counter("vllm:spec_decode_num_accepted_tokens_total", pair("a"), 78),
            # b: 3 accepted per draft: length 4.0, healthy
            counter("vllm:spec_decode_num_drafts_total", pair("b"), 60),
            counter("vllm:spec_decode_num_accepted_tokens_total", pair("b"), 180),
            # c: no drafts at all (idle): no verdict
            const("vllm:spec_decode_num_drafts_total", pair("c"), 0),
            const("vllm:spec_decode_num_accepted_tokens_total", pair("c"), 0),
            # d: a trickle (3 drafts/min) of hard requests: too few drafts to judge
            counter("vllm:spec_decode_num_drafts_total", pair("d"), 3),
            counter("vllm:spec_decode_num_accepted_tokens_total", pair("d"), 3),
        ],
        "40m",
        [{"fleet": "f", "pair": "a"}],
    ),
    (
        "DSv4LateDraftPositionsCollapsed",
        [
            # a: position 0 fine (0.75), position 2 collapsed (0.017): dropped draft weights
            counter("vllm:spec_decode_num_drafts_total", pair("a"), 60),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("a") + ', position="0"',
                45,
            ),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("a") + ', position="2"',
                1,
            ),
            # b: hard traffic: every position low together (0.33, 0.05): a mix change
            counter("vllm:spec_decode_num_drafts_total", pair("b"), 60),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("b") + ', position="0"',
                20,
            ),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("b") + ', position="2"',
                3,
            ),
            # c: healthy (0.75, 0.25)
            counter("vllm:spec_decode_num_drafts_total", pair("c"), 60),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("c") + ', position="0"',
                45,
            ),
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                pair("c") + ', position="2"',
                15,
            ),
        ],
        "40m",
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

_NODES = [
    # s1: 9.2% available (warning band); s2: 4.2% (critical); s3: 50% (fine)
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s1:9100"', 11e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s1:9100"', 120e9, 10),
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s2:9100"', 5e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s2:9100"', 120e9, 10),
    const("node_memory_MemAvailable_bytes", 'job="node", instance="s3:9100"', 60e9, 10),
    const("node_memory_MemTotal_bytes", 'job="node", instance="s3:9100"', 120e9, 10),
]
CASES += [
    (
        "DSv4NodeMemoryPressure",
        _NODES,
        "5m",
        [{"job": "node", "instance": "s1:9100"}, {"job": "node", "instance": "s2:9100"}],
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
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}


def test_every_alert_has_a_case() -> None:
    assert {c[0] for c in CASES} == set(rules())


def test_promtool_unit_tests_fire_for_the_broken_and_stay_quiet_for_the_rest(
    tmp_path: Path,
) -> None:
    tool = promtool()
    spec = tmp_path / "dsv4-alerts.test.yml"
    spec.write_text(yaml.safe_dump(unit_tests(), sort_keys=False))
    p = subprocess.run(
        [tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_the_unit_tests_catch_a_rule_that_never_fires(tmp_path: Path) -> None:
    """The harness is not vacuous: a rules file whose memory alert cannot fire fails it."""
    tool = promtool()
    broken = tmp_path / "dsv4-alerts.yml"
    broken.write_text(RULES.read_text().replace("MemTotal_bytes < 0.05", "MemTotal_bytes < 0.0"))
    doc = unit_tests()
    doc["rule_files"] = [str(broken)]
    spec = tmp_path / "t.yml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    p = subprocess.run(
        [tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode != 0 and "DSv4NodeMemoryCritical" in p.stdout + p.stderr


def panel_exprs() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: "\n".join(t["expr"] for t in p["targets"]) for p in panels}


def metrics_of(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def test_every_alert_has_a_panel_plotting_its_metrics() -> None:
    panels = panel_exprs()
    for name, rule in rules().items():
        title = rule["annotations"]["panel"]
        assert title in panels, f"{name}: no dashboard panel titled {title!r}"
        used = metrics_of(rule["expr"])
        assert used, f"{name}: no metric found in {rule['expr']!r}"
        missing = used - metrics_of(panels[title])
        assert not missing, f"{name}: panel {title!r} does not plot {sorted(missing)}"


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
        m = re.search(r"MemTotal_bytes < ([0-9.]+)$", r[alert]["expr"].strip())
        assert m and float(m.group(1)) == fraction, alert


def test_ci_installs_promtool() -> None:
    script = (REPO / "scripts" / "ensure_system_deps.sh").read_text()
    packages = re.search(r"PACKAGES=\(([^)]*)\)", script)
    assert packages and "prometheus" in packages.group(1).split()
