"""RoCE GID index check: the peers' "ibv_modify_qp errors after a reboot" pain.

NCCL addresses a RoCE peer by a GID *index*. On a Spark the RoCEv2 IPv4 entry of a port
can move to another index after a reboot or a netplan change; a pinned
``NCCL_IB_GID_INDEX`` that now points at a RoCEv1 or link-local entry makes ``ibv_modify_qp``
fail. Evidence is the sysfs GID table of each node (``pairctl.probe``, section
``roce_gids``); the decision here is pure so it is unit-tested on recorded tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def parse_gids(lines: list[str]) -> list[dict[str, Any]]:
    """Probe lines → JSON-serialisable GID records (malformed lines are dropped)."""
    out = []
    for line in lines:
        parts = line.split(None, 4)
        if len(parts) < 5 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        out.append(
            {
                "dev": parts[0],
                "port": int(parts[1]),
                "index": int(parts[2]),
                "gid": parts[3],
                "type": parts[4].strip(),
            }
        )
    return out


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


def decide_gid(
    hca_spec: str, gid_index: str, node_gids: dict[int, list[dict[str, Any]] | None]
) -> tuple[str, str]:
    """(status, detail) for PF-ROCE-GID; status is PASS/WARN/FAIL/SKIP.

    ``node_gids`` maps rank → recorded GID table (None = node not probed).
    """
    tables = {r: [Gid(**g) for g in t] for r, t in node_gids.items() if t is not None}
    if not any(tables.values()):
        return "SKIP", "no RoCE GID tables visible (no RDMA devices on the probed nodes)"
    problems: list[str] = []
    chosen: dict[str, list[int]] = {}
    for rank, gids in sorted(tables.items()):
        for dev, port in _hca_ports(hca_spec, gids):
            v2 = v2_indices(gids, dev, port)
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
        return "FAIL", "; ".join(problems)
    if gid_index:
        return "PASS", f"NCCL_IB_GID_INDEX={gid_index} is RoCEv2 IPv4 on every port"
    firsts = {w: v[0] for w, v in chosen.items()}
    if len(set(firsts.values())) > 1:
        listed = ", ".join(f"{w}={i}" for w, i in firsts.items())
        return "WARN", (
            f"RoCEv2 IPv4 GID index differs between ports ({listed}); NCCL picks "
            "per port, but a pinned NCCL_IB_GID_INDEX would break one of them"
        )
    index = next(iter(set(firsts.values())))
    return "PASS", f"RoCEv2 IPv4 at GID index {index} on every port (NCCL auto-selects it)"
