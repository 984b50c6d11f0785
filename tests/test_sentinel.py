"""The acceptance sentinel's core (pairctl/sentinel/acceptance.py, baseline.py, monitors.py's
window): pure functions of two counter snapshots and a band.

The figures are the ones the sentinel is built for: a healthy DSpark draft at
81/62/46/33/24% per position that loses its shared-expert weights and falls to 60/20/8/3/1%
while the output stays correct (tonyd2wild's DSv4-Flash README, "Patch 4"), and traffic
kinds whose mean acceptance length differs twofold (prose ~2.1, agent ~3.5, code ~4.6
tokens per step), which must never fire on their own or mixed.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from pairctl.sentinel import baseline
from pairctl.sentinel.acceptance import (
    DROP,
    INSUFFICIENT,
    MISMATCH,
    NO_BASELINE,
    NO_SPEC,
    OK,
    Counters,
    counters_of,
    judge,
    shape,
)
from pairctl.sentinel.monitors import AcceptanceWindow, pick_base
from pairctl.status.metrics import parse

HEALTHY = [0.81, 0.62, 0.46, 0.33, 0.24]
DROPPED = [0.60, 0.20, 0.08, 0.03, 0.01]
# Conditional acceptance per position (k given k-1) of three kinds of traffic, each with
# a draft a bit weaker at depth (as real drafts are); mean lengths 2.2 / 3.5 / 4.6.
PROSE = [0.62, 0.55, 0.50, 0.45, 0.42]
AGENT = [0.86, 0.78, 0.72, 0.67, 0.63]
CODE = [0.95, 0.90, 0.86, 0.82, 0.80]


def cum(cond: list[float]) -> list[float]:
    out, c = [], 1.0
    for p in cond:
        c *= p
        out.append(c)
    return out


def counters(per_pos: list[float], drafts: float = 5000.0) -> Counters:
    """Counters of ``drafts`` drafts with P(position k accepted) = per_pos[k]."""
    a = tuple(drafts * p for p in per_pos)
    return Counters(drafts, drafts * len(per_pos), sum(a), a)


def mixed(parts: list[tuple[list[float], float]]) -> Counters:
    """Counters of a window where each traffic kind (cumulative per position) had so many
    drafts: counters add up, as the server's do."""
    total = Counters(0.0, 0.0, 0.0, (0.0,) * 5)
    for per_pos, drafts in parts:
        c = counters(per_pos, drafts)
        total = Counters(
            total.drafts + c.drafts,
            total.draft_tokens + c.draft_tokens,
            total.accepted + c.accepted,
            tuple(x + y for x, y in zip(total.per_pos, c.per_pos, strict=True)),
        )
    return total


def band_of(*per_pos: list[float]) -> baseline.Band:
    obs = [baseline.observation("live", shape(counters(p)), 300.0) for p in per_pos]
    return baseline.band_from(obs, 5)


def test_the_figures_of_a_window_follow_vllms_formulas() -> None:
    s = shape(counters(HEALTHY, 1000))
    assert s.per_pos == pytest.approx(HEALTHY)
    assert s.mean_length == pytest.approx(1 + sum(HEALTHY))  # 1 + accepted / drafts
    assert s.conditional[1] == pytest.approx(0.62 / 0.81)
    assert s.depth_ratio == pytest.approx((sum(HEALTHY[1:]) / sum(HEALTHY[:-1])) / 0.81)


def test_dropped_draft_weights_fire_and_name_the_collapsed_positions() -> None:
    band = band_of(HEALTHY)
    assert judge(None, counters(HEALTHY), band, "w").state == OK
    r = judge(None, counters(DROPPED), band, "w")
    assert r.state == DROP and r.event
    assert r.depth_ratio == pytest.approx(0.586, abs=0.01)
    assert r.collapsed == [1, 2, 3, 4]
    assert "later draft positions collapse" in r.detail and "60/20/8/3/1%" in r.detail


@pytest.mark.parametrize("kind", [PROSE, AGENT, CODE], ids=["prose", "agent", "code"])
@pytest.mark.parametrize("recorded", [PROSE, AGENT, CODE], ids=["prose", "agent", "code"])
def test_a_change_of_traffic_kind_alone_never_fires(
    kind: list[float], recorded: list[float]
) -> None:
    """A band recorded on one kind of traffic; the pair then serves another kind only."""
    r = judge(None, counters(cum(kind)), band_of(cum(recorded)), "w")
    assert r.state == OK, r.detail
    if kind is not recorded:
        assert "change of traffic mix" in r.note  # the mean length moved: said, not fired


def test_any_mix_of_traffic_kinds_never_fires() -> None:
    band = band_of(cum(AGENT))
    rng = random.Random(7)
    for _ in range(200):
        parts = [(cum(k), rng.uniform(0, 3000)) for k in (PROSE, AGENT, CODE)]
        parts.append((cum(rng.choice([PROSE, AGENT, CODE])), 1000))  # >= min drafts
        r = judge(None, mixed(parts), band, "w")
        assert r.state == OK, (parts, r.detail)


def test_uniform_scaling_of_every_position_keeps_the_depth_ratio() -> None:
    """Harder or easier text scales every conditional together: R does not move."""
    base = shape(counters(cum([0.8] * 5))).depth_ratio
    for alpha in (0.3, 0.5, 0.7, 0.95):
        assert shape(counters(cum([alpha] * 5))).depth_ratio == pytest.approx(base)


def test_mixing_never_lowers_the_depth_ratio_below_its_parts() -> None:
    """Chebyshev's association inequality, as the module docstring says."""
    for a, b in itertools.combinations([0.3, 0.5, 0.7, 0.9], 2):
        for w in (0.1, 0.5, 0.9):
            m = mixed([(cum([a] * 5), 1000 * w), (cum([b] * 5), 1000 * (1 - w))])
            assert shape(m).depth_ratio >= 1.0 - 1e-9


def test_a_draft_collapsed_everywhere_fires_on_the_first_position() -> None:
    band = band_of(HEALTHY)
    flat = [0.05, 0.04, 0.03, 0.024, 0.019]  # R stays ~0.8x, but a0 is a sixteenth
    r = judge(None, counters(flat), band, "w")
    assert r.state == DROP and "first-position acceptance 5%" in r.detail


def test_too_few_drafts_are_not_judged_however_bad() -> None:
    band = band_of(HEALTHY)
    r = judge(None, counters(DROPPED, drafts=band.min_drafts - 1), band, "w")
    assert r.state == INSUFFICIENT and not r.event
    assert f"judged from {band.min_drafts}" in r.detail


def test_the_window_is_the_difference_of_two_snapshots() -> None:
    band = band_of(HEALTHY)
    before = counters(HEALTHY, 100_000)  # a long healthy history...
    after = mixed([(HEALTHY, 100_000), (DROPPED, 3000)])  # ...then the weights went
    assert judge(None, after, band, "since start").state == OK  # diluted over the lifetime
    assert judge(before, after, band, "last 600 s").state == DROP  # seen in the window


def test_a_counter_reset_judges_the_new_counters_alone() -> None:
    band = band_of(HEALTHY)
    before = counters(HEALTHY, 100_000)
    after = counters(DROPPED, 3000)  # lower than before: the server restarted
    assert after.reset_since(before)
    assert judge(before, after, band, "w").drafts == 3000


def test_no_band_no_counters_or_another_gamma_is_said_not_fired() -> None:
    assert judge(None, counters(DROPPED), None, "w").state == NO_BASELINE
    assert judge(None, None, band_of(HEALTHY), "w").state == NO_SPEC
    r = judge(None, counters(DROPPED[:3]), band_of(HEALTHY), "w")
    assert r.state == MISMATCH and "record it again" in r.detail


def test_counters_are_read_from_vllms_metric_names() -> None:
    lb = 'engine="0",model_name="m"'
    body = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts counter",
            f"vllm:spec_decode_num_drafts_total{{{lb}}} 100.0",
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lb}}} 300.0",
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lb}}} 150.0",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lb},position="0"}} 80.0',
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lb},position="1"}} 50.0',
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lb},position="2"}} 20.0',
        ]
    )
    c = counters_of(parse(body + "\n"))
    assert c == Counters(100.0, 300.0, 150.0, (80.0, 50.0, 20.0))
    assert counters_of(parse("# TYPE vllm:num_requests_running gauge\n")) is None


def test_the_baseline_file_round_trips_and_a_broken_one_says_so(tmp_path) -> None:
    band = band_of(HEALTHY, cum(AGENT))
    path = baseline.path_for(tmp_path / "recipes" / "r.yaml", "r")
    assert path == tmp_path / "recipes" / "baselines" / "r.acceptance.json"
    assert baseline.load(path) is None
    baseline.save(path, baseline.document("r", band, 0.15, {"how": "test"}))
    assert baseline.load(path) == band
    assert json.loads(path.read_text())["recorded"] == {"how": "test"}
    path.write_text("{")
    with pytest.raises(baseline.BaselineError, match="record it again"):
        baseline.load(path)


def test_a_band_needs_an_observation_with_later_positions() -> None:
    with pytest.raises(baseline.BaselineError, match="record longer"):
        baseline.band_from([{"depth_ratio": None}], 5)


def test_the_sliding_window_starts_far_enough_back_for_the_minimum_drafts() -> None:
    band = band_of(HEALTHY)
    w = AcceptanceWindow(window_s=600, max_window_s=3600)
    # a quiet pair: 10 drafts a second of healthy traffic, a snapshot a minute
    for i in range(40):
        w.add(60.0 * i, counters(HEALTHY, 600.0 * i))
    now = 60.0 * 39
    r = w.reading(now, band)
    assert r.state == OK
    assert r.window == "last 600 s"  # 6000 drafts: the window as configured
    base = pick_base(list(w.samples), now, 600, 20_000)
    assert base is not None and now - base[0] == pytest.approx(2040)  # reached back further
    w.add(now + 60, counters(DROPPED, 10))  # restart: counters went down, window emptied
    assert len(w.samples) == 1
