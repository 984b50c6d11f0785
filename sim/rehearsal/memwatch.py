"""The machine's memory while a rehearsal group runs, sampled every second.

Why: the TP=4 rehearsal must fit a 2-core, 24 GiB machine (the one `make test` runs on), and what
decides that is the peak, which a reading before and after a boot never sees (vLLM's
processes import torch one after another, load, profile, then settle lower). A thread
reads the machine's MemAvailable (/proc/meminfo) and the resident memory of every process
in the test hosts' network namespaces (their sshd aside) once a second; ``peak`` says
how far MemAvailable fell below its level before the boot, and the largest resident and
proportional (PSS, /proc/PID/smaps_rollup) sums. The resident sum counts pages shared
between processes once per process (an upper bound); PSS splits them, so it is what the
hosts' processes hold, whatever else runs on the machine; the MemAvailable drop is what
the machine lost, whoever holds it (on a shared machine, other jobs too).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.rehearsal import hosts
from sim.rehearsal.leaks import meminfo, rss_kib


@dataclass
class MemPeak:
    """What the sampler saw: the levels before, the worst moment, and how many samples."""

    mem_total_kib: int = 0
    available_before_kib: int = 0
    available_min_kib: int = 0
    hosts_rss_max_kib: int = 0
    hosts_pss_max_kib: int = 0
    samples: int = 0
    series: list[tuple[float, int, int, int]] = field(default_factory=list)  # s, avail, rss, pss

    @property
    def drop_kib(self) -> int:
        """How far MemAvailable fell below its level before the boot, at worst."""
        return max(0, self.available_before_kib - self.available_min_kib)

    @property
    def used_at_peak_kib(self) -> int:
        """The whole machine's use at the worst moment (MemTotal - MemAvailable)."""
        return self.mem_total_kib - self.available_min_kib

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["drop_kib"] = self.drop_kib
        doc["used_at_peak_kib"] = self.used_at_peak_kib
        return doc

    def line(self) -> str:
        gib = 1 << 20
        return (
            f"peak memory: MemAvailable fell {self.drop_kib / gib:.2f} GiB below its level "
            f"before the boot (machine in use at worst {self.used_at_peak_kib / gib:.2f} of "
            f"{self.mem_total_kib / gib:.2f} GiB); the hosts' processes held at most "
            f"{self.hosts_pss_max_kib / gib:.2f} GiB (PSS; {self.hosts_rss_max_kib / gib:.2f} "
            f"GiB resident) ({self.samples} samples)"
        )


def pss_kib(pid: int) -> int:
    """The process's proportional set size (its share of every page it maps), in KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass  # gone meanwhile
    return 0


class MemWatch:
    """Samples the machine and ``test_hosts`` every ``interval_s`` until ``stop``."""

    def __init__(self, test_hosts: list[hosts.Host], interval_s: float = 1.0) -> None:
        self.hosts = test_hosts
        self.interval_s = interval_s
        mem = meminfo()
        self.peak = MemPeak(
            mem_total_kib=mem.get("MemTotal", 0),
            available_before_kib=mem.get("MemAvailable", 0),
            available_min_kib=mem.get("MemAvailable", 0),
        )
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memwatch", daemon=True)

    def start(self) -> MemWatch:
        self._thread.start()
        return self

    def sample(self) -> None:
        avail = meminfo().get("MemAvailable", 0)
        pids = [p for h in self.hosts for p in h.pids() if p != h.sshd_pid()]
        rss = sum(rss_kib(p) for p in pids)
        pss = sum(pss_kib(p) for p in pids)
        p = self.peak
        p.available_min_kib = min(p.available_min_kib, avail)
        p.hosts_rss_max_kib = max(p.hosts_rss_max_kib, rss)
        p.hosts_pss_max_kib = max(p.hosts_pss_max_kib, pss)
        p.samples += 1
        p.series.append((round(time.monotonic() - self._t0, 1), avail, rss, pss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> MemPeak:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.peak

    def __enter__(self) -> MemWatch:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
