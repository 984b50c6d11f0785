"""The suite's scheduling (tests/conftest.py, docs/testing.md) really takes under xdist:
each heavy lane's tests share one worker and a module fixture is built once. Run on a tiny suite of
its own with the real pytest-xdist, since a lost group fails nothing by itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest
from tests.conftest import (  # noqa: F401  the hooks under test
    pytest_collection_modifyitems,
    pytest_xdist_node_collection_finished,
)

def pytest_configure(config):
    for name in ("needs_engine", "needs_netns", "engine_no_boot", "vllm_scripts"):
        config.addinivalue_line("markers", name)
"""

HEAVY = """
import os
import pytest

pytestmark = [pytest.mark.needs_engine]

@pytest.fixture(scope="module")
def booted():
    with open(os.environ["BOOTS"], "a") as f:
        f.write(f"{__name__}={os.getpid()}\\n")

@pytest.mark.parametrize("i", range(4))
def test_heavy(booted, i):
    pass
"""

LIGHT = """
import pytest

@pytest.mark.parametrize("i", range(3))
def test_light(i):
    pass
"""


SCRIPTS = """
import os
import pytest

pytestmark = pytest.mark.vllm_scripts

@pytest.mark.parametrize("i", range(3))
def test_script(i):
    with open(os.environ["BOOTS"], "a") as f:
        f.write(f"{__name__}={os.getpid()}\\n")
"""


def run_suite(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_heavy_a.py").write_text(HEAVY)
    (tmp_path / "test_heavy_b.py").write_text(HEAVY.replace("test_heavy", "test_other"))
    netns = HEAVY.replace("needs_engine", "needs_netns").replace("test_heavy", "test_netns")
    (tmp_path / "test_netns_a.py").write_text(netns)
    for n in range(3):
        (tmp_path / f"test_light_{n}.py").write_text(LIGHT)
    for n in range(2):
        (tmp_path / f"test_scripts_{n}.py").write_text(SCRIPTS)
    boots = tmp_path / "boots"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v"]
        + ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "BOOTS": str(boots), "PATH": "/usr/bin:/bin"},
    )
    return res, boots.read_text().split() if boots.exists() else []


def lane_workers(out: str, lane: str) -> tuple[int, set[str]]:
    """How many tests passed in ``lane`` and on which workers."""
    hits = re.findall(rf"\[(gw\d+)\] .*PASSED \S+@{lane}\b", out)
    return len(hits), set(hits)


def test_each_heavy_lane_runs_on_one_worker_and_a_module_fixture_is_built_once(
    tmp_path: Path,
):
    res, boots = run_suite(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ran, workers = lane_workers(res.stdout, "heavy-engine")
    assert ran == 8 and len(workers) == 1, res.stdout[-3000:]
    ran_n, workers_n = lane_workers(res.stdout, "heavy-netns")
    assert ran_n == 4 and len(workers_n) == 1, res.stdout[-3000:]
    # one boot per heavy module (three modules); the engine lane's two in one process
    heavy = [b for b in boots if not b.startswith("test_scripts")]
    pids = dict(b.split("=") for b in heavy)
    assert len(heavy) == 3 and len(pids) == 3, boots
    assert pids["test_heavy_a"] == pids["test_heavy_b"], boots
    # the vLLM scripts' modules share one lane, so one worker's warm servers serve them all
    ran_s, workers_s = lane_workers(res.stdout, "vllm-scripts")
    assert ran_s == 6 and len(workers_s) == 1, res.stdout[-3000:]
    assert len({b.split("=")[1] for b in boots if b.startswith("test_scripts")}) == 1, boots
    # light tests keep their module's group
    assert len(re.findall(r"PASSED \S*test_light_\d\.py::\S+@test_light_\d", res.stdout)) == 9


def test_an_outside_suite_module_runs_only_when_asked(tmp_path: Path) -> None:
    """tests/test_real_group.py's marker: deselected in the default suite (it would pass by
    not running, so the count is what is checked), run with DSV4_OUTSIDE_SUITE=1."""
    import os

    (tmp_path / "conftest.py").write_text(
        CONFTEST.replace('"engine_no_boot")', '"engine_no_boot", "outside_suite")')
    )
    (tmp_path / "test_long.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.outside_suite]\n\ndef test_long():\n    pass\n"
    )
    (tmp_path / "test_short.py").write_text("def test_short():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(tmp_path), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "DSV4_OUTSIDE_SUITE"}
    env["PYTHONPATH"] = str(REPO)
    default = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert "1 passed, 1 deselected" in default.stdout, default.stdout + default.stderr
    env["DSV4_OUTSIDE_SUITE"] = "1"
    asked = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert "2 passed" in asked.stdout and "deselected" not in asked.stdout, asked.stdout
