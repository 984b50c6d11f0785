"""Cut a server's log into events (boot, shutdown) and keep each event's line classes."""

from __future__ import annotations

from pathlib import Path

from sim.diffcheck import logclass

READY = "Application startup complete."
SHUTDOWN = ("[shutdown]", "Shutting down", "KeyboardInterrupt: terminated")


def split(text: str) -> dict[str, list[str]]:
    """``boot``: up to uvicorn's startup line; ``shutdown``: from the first shutdown line.
    Request-time lines in between (access log, stats) are no event of ours."""
    lines = text.splitlines()
    boot_end = next((i for i, ln in enumerate(lines) if READY in ln), len(lines) - 1)
    down = next(
        (i for i, ln in enumerate(lines) if i > boot_end and any(m in ln for m in SHUTDOWN)),
        None,
    )
    out = {"boot": logclass.classes(lines[: boot_end + 1])}
    if down is not None:
        out["shutdown"] = logclass.classes(lines[down:])
    return out


def read(server_logs: list[Path], events: list[str]) -> dict[str, list[str]]:
    """Classes per event: server logs split into boot/shutdown; ``KIND=FILE`` whole."""
    out: dict[str, list[str]] = {}
    for path in server_logs:
        for kind, classes in split(path.read_text(errors="replace")).items():
            out.setdefault(kind, [])
            out[kind] += [c for c in classes if c not in out[kind]]
    for item in events:
        kind, _, path = item.partition("=")
        out[kind] = logclass.classes(Path(path).read_text(errors="replace").splitlines())
    return out
