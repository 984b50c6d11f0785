"""The simulator's command line refuses values it cannot serve with a usage error (exit 2),
before it boots: no traceback, no 150 s of simulated weight loading first."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--port", "99999"], "argument --port: must be a port number 1-65535, got '99999'"),
        (["--port", "0"], "argument --port"),
        (["--port", "http"], "argument --port"),
        (["--master-port", "70000"], "argument --master-port"),
    ],
)
@pytest.mark.parametrize("cmd", ["serve", "truth"])
def test_bad_ports_are_usage_errors(cmd: str, args: list[str], needle: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "sim.twin", cmd, "m", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert "Loading weights" not in p.stdout + p.stderr
