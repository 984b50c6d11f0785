"""Is this the right pair? Checks that refuse a wrong target before anything is touched.

An env file copied from another pair is how the seed's incident started; these checks
catch each way such a copy can be half-adapted (README "Safety design").
"""

from __future__ import annotations

import ipaddress

from pairctl.nodes.docker_access import group_fix, permission_denied
from pairctl.pair.plan import LABEL_PAIR
from pairctl.preflight.check import FAIL, PASS, WARN, Check, CheckSpec, Need
from pairctl.preflight.evidence import NodeEvidence

PF_SSH = CheckSpec(
    "PF-SSH",
    title="ssh to SPARK2 works with BatchMode=yes and StrictHostKeyChecking=yes",
    remedy="fix SPARK2/SSH_* in the env file; add SPARK2's host key to the known_hosts "
    "file after verifying its fingerprint (never disable host-key checking)",
    needs=(Need.SSH,),
    decide=lambda v: check_ssh(v.ssh),
)


def check_ssh(n1: NodeEvidence) -> Check:
    if n1.reachable:
        return PF_SSH.verdict(PASS, "SPARK2 answered over ssh")
    err = n1.stderr
    hint = ""
    if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION" in err:
        hint = " (host key unknown or changed)"
    elif "Permission denied" in err:
        hint = " (authentication: check SSH_USER / SSH_IDENTITY_FILE)"
    elif "timed out" in err.lower() or "No route" in err or "refused" in err:
        hint = " (host unreachable: check SPARK2 / SSH_PORT)"
    return PF_SSH.verdict(FAIL, f"ssh failed rc={n1.rc}{hint}: {err[-200:]}")


PF_SELF_IS_SPARK1 = CheckSpec(
    "PF-SELF-IS-SPARK1",
    title="the machine running the launcher owns SPARK1 and MASTER_ADDR, and MASTER_ADDR "
    "is not loopback when SPARK2 is another machine",
    remedy="run the launcher on the rank-0 node, or fix SPARK1/MASTER_ADDR",
    needs=(Need.NAMES, Need.RANK0),
    decide=lambda v: check_self(v.names, v.rank0),
)


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_self(resolved: dict[str, str | None], n0: NodeEvidence) -> Check:
    addrs = set(n0.addrs)
    bad = []
    for key in ("SPARK1", "MASTER_ADDR"):
        ip = resolved.get(key)
        if ip is None:
            bad.append(f"{key} does not resolve")
        elif ip not in addrs:
            bad.append(f"{key}={ip} is not an address of this machine")
    master, spark2 = resolved.get("MASTER_ADDR"), resolved.get("SPARK2")
    if master and spark2 and _loopback(master) and not _loopback(spark2):
        bad.append(f"MASTER_ADDR={master} is loopback: rank 1 cannot reach it")
    if bad:
        local = ", ".join(sorted(addrs)) or "none"
        return PF_SELF_IS_SPARK1.verdict(FAIL, "; ".join(bad) + f" (local addrs: {local})")
    return PF_SELF_IS_SPARK1.verdict(PASS, f"this machine has {resolved.get('SPARK1')}")


PF_DISTINCT_NODES = CheckSpec(
    "PF-DISTINCT-NODES",
    title="SPARK2 is a different machine from SPARK1: another address, and ssh to SPARK2 "
    "does not land on a machine that owns SPARK1's address",
    remedy="set SPARK2 to this pair's rank-1 node (a copied env file still pointing "
    "elsewhere is how the seed's incident started)",
    needs=(Need.NAMES, Need.RANK1_IF_REACHED),
    decide=lambda v: check_distinct(v.names, v.rank1_if_reached),
)


def check_distinct(resolved: dict[str, str | None], n1: NodeEvidence | None) -> Check:
    """``n1`` is rank 1's probe, or None when ssh to it failed (addresses alone decide)."""
    s1, s2 = resolved.get("SPARK1"), resolved.get("SPARK2")
    unresolved = [k for k, ip in (("SPARK1", s1), ("SPARK2", s2)) if ip is None]
    if unresolved:
        verb = "does" if len(unresolved) == 1 else "do"
        return PF_DISTINCT_NODES.verdict(
            FAIL, f"{' and '.join(unresolved)} {verb} not resolve on this machine"
        )
    if s1 == s2:
        return PF_DISTINCT_NODES.verdict(FAIL, f"SPARK1 and SPARK2 are both {s1}")
    if n1 is not None and s1 in set(n1.addrs):
        return PF_DISTINCT_NODES.verdict(
            FAIL, f"ssh to SPARK2 landed on a machine that has SPARK1's address {s1}"
        )
    return PF_DISTINCT_NODES.verdict(PASS, f"SPARK1 {s1} != SPARK2 {s2}")


PF_FOREIGN_PAIR = CheckSpec(
    "PF-FOREIGN-PAIR",
    title="no running container of another pair on either node (the pair is named); "
    "stopped ones WARN",
    remedy="this env file points at another pair's node: fix SPARK1/SPARK2/PAIR_ID; "
    "never remove the other pair's containers from here",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_foreign(v.pair.pair_id, v.rank0, v.rank1),
)


def check_foreign(pair_id: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    running: list[str] = []
    stopped: list[str] = []
    errors: list[str] = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.reachable:
            continue
        if ev.docker_ps_rc not in (0, None):
            if permission_denied(ev.docker_ps_error):
                errors.append(group_fix(rank))
            else:
                errors.append(f"rank {rank}: docker ps failed: {ev.docker_ps_error}")
            continue
        for c in ev.containers:
            other = c.labels.get(LABEL_PAIR)
            if other is None or other == pair_id:
                continue
            desc = f"rank {rank} runs {c.name} of pair '{other}'"
            (running if c.running else stopped).append(desc)
    if running:
        return PF_FOREIGN_PAIR.verdict(FAIL, "; ".join(running))
    if errors:
        return PF_FOREIGN_PAIR.verdict(FAIL, "; ".join(errors))
    if stopped:
        return PF_FOREIGN_PAIR.verdict(WARN, "stopped: " + "; ".join(stopped))
    return PF_FOREIGN_PAIR.verdict(PASS, "no other pair's containers on either node")
