"""Recipe typos stop before anything starts: the final argv through vLLM's own parser.

Locally (vLLM importable, needs_vllm) `plan`/`preflight` exit 2 naming the key; on a Spark
(vLLM only in the image) preflight runs the image's parser in a throwaway container and
PF-VLLM-ARGS decides (here with the fake docker; tests/test_proc_docker.py runs the real
parser in the rehearsal's process runtime).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pairctl.pair.config import parse_env
from pairctl.pair.recipe import load_recipe, parse_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight import argcheck
from pairctl.preflight.checks_launch import check_vllm_args
from pairctl.preflight.evidence import ArgvCheck
from tests.fakes.fakepair import Env, free_port

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "recipes" / "dsv4-flash-dspark.yaml"
ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "MODEL_PATH": "/models/dsv4",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
}


def _recipe(**serve_edits) -> object:
    data = yaml.safe_load(MAIN.read_text())
    for key, val in serve_edits.items():
        if val is None:
            data["serve"].pop(key.replace("_", "-"))
        else:
            data["serve"][key.replace("_", "-")] = val
    return parse_recipe(data, "bad.yaml")


def _verdicts(out: str, recipe, passthrough: list[str]) -> ArgvCheck:
    return argcheck.parse_output(out, "this machine's vLLM", recipe, passthrough)


@pytest.mark.needs_vllm
def test_real_parser_names_each_typo_and_where_it_came_from() -> None:
    """One child process parses every case with vLLM 0.33's `vllm serve` parser."""
    cfg = parse_env(ENV)
    good = load_recipe(MAIN)
    typo = _recipe(max_num_seqs=None, **{"max-num-seq": 24})
    unknown = _recipe(**{"bogus-key": 1})
    lots = _recipe(max_num_seqs="lots")
    cases = [
        (good, []),
        (typo, []),
        (unknown, []),
        (lots, []),
        (good, ["--bogus-flag", "1"]),
        (good, ["--max_num_seqs", "8"]),  # vLLM's own underscore spelling is a full name
    ]
    argvs = [argv for r, extra in cases for argv in argcheck.rank_argvs(resolve(cfg, r, extra))]
    out, err = argcheck.run_script_locally(argvs)
    data = json.loads(out.split(argcheck.MARK, 1)[1])
    assert data["vllm"] == "0.33.0", err[-2000:]
    per_case = [data["results"][i : i + 2] for i in range(0, len(argvs), 2)]
    explained = []
    for (recipe, extra), results in zip(cases, per_case, strict=True):
        line = argcheck.MARK + json.dumps({"vllm": "0.33.0", "results": results})
        explained.append(_verdicts(line, recipe, extra))
    ok, typo_v, unknown_v, lots_v, bogus_v, underscore_v = explained
    assert ok.ok and underscore_v.ok
    assert typo_v.errors == [
        "both ranks: recipe bad.yaml: serve key 'max-num-seq': vLLM's parser says: "
        "--max-num-seq is not a flag of vllm serve; argparse would read it as "
        "--max-num-seqs (a prefix match): write the full name"
    ]
    assert unknown_v.errors and "serve key 'bogus-key'" in unknown_v.errors[0]
    assert "unrecognized arguments: --bogus-key 1" in unknown_v.errors[0]
    assert lots_v.errors == [
        "both ranks: recipe bad.yaml: serve key 'max-num-seqs': vLLM's parser says: "
        "argument --max-num-seqs: invalid int value: 'lots'"
    ]
    assert bogus_v.errors and bogus_v.errors[0].startswith("both ranks: extra vLLM args after --")


@pytest.mark.needs_vllm
def test_plan_exits_2_naming_the_bad_extra_flag(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    p = pair.run("plan", "--", "--bogus-flag", "1", timeout=300, env={"PAIRCTL_ARGCHECK": "auto"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "extra vLLM args after --" in p.stderr and "--bogus-flag 1" in p.stderr
    assert "docker run" not in p.stdout and pair.calls() == []


def test_cache_key_ignores_only_the_launchers_wiring() -> None:
    a = [["/m1", "--port", "8000", "--master-addr", "10.0.0.1", "--max-num-seqs", "24"]]
    b = [["/m2", "--port", "9000", "--master-addr", "10.9.9.9", "--max-num-seqs", "24"]]
    c = [["/m1", "--port", "8000", "--master-addr", "10.0.0.1", "--max-num-seqs", "25"]]
    assert argcheck._key("vllm==0.33.0", a) == argcheck._key("vllm==0.33.0", b)
    assert argcheck._key("vllm==0.33.0", a) != argcheck._key("vllm==0.33.0", c)
    assert argcheck._key("vllm==0.33.0", a) != argcheck._key("image:sha256:1", a)


@pytest.mark.parametrize("operator", [None, "0"])
def test_the_local_parser_runs_without_hummings_background_builds(
    monkeypatch: pytest.MonkeyPatch, operator: str | None
) -> None:
    """The local check's child starts no CUDA JIT build (vLLM 0.33's humming-kernels does at
    import unless HUMMING_DISABLE_PARALLEL_BUILD=1); an operator's own setting is kept."""
    if operator is None:
        monkeypatch.delenv("HUMMING_DISABLE_PARALLEL_BUILD", raising=False)
    else:
        monkeypatch.setenv("HUMMING_DISABLE_PARALLEL_BUILD", operator)
    seen: dict[str, str] = {}

    def fake_run(argv, **kw):
        seen.update(kw["env"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(argcheck.subprocess, "run", fake_run)
    argcheck.run_script_locally([["/m", "--max-num-seqs", "24"]])
    assert seen["HUMMING_DISABLE_PARALLEL_BUILD"] == (operator or "1")


def test_throwaway_container_is_labelled_isolated_and_removed() -> None:
    cfg = parse_env(ENV)
    argv = argcheck.container_argv(
        cfg["PAIR_ID"], "img:1", [["/m", "--max-num-seqs", "24"]], "/opt/env/bin/python"
    )
    i = argv.index("img:1")
    head = argv[:i]
    assert argv[:3] == ["docker", "run", "--rm"] and "-d" not in head
    assert "dsv4.pair=pair-a" in head and "dsv4.role=argcheck" in head
    assert head[head.index("--network") + 1] == "none"
    assert head[head.index("--entrypoint") + 1] == "/opt/env/bin/python"
    assert argv[i + 1] == "-c" and json.loads(argv[-1]) == [["/m", "--max-num-seqs", "24"]]


def test_pf_vllm_args_verdicts() -> None:
    assert check_vllm_args(ArgvCheck("image x", True)).status == "PASS"
    c = check_vllm_args(ArgvCheck("image x", True, "", ["both ranks: serve key 'x': no"]))
    assert c.status == "FAIL" and "serve key 'x'" in c.detail and "vllm serve --help" in c.remedy
    c = check_vllm_args(ArgvCheck("image x", False, "cannot build vLLM's serve parser: E"))
    assert c.status == "WARN" and "cannot build" in c.detail


def _throwaway(verdicts: list[dict]) -> dict:
    return {"out": argcheck.MARK + json.dumps({"vllm": "0.33.0+fork", "results": verdicts})}


@pytest.mark.parametrize(
    ("reply", "rc", "status"),
    [
        (_throwaway([{"ok": True}, {"ok": True}]), 0, "PASS"),
        (
            _throwaway(
                [{"ok": False, "flag": "--max-num-seq", "error": "--max-num-seq is no"}] * 2
            ),
            3,
            "FAIL",
        ),
        ({"out": "python3: No module named vllm", "rc": 1}, 0, "WARN"),
    ],
)
def test_preflight_runs_the_images_parser_when_vllm_is_not_local(
    tmp_path: Path, reply: dict, rc: int, status: str
) -> None:
    """PAIRCTL_ARGCHECK=image is what a Spark without vLLM does by itself."""
    pair = Env(tmp_path, free_port())
    pair.state["hosts"]["h1"]["throwaway"] = reply
    pair.save()
    out = tmp_path / "pf.json"
    fresh = {"PAIRCTL_ARGCHECK": "image", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    p = pair.run("preflight", "--json", str(out), env=fresh)
    assert p.returncode == rc, p.stdout + p.stderr
    check = next(c for c in json.loads(out.read_text())["checks"] if c["id"] == "PF-VLLM-ARGS")
    assert check["status"] == status, check
    runs = argcheck_runs(pair)
    assert len(runs) == 1 and runs[0]["host"] == "h1"  # on SPARK1, once
    assert "dsv4.pair=pair-a" in runs[0]["argv"]
    # the image's own interpreter, the fork stack's (the recipe's default): not a python3
    # the seed's /opt/env image need not have on its PATH
    argv = runs[0]["argv"]
    assert argv[argv.index("--entrypoint") + 1] == "/opt/env/bin/python"
    if status == "FAIL":
        assert "--max-num-seq" in check["detail"]
    # a pass is remembered per image ID: the next preflight does not start a container
    pair.run("preflight", env=fresh)
    again = argcheck_runs(pair)
    assert len(again) == (1 if status == "PASS" else 2)


def argcheck_runs(pair: Env) -> list[dict]:
    """The argv check's throwaways (the image probe runs its own, role imageprobe)."""
    return [
        c
        for c in pair.calls()
        if c["argv"][:2] == ["run", "--rm"] and "dsv4.role=argcheck" in c["argv"]
    ]


def test_plan_without_local_vllm_says_who_checks(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    p = pair.run("plan", env={"PAIRCTL_ARGCHECK": "image"})
    assert p.returncode == 0, p.stderr
    assert "preflight checks it with the image's own parser (PF-VLLM-ARGS)" in p.stdout
    assert pair.calls() == []  # plan contacts no node, not even for the check
