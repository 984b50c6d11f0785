"""RoCE GID tables: the probe's sysfs fragment, its parser and the record it yields.

NCCL addresses a RoCE peer by a GID *index*. On a Spark the RoCEv2 IPv4 entry of a port
can move to another index after a reboot or a netplan change; a pinned
``NCCL_IB_GID_INDEX`` that now points at a RoCEv1 or link-local entry makes ``ibv_modify_qp``
fail. This module is the evidence side (section ``roce_gids`` of ``pairctl.preflight.probe``'s
script); PF-ROCE-GID decides on it in ``pairctl.preflight.checks_rdma``.
"""

from __future__ import annotations

from dataclasses import dataclass

ROCE_V2 = "RoCE v2"
_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"

# Appended to the probe script: one line per populated GID, "dev port index gid type...".
PROBE_SECTION = r"""
sec roce_gids
for t in /sys/class/infiniband/*/ports/*/gid_attrs/types/*; do
  [ -r "$t" ] || continue
  ty=$(cat "$t" 2>/dev/null) || continue
  [ -n "$ty" ] || continue
  p=${t%/gid_attrs/types/*}; i=${t##*/}
  g=$(cat "$p/gids/$i" 2>/dev/null) || continue
  case "$g" in ""|0000:0000:0000:0000:0000:0000:0000:0000) continue;; esac
  d=${p%/ports/*}
  printf '%s %s %s %s %s\n' "${d##*/}" "${p##*/}" "$i" "$g" "$ty"
done
"""


@dataclass(frozen=True)
class Gid:
    """One populated entry of a port's GID table."""

    dev: str
    port: int
    index: int
    gid: str
    type: str

    @property
    def roce_v2_ipv4(self) -> bool:
        """The entry NCCL needs on a Spark pair: RoCEv2 with an IPv4-mapped address."""
        return self.type == ROCE_V2 and self.gid.lower().startswith(_V4_MAPPED)


def parse_gids(lines: list[str]) -> list[Gid]:
    """Probe lines → GID records (malformed lines are dropped)."""
    out = []
    for line in lines:
        parts = line.split(None, 4)
        if len(parts) < 5 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        out.append(Gid(parts[0], int(parts[1]), int(parts[2]), parts[3], parts[4].strip()))
    return out
