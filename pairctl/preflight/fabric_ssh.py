"""Will the bulk copies reach rank 1 at FABRIC2, with its host key checked?

``image ship`` and ``model fetch`` stream to rank 1 over ssh to FABRIC2
(pairctl.nodes.fabric), with the same BatchMode and strict host-key checking as every
other ssh. Two short ssh runs from this machine, both read-only (``true``), say whether
that will work and whether FABRIC2 is SPARK2's machine:
- ``ssh FABRIC2 true``: known_hosts holds FABRIC2's key (the copies need exactly this);
- ``ssh -o HostKeyAlias=SPARK2 FABRIC2 true``: the key FABRIC2 presents is one known_hosts
  trusts for SPARK2. The same machine has the same host key on every address, so this is
  what says FABRIC2 is not some other machine (a copied env file's FABRIC2). ssh itself
  does the comparison, with every known_hosts file and hashed entry it would read.
Nothing is ever added to known_hosts: that first contact is the operator's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pairctl.nodes.ssh import Node


@dataclass(frozen=True)
class FabricSsh:
    """What the two ssh runs to FABRIC2 saw (defaults: they did not run)."""

    ran: bool = False
    host: str = ""  # FABRIC2
    known_rc: int | None = None  # ssh FABRIC2 true
    known_err: str = ""
    same_rc: int | None = None  # ssh -o HostKeyAlias=SPARK2 FABRIC2 true
    same_err: str = ""


def spark2_alias(spark2: str, port: str) -> str:
    """SPARK2's name in known_hosts: ``[host]:port`` off port 22 (as ssh writes it;
    HostKeyAlias is looked up verbatim, without the port)."""
    return spark2 if port in ("", "22") else f"[{spark2}]:{port}"


def probe(rank1: Node, fabric2: str, timeout: float = 30) -> FabricSsh:
    """Run both checks from this machine (rank 0); rank 1 only runs ``true``."""
    cfg = rank1.cfg
    node = Node(rank1.rank, fabric2, cfg, ssh_host=fabric2)
    known = node.run(["true"], timeout=timeout)
    alias = f"HostKeyAlias={spark2_alias(rank1.addr, cfg['SSH_PORT'])}"
    same = Node(rank1.rank, fabric2, cfg, ssh_host=fabric2, ssh_options=(alias,))
    res = same.run(["true"], timeout=timeout)
    return FabricSsh(
        ran=True,
        host=fabric2,
        known_rc=known.rc,
        known_err=known.err.strip()[-400:],
        same_rc=res.rc,
        same_err=res.err.strip()[-400:],
    )
