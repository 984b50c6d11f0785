"""RoCE between the two Sparks: one port per card, and a GID index NCCL can use.

Both checks decide on whichever nodes answered (rank 0 alone when ssh to rank 1 failed):
a wrong HCA list or GID index on rank 0 is worth reporting even then.
"""

from __future__ import annotations

import re

from pairctl.evidence import NodeEvidence
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need
from pairctl.roce import Gid

PF_HCA_2RAIL = CheckSpec(
    "PF-HCA-2RAIL",
    title="NCCL_IB_HCA names one port per card (2-rail; card = PCI domain:bus:device from "
    "sysfs, else the name without fN) and the devices exist; an empty list WARNs",
    remedy="list one port of each card, e.g. NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1; "
    "4-rail fails with ibv_modify_qp ... 110",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_hca(v.cfg.NCCL_IB_HCA, v.reached),
)


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
            WARN, "NCCL_IB_HCA empty: NCCL uses every port it finds (4-rail on a Spark pair)"
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
                + "; ".join(f"{', '.join(v)} are ports of one card" for v in dup.values())
            )
    if probs:
        return PF_HCA_2RAIL.verdict(FAIL, " | ".join(sorted(set(probs))))
    missing = sorted(
        {
            e.split(":")[0]
            for ev in evs
            for e in entries
            if ev.ibdevs and e.split(":")[0] not in ev.ibdevs
        }
    )
    if missing:
        return PF_HCA_2RAIL.verdict(FAIL, f"HCA(s) not present: {', '.join(missing)}")
    if not any(ev.ibdevs for ev in evs):
        return PF_HCA_2RAIL.verdict(
            WARN,
            f"{spec}: one port per card, but no RDMA devices "
            "visible (NCCL would fall back to sockets)",
        )
    return PF_HCA_2RAIL.verdict(PASS, f"{spec}: one port per card")


PF_ROCE_GID = CheckSpec(
    "PF-ROCE-GID",
    title="each NCCL_IB_HCA port (every port when the list is empty) has a RoCEv2 IPv4 GID "
    "on both nodes, and a pinned NCCL_IB_GID_INDEX points at it; indices differing across "
    "ports WARN; no RDMA devices SKIP",
    remedy="unset NCCL_IB_GID_INDEX (NCCL picks RoCEv2) or set it to the index shown; "
    "check the port's netdev has its IPv4 address (ip -br addr)",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_roce_gid(v.cfg.NCCL_IB_HCA, v.cfg.NCCL_IB_GID_INDEX, v.reached),
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
    chosen: dict[str, list[int]] = {}
    for rank, ev in enumerate(evs):
        for dev, port in _hca_ports(hca_spec, ev.roce_gids):
            v2 = v2_indices(ev.roce_gids, dev, port)
            where = f"rank {rank} {dev}:{port}"
            if not v2:
                problems.append(
                    f"{where} has no RoCEv2 IPv4 GID (link down or no IPv4 address on its netdev?)"
                )
                continue
            chosen[where] = v2
            if gid_index and int(gid_index) not in v2:
                problems.append(
                    f"{where}: NCCL_IB_GID_INDEX={gid_index} is not RoCEv2 "
                    f"IPv4 there; RoCEv2 IPv4 index is {v2[0]}"
                )
    if problems:
        return PF_ROCE_GID.verdict(FAIL, "; ".join(problems))
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
