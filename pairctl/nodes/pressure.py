"""Memory pressure of a node: which band its MemAvailable and swap put it in, and what to do.

Pure decisions on /proc/meminfo figures (kB), shared by preflight's PF-MEMORY-FLOOR, ``status``
and ``watch``; the bands, their reasoning and their actions are ``pairctl.contracts``'
(``MEMORY_BANDS``). The sampler that reads the nodes is ``pairctl.status.memory``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pairctl.contracts import MEM_CRIT_FRACTION, MEM_WARN_FRACTION, MEMORY_BANDS, SWAP_WARN_KIB

OK, WARNING, CRITICAL, UNKNOWN = "ok", "warning", "critical", "unknown"
ACTION = {b.name: b.action for b in MEMORY_BANDS}
SEVERITY = {UNKNOWN: -1, OK: 0, WARNING: 1, CRITICAL: 2}
GIB_KIB = 1 << 20


def gib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / GIB_KIB:.1f} GiB"


def swap_used(meminfo: dict[str, int]) -> int | None:
    """Swap in use (kB), None when /proc/meminfo gave no swap counters."""
    total, free = meminfo.get("SwapTotal"), meminfo.get("SwapFree")
    if total is None or free is None:
        return None
    return max(0, total - free)


def band(total_kib: int | None, avail_kib: int | None, swap_kib: int | None = None) -> str:
    """The band of a node: critical / warning / ok, or unknown without MemTotal/MemAvailable."""
    if not total_kib or avail_kib is None:
        return UNKNOWN
    share = avail_kib / total_kib
    if share < MEM_CRIT_FRACTION:
        return CRITICAL
    if share < MEM_WARN_FRACTION or (swap_kib or 0) >= SWAP_WARN_KIB:
        return WARNING
    return OK


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory as ``status``/``watch`` saw it (kB), and its band.

    ``reachable`` False: the node could not be asked (for rank 1: ssh failed; ``error`` has
    ssh's words, e.g. "Connection timed out during banner exchange", a wedged host's sign).
    """

    rank: int
    addr: str
    reachable: bool
    error: str
    total_kib: int | None
    available_kib: int | None
    swap_total_kib: int | None
    swap_used_kib: int | None
    earlyoom: bool
    band: str  # ok | warning | critical | unknown
    action: str  # what to do in this band ("" when ok or unknown)

    @classmethod
    def of(cls, rank: int, addr: str, meminfo: dict[str, int], earlyoom: bool) -> NodeMemory:
        total, avail = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
        used = swap_used(meminfo)
        name = band(total, avail, used)
        return cls(
            rank,
            addr,
            True,
            "" if total else "/proc/meminfo gave no MemTotal",
            total,
            avail,
            meminfo.get("SwapTotal"),
            used,
            earlyoom,
            name,
            ACTION[name] if name in (WARNING, CRITICAL) else "",
        )

    @classmethod
    def unknown(cls, rank: int, addr: str, error: str, reachable: bool = False) -> NodeMemory:
        """Not read: the node did not answer (``reachable`` False) or gave no figures."""
        return cls(rank, addr, reachable, error, None, None, None, None, False, UNKNOWN, "")

    def line(self) -> str:
        """One line: ``rank 1 (addr): 7.9 GiB of 119.7 GiB available (6.6%), swap ..., band``."""
        head = f"rank {self.rank} ({self.addr})"
        if not self.reachable or self.band == UNKNOWN:
            return f"{head}: memory not read: {self.error}"
        share = f" ({100 * self.available_kib / self.total_kib:.1f}%)" if self.total_kib else ""
        swap = (
            "no swap"
            if not self.swap_total_kib
            else f"swap {gib(self.swap_used_kib)} used of {gib(self.swap_total_kib)}"
        )
        oom = ", earlyoom runs" if self.earlyoom else ""
        return (
            f"{head}: {gib(self.available_kib)} of {gib(self.total_kib)} available{share}, "
            f"{swap}{oom}: {self.band.upper()}"
        )
