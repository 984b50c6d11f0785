"""The suite's CPU profiler (tests/support/suite_cpu.py) on a tiny suite of its own: a test whose
child burns CPU is charged that CPU, a test that only sleeps is charged its wall time and next to
no CPU, and the report ranks modules by CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import suite_cpu

REPO = Path(__file__).resolve().parents[1]

BURN = """
import subprocess, sys

def test_burn():
    loop = "import time\\nwhile time.process_time() < 0.6: pass"
    subprocess.run([sys.executable, "-c", loop], check=True)
"""

SLEEP = """
import time

def test_sleep():
    time.sleep(0.6)
"""


def test_cpu_is_charged_to_the_test_whose_child_spent_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "test_a_sleep.py").write_text(SLEEP)
    (tmp_path / "test_b_burn.py").write_text(BURN)
    out = tmp_path / "prof"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.suite_cpu"]
        + ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", suite_cpu.OUT_ENV: str(out)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["id"].split("::")[-1]: r for r in suite_cpu.read_rows(out)}
    assert set(rows) == {"test_burn", "test_sleep"}
    assert rows["test_burn"]["children"] >= 0.55
    assert rows["test_sleep"]["wall"] >= 0.6
    assert rows["test_sleep"]["self"] + rows["test_sleep"]["children"] < 0.3

    assert suite_cpu.main([str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [m["module"] for m in report["modules"]] == ["test_b_burn.py", "test_a_sleep.py"]
    assert report["tests"] == 2 and report["cpu_s"] >= 0.55
    assert "test_b_burn.py" in capsys.readouterr().out.splitlines()[2]


def test_an_empty_folder_says_how_to_record(tmp_path: Path, capsys) -> None:
    assert suite_cpu.main([str(tmp_path)]) == 2
    assert suite_cpu.OUT_ENV in capsys.readouterr().err
