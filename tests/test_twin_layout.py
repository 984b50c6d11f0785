"""How the simulator is put together: imports go one way, overlay flags come from the plugin.

An import cycle hidden inside functions works until someone imports the modules in
another order; a copied flag parser works until the plugin changes its rules. Both are
checked here, so neither can come back silently.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dsv4_flash_overlays import flags

import sim
from sim.twin import app, overlay_flags
from sim.twin import profile as profmod
from sim.twin.cli import parse_serve_args
from sim.twin.faults import Faults

SIM = Path(sim.__file__).resolve().parent
MODULES = sorted(
    ".".join(p.relative_to(SIM.parent).with_suffix("").parts).removesuffix(".__init__")
    for p in SIM.rglob("*.py")
)


def _sim_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported sim module, at module top?) for every import of a sim module in `path`."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from sim.twin import faults` imports the submodule when there is one.
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in MODULES and (name == "sim" or name.startswith("sim.")):
                found.append((name, id(node) in top))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod in MODULES:
        rel = Path(*mod.split("."))
        path = SIM.parent / rel.with_suffix(".py")
        if not path.exists():
            path = SIM.parent / rel / "__init__.py"
        # A package's __init__ runs before its submodules: that edge is not a cycle.
        deps = {d for d, _ in _sim_imports(path) if not mod.startswith(d + ".") and d != mod}
        graph[mod] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_sim_has_no_import_cycle() -> None:
    graph = _graph()
    assert "sim.twin.serve" in graph and "sim.twin.app" in graph["sim.twin.serve"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_twin_imports_sim_modules_only_at_module_top() -> None:
    hidden = []
    for path in sorted((SIM / "twin").glob("*.py")):
        hidden += [f"{path.name}: {name}" for name, top in _sim_imports(path) if not top]
    assert hidden == [], "import these at module top (and keep the graph acyclic)"


def test_each_twin_module_imports_alone() -> None:
    """Each module first, in a clean import state: an order-dependent cycle fails here."""
    mods = [m for m in MODULES if m.startswith("sim.twin") and m != "sim.twin.__main__"]
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]:\n"
        "    for k in [k for k in sys.modules if k == 'sim' or k.startswith('sim.')]:\n"
        "        del sys.modules[k]\n"
        "    importlib.import_module(m)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr


ENVS = [
    {},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "0"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "true"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": " 1"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_OVERLAYS_DISABLE": "1"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_OVERLAYS_DISABLE": "0"},
    {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_OVERLAYS_DISABLE": "yes"},
    {"VLLM_INCREMENTAL_ENCODE_CACHE": "1", "DSV4_OVERLAYS_DISABLE": "1"},
    {"VLLM_INCREMENTAL_ENCODE_CACHE": "1"},
]
OVERLAY_VARS = ("VLLM_DSPARK_FP8_DRAFT_HEAD", "VLLM_INCREMENTAL_ENCODE_CACHE", flags.KILL_SWITCH)


def _twin_fp8(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> bool:
    """The fp8 decision the twin's engine is built with, in environment `env`."""
    for var in OVERLAY_VARS:
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = parse_serve_args(["dsv4", "--twin-profile", "rehearsal"])
    return app.engine_config(args, profmod.load("rehearsal"), Faults(), warm=True).fp8_head


@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_fp8_and_encode_cache_decisions_follow_the_plugin(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    assert _twin_fp8(monkeypatch, env) is flags.flag_enabled("VLLM_DSPARK_FP8_DRAFT_HEAD", env)
    assert overlay_flags.encode_cache_enabled(env) is flags.flag_enabled(
        "VLLM_INCREMENTAL_ENCODE_CACHE", env
    )


def test_fp8_truth_table(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _twin_fp8(monkeypatch, {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1"}) is True
    assert _twin_fp8(monkeypatch, {}) is False
    kill = {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_OVERLAYS_DISABLE": "1"}
    assert _twin_fp8(monkeypatch, kill) is False


def test_twin_reads_the_registry_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Were the plugin to rename its kill switch, the twin must follow without an edit.
    monkeypatch.setattr(flags, "KILL_SWITCH", "DSV4_TEST_RENAMED_KILL_SWITCH")
    env = {"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_TEST_RENAMED_KILL_SWITCH": "1"}
    assert _twin_fp8(monkeypatch, env) is False
    assert _twin_fp8(monkeypatch, {**env, "DSV4_TEST_RENAMED_KILL_SWITCH": "0"}) is True


def test_truth_command_reports_the_kill_switch() -> None:
    def fp8(extra: dict[str, str]) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in OVERLAY_VARS}
        res = subprocess.run(
            [sys.executable, "-m", "sim.twin", "truth", "--twin-profile", "rehearsal"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["derived"]["fp8_draft_head"]

    assert fp8({"VLLM_DSPARK_FP8_DRAFT_HEAD": "1"}) is True
    assert fp8({"VLLM_DSPARK_FP8_DRAFT_HEAD": "1", "DSV4_OVERLAYS_DISABLE": "1"}) is False
