"""The peak memory of a rehearsal while it runs: does a real fleet fit a 24 GiB machine?

A background thread samples, every ``interval_s``: the proportional set size (Pss, from
/proc/PID/smaps_rollup) of every process in the test hosts' network namespaces, i.e. what
the rehearsal's own engines, routers and sshds hold, shared pages split between their
sharers rather than counted once per process as RSS would; and the machine's used memory
(MemTotal - MemAvailable), which also holds everyone else's (the box is shared). Both
peaks are reported; the first is the fleet's own figure.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sim.rehearsal.hosts import Host


def pss_kib(pid: int) -> int:
    """A process's Pss in KiB; 0 once it is gone (or not readable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def used_kib() -> int:
    """MemTotal - MemAvailable of the machine, in KiB."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            info[key] = int(rest.split()[0])
    return info.get("MemTotal", 0) - info.get("MemAvailable", 0)


@dataclass
class Peak:
    hosts_pss_kib: int = 0
    machine_used_kib: int = 0
    machine_used_before_kib: int = 0
    samples: int = 0

    def line(self) -> str:
        gib = 1024 * 1024
        return (
            f"peak memory: {self.hosts_pss_kib / gib:.1f} GiB held by the test hosts' "
            f"processes (Pss, {self.samples} samples); the machine's used memory peaked at "
            f"{self.machine_used_kib / gib:.1f} GiB (from {self.machine_used_before_kib / gib:.1f}"
            " GiB before, other jobs included)"
        )


class Sampler:
    """``with Sampler(hosts) as s: ...``; ``s.peak`` afterwards (and during)."""

    def __init__(self, hosts: list[Host], interval_s: float = 2.0) -> None:
        self.hosts, self.interval_s = hosts, interval_s
        self.peak = Peak(machine_used_before_kib=used_kib())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        pss = sum(pss_kib(pid) for h in self.hosts for pid in h.pids())
        p = self.peak
        p.hosts_pss_kib = max(p.hosts_pss_kib, pss)
        p.machine_used_kib = max(p.machine_used_kib, used_kib())
        p.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def timed(t0: float) -> str:
    s = int(time.monotonic() - t0)
    return f"{s // 60} min {s % 60:02d} s"
