"""One lock (pairctl/lock.py) and one log helper (pairctl/log.py), used by every command:
the same lock files and messages as before, the same line formats."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pairctl import lock
from pairctl.log import log, logger

REPO = Path(__file__).resolve().parents[1]


def test_pair_and_fleet_share_one_lock_and_keep_their_messages(tmp_path, monkeypatch) -> None:
    from pairctl.fleet import ops as fleet_ops
    from pairctl.lifecycle import updown

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert updown.LockHeld is lock.LockHeld
    assert lock.pair_lock_path("pa", "10.0.0.1") == f"{tmp_path}/dsv4-launch-pa-10.0.0.1.lock"
    path = lock.fleet_lock_path("f")
    assert path == tmp_path / "dsv4-fleet-f.lock"
    with fleet_ops.fleet_lock("f"):
        assert lock.busy(path)
        with pytest.raises(lock.LockHeld) as exc, lock.held(path, "fleet up/down"):
            pass
    assert str(exc.value) == (
        f"another fleet up/down is running (lock {path}); nothing was started or removed"
    )
    assert not lock.busy(path)
    assert not lock.busy(tmp_path / "absent.lock")


def test_log_lines_keep_their_formats(capsys) -> None:
    from pairctl.engine import imageship
    from pairctl.lifecycle import updown
    from pairctl.nodes import modelfetch

    log("plain")
    imageship.log("shipped")
    modelfetch.log("fetched")
    updown.log("up")
    assert capsys.readouterr() == ("", "plain\nimage: shipped\nmodel: fetched\ndspark_launch: up\n")
    log("out", prefix="w: ", stream=sys.stdout)
    assert capsys.readouterr().out == "w: out\n"
    logger("image: ")("again")
    assert capsys.readouterr().err == "image: again\n"


def test_watch_lines_are_stamped_on_stdout(capsys) -> None:
    from pairctl.status import watch

    watch.printer("pa")("probe ok")
    out = capsys.readouterr().out
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ watch pa: probe ok\n", out), out


def _shipped_sources() -> list[str]:
    """Every Python file of the project's packages, as git tracks them."""
    return subprocess.run(
        ["git", "ls-files", "pairctl/*.py", "bench/*.py", "sim/*.py", "perfmodel/*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_no_module_defines_its_own_log_or_lock() -> None:
    for rel in _shipped_sources():
        if rel in ("pairctl/log.py", "pairctl/lock.py"):
            continue
        code = (REPO / rel).read_text()
        assert not re.search(r"^def _?log\(", code, re.M), f"{rel}: use pairctl.log"
        assert "class LockHeld" not in code, f"{rel}: use pairctl.lock"


def test_only_the_metrics_module_asks_a_server_for_its_metrics_page() -> None:
    """One place fetches /metrics (pairctl/status/metrics.py `fetch`): a GET of the page
    anywhere else in the shipped code would be a second fetcher with its own session,
    timeout and error wording. The simulator serves the page; it does not fetch it."""
    fetchers = [
        rel
        for rel in _shipped_sources()
        if rel != "pairctl/status/metrics.py"
        and re.search(r"\.get\([^)\n]*/metrics", (REPO / rel).read_text())
    ]
    assert fetchers == [], fetchers
    code = (REPO / "pairctl/status/metrics.py").read_text()
    assert re.search(r"\.get\([^)\n]*/metrics", code)
