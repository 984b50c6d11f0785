"""Shared test policy.

Tests that need real vLLM, root or `ip netns` carry a marker. On a laptop without
them they skip; in CI (CI=true) a missing requirement is a failure, because CI is
where these tests must actually run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from pairctl.preflight.argcheck import NO_CUDA_JIT

REPO = Path(__file__).resolve().parents[1]
# the launcher tests' fake-pair fixtures (endpoint, pair, dead_pair)
pytest_plugins = ["tests.fakes.fakepair"]
IN_CI = os.environ.get("CI", "").lower() == "true"
# No humming-kernels background CUDA builds at `import vllm` (argcheck.NO_CUDA_JIT): this machine
# has no CUDA, and 52 such interpreters cost 203 CPU-s in one run (docs/testing.md). Every
# test's children inherit it; a child given an env of its own adds NO_CUDA_JIT.
for _name, _value in NO_CUDA_JIT.items():
    os.environ.setdefault(_name, _value)


def _have_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


ENGINE_PY = REPO / ".venv-engine" / "bin" / "python"


def _have_engine() -> bool:
    """The real CPU engine's venv (make engine) in this checkout."""
    return ENGINE_PY.exists() and (ENGINE_PY.parent / "vllm").exists()


def _is_root() -> bool:
    return os.geteuid() == 0


def _have_netns() -> bool:
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    return _is_root() and shutil.which("ip") is not None and sshd is not None


_REQUIREMENTS = {
    "needs_vllm": (_have_vllm, "real vLLM 0.33 is not importable (make test installs it)"),
    "needs_engine": (_have_engine, "the real CPU engine is not installed (make engine)"),
    "needs_root": (_is_root, "not running as root"),
    "needs_netns": (_have_netns, "needs root, iproute2 and openssh-server"),
}


def require(condition: bool, why: str) -> None:
    """Skip on a laptop, fail in CI: for requirements checked inside a test."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {why}")
    pytest.skip(why)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, (check, why) in _REQUIREMENTS.items():
        if item.get_closest_marker(name) is not None:
            require(check(), why)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _undo_weight_guard():
    """register() installs the plugin's default-on weight guard on vLLM's loader in the
    test process; undone after each test, so no test runs under another's patch."""
    yield
    guard = sys.modules.get("dsv4_flash_overlays.weight_guard")
    if guard is not None:
        guard.remove()


# Tests that boot real engines (three Python processes importing torch per rank) or netns
# rehearsals (sshd, docker stand-ins and simulated ranks per host) are heavy. They run in two
# lanes, each one test at a time: real-engine boots in one (a real pair is ~6 GB, a four-rank
# group or a fleet of two pairs ~10-12 GB: two at once could exhaust the 24 GiB box), netns
# rehearsals of the simulator in the other.
ENGINE_LANE = "heavy-engine"
NETNS_LANE = "heavy-netns"
# Light modules that run vLLM scripts through tests/support/warm.py (marked vllm_scripts) share
# one more lane: one worker, so one warm server per interpreter serves all their scripts and
# vLLM is imported into one worker's own process, not into every worker's.
VLLM_SCRIPTS_LANE = "vllm-scripts"
# A heavy module too long for the default suite's budget (~12 min on 2 cores, docs/testing.md)
# is marked outside_suite: deselected unless this is "1" (make test-group sets it).
OUTSIDE_SUITE_ENV = "DSV4_OUTSIDE_SUITE"


def heavy_lane(item: pytest.Item) -> str | None:
    """The heavy lane a test runs in, or None for a light test. An engine test that boots
    no server (engine_no_boot: one interpreter importing the CPU engine's vLLM) is light
    unless it also builds netns hosts."""
    netns = item.get_closest_marker("needs_netns") is not None
    engine = item.get_closest_marker("needs_engine") is not None
    if engine and item.get_closest_marker("engine_no_boot") is None:
        return ENGINE_LANE
    return NETNS_LANE if netns else None


def is_heavy(item: pytest.Item) -> bool:
    return heavy_lane(item) is not None


# tryfirst: xdist's worker reads the xdist_group marks in its own collection hook and
# registers before this conftest, so without it our marks come after it has read them and
# every group is silently ignored (pytest-dev/pytest#13677: the heavy tests then ran three
# at once and each worker booted its own real pair).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scheduling under `pytest -n N --dist loadgroup` (make test; docs/testing.md):
    - every heavy test joins its lane's group (heavy_lane), so each lane runs one test at a
      time on one worker; both lanes are moved to the front, so two workers start on them at
      once (the longer lane is the suite's critical path);
    - the light tests of modules marked vllm_scripts share one lane (VLLM_SCRIPTS_LANE), moved
      in front of the other light tests;
    - every other test stays with its module on one worker, so a module's fixtures (a twin, a
      mock server) are built once, not once per worker;
    - a test marked outside_suite is deselected unless DSV4_OUTSIDE_SUITE=1."""
    outside = [i for i in items if i.get_closest_marker("outside_suite") is not None]
    if outside and os.environ.get(OUTSIDE_SUITE_ENV) != "1":
        config.hook.pytest_deselected(items=outside)
        items[:] = [i for i in items if i.get_closest_marker("outside_suite") is None]
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = heavy_lane(item) or light_lane(item)
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lane_order)  # stable: file order kept within each


def light_lane(item: pytest.Item) -> str:
    """A light test's group: the vLLM scripts' lane, else its module."""
    if item.get_closest_marker("vllm_scripts") is not None:
        return VLLM_SCRIPTS_LANE
    return item.module.__name__


def lane_order(item: pytest.Item) -> int:
    """The heavy lanes first, then the vLLM scripts' lane: the longest groups start first."""
    if is_heavy(item):
        return 0
    return 1 if light_lane(item) == VLLM_SCRIPTS_LANE else 2


def grouped(nodeid: str) -> bool:
    """Whether xdist gave a test its group: ``--dist loadgroup`` schedules by the
    ``@group`` suffix it appends to the node id (one inside a parameter's ``[...]`` is not
    one)."""
    return nodeid.rfind("@") > nodeid.rfind("]")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """On the xdist controller under ``--dist loadgroup``: stop at once if a worker's tests
    came without their groups. Nothing else would say so: the suite still passes, only
    slower and flakier, with heavy tests competing for the cores (pytest 9.2 keeps node ids
    where xdist 3.8's rename cannot reach them: pytest-dev/pytest-xdist#1386, hence
    pytest<9.2 in pyproject.toml)."""
    config = getattr(node, "config", None)
    if config is None or config.getvalue("dist") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if not grouped(nodeid)]
    if lost:
        pytest.exit(
            f"--dist loadgroup lost the xdist groups of {len(lost)} tests (e.g. {lost[0]}): "
            "this pytest/pytest-xdist pair ignores them (pytest-dev/pytest-xdist#1386); "
            "install the versions pyproject.toml's dev extra pins (make venv)",
            returncode=3,
        )
