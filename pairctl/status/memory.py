"""Both nodes' memory pressure for ``status`` and ``watch``, read the way preflight reads it.

The script is preflight's own meminfo and earlyoom sections (``pairctl.preflight.probe_host``),
run on rank 0 locally and on rank 1 over the pair's ssh (``pairctl.nodes.ssh``: BatchMode, strict
host-key checking), and parsed by the same parsers; so ``status``, ``watch`` and ``up``'s
preflight judge the same figures. Bands and actions: ``pairctl.nodes.pressure``.

A rank-1 read that fails in ssh itself (exit 255, or no answer in time) is how a wedged host
looks from rank 0: ``ssh_lost`` tells ``watch`` to wait for ssh before it cleans up and
relaunches (README troubleshooting: "Host wedged, ssh banner timeout").
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pairctl.nodes.pressure import CRITICAL, NodeMemory
from pairctl.nodes.ssh import Node
from pairctl.preflight.probe import split_sections
from pairctl.preflight.probe_host import EARLYOOM_SECTION, MEMINFO_SECTION, parse_meminfo

SCRIPT = (
    "sec() { printf '\\n==== %s ====\\n' \"$1\"; }\n"
    + MEMINFO_SECTION
    + EARLYOOM_SECTION
    + "sec end\n"
)
# ssh's exit for its own failures; Node.run's for no answer in time and for no ssh binary
NOT_REACHED = (255, 124, 127)
READ_TIMEOUT_S = 30


def parse(rank: int, addr: str, text: str) -> NodeMemory:
    """The script's output into a reading; no end marker = the script did not finish."""
    sec = split_sections(text)
    if "end" not in sec:
        return NodeMemory.unknown(rank, addr, "the memory probe did not finish", reachable=True)
    return NodeMemory.of(
        rank, addr, parse_meminfo(sec.get("meminfo", [])), bool(sec.get("earlyoom"))
    )


def read(node: Node, timeout: float = READ_TIMEOUT_S) -> NodeMemory:
    """One node's reading (a headless rank's over ssh); unreachable with ssh's last words
    on failure."""
    res = node.run_script(SCRIPT, timeout=timeout)
    if res.rc in NOT_REACHED:
        why = (res.err.strip().splitlines() or [f"exit {res.rc}"])[-1][:300]
        return NodeMemory.unknown(node.rank, node.addr, why)
    return parse(node.rank, node.addr, res.out)


def sample(node_list: Sequence[Node]) -> list[NodeMemory]:
    """Every node at once (each headless rank's ssh alongside rank 0's local read), in
    rank order."""
    with ThreadPoolExecutor(max_workers=max(1, len(node_list))) as pool:
        return list(pool.map(read, node_list))


def ssh_lost(readings: list[NodeMemory]) -> str | None:
    """Why a remote node cannot be reached over ssh (a wedge or a reboot), else None."""
    lost = [m for m in readings if m.rank != 0 and not m.reachable]
    if not lost:
        return None
    return "; ".join(f"ssh to rank {m.rank} ({m.addr}) failed: {m.error}" for m in lost)


def reasons(readings: list[NodeMemory]) -> list[str]:
    """Why memory makes a pair degraded: a node in the critical band, with its action."""
    return [f"{m.line()}: {m.action}" for m in readings if m.band == CRITICAL]
