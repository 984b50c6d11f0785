"""The watchdog's eye on the nodes: memory pressure events, and whether rank 1 answers ssh.

Each probe cycle ``NodeWatch`` reads both nodes' memory (``pairctl.status.memory``, the same
reader as ``status`` and preflight) and logs one line when a node changes band (ok, warning,
critical, unknown), with the band's action; the first reading is logged once. It never
restarts anything: a restart allocates the same memory again. It returns why rank 1 cannot
be reached over ssh, so the watchdog waits for ssh instead of restarting into a wedged host.
"""

from __future__ import annotations

from collections.abc import Callable

from pairctl.nodes.pressure import OK, NodeMemory
from pairctl.status.memory import ssh_lost


class NodeWatch:
    """Callable once per cycle: logs band changes, returns the ssh failure (None: reached)."""

    def __init__(self, sample: Callable[[], list[NodeMemory]], log: Callable[[str], None]) -> None:
        self.sample, self.log = sample, log
        self.bands: dict[int, str] = {}

    def __call__(self) -> str | None:
        readings = self.sample()
        first = not self.bands
        if first:
            self.log("memory: " + "; ".join(m.line() for m in readings))
        for m in readings:
            before = self.bands.get(m.rank)
            self.bands[m.rank] = m.band
            if first or before == m.band:
                if first and m.action:
                    self.log(f"memory {m.band.upper()} on rank {m.rank}: {m.action}")
                continue
            if m.action:
                self.log(f"memory {m.band.upper()}: {m.line()}; action: {m.action}")
            elif m.band == OK:
                self.log(f"memory back to ok: {m.line()}")
            else:
                self.log(f"memory: {m.line()}")
        return ssh_lost(readings)
