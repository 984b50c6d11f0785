"""RoCE between the two Sparks: one port per card, and a GID index NCCL can use.

Both checks decide on whichever nodes answered (rank 0 alone when ssh to rank 1 failed):
a wrong HCA list or GID index on rank 0 is worth reporting even then.
"""

from __future__ import annotations

import re

from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.roce import Gid

PF_HCA_2RAIL = CheckSpec(
    "PF-HCA-2RAIL",
    title="NCCL_IB_HCA names the RoCE devices of one physical port only (its two PCIe "
    "halves, e.g. rocep1s0f1 and roceP2p1s0f1, eugr/spark-vllm-docker docs/NETWORKING.md; "
    "two devices on one PCI function group = both ports = FAIL) and they exist; an empty "
    "list WARNs",
    remedy="list the RoCE devices of the cabled port only: the ones ibdev2netdev shows Up "
    "(both PCIe halves); devices of both ports (4 entries) fail with ibv_modify_qp ... 110",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_hca(v.pair.nccl_ib_hca, v.reached),
)


def active_hcas(evs: list[NodeEvidence]) -> str:
    """The RDMA devices ACTIVE on every reached node, comma-joined ('' if none or unequal)."""
    sets = [{p.dev for p in ev.ibports if p.state == "ACTIVE"} for ev in evs]
    if not sets or not sets[0] or any(s != sets[0] for s in sets):
        return ""
    return ",".join(sorted(sets[0]))


def _suggest(spec: str, evs: list[NodeEvidence]) -> str:
    """ "; the ACTIVE devices are X" unless that is already the value set."""
    want = active_hcas(evs)
    have = ",".join(sorted(e.split(":")[0] for e in spec.lstrip("=^").split(",") if e))
    if want and want != have:
        return f"; the ACTIVE RDMA devices on both nodes are NCCL_IB_HCA={want}"
    return ""


def hca_card(name: str, pci: str = "") -> str:
    """Card identity of an HCA: PCI domain:bus:device when known, else the name minus fN."""
    if pci:
        m = re.search(r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\.[0-7]$", pci.rstrip("/"))
        if m:
            return m.group(1)
    return re.sub(r"f\d+$", "", name)


def check_hca(spec: str, evs: list[NodeEvidence]) -> Check:
    """``evs``: the probes of the nodes that answered, index = rank."""
    if not spec:
        return PF_HCA_2RAIL.verdict(
            WARN,
            "NCCL_IB_HCA empty: NCCL uses every port it finds (4-rail on a Spark pair)"
            + _suggest(spec, evs),
        )
    if spec.startswith("^"):
        return PF_HCA_2RAIL.verdict(WARN, "exclusion list: cannot prove one port per card")
    entries = [e for e in spec.lstrip("=").split(",") if e]
    probs = []
    for rank, ev in enumerate(evs):
        cards: dict[str, list[str]] = {}
        for e in entries:
            dev = e.split(":")[0]
            cards.setdefault(hca_card(dev, ev.ibdevs.get(dev, "")), []).append(e)
        dup = {c: v for c, v in cards.items() if len(v) > 1}
        if dup:
            probs.append(
                f"rank {rank}: "
                + "; ".join(
                    f"{', '.join(v)} are devices of both physical ports (one PCI function group)"
                    for v in dup.values()
                )
            )
    if probs:
        return PF_HCA_2RAIL.verdict(FAIL, " | ".join(sorted(set(probs))) + _suggest(spec, evs))
    missing = sorted(
        {
            e.split(":")[0]
            for ev in evs
            for e in entries
            if ev.ibdevs and e.split(":")[0] not in ev.ibdevs
        }
    )
    if missing:
        return PF_HCA_2RAIL.verdict(
            FAIL, f"HCA(s) not present: {', '.join(missing)}" + _suggest(spec, evs)
        )
    if not any(ev.ibdevs for ev in evs):
        return PF_HCA_2RAIL.verdict(
            FAIL, f"{spec}: no RDMA devices visible at all (NCCL_NET=IB fails init)"
        )
    return PF_HCA_2RAIL.verdict(PASS, f"{spec}: the devices of one physical port")


PF_ROCE_GID = CheckSpec(
    "PF-ROCE-GID",
    title="each node has a RoCEv2 IPv4 GID on its NCCL_IB_HCA ports (every port when the "
    "list is empty), and a pinned NCCL_IB_GID_INDEX points at it; a port without one WARNs "
    "when another port of the node has one (the second PCIe half often has no IPv4, eugr/"
    "spark-vllm-docker docs/NETWORKING.md), FAILs when none has; indices differing across "
    "ports WARN; no RDMA devices SKIP",
    remedy="unset NCCL_IB_GID_INDEX (NCCL picks RoCEv2) or set it to the index shown; "
    "check the port's netdev has its IPv4 address (ip -br addr)",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_roce_gid(v.pair.nccl_ib_hca, v.pair.nccl_ib_gid_index, v.reached),
)


def _hca_ports(spec: str, gids: list[Gid]) -> list[tuple[str, int]]:
    """(dev, port) pairs the HCA list selects; every port with GIDs when the list is empty."""
    if spec and not spec.startswith("^"):
        sel = []
        for entry in spec.lstrip("=").split(","):
            if not entry:
                continue
            dev, _, port = entry.partition(":")
            sel.append((dev, int(port) if port.isdigit() else 1))
        return sel
    return sorted({(g.dev, g.port) for g in gids})


def v2_indices(gids: list[Gid], dev: str, port: int) -> list[int]:
    return sorted(g.index for g in gids if g.dev == dev and g.port == port and g.roce_v2_ipv4)


def check_roce_gid(hca_spec: str, gid_index: str, evs: list[NodeEvidence]) -> Check:
    """PF-ROCE-GID on the GID tables of the nodes that answered (``evs``, index = rank)."""
    if not any(ev.roce_gids for ev in evs):
        return PF_ROCE_GID.verdict(
            SKIP, "no RoCE GID tables visible (no RDMA devices on the probed nodes)"
        )
    problems: list[str] = []
    halves: list[str] = []  # ports without IPv4 whose node has another port with it
    chosen: dict[str, list[int]] = {}
    for rank, ev in enumerate(evs):
        ports = _hca_ports(hca_spec, ev.roce_gids)
        bare = []
        for dev, port in ports:
            v2 = v2_indices(ev.roce_gids, dev, port)
            where = f"rank {rank} {dev}:{port}"
            if not v2:
                bare.append(where)
                continue
            chosen[where] = v2
            if gid_index and int(gid_index) not in v2:
                problems.append(
                    f"{where}: NCCL_IB_GID_INDEX={gid_index} is not RoCEv2 "
                    f"IPv4 there; RoCEv2 IPv4 index is {v2[0]}"
                )
        if bare and len(bare) == len(ports):
            problems.append(
                f"{', '.join(bare)}: no RoCEv2 IPv4 GID on any port (link down or no IPv4 "
                "address on the netdev?)"
            )
        else:
            halves += bare
    if problems:
        return PF_ROCE_GID.verdict(FAIL, "; ".join(problems))
    if halves:
        return PF_ROCE_GID.verdict(
            WARN,
            f"{', '.join(halves)}: no IPv4 RoCEv2 GID (fine when its twin half carries the "
            "port's address); the others have one",
        )
    if gid_index:
        return PF_ROCE_GID.verdict(
            PASS, f"NCCL_IB_GID_INDEX={gid_index} is RoCEv2 IPv4 on every port"
        )
    firsts = {w: v[0] for w, v in chosen.items()}
    if len(set(firsts.values())) > 1:
        listed = ", ".join(f"{w}={i}" for w, i in firsts.items())
        return PF_ROCE_GID.verdict(
            WARN,
            f"RoCEv2 IPv4 GID index differs between ports ({listed}); NCCL picks "
            "per port, but a pinned NCCL_IB_GID_INDEX would break one of them",
        )
    index = next(iter(set(firsts.values())))
    return PF_ROCE_GID.verdict(
        PASS, f"RoCEv2 IPv4 at GID index {index} on every port (NCCL auto-selects it)"
    )


PF_RDMA_DEVICES = CheckSpec(
    "PF-RDMA-DEVICES",
    title="RDMA_DEVICE_DIR (/dev/infiniband) holds uverbs* character devices on both nodes "
    "(what libibverbs opens in the container; without them NCCL_NET=IB fails init)",
    remedy="load the RDMA drivers on that node (modprobe ib_uverbs mlx5_ib; rdma link shows "
    "the ports) or set RDMA_DEVICE_DIR to the directory holding uverbs*",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_rdma_devices(v.pair.rdma_device_dir, v.rank0, v.rank1),
)


def check_rdma_devices(path: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    probs, seen = [], []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.rdma_dir:
            probs.append(f"rank {rank}: {path} missing")
        elif not ev.uverbs:
            probs.append(f"rank {rank}: no uverbs* character device in {path}")
        else:
            seen.append(f"rank {rank}: {', '.join(ev.uverbs)}")
    if probs:
        return PF_RDMA_DEVICES.verdict(FAIL, "; ".join(probs))
    return PF_RDMA_DEVICES.verdict(PASS, "; ".join(seen))


PF_ROCE_MTU = CheckSpec(
    "PF-ROCE-MTU",
    title="the link's netdevs (NCCL_SOCKET_IFNAME and the netdevs of the NCCL_IB_HCA "
    "devices) are up with the same MTU on both nodes, and those RDMA ports are ACTIVE",
    remedy="set the same MTU on both nodes' link netdevs (eugr/spark-vllm-docker "
    "docs/NETWORKING.md uses mtu: 9000 in netplan) and bring the link up (check the cable, "
    "ip link set DEV up)",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_roce_mtu(
        v.pair.nccl_socket_ifname, v.pair.nccl_ib_hca, [v.rank0, v.rank1]
    ),
)

_DOWN = ("down", "lowerlayerdown", "notpresent", "dormant")


def _link_names(ifspec: str, hca_spec: str, ev: NodeEvidence) -> list[str]:
    names = {x.name for x in ev.links}
    want: set[str] = set()
    if not ifspec.startswith("^"):
        exact = ifspec.startswith("=")
        for n in ifspec.lstrip("=").split(","):
            want |= {n} & names if exact else {d for d in names if n and d.startswith(n)}
    devs = {e.split(":")[0] for e in hca_spec.lstrip("=").split(",") if e}
    if hca_spec.startswith("^"):
        devs = set()
    want |= {p.netdev for p in ev.ibports if p.netdev and (not devs or p.dev in devs)}
    return sorted(want & names)


def check_roce_mtu(ifspec: str, hca_spec: str, evs: list[NodeEvidence]) -> Check:
    probs, mtus = [], {}
    devs = {e.split(":")[0] for e in hca_spec.lstrip("=").split(",") if e}
    for rank, ev in enumerate(evs):
        links = {x.name: x for x in ev.links}
        for name in _link_names(ifspec, hca_spec, ev):
            link = links[name]
            mtus[f"rank {rank} {name}"] = link.mtu
            if link.state in _DOWN:
                probs.append(f"rank {rank}: {name} is {link.state}")
        for p in ev.ibports:
            if (not devs or p.dev in devs) and p.state != "ACTIVE":
                probs.append(f"rank {rank}: RDMA port {p.dev}:{p.port} is {p.state}")
    if not mtus:
        return PF_ROCE_MTU.verdict(SKIP, "no link netdev found (PF-NCCL-IFACE says why)")
    if len(set(mtus.values())) > 1:
        listed = ", ".join(f"{w} {m}" for w, m in mtus.items())
        probs.append(f"MTU differs: {listed}")
    if probs:
        return PF_ROCE_MTU.verdict(FAIL, "; ".join(probs))
    return PF_ROCE_MTU.verdict(
        PASS, f"MTU {next(iter(mtus.values()))} on {', '.join(mtus)}; all up"
    )
