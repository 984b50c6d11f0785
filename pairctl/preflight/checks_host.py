"""Is each node ready to host its rank? Free ports, the socket interfaces, the JIT caches."""

from __future__ import annotations

from collections.abc import Mapping

from pairctl.pair.config import CACHE_VARS
from pairctl.pair.plan import LABEL_PAIR
from pairctl.preflight.check import FAIL, PASS, WARN, Check, CheckSpec, Need
from pairctl.preflight.evidence import NodeEvidence

PF_PORT_FREE = CheckSpec(
    "PF-PORT-FREE",
    title="PORT is free on SPARK1, or held while this pair's own container runs "
    "(WARN: up replaces it)",
    remedy="stop the process holding the port (ss -ltnp 'sport = :PORT') or set PORT",
    needs=(Need.CONFIG, Need.RANK0),
    decide=lambda v: check_port(PF_PORT_FREE, v.pair.port, v.pair.pair_id, v.rank0),
)

PF_MASTER_PORT_FREE = CheckSpec(
    "PF-MASTER-PORT-FREE",
    title="MASTER_PORT is free on SPARK1, or held while this pair's own container runs "
    "(WARN: up replaces it)",
    remedy="stop the process holding it (ss -ltnp 'sport = :MASTER_PORT') or set MASTER_PORT",
    needs=(Need.CONFIG, Need.RANK0),
    decide=lambda v: check_port(PF_MASTER_PORT_FREE, v.pair.master_port, v.pair.pair_id, v.rank0),
)


def own_running(pair_id: str, ev: NodeEvidence) -> list[str]:
    return [c.name for c in ev.containers if c.labels.get(LABEL_PAIR) == pair_id and c.running]


def check_port(spec: CheckSpec, port: int, pair_id: str, n0: NodeEvidence) -> Check:
    """One port on SPARK1; ``spec`` says which of the two port checks this is."""
    if port not in set(n0.listen_ports):
        return spec.verdict(PASS, f"port {port} free on SPARK1")
    own = own_running(pair_id, n0)
    if own:
        return spec.verdict(
            WARN,
            f"port {port} held, and this pair's {', '.join(own)} runs on SPARK1: up replaces it",
        )
    return spec.verdict(
        FAIL, f"port {port} on SPARK1 is held by a process that is not this pair's container"
    )


PF_NCCL_IFACE = CheckSpec(
    "PF-NCCL-IFACE",
    title="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME exist on each node (NCCL's prefix "
    "rules: = exact, a ^ exclusion list is not checked)",
    remedy="set them to the RoCE link's netdev (ip -br link) on both nodes",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_ifaces(
        v.pair.nccl_socket_ifname, v.pair.gloo_socket_ifname, v.rank0, v.rank1
    ),
)


def iface_present(spec: str, netdevs: list[str]) -> list[str]:
    """Interfaces of an NCCL-style list missing from ``netdevs`` ('^' excludes; '=' exact)."""
    if spec.startswith("^"):
        return []
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]
    missing = []
    for n in names:
        ok = n in netdevs if exact else any(d.startswith(n) for d in netdevs)
        if not ok:
            missing.append(n)
    return missing


def check_ifaces(nccl: str, gloo: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    """NCCL_SOCKET_IFNAME (``nccl``) and GLOO_SOCKET_IFNAME (``gloo``) on both nodes."""
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        for var, spec in (("NCCL_SOCKET_IFNAME", nccl), ("GLOO_SOCKET_IFNAME", gloo)):
            miss = iface_present(spec, ev.netdevs)
            if miss:
                probs.append(f"rank {rank}: {var} {','.join(miss)} not found")
    if probs:
        return PF_NCCL_IFACE.verdict(FAIL, "; ".join(probs))
    return PF_NCCL_IFACE.verdict(PASS, f"{nccl}/{gloo} present on both")


PF_TILELANG_CACHE = CheckSpec(
    "PF-TILELANG-CACHE",
    title="TILELANG_CACHE_DIR exists (the probe creates it) and is writable on both nodes",
    remedy="mkdir -p TILELANG_CACHE_DIR and fix its owner on that node",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_tilelang(v.pair.tilelang_cache_dir, v.rank0, v.rank1),
)


def check_tilelang(path: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    bad = [f"rank {r}" for r, ev in ((0, n0), (1, n1)) if not ev.tilelang_ok]
    if bad:
        return PF_TILELANG_CACHE.verdict(FAIL, f"{path} not writable on {', '.join(bad)}")
    return PF_TILELANG_CACHE.verdict(PASS, f"{path} ready on both")


PF_JIT_CACHES = CheckSpec(
    "PF-JIT-CACHES",
    title="the other JIT caches (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, FLASHINFER_WORKSPACE_BASE, "
    "DG_JIT_CACHE_DIR) exist (the probe creates them) and are writable on both nodes",
    remedy="mkdir -p the directory named and fix its owner on that node, or point the "
    "variable in the env file at a writable directory",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_jit_caches(v.pair.caches, v.rank0, v.rank1),
)


def check_jit_caches(caches: Mapping[str, str], n0: NodeEvidence, n1: NodeEvidence) -> Check:
    """``caches``: each of CACHE_VARS and its host dir."""
    bad = []
    for rank, ev in ((0, n0), (1, n1)):
        for var in CACHE_VARS[1:]:  # the TileLang cache is PF-TILELANG-CACHE's
            if not ev.cache_dirs.get(var, False):
                bad.append(f"rank {rank}: {var}={caches[var]} not writable")
    if bad:
        return PF_JIT_CACHES.verdict(FAIL, "; ".join(bad))
    return PF_JIT_CACHES.verdict(PASS, f"{len(CACHE_VARS) - 1} cache dirs ready on both")
