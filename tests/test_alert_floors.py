"""The acceptance alerts' floors (pairctl/fleet/alertfloors.py): derived from healthy classes,
out of reach of any mix of them, lowered by a class's repeat spread, and written by
`fleet alert-floors` from the published classes or from a recorded probe's file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from pairctl.fleet import alertfloors as af
from pairctl.fleet import cli as fleet_cli

REPO = Path(__file__).resolve().parents[1]


def figures(per_pos: list[float]) -> tuple[float, float, float]:
    """Mean length, position-0 share, conditional at LATE: what the three alerts compute."""
    return 1 + sum(per_pos), per_pos[0], per_pos[af.LATE] / per_pos[af.LATE - 1]


def test_each_floor_is_half_the_lowest_healthy_figure() -> None:
    f = af.floors(af.ANCHOR)
    lengths, firsts, lates = zip(*(figures(list(c.per_pos)) for c in af.ANCHOR), strict=True)
    assert f.mean_length == pytest.approx(1 + af.HALF * (min(lengths) - 1), abs=1e-3)
    assert f.first_position == pytest.approx(af.HALF * min(firsts), abs=1e-3)
    assert f.late_conditional == pytest.approx(af.HALF * min(lates), abs=1e-3)
    # the prose class is the lowest on every figure, and sits at 2.0 tokens per step
    assert min(lengths) == pytest.approx(2.0, abs=0.01)


def test_no_mix_of_healthy_classes_reaches_a_floor() -> None:
    """A ratio of sums over any mix lies between the classes' own ratios: random mixes (by
    drafts) of the healthy classes stay over every floor."""
    f = af.floors(af.ANCHOR)
    rng = random.Random(7)
    for _ in range(500):
        w = [rng.random() ** 3 for _ in af.ANCHOR]  # skewed mixes, one class often dominant
        per_pos = [
            sum(wi * c.per_pos[k] for wi, c in zip(w, af.ANCHOR, strict=True)) / sum(w)
            for k in range(5)
        ]
        length, first, late = figures(per_pos)
        assert length > f.mean_length and first > f.first_position
        assert late > f.late_conditional


def test_the_broken_signatures_fall_under_a_floor() -> None:
    f = af.floors(af.ANCHOR)
    dropped = [0.26 ** (k + 1) for k in range(5)]  # position 0 from 60% to 26%
    length, first, _ = figures(dropped)
    assert length < f.mean_length and first < f.first_position
    grammar = [0.914, 0.224, 0.0, 0.0, 0.0]  # every draft past position 1 rejected
    assert figures(grammar)[2] < f.late_conditional
    assert figures(grammar)[0] > 2.1  # while its mean length looks like healthy prose


def test_a_repeat_spread_lowers_the_floors() -> None:
    plain = af.floors(af.ANCHOR)
    spread = tuple(
        af.HealthyClass(c.name, c.per_pos, tuple(0.1 * p for p in c.per_pos)) for c in af.ANCHOR
    )
    wide = af.floors(spread)
    assert wide.mean_length < plain.mean_length
    assert wide.first_position < plain.first_position
    assert wide.late_conditional < plain.late_conditional


def probe_file(tmp_path: Path, classes: list[dict]) -> Path:
    p = tmp_path / "probe-classes.json"
    p.write_text(json.dumps({"source": "probe recorded at up --gate", "classes": classes}))
    return p


def test_fleet_alert_floors_writes_the_repos_file_and_takes_a_probes_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "floors.yml"
    assert fleet_cli.main(["alert-floors", "--output", str(out)]) == 0
    assert out.read_text() == (REPO / af.DEFAULT_OUTPUT).read_text()
    # a recorded probe: one low class (a prompt kind at 1.8 tokens per step)
    classes = [
        {"name": "prose", "per_pos": [0.5, 0.2, 0.08, 0.02, 0.0], "spread": [0.02] * 5},
        {"name": "code", "per_pos": [0.9, 0.8, 0.7, 0.6, 0.5]},
    ]
    assert fleet_cli.main(["alert-floors", "--classes", str(probe_file(tmp_path, classes))]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    got = {r["record"]: r["expr"] for r in doc["groups"][0]["rules"]}
    low = [0.48, 0.18, 0.06, 0.0, 0.0]
    assert got[af.PREFIX + "mean_length"] == f"vector({round(1 + 0.5 * sum(low), 3):g})"
    assert got[af.PREFIX + "first_position"] == "vector(0.24)"
    assert got[af.PREFIX + "late_conditional"] == f"vector({round(0.5 * 0.06 / 0.22, 3):g})"


@pytest.mark.parametrize(
    "classes, why",
    [
        ([], "no healthy class"),
        ([{"name": "x", "per_pos": [0.5, 0.6, 0.1, 0.0, 0.0]}], "cannot grow"),
        ([{"name": "x", "per_pos": [1.5, 0.6, 0.1, 0.0, 0.0]}], "shares in [0, 1]"),
        ([{"name": "x", "per_pos": [0.5, 0.2]}], "positions"),
        ([{"name": "x", "per_pos": [0.5, 0.2, 0.1], "spread": [0.1]}], "one entry per position"),
        ([{"per_pos": [0.5, 0.2, 0.1]}], "needs name and per_pos"),
    ],
)
def test_a_bad_classes_file_is_a_usage_error_that_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], classes: list[dict], why: str
) -> None:
    rc = fleet_cli.main(["alert-floors", "--classes", str(probe_file(tmp_path, classes))])
    assert rc == 2
    err = capsys.readouterr().err
    assert why in err and err.startswith("fleet alert-floors: ")
