"""How a group of four Sparks is cabled, and the NCCL settings each cabling needs: one table.

A pair is one cable between two Sparks and needs nothing here (its recipe env is the pair's,
unchanged). Four Sparks are cabled one of two ways, each as the peers who run it publish:

- ``switched``: every Spark's RoCE port on one switch, one subnet; any rank reaches any
  other directly (tonyd2wild/Deepseek-V4-Flash-TP4-4x-DGX-Spark, vLLM ``mp`` over switched
  RoCE).
- ``ring``: no switch; four cables 0-1-2-3-0, each Spark's two QSFP ports going to its two
  neighbours, and ranks two apart reach each other only through a neighbour that forwards
  (luxingcom/LuZ0.3.1-DeepSeek-v4-Flash-DSpark-DGXspark-TP4-Ring, FujitsuPolycom/sparkring).

Every container variable a cabling adds is a ``Setting`` here with the peer file it comes
from; ``plan`` prints each with its source. Nothing elsewhere sets a cabling-dependent value.
Site-specific values the peers also set (the fabric subnet for NCCL_IB_ADDR_RANGE or
NCCL_IB_SUBNET_PREFIX_LEN, the GID index) stay the operator's: NCCL_IB_HCA and
NCCL_IB_GID_INDEX in the env file.
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCHED = "switched"
RING = "ring"

_TONY = "tonyd2wild/Deepseek-V4-Flash-TP4-4x-DGX-Spark"
_LUX = "luxingcom/LuZ0.3.1-DeepSeek-v4-Flash-DSpark-DGXspark-TP4-Ring"
_RING_SPARK = "FujitsuPolycom/sparkring"
_TONY_ENV = f"{_TONY} launch/nccl-env.example.sh"
_TONY_RUN = f"{_TONY} launch/tp4-4x-spark-launch.sh"
_LUX_RUN = f"{_LUX} scripts/server-production/start_tp4_worker.sh"
_SR_ENV = f"{_RING_SPARK} scripts/config/deepseek-v4-flash-0731.env.example"


@dataclass(frozen=True)
class Setting:
    """One container variable a cabling needs, and where the peers set it."""

    name: str
    value: str
    source: str


# Container env per cabling of a group of four (a pair gets none: cabling_env).
SETTINGS: dict[str, tuple[Setting, ...]] = {
    SWITCHED: (
        # RoCE verbs on, RoCEv2 forced: the switch carries RoCEv2 only.
        Setting("NCCL_IB_DISABLE", "0", f"{_TONY_ENV}; {_TONY_RUN}"),
        Setting("NCCL_IB_ROCE_VERSION_NUM", "2", f"{_TONY_ENV}; {_TONY_RUN}"),
    ),
    RING: (
        # Each neighbour sits on another port (another subnet): NCCL must route by subnet,
        # not merge the two ports into one NIC, and may cross NICs within a ring channel.
        Setting("NCCL_IB_SUBNET_AWARE_ROUTING", "1", f"{_SR_ENV}; {_LUX_RUN}"),
        Setting("NCCL_IB_MERGE_NICS", "0", f"{_SR_ENV}; {_LUX_RUN}"),
        Setting("NCCL_CROSS_NIC", "1", f"{_SR_ENV}; {_LUX_RUN}"),
        # Only ring all-reduce follows the cables; a tree would need non-neighbour links.
        Setting("NCCL_ALGO", "Ring", f"{_SR_ENV}; {_LUX_RUN} (RING)"),
        Setting("NCCL_SKIP_TREE_CONNECT", "1", _SR_ENV),
    ),
}

# What the operator must set in the env file for a cabling (README "Four Sparks").
OPERATOR_NOTES: dict[str, str] = {
    SWITCHED: (
        "the same NCCL_IB_GID_INDEX (RoCEv2/IPv4) on every node, NCCL_IB_HCA the one cabled "
        f"HCA ({_TONY_ENV})"
    ),
    RING: (
        "NCCL_IB_HCA listing both ports' devices (each neighbour is on its own port), "
        "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME naming both ports' netdevs, IP forwarding on "
        f"every node for the ranks two apart ({_SR_ENV}; {_RING_SPARK} "
        "docs/DEEPSEEK_V4_FLASH_QUICKSTART.md)"
    ),
}


def cabling_env(cabling: str, nnodes: int) -> tuple[Setting, ...]:
    """The container variables a group's cabling adds: none for a pair (one cable, the
    recipe's own settings), else the table's."""
    if nnodes <= 2:
        return ()
    return SETTINGS[cabling]


def links(cabling: str, nnodes: int) -> tuple[tuple[int, int], ...]:
    """The rank pairs whose fabric preflight proves: the head and every rank (the TCP
    store and the head's message queue are on rank 0), and on a ring also each rank and
    its next neighbour (the cables the ring all-reduce uses), in rank order."""
    pairs = [(0, r) for r in range(1, nnodes)]
    if cabling == RING and nnodes > 2:
        for r in range(nnodes):
            link = tuple(sorted((r, (r + 1) % nnodes)))
            if link not in pairs:
                pairs.append(link)  # type: ignore[arg-type]
    return tuple(pairs)


def describe(cabling: str, nnodes: int) -> str:
    """One phrase for plan/status: how the group is cabled."""
    if nnodes <= 2:
        return "a pair (one cable)"
    if cabling == RING:
        ring = "-".join(str(r) for r in (*range(nnodes), 0))
        return f"ring {ring} (no switch; ranks two apart through a neighbour)"
    return "switched (one RoCE switch, one subnet)"
