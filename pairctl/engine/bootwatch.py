"""A boot followed by its phases, not one wall clock: is it advancing, or has a phase stalled?

A cold first boot of this model is ~10 min (weights, torch.compile and TileLang JIT, CUDA
graph capture) and a warm one much less, so one fixed timeout either kills a first boot
that was about to finish or sits for many minutes on a boot that stalled in its second
phase. ``PhaseTracker`` keeps, per rank, the furthest phase its log has shown
(pairctl.engine.bootlog: needles vLLM 0.33 really prints) and when it got there; the boot goes
on while each rank's current phase is within its own limit (pairctl.contracts.BOOT_PHASES,
first-boot or warm-boot) and is a stall once one is not, naming the rank and the phase.

A first boot is told by the JIT caches: ``first_boot_reasons`` lists the nodes where
vLLM's torch.compile cache (VLLM_CACHE_ROOT/torch_compile_cache, vllm/compilation/
backends.py) or the TileLang cache is still empty.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pairctl.contracts import phase_limit
from pairctl.engine.bootlog import PHASES
from pairctl.nodes.ssh import Node
from pairctl.pair.resolved import ResolvedPair

# What must be non-empty on both nodes for a boot to count as warm (cache var, subdir).
FIRST_BOOT_DIRS: tuple[tuple[str, str], ...] = (
    ("VLLM_CACHE_ROOT", "torch_compile_cache"),
    ("TILELANG_CACHE_DIR", ""),
)


@dataclass(frozen=True)
class Stall:
    """A rank that has sat in one phase past that phase's limit."""

    rank: int
    phase: str
    for_s: float
    limit_s: int
    first_boot: bool

    def message(self) -> str:
        kind = "first-boot" if self.first_boot else "warm-boot"
        return (
            f"rank {self.rank} stalled in phase '{self.phase}': no further phase for "
            f"{self.for_s:.0f} s, past its {kind} limit of {self.limit_s} s "
            "(pairctl/contracts/__init__.py BOOT_PHASES)"
        )


@dataclass
class PhaseTracker:
    """Per rank: the furthest phase seen and when it was first seen (monotonic seconds)."""

    first_boot: bool
    phase: dict[int, str] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)
    # per rank, each phase it has left and the seconds it spent there, in order
    done: dict[int, list[tuple[str, float]]] = field(default_factory=dict)

    def observe(self, rank: int, phase: str, now: float) -> str:
        """Record a rank's phase as its log shows it now; returns the phase kept (a phase
        earlier in ``PHASES`` than the one held, e.g. a tail whose needle scrolled out, or
        one not in ``PHASES``, is no step back)."""
        held = self.phase.get(rank)
        if held is None:
            self.phase[rank], self.since[rank] = phase, now
        elif phase in PHASES and PHASES.index(phase) > PHASES.index(held):
            self.done.setdefault(rank, []).append((held, now - self.since[rank]))
            self.phase[rank], self.since[rank] = phase, now
        return self.phase[rank]

    def slowest(self, now: float) -> str:
        """Where a boot's time went, for a backstop that ran out with no phase stalled: per
        rank, the phase it is in (and for how long) and its longest phase so far."""
        parts = []
        for rank in sorted(self.phase):
            held = now - self.since[rank]
            spent = [*self.done.get(rank, []), (self.phase[rank], held)]
            name, longest = max(spent, key=lambda p: p[1])
            parts.append(
                f"rank {rank} in '{self.phase[rank]}' for {held:.0f} s, "
                f"slowest phase '{name}' {longest:.0f} s"
            )
        return "; ".join(parts) or "no rank's log showed a phase"

    def stalled(self, now: float) -> Stall | None:
        """The first rank (by rank) whose phase has outlived its limit, or None."""
        for rank in sorted(self.phase):
            phase = self.phase[rank]
            limit = phase_limit(phase, self.first_boot)
            held = now - self.since[rank]
            if held > limit:
                return Stall(rank, phase, held, limit, self.first_boot)
        return None


_CACHE_SCRIPT = r"""
for d in "$@"; do
  [ -n "$(ls -A "$d" 2>/dev/null | head -n 1)" ] || echo "empty $d"
done
"""


def first_boot_reasons(pair: ResolvedPair) -> list[str]:
    """Why this boot counts as a first one ([] = warm): each node's empty JIT cache dirs.

    A node that does not answer counts as cold (the longer limits are the safe side)."""
    dirs = []
    for var, sub in FIRST_BOOT_DIRS:
        base = pair.caches[var].rstrip("/")
        dirs.append(f"{base}/{sub}" if sub else base)
    reasons = []
    for node in pair.nodes:
        reasons += _empty_on(node, dirs)
    return reasons


def _empty_on(node: Node, dirs: list[str]) -> list[str]:
    res = node.run_script(f"set -- {shlex.join(dirs)}\n" + _CACHE_SCRIPT, timeout=30)
    if res.rc != 0:
        return [f"rank {node.rank}: cache dirs not readable (rc={res.rc})"]
    return [
        f"rank {node.rank}: {line[6:]} empty"
        for line in res.out.splitlines()
        if line.startswith("empty ")
    ]
