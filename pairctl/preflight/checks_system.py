"""Can each host's OS carry a rank? Unified memory, the kernel's CMA bug, OOM killers.

All three fail a real pair minutes into a boot, far from the cause: vLLM's start-up
memory check, NCCL's first memory registration, or an OOM killer under load.
"""

from __future__ import annotations

import math

from pairctl.contracts import MEM_CRIT_FRACTION, MEM_WARN_FRACTION
from pairctl.nodes import pressure
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need, View
from pairctl.preflight.checks_host import own_running
from pairctl.preflight.evidence import NodeEvidence

# vLLM's default (vllm/config/cache.py CacheConfig.gpu_memory_utilization).
VLLM_DEFAULT_UTIL = 0.92
# On rank 0 the API server and the engine core start, and take memory, before the worker
# measures (vllm/v1/worker/utils.py request_memory): a node just above the line fails.
HEAD_HEADROOM_GIB = 4.0
GIB = 1 << 30


def last_value(argv: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` (argparse: last one wins), ``--f v`` or ``--f=v``."""
    val = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith(flag + "="):
            val = a.split("=", 1)[1]
    return val


def _gib(kib: int) -> str:
    return f"{kib * 1024 / GIB:.1f} GiB"


def _memory(v: View) -> Check:
    argv = list(v.pair.vllm_argv[0])
    raw = last_value(argv, "--gpu-memory-utilization")
    return check_memory(raw, v.pair.pair_id, v.reached)


PF_MEMORY = CheckSpec(
    "PF-MEMORY",
    title="on a unified-memory GPU (GB10), each node's MemAvailable covers vLLM's start-up "
    "check: available >= gpu-memory-utilization x total; rank 0 also keeps "
    f"{HEAD_HEADROOM_GIB:g} GiB for its API server and engine core (WARN); no such GPU SKIP",
    remedy="free memory on that node (other containers, page cache: sync; echo 3 > "
    "/proc/sys/vm/drop_caches) or lower gpu-memory-utilization in the recipe",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=_memory,
)


def check_memory(raw: str | None, pair_id: str, evs: list[NodeEvidence]) -> Check:
    """``raw``: the effective --gpu-memory-utilization (None: vLLM's default 0.92)."""
    try:
        util = float(raw) if raw is not None else VLLM_DEFAULT_UTIL
    except ValueError:
        util = -1.0
    if not 0 < util <= 1:
        return PF_MEMORY.verdict(FAIL, f"gpu-memory-utilization {raw!r} is not in (0, 1]")
    fails, warns, ok, skipped = [], [], [], []
    for rank, ev in enumerate(evs):
        if not unified(ev.gpu):
            # vLLM reads psutil's available memory only on an integrated GPU
            # (vllm/utils/mem_utils.py); elsewhere it is the GPU's own free memory.
            skipped.append(f"rank {rank}: {ev.gpu or 'no NVIDIA GPU visible'}")
            continue
        total, avail = ev.meminfo.get("MemTotal"), ev.meminfo.get("MemAvailable")
        if total is None or avail is None:
            warns.append(f"rank {rank}: /proc/meminfo not read")
            continue
        need = math.ceil(total * util)  # request_memory: ceil(total x utilization)
        line = f"rank {rank}: MemAvailable {_gib(avail)} vs {util:g} x {_gib(total)} = {_gib(need)}"
        own = own_running(pair_id, ev)
        if avail < need and own:
            warns.append(f"{line}, but this pair's {', '.join(own)} holds memory: up replaces it")
        elif avail < need:
            fails.append(f"{line}: vLLM would refuse to start")
        elif rank == 0 and (avail - need) * 1024 < HEAD_HEADROOM_GIB * GIB:
            warns.append(f"{line}: under {HEAD_HEADROOM_GIB:g} GiB left for the API server")
        else:
            ok.append(line)
    if fails:
        return PF_MEMORY.verdict(FAIL, "; ".join(fails + warns))
    if warns:
        return PF_MEMORY.verdict(WARN, "; ".join(warns + ok))
    if not ok:
        return PF_MEMORY.verdict(SKIP, "not unified memory: " + "; ".join(skipped))
    return PF_MEMORY.verdict(PASS, "; ".join(ok + skipped))


def unified(gpu: str) -> bool:
    """GB10 (DGX Spark) shares the system's LPDDR5X with the CPU."""
    return "GB10" in gpu.upper()


def _floor(v: View) -> Check:
    argv = list(v.pair.vllm_argv[0])
    raw = last_value(argv, "--gpu-memory-utilization")
    return check_memory_floor(raw, v.pair.pair_id, v.reached)


PF_MEMORY_FLOOR = CheckSpec(
    "PF-MEMORY-FLOOR",
    title="no node is in the critical memory band already (MemAvailable under "
    f"{MEM_CRIT_FRACTION:.0%} of MemTotal, where a GB10 wedges or resets instead of "
    "OOM-killing: FAIL), and on unified memory (GB10) what stays available once vLLM holds "
    "gpu-memory-utilization x total is above that floor (FAIL) and above the warning band "
    f"({MEM_WARN_FRACTION:.0%}: WARN); this pair's own running containers WARN (up replaces "
    "them)",
    remedy="stop what else takes memory on that node (ps aux --sort=-rss, other containers, "
    "a benchmark) and run up again; the bands and their actions: launch/README.md, "
    '"Memory pressure"',
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=_floor,
)


def check_memory_floor(raw: str | None, pair_id: str, evs: list[NodeEvidence]) -> Check:
    """``raw``: the effective --gpu-memory-utilization (None: vLLM's 0.92; a bad value is
    PF-MEMORY's FAIL, and here only today's figures are judged)."""
    try:
        util: float | None = float(raw) if raw is not None else VLLM_DEFAULT_UTIL
    except ValueError:
        util = None
    if util is not None and not 0 < util <= 1:
        util = None
    fails, warns, ok = [], [], []
    for rank, ev in enumerate(evs):
        total, avail = ev.meminfo.get("MemTotal"), ev.meminfo.get("MemAvailable")
        if not total or avail is None:
            warns.append(f"rank {rank}: /proc/meminfo not read")
            continue
        swap = pressure.swap_used(ev.meminfo)
        now = pressure.band(total, avail, swap)
        line = f"rank {rank}: {_gib(avail)} of {_gib(total)} available ({avail / total:.1%})"
        own = own_running(pair_id, ev)
        if own and now != pressure.OK:
            warns.append(
                f"{line} ({now}), but this pair's {', '.join(own)} holds memory: up replaces it"
            )
            continue
        if now == pressure.CRITICAL:
            fails.append(f"{line}: under the {MEM_CRIT_FRACTION:.0%} floor already")
            continue
        if unified(ev.gpu) and util is not None and not own:
            left = avail - math.ceil(total * util)
            after = pressure.band(total, max(0, left))
            line += f", {_gib(max(0, left))} once vLLM holds {util:g} x {_gib(total)}"
            if after == pressure.CRITICAL:
                fails.append(f"{line}: under the {MEM_CRIT_FRACTION:.0%} floor")
                continue
            if after == pressure.WARNING:
                warns.append(f"{line}: in the warning band (under {MEM_WARN_FRACTION:.0%})")
                continue
        if now == pressure.WARNING:
            why = "swap in use" if avail / total >= MEM_WARN_FRACTION else "warning band"
            warns.append(f"{line}, swap {_gib(swap or 0)} used: {why}")
            continue
        ok.append(line)
    if fails:
        return PF_MEMORY_FLOOR.verdict(FAIL, "; ".join(fails + warns))
    if warns:
        return PF_MEMORY_FLOOR.verdict(WARN, "; ".join(warns + ok))
    return PF_MEMORY_FLOOR.verdict(PASS, "; ".join(ok))


PF_KERNEL_CMA = CheckSpec(
    "PF-KERNEL-CMA",
    title="no kernel CMA trap on either node: CmaTotal 0 with CmaFree > 0 (the KHO scratch "
    "pageblocks of kernels 7.0.0-1019-nvidia / 7.0.0-31) makes NCCL's memory registration "
    "fail (ibv_reg_mr_iova2 ENOMEM); such a kernel without the counters WARNs",
    remedy="add kho=off to the kernel command line (GRUB_CMDLINE_LINUX, update-grub, "
    "reboot) or boot the 6.17 kernel (MiaAI-Lab #259, eugr/spark-vllm-docker #389/#392)",
    needs=(Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_kernel_cma(v.reached),
)

# Kernels reported with the trap (MiaAI-Lab #259: 7.0.0-31 HWE; 7.0.0-1019-nvidia).
_KNOWN_BAD = ("7.0.0-1019", "7.0.0-31-")


def check_kernel_cma(evs: list[NodeEvidence]) -> Check:
    fails, warns, ok = [], [], []
    for rank, ev in enumerate(evs):
        cma_total, cma_free = ev.meminfo.get("CmaTotal"), ev.meminfo.get("CmaFree")
        kernel = ev.kernel or "unknown kernel"
        if cma_total == 0 and (cma_free or 0) > 0:
            fails.append(
                f"rank {rank} ({kernel}): CmaTotal 0 kB but CmaFree {cma_free} kB "
                "(KHO scratch): NCCL init will fail with ibv_reg_mr_iova2 ENOMEM"
            )
        elif cma_total is None and kernel.startswith(_KNOWN_BAD):
            warns.append(f"rank {rank} ({kernel}): no Cma counters in /proc/meminfo to rule out")
        elif cma_total is None:
            ok.append(f"rank {rank} {kernel} (no CMA counters)")
        else:
            ok.append(f"rank {rank} {kernel} (CmaTotal {cma_total} kB, CmaFree {cma_free} kB)")
    if fails:
        return PF_KERNEL_CMA.verdict(FAIL, "; ".join(fails))
    if warns:
        return PF_KERNEL_CMA.verdict(WARN, "; ".join(warns + ok))
    return PF_KERNEL_CMA.verdict(PASS, "; ".join(ok))


PF_EARLYOOM = CheckSpec(
    "PF-EARLYOOM",
    title="no earlyoom process on either node (WARN: it kills vLLM under deep-context load)",
    remedy="sudo systemctl disable --now earlyoom on that node (MiaAI-Lab README)",
    needs=(Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_earlyoom(v.reached),
)


def check_earlyoom(evs: list[NodeEvidence]) -> Check:
    running = [f"rank {r}" for r, ev in enumerate(evs) if ev.earlyoom]
    if running:
        return PF_EARLYOOM.verdict(WARN, f"earlyoom runs on {', '.join(running)}")
    return PF_EARLYOOM.verdict(PASS, "no earlyoom process")
