"""The fp8 tuner's rules (CPU): accuracy eligibility, the choice per M, search space, CLI.

The measurements these rules ran on are recorded in bench/results/fp8_head/ (H200; the runs
no document cites are test data in tests/data/fp8_head/).
"""

from __future__ import annotations

import json
import types

import pytest
import torch
from dsv4_flash_overlays.fp8_head import configs as C

from bench.kernels.fp8_tune import search, table, tune
from tests.conftest import REPO

RESULTS = REPO / "bench" / "results" / "fp8_head"  # the runs the docs cite
DATA = REPO / "tests" / "data" / "fp8_head"  # the runs no doc cites, read only by tests


def test_w8a8_is_eligible_only_within_a_tenth_of_a_point_of_w8a16():
    acc = {
        "w8a16": {"agreement": 0.9800},
        "w8a8-t2-row": {"agreement": 0.9791},  # 0.09 pp below: eligible
        "w8a8-t1-row": {"agreement": 0.9789},  # 0.11 pp below: not
        "w8a8-t2-g128": {"agreement": 0.9900},  # better than W8A16: eligible
        "scaled_mm": {"error": "RuntimeError: no rowwise scaling on this GPU"},
    }
    assert tune.eligibility(acc) == {
        "w8a16": True,
        "w8a8-t2-row": True,
        "w8a8-t1-row": False,
        "w8a8-t2-g128": True,
        "scaled_mm": False,
    }
    assert not any(
        tune.eligibility({"w8a16": {"error": "x"}, "w8a8-t2-row": acc["w8a8-t2-row"]}).values()
    )


@pytest.mark.parametrize(
    "path",
    [
        DATA / "fp8_head_run24_bench.json",
        DATA / "fp8_head_run26_bench.json",
        DATA / "fp8_head_run28_explore.json",
        RESULTS / "fp8_head_run30_bench.json",
    ],
    ids=lambda p: p.stem.removeprefix("fp8_head_"),
)
def test_recorded_h200_accuracy_follows_the_rule(path):
    run = json.loads(path.read_text())
    acc = run["accuracy"]
    assert {f: r["eligible"] for f, r in acc.items()} == tune.eligibility(acc)
    assert acc["w8a8-t2-row"]["eligible"] and not acc["w8a8-t1-row"]["eligible"]
    if "w8a8-t2-row-fastacc" in acc:  # no promotion over K = 4096: not eligible on an H200
        assert not acc["w8a8-t2-row-fastacc"]["eligible"]
    if "w8a8-t2-row-p256" in acc:  # both terms per promotion (fuse=1): eligible
        assert acc["w8a8-t2-row-p256"]["eligible"]
        assert acc["w8a8-t2-row-p256"]["config"]["fuse"] == 1


def _t(fam: str, us: float, choice: object = None) -> dict:
    c = choice or (C.W8A16Config(64) if fam == "w8a16" else C.W8A8Config(terms=2))
    return {"family": fam, "us": us, "choice": C.choice_to_json(c)}


def test_choice_is_the_fastest_eligible_path_with_a_margin_over_bf16():
    timings = [_t("w8a16", 80.0), _t("w8a8-t1-row", 60.0), _t("w8a8-t2-row", 85.0)]
    timings.append({"family": "w8a16", "error": "OutOfResources"})
    eligible = {"w8a16", "w8a8-t2-row"}
    choice, t = tune.choose(100.0, timings, eligible)
    assert choice == C.W8A16Config(64) and t == 80.0  # t1 is faster but not eligible
    assert tune.choose(100.0, timings, eligible, repeat=78.0)[1] == 78.0
    assert tune.choose(90.0, timings, eligible) == (C.BF16, 90.0)  # 80 is not 13% below 90
    assert tune.choose(100.0, [], eligible) == (C.BF16, 100.0)
    assert tune.choose(100.0, timings, {"w8a8-t1-row", "w8a16"})[0] == C.W8A8Config(terms=2)


def test_search_space_follows_eligibility_shape_and_m():
    fams = {"w8a16"}
    assert {
        C.family(c) for c in search.candidates(40, "full", fams, C.SMEM_LIMIT_BY_SM[(9, 0)])
    } == fams
    fams = set(search.family_representatives())
    at40 = search.candidates(40, "full", fams, C.SMEM_LIMIT_BY_SM[(9, 0)], n=64640)
    assert {C.family(c) for c in at40} == fams
    assert C.SCALED_MM not in search.candidates(40, "full", fams, 232448, n=64641)  # N % 16
    assert not any(isinstance(c, C.W8A8Config) for c in search.candidates(5, "full", fams, 232448))
    w16 = [c for c in at40 if isinstance(c, C.W8A16Config)]
    assert {c.pad_m for c in w16} == {0, 1}
    w16_48 = [
        c for c in search.candidates(48, "full", fams, 232448) if isinstance(c, C.W8A16Config)
    ]
    tma_48 = {c for c in w16_48 if c.tma}
    assert {c.pad_m for c in w16_48 if not c.tma} == {1}  # an entry at a multiple of 16 serves
    # the M below it; copy-engine (tma) loads need no padding, and come in from M > 16
    assert tma_48 and {c.num_warps for c in tma_48} == {4, 8}  # one or two warpgroups
    assert {c.tma for c in tma_48} == {1, 2}  # 48 rows: one tile of 64, or 32 + 16
    w16_64 = search.candidates(64, "full", fams, 232448)
    assert {c.tma for c in w16_64 if isinstance(c, C.W8A16Config)} == {0, 1}  # one tile only
    w16_80 = search.candidates(80, "full", fams, 232448)
    assert {c.tma for c in w16_80 if isinstance(c, C.W8A16Config)} == {0, 1, 2}
    assert C.W8A16Config(tma=2).tiles(72) == (64, 16) and C.W8A16Config(tma=1).tiles(72) == (
        128,
        0,
    )
    w16_16 = search.candidates(16, "full", fams, 232448)
    assert not any(getattr(c, "tma", 0) for c in w16_16)
    assert len(search.candidates(40, "quick", fams, 232448)) < len(at40)


def test_quantize_once_search_covers_fused_single_tile_and_promotion_variants():
    h200 = C.SMEM_LIMIT_BY_SM[(9, 0)]
    fams = {"w8a16", "w8a8-t2-row", "w8a8-t2-row-p256"}
    for m, split in ((20, False), (40, True), (64, False), (80, True), (128, False)):
        once = [c for c in search.candidates(m, "full", fams, h200, w8a8_grid_name="quick")
                if isinstance(c, C.W8A8Config) and c.once]  # fmt: skip
        assert {C.family(c) for c in once} == {"w8a8-t2-row", "w8a8-t2-row-p256"}, m
        assert any(c.fuse and c.tma for c in once) and any(not c.fuse for c in once)
        assert any(c.single_tile for c in once) == split, m  # only where m_tiles splits M
    assert not [c for c in search.candidates(16, "full", fams, h200) if getattr(c, "once", 0)]
    # the fastacc family is timed only where it is eligible
    fast = {"w8a16", "w8a8-t2-row-fastacc"}
    once = [c for c in search.candidates(64, "full", fast, h200) if getattr(c, "once", 0)]
    assert once and {c.promote for c in once} == {0}
    # on GB10 a shrunk fused config changes family (2 x BK); eligibility is checked after
    gb10 = C.SMEM_LIMIT_BY_SM[(12, 1)]
    for c in search.candidates(144, "full", {"w8a16", "w8a8-t2-row-p256"}, gb10):
        assert C.family(c) in {"w8a16", "w8a8-t2-row-p256"} and C.fits(c, 144, gb10)


def test_cliffs_flag_drops_over_ten_percent_between_tuned_m():
    rows = [
        {"n": 1, "m": 32, "speedup": 1.90},
        {"n": 1, "m": 40, "speedup": 1.75},
        {"n": 1, "m": 48, "speedup": 1.50},
        {"n": 2, "m": 1, "speedup": 1.0},
    ]
    assert tune.cliffs(rows) == ["N=1: M 40 -> 48: 1.75x -> 1.50x"]


def test_tune_shapes_seeds_later_shapes_only_when_asked(monkeypatch):
    calls = []

    def fake_tune_shape(n, k, ms, grid, eligible, limit, reps, deadline, workers, seeds, *rest):
        calls.append((n, k, seeds, rest))
        row = {"m": ms[0], "timings": [_t("w8a16", 80.0 + n % 7)]}
        return {str(ms[0]): "bf16"}, [row], {}

    monkeypatch.setattr(tune, "tune_shape", fake_tune_shape)
    args = types.SimpleNamespace(
        n=[129280, 64640], m=[40], grid="full", reps=3, workers=0, w8a8_grid=None
    )
    seen = []
    entries, rows = tune.tune_shapes(
        "GPU", args, 4096, {"w8a16"}, 1, 0.0, True, on_shape=lambda e, r: seen.append(len(r))
    )
    assert list(entries) == [C.config_key("GPU", n, 4096) for n in args.n] and len(rows) == 2
    assert calls[0][2] is None and calls[1][2] == {40: [C.W8A16Config(64)]}  # seeded
    assert calls[0][3] == (False, "") and seen == [1, 2]
    calls.clear()
    tune.tune_shapes("GPU", args, 4096, {"w8a16"}, 1, 0.0, False)
    assert [c[2] for c in calls] == [None, None]  # every shape gets the full search


def test_top_candidates_keep_the_best_per_family():
    row = {"m": 40, "timings": [_t("w8a16", 90), _t("w8a16", 80), _t("w8a16", 85)]}
    row["timings"].append(_t("w8a8-t2-row", 120))
    top = tune.top_candidates([row], per_family=1)
    assert top == {40: [C.W8A16Config(64), C.W8A8Config(terms=2)]}


def test_cli_validates_and_needs_a_gpu(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        tune.parse_args(["--m", "0"])
    with pytest.raises(SystemExit):
        tune.parse_args(["--k", "100"])
    assert tune.parse_args([]).n == [64640]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tune.main([]) == 2
    assert "--gpus all" in capsys.readouterr().err


def test_recorded_dispatch_never_picked_a_path_slower_than_bf16():
    """The final H200 runs: every M from 1 to 160 timed through the overlay's head (24 tuned
    the shipped table and timed it in the same run)."""
    for path in (
        DATA / "fp8_head_run21_bench.json",
        DATA / "fp8_head_run22_dispatch.json",
        DATA / "fp8_head_run23_bench.json",
        DATA / "fp8_head_run24_bench.json",
        DATA / "fp8_head_run25_bench.json",
        DATA / "fp8_head_run26_bench.json",
        RESULTS / "fp8_head_run30_bench.json",
        RESULTS / "fp8_head_run33_dispatch.json",
    ):
        _check_dispatch(json.loads(path.read_text()))


def _check_dispatch(run: dict) -> None:
    rows = run["dispatch_rows"]
    for n in (129280, 64640):
        ms = sorted(r["m"] for r in rows if r["n"] == n)
        assert ms[0] == 1 and ms[-1] == 160 and len(ms) >= 25
    for r in rows:
        if r["path"] != "bf16":  # the fp8 paths chosen are faster than bf16 ...
            assert r["speedup"] > 1.0, r
        else:  # ... and the fallback is the same cuBLAS call (A-B-A spread only)
            lo, hi = sorted(r["bf16_before_after_us"])
            assert r["head_us"] > 0.95 * lo and r["head_us"] < 1.05 * hi, r


def test_table_writer_records_no_path_of_the_machine_that_tuned(tmp_path):
    """The table ships to every Spark: a recorded command is what an operator types in a
    clone (repo-relative paths, file names for scratch paths), never this machine's paths,
    whoever builds the command line, and old entries are cleaned on the next write."""
    clone = tmp_path / "clone"
    argv = [
        "--configs-out",
        "/scratch/fp8_configs.json",
        f"--json={clone}/bench/results/fp8_head/run.json",
        "--m",
        "40",
        "--seed",
        "relative/x.json",
    ]
    cmd = table.portable_command("bench.kernels.bench_fp8_head", argv, root=clone)
    assert cmd == (
        "python -m bench.kernels.bench_fp8_head --configs-out fp8_configs.json "
        "--json=bench/results/fp8_head/run.json --m 40 --seed relative/x.json"
    )
    out = tmp_path / "fp8_configs.json"
    old = {"schema_version": 2, "entries": {}, "meta": {"A|N=1|K=128": {"command": "/x/y.py"}}}
    out.write_text(json.dumps(old))
    raw = f"{clone}/bench/kernels/bench_fp8_head.py --tune --configs-out /scratch/fp8_configs.json"
    key = C.config_key("GPU", 64640, 4096)
    data = table.merge_into_file(out, {key: {"5": "bf16"}}, {key: {"command": raw}}, root=clone)
    assert data["meta"][key]["command"] == (
        "bench/kernels/bench_fp8_head.py --tune --configs-out fp8_configs.json"
    )
    assert data["meta"]["A|N=1|K=128"]["command"] == "y.py"
    text = out.read_text()
    assert str(tmp_path) not in text and "/root" not in text and "/x/" not in text
    assert table.portable_path(str(clone), root=clone) == "."
    assert table.portable_path("-", root=clone) == "-" and table.portable_path("/") == "/"


def test_tuner_records_its_own_command_without_machine_paths(monkeypatch, tmp_path):
    """``main`` writes the table with a command built from sys.argv: the module's absolute
    path (``python -m`` puts it in argv[0]) and a scratch --out never reach the file."""
    out = tmp_path / "scratch" / "fp8_configs.json"
    out.parent.mkdir()
    argv0 = str(REPO / "bench" / "kernels" / "fp8_tune" / "__main__.py")
    monkeypatch.setattr(tune.sys, "argv", [argv0, "--eval-rows", "0", "--out", str(out)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune, "env_info", lambda: {"device": "GPU", "smem_per_block_optin": 1})
    key = C.config_key("GPU", 64640, 4096)
    monkeypatch.setattr(tune, "tune_shapes", lambda *a, **k: ({key: {"5": "bf16"}}, []))
    tf32 = torch.backends.cuda.matmul.allow_tf32  # main turns it off
    try:
        assert tune.main(tune.sys.argv[1:]) == 0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    data = json.loads(out.read_text())
    assert data["meta"][key]["command"] == (
        "python -m bench.kernels.fp8_tune --eval-rows 0 --out fp8_configs.json"
    )
    assert str(REPO) not in out.read_text() and str(tmp_path) not in out.read_text()
