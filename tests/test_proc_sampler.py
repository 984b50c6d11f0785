"""tests/support/proc_sampler.py: it sees a process no test reaps, charges it to the test whose
worker spawned it (or an ancestor's), and names its command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import proc_sampler

BURN = (
    "import sys, time\n"
    "while time.process_time() < 0.5: pass\n"
    "print('burnt', flush=True)\n"
    "time.sleep(30)\n"
)


def test_a_childs_cpu_command_and_test_are_recorded_and_reported() -> None:
    env = dict(os.environ, PYTEST_CURRENT_TEST="tests/test_x.py::test_y (call)")
    parent = subprocess.Popen(  # a shell that starts the burner: an ancestor with the test
        ["sh", "-c", f'env -u PYTEST_CURRENT_TEST {sys.executable} -c "$0"', BURN],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "burnt\n"
        seen: dict[str, dict] = {}
        proc_sampler.scan(seen)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the shell and the burner
        parent.wait(10)
    rows = list(seen.values())
    burner = [r for r in rows if r["cmd"].startswith(sys.executable + " -c import sys, time")]
    assert len(burner) == 1, [r["cmd"][:80] for r in rows if "python" in r["cmd"]][:20]
    (b,) = burner
    assert b["cpu"] >= 0.4 and b["test"] is None  # 0.5 s burnt, in 10 ms ticks; no test of its own
    by_pid = {r["pid"]: r for r in rows}
    assert proc_sampler.test_module(b, by_pid) == "tests/test_x.py"  # its parent shell's has it
    assert proc_sampler.kind(b) == "python -c import sys, time"
    text = proc_sampler.report(rows, top=len(rows))  # a loaded machine has busier processes
    assert "python -c import sys, time" in text and "tests/test_x.py" in text


def test_record_writes_its_file_when_stopped(tmp_path: Path) -> None:
    out = tmp_path / "procs.json"
    rec = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.proc_sampler",
            "record",
            str(out),
            "--interval",
            "0.1",
        ]
    )
    time.sleep(1.0)
    rec.send_signal(signal.SIGTERM)
    assert rec.wait(20) == 0
    rows = json.loads(out.read_text())
    assert any(r["pid"] == rec.pid for r in rows)  # it saw itself, at least
    # what ran before the recording counts from its start: pytest here spent none since
    (me,) = [r for r in rows if r["pid"] == os.getpid()]
    assert me["cpu"] < 0.5
    assert subprocess.run(
        [sys.executable, "-m", "tests.support.proc_sampler", "report", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.startswith(f"{len(rows)} processes")
