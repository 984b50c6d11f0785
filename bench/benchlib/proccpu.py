"""CPU seconds of a process tree, read from /proc (Linux), for benches that boot their servers.

Why: one node of a vLLM pair is a tree of processes (API server, engine core, workers), and
what a change costs or saves in CPU is the sum over that tree; which process pays it is the
breakdown. Each process's utime + stime (``/proc/PID/stat`` fields 14 and 15, in clock
ticks, all its threads included) is sampled before and after a phase; a process that starts
during the phase counts from zero, one that ends during it is lost (the benches sample
between requests, when no process comes or goes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcCpu:
    """One process at one moment: its name (comm, or vLLM's title) and CPU seconds so far."""

    pid: int
    name: str
    cpu_s: float


def _title(pid: int, comm: str, proc: Path) -> str:
    """vLLM's process title (``VLLM::Worker_TP0``; setproctitle writes it over argv, and the
    15-character comm cuts it), else the comm."""
    if not comm.startswith("VLLM::"):
        return comm
    try:
        argv0 = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return comm
    title = argv0.decode(errors="replace").strip()
    return title if title.startswith(comm) else comm


def _stat(pid: int, proc: Path = PROC) -> tuple[str, int, float] | None:
    """(name, ppid, utime + stime seconds) of ``pid``, or None if it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces or ')': split at the last ')'.
    head, _, rest = text.rpartition(")")
    name = _title(pid, head.partition("(")[2], proc)
    fields = rest.split()
    # rest starts at field 3 (state): ppid is field 4, utime 14, stime 15 (1-based).
    try:
        return name, int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S
    except (IndexError, ValueError):
        return None


def tree(root: int, proc: Path = PROC) -> dict[int, ProcCpu]:
    """``root`` and all its live descendants, by pid."""
    stats: dict[int, tuple[str, int, float]] = {}
    for d in proc.iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name), proc)
            if st is not None:
                stats[int(d.name)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, ProcCpu] = {}
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        name, _, cpu = stats[pid]
        out[pid] = ProcCpu(pid, name, cpu)
        todo += children.get(pid, [])
    return out


def delta(before: dict[int, ProcCpu], after: dict[int, ProcCpu]) -> dict[int, ProcCpu]:
    """CPU seconds each process of ``after`` spent since ``before`` (new ones from zero)."""
    return {
        pid: ProcCpu(pid, p.name, round(p.cpu_s - (before[pid].cpu_s if pid in before else 0), 3))
        for pid, p in after.items()
    }


def total_s(procs: dict[int, ProcCpu]) -> float:
    return round(sum(p.cpu_s for p in procs.values()), 3)


def by_name(procs: dict[int, ProcCpu]) -> dict[str, float]:
    """CPU seconds per process name (``VLLM::EngineCore``, ``VLLM::Worker_TP0``, ...)."""
    out: dict[str, float] = {}
    for p in procs.values():
        out[p.name] = round(out.get(p.name, 0.0) + p.cpu_s, 3)
    return dict(sorted(out.items()))
