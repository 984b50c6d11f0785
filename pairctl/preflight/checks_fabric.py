"""Does the engine talk over the fabric? Its addresses on the RoCE interface, and a route.

Two kinds of address (README "Two kinds of address"): SPARK1/SPARK2 are where ssh, the
router and clients reach a node; FABRIC1/FABRIC2 (default SPARK1/SPARK2) are each rank's
VLLM_HOST_IP and, for rank 0, MASTER_ADDR's default. vLLM binds its cross-node message
queue on VLLM_HOST_IP and rank 1 dials MASTER_ADDR for the TCP store, so an address on
the LAN would carry every step's scheduler output over it while NCCL/Gloo use the
interface named in NCCL_SOCKET_IFNAME. These checks tie the addresses to that interface,
and check the ssh the bulk copies (image ship, model fetch) take to FABRIC2.
"""

from __future__ import annotations

import ipaddress

from pairctl.nodes.fabric import HOSTKEY_CHANGED, HOSTKEY_FAILED, hostkey_fix
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.fabric_ssh import FabricSsh
from pairctl.preflight.reach import Reach

PF_FABRIC_ADDR = CheckSpec(
    "PF-FABRIC-ADDR",
    title="each rank's fabric address (FABRIC1/FABRIC2, default SPARK1/SPARK2; its "
    "VLLM_HOST_IP) and MASTER_ADDR sit on that node's NCCL_SOCKET_IFNAME interface "
    "(ip -o addr show), and FABRIC1 != FABRIC2",
    remedy="set FABRIC1/FABRIC2 (and MASTER_ADDR, or leave it empty = FABRIC1) to the "
    "addresses `ip -4 -o addr show dev IFACE` shows for the RoCE interface on each node; "
    "SPARK1/SPARK2 stay the ssh/client addresses",
    needs=(Need.CONFIG, Need.NAMES, Need.RANK0, Need.RANK1_IF_REACHED),
    decide=lambda v: check_fabric_addr(v.pair, v.names, v.reached),
)


def fabric_ifaces(spec: str, ev: NodeEvidence) -> list[str]:
    """The node's interfaces an NCCL-style list names ('=' exact, else prefix); [] for a
    '^' exclusion list (it names no interface)."""
    if spec.startswith("^"):
        return []
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]
    have = set(ev.netdevs) | set(ev.ifaddrs)  # an interface without an address counts too
    return sorted(d for d in have if any((d == n) if exact else d.startswith(n) for n in names))


def _where(ip: str, ev: NodeEvidence) -> str:
    """Which interface of the node holds ``ip`` ('' when none)."""
    return next((d for d, addrs in ev.ifaddrs.items() if ip in addrs), "")


def _on_link(ev: NodeEvidence, ifaces: list[str]) -> list[str]:
    """The IPv4 addresses on the named interfaces (what the remedy suggests)."""
    out = []
    for d in ifaces:
        for a in ev.ifaddrs.get(d, []):
            try:
                if ipaddress.ip_address(a).version == 4:
                    out.append(a)
            except ValueError:
                continue
    return out


def check_fabric_addr(
    pair: ResolvedPair, names: dict[str, str | None], evs: list[NodeEvidence]
) -> Check:
    """``evs``: the probes of the nodes that answered, index = rank."""
    spec = pair.nccl_socket_ifname
    if spec.startswith("^"):
        return PF_FABRIC_ADDR.verdict(
            WARN, f"NCCL_SOCKET_IFNAME={spec} is an exclusion list: it names no interface"
        )
    f1, f2 = names.get("FABRIC1"), names.get("FABRIC2")
    if f1 and f1 == f2:
        return PF_FABRIC_ADDR.verdict(FAIL, f"FABRIC1 and FABRIC2 are both {f1}")
    wanted = [(0, "FABRIC1", pair.fabric1), (1, "FABRIC2", pair.fabric2)]
    wanted.append((0, "MASTER_ADDR", pair.master_addr))
    probs, seen = [], []
    ifaces_of = [fabric_ifaces(spec, ev) for ev in evs]
    for rank, ifaces in enumerate(ifaces_of):
        if not ifaces:
            probs.append(f"rank {rank} has no interface {spec} (PF-NCCL-IFACE)")
    for rank, var, given in wanted:
        if rank >= len(evs) or not ifaces_of[rank]:
            continue
        ev, ip, ifaces = evs[rank], names.get(var), ifaces_of[rank]
        if ip is None:
            probs.append(f"{var}={given} does not resolve on this machine")
            continue
        if any(ip in ev.ifaddrs.get(d, []) for d in ifaces):
            seen.append(f"{var} {ip} on rank {rank}'s {'/'.join(ifaces)}")
            continue
        other = _where(ip, ev)
        where = f"on {other}" if other else "not an address of that node"
        link = ", ".join(_on_link(ev, ifaces)) or "no IPv4 address"
        probs.append(f"{var}={ip} is {where}, not on rank {rank}'s {spec} (which has {link})")
    if probs:
        return PF_FABRIC_ADDR.verdict(FAIL, "; ".join(probs))
    if len(evs) < 2:
        return PF_FABRIC_ADDR.verdict(
            PASS, "; ".join(seen) + " (rank 1 not reached: FABRIC2 not checked)"
        )
    return PF_FABRIC_ADDR.verdict(PASS, "; ".join(seen))


PF_FABRIC_REACH = CheckSpec(
    "PF-FABRIC-REACH",
    title="rank 1 connects to MASTER_ADDR:MASTER_PORT (a short-lived listener here, before "
    "anything starts) and the connection comes from FABRIC2, i.e. its route uses the fabric",
    remedy="make MASTER_ADDR rank 0's fabric address (empty = FABRIC1) and let the fabric "
    "through any firewall (MASTER_PORT and the ports vLLM's message queue picks); if the "
    "connection came from another address, rank 1's route to MASTER_ADDR leaves over another "
    "interface: put both fabric addresses in one subnet on the RoCE link",
    needs=(Need.CONFIG, Need.NAMES, Need.RANK1, Need.REACH),
    decide=lambda v: check_fabric_reach(v.pair, v.names, v.reach),
)


def _loopback(ip: str | None) -> bool:
    try:
        return ip is not None and ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_fabric_reach(pair: ResolvedPair, names: dict[str, str | None], r: Reach) -> Check:
    target = f"{pair.master_addr}:{pair.master_port}"
    if not r.ran:
        if "in use" in r.detail:
            return PF_FABRIC_REACH.verdict(
                WARN, f"not tested: {r.detail} (PF-MASTER-PORT-FREE says by whom)"
            )
        if r.detail:
            return PF_FABRIC_REACH.verdict(FAIL, r.detail)
        return PF_FABRIC_REACH.verdict(SKIP, "not tested: MASTER_ADDR does not resolve here")
    if not r.ok:
        return PF_FABRIC_REACH.verdict(FAIL, f"rank 1 could not reach {target}: {r.detail}")
    master, f2 = names.get("MASTER_ADDR"), names.get("FABRIC2")
    if _loopback(master):
        # one machine's loopback: the kernel picks 127.0.0.1 whoever dials (a test setup;
        # PF-SELF-IS-SPARK1 fails a loopback master on a real pair)
        return PF_FABRIC_REACH.verdict(PASS, f"rank 1 reached {target} (loopback)")
    if f2 and r.peer and r.peer != f2:
        return PF_FABRIC_REACH.verdict(
            FAIL,
            f"rank 1 reached {target}, but from {r.peer}, not FABRIC2 {f2}: its route to "
            "MASTER_ADDR does not use the fabric",
        )
    return PF_FABRIC_REACH.verdict(PASS, f"rank 1 reached {target} from {r.peer or f2}")


PF_FABRIC_HOSTKEY = CheckSpec(
    "PF-FABRIC-HOSTKEY",
    title="FABRIC2 presents a host key known_hosts trusts for SPARK2 (the same machine: FAIL "
    "if not), and the bulk copies' ssh to FABRIC2 (image ship, model fetch) works with "
    "BatchMode=yes and StrictHostKeyChecking=yes (WARN if not: only the copies need it); "
    "nothing to check when FABRIC2 = SPARK2",
    remedy="a FAIL: FABRIC2 is not rank 1's fabric address, fix it. A WARN: from rank 0, run "
    "ssh FABRIC2 true once (with the pair's SSH_* settings) and answer yes only if the "
    "fingerprint it shows is one `ssh-keygen -l -F SPARK2` prints. Never turn host-key "
    "checking off",
    needs=(Need.CONFIG, Need.FABRIC_SSH),
    decide=lambda v: check_fabric_hostkey(v.pair, v.fabric_ssh),
)


def check_fabric_hostkey(pair: ResolvedPair, f: FabricSsh) -> Check:
    f2, s2 = pair.fabric2, pair.spark2
    if f2 == s2:
        return PF_FABRIC_HOSTKEY.verdict(
            PASS, f"FABRIC2 is SPARK2 ({s2}): the copies take the ssh PF-SSH checks"
        )
    if not f.ran:
        return PF_FABRIC_HOSTKEY.verdict(SKIP, "not checked (rank 1 not probed)")
    if f.same_rc != 0 and HOSTKEY_FAILED in f.same_err:
        return PF_FABRIC_HOSTKEY.verdict(
            FAIL,
            f"FABRIC2 {f2} presents a host key that known_hosts does not trust for SPARK2 "
            f"{s2}: FABRIC2 names another machine (or SPARK2's entry is another machine's); "
            "set FABRIC2 to rank 1's own fabric address",
        )
    copies = "image ship and model fetch copy over it"
    if f.known_rc != 0:
        if HOSTKEY_FAILED in f.known_err:
            fix = hostkey_fix(pair.nodes[1].cfg, f2, HOSTKEY_CHANGED in f.known_err, s2)
            return PF_FABRIC_HOSTKEY.verdict(WARN, f"{fix} ({copies})")
        return PF_FABRIC_HOSTKEY.verdict(
            WARN, f"ssh to FABRIC2 {f2} failed (rc={f.known_rc}; {copies}): {f.known_err[-200:]}"
        )
    if f.same_rc != 0:
        return PF_FABRIC_HOSTKEY.verdict(
            WARN,
            f"ssh to FABRIC2 {f2} checked against SPARK2's host key failed (rc={f.same_rc}): "
            f"{f.same_err[-200:]}",
        )
    return PF_FABRIC_HOSTKEY.verdict(
        PASS, f"ssh to FABRIC2 {f2} works (its host key is known), and the key is SPARK2's"
    )
