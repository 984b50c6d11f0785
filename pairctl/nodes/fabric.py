"""The bulk copies to rank 1 go over the fabric: ssh to FABRIC2, its host key checked.

The image tar (tens of GB) and the checkpoint (~150 GB) are the only large transfers a pair
makes; on a Spark pair the ConnectX-7 link (FABRIC2) is far faster than the LAN port that
SPARK2 usually names. So ``image ship`` and ``model fetch`` stream their bytes to rank 1 at
FABRIC2, while every control command (docker, listing, verifying) stays on SPARK2. With
FABRIC2 empty or equal to SPARK2 nothing changes.

ssh to FABRIC2 runs with the same BatchMode and strict host-key checking as to SPARK2, so
FABRIC2 must be in known_hosts too. That entry is never added for the operator: the first
contact is theirs, comparing the fingerprint with SPARK2's (the same machine has the same
host key on every address), and preflight's PF-FABRIC-HOSTKEY checks both that the key is
known and that it is SPARK2's (``pairctl.preflight.fabric_ssh``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pairctl.nodes.ssh import Node
from pairctl.nodes.transfer import TransferError, send_tree
from pairctl.pair.config import PairConfig

# What ssh prints when strict checking refuses a host key (OpenSSH sshconnect.c): unknown
# ("No ED25519 host key is known for H and you have requested strict checking.") or changed
# ("REMOTE HOST IDENTIFICATION HAS CHANGED"), both ending "Host key verification failed.".
HOSTKEY_FAILED = "Host key verification failed"
HOSTKEY_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"


def bulk_node(rank1: Node, fabric2: str) -> Node:
    """Rank 1 as the bulk copies reach it: at ``fabric2`` (the same node when it is SPARK2)."""
    if not fabric2 or fabric2 == rank1.addr:
        return rank1
    return Node(rank1.rank, fabric2, rank1.cfg, ssh_host=fabric2)


def first_contact(cfg: PairConfig, host: str) -> str:
    """The interactive ssh an operator runs once from rank 0 to see ``host``'s fingerprint
    (ssh asks before it records the key; nothing here answers for them)."""
    argv = ["ssh"]
    if cfg["SSH_KNOWN_HOSTS_FILE"]:
        argv += ["-o", f"UserKnownHostsFile={cfg['SSH_KNOWN_HOSTS_FILE']}"]
    if cfg["SSH_IDENTITY_FILE"]:
        argv += ["-i", cfg["SSH_IDENTITY_FILE"]]
    if cfg["SSH_PORT"]:
        argv += ["-p", cfg["SSH_PORT"]]
    if cfg["SSH_USER"]:
        argv += ["-l", cfg["SSH_USER"]]
    return shlex.join([*argv, host, "true"])


def known_fingerprint(cfg: PairConfig, host: str) -> str:
    """The command that prints the fingerprint known_hosts already trusts for ``host``."""
    name = host if cfg["SSH_PORT"] in ("", "22") else f"[{host}]:{cfg['SSH_PORT']}"
    argv = ["ssh-keygen", "-l", "-F", name]
    if cfg["SSH_KNOWN_HOSTS_FILE"]:
        argv += ["-f", cfg["SSH_KNOWN_HOSTS_FILE"]]
    return shlex.join(argv)


def hostkey_fix(cfg: PairConfig, fabric2: str, changed: bool = False, spark: str = "") -> str:
    """What the operator runs when ssh refuses FABRIC2's host key, exactly; ``spark``: the
    same node's SPARK address (default SPARK2; a group's rank R: SPARK<R+1>)."""
    spark2 = spark or cfg["SPARK2"]
    how = (
        f"run `{first_contact(cfg, fabric2)}` once on rank 0 and answer yes only if the "
        f"fingerprint it shows is one `{known_fingerprint(cfg, spark2)}` prints (the key "
        f"already trusted for SPARK2 {spark2}: the same machine has the same host key)"
    )
    if changed:
        kh = cfg["SSH_KNOWN_HOSTS_FILE"]
        drop = shlex.join(["ssh-keygen", "-R", fabric2, *(["-f", kh] if kh else [])])
        return (
            f"known_hosts holds another key for FABRIC2 {fabric2}: make sure FABRIC2 is "
            f"rank 1's fabric address, remove the stale entry (`{drop}`), then {how}"
        )
    return f"FABRIC2 {fabric2} is not in known_hosts: {how}; host-key checking stays on"


def explain(cfg: PairConfig, node: Node, message: str) -> str:
    """``message`` (a copy's error) plus the host-key fix when ssh to the fabric refused."""
    if not node.ssh_host or HOSTKEY_FAILED not in message:
        return message
    fix = hostkey_fix(cfg, node.ssh_host, HOSTKEY_CHANGED in message, cfg.spark(node.rank))
    return f"{message}\n{fix}"


def send(
    rank1: Node, fabric2: str, src_root: Path, dst_root: str, files: list[str], what: str
) -> tuple[int, int]:
    """``transfer.send_tree`` to rank 1 over the fabric; a refused host key says what to
    run (TransferError)."""
    node = bulk_node(rank1, fabric2)
    try:
        return send_tree(node, src_root, dst_root, files, what)
    except TransferError as exc:
        raise TransferError(explain(node.cfg, node, str(exc))) from None
