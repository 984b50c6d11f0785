"""The one lock of the control plane: an exclusive ``flock`` on a file in the runtime dir.

A pair's ``up``/``down`` (pairctl.lifecycle.updown) and a fleet's (pairctl.fleet.ops) each
hold theirs for their whole run, so two operators, or an operator and the watchdog, never
race; the watchdog only asks whether it is held (``busy``). Whoever finds it held gets
``LockHeld`` at once (the commands' exit 3: nothing was started or removed).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockHeld(RuntimeError):
    """Another process holds the lock; the message names what runs and the lock file."""

    def __init__(self, what: str, path: str | Path) -> None:
        super().__init__(f"another {what} is running (lock {path}); nothing was started or removed")
        self.path = str(path)


def runtime_dir() -> str:
    """Where lock files live: $XDG_RUNTIME_DIR, else /tmp."""
    return os.environ.get("XDG_RUNTIME_DIR") or "/tmp"


def pair_lock_path(pair_id: str, spark1: str) -> str:
    # SPARK1 in the name: two test pairs on one machine may share a PAIR_ID.
    return f"{runtime_dir()}/dsv4-launch-{pair_id}-{spark1}.lock"


def fleet_lock_path(fleet_id: str) -> Path:
    return Path(runtime_dir()) / f"dsv4-fleet-{fleet_id}.lock"


@contextmanager
def held(path: str | Path, what: str) -> Iterator[None]:
    """Hold the lock at ``path`` for the block; ``LockHeld(what, path)`` at once when another
    process has it."""
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(what, path) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def busy(path: str | Path) -> bool:
    """True while another process holds the lock at ``path`` (no file: nobody does)."""
    p = Path(path)
    if not p.exists():
        return False
    try:
        with open(p, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return False
    return False
