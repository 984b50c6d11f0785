"""The registry: every preflight check, in report order, and the table the README shows.

``CHECKS`` is the single source of truth: ``decide`` runs it, and launch/README.md's table
is ``python -m pairctl preflight --catalogue-md`` (tests/test_pairctl.py fails when the
README and the registry disagree).
"""

from __future__ import annotations

from collections.abc import Mapping

from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight.check import Check, CheckSpec, Inputs
from pairctl.preflight.checks_fabric import PF_FABRIC_ADDR, PF_FABRIC_REACH
from pairctl.preflight.checks_host import (
    PF_JIT_CACHES,
    PF_MASTER_PORT_FREE,
    PF_NCCL_IFACE,
    PF_PORT_FREE,
    PF_TILELANG_CACHE,
)
from pairctl.preflight.checks_identity import (
    PF_DISTINCT_NODES,
    PF_FOREIGN_PAIR,
    PF_SELF_IS_SPARK1,
    PF_SSH,
)
from pairctl.preflight.checks_image import PF_IMAGE_OVERLAYS, PF_IMAGE_STACK, PF_IMAGE_VERSIONS
from pairctl.preflight.checks_launch import (
    PF_API_KEY,
    PF_NO_COMPRESSED_MLA,
    PF_NO_RAY,
    PF_VLLM_ARGS,
)
from pairctl.preflight.checks_match import (
    PF_IMAGE_MATCH,
    PF_MODEL_MATCH,
    PF_MODEL_REVISION,
    PF_OVERLAYS,
)
from pairctl.preflight.checks_rdma import (
    PF_HCA_2RAIL,
    PF_RDMA_DEVICES,
    PF_ROCE_GID,
    PF_ROCE_MTU,
)
from pairctl.preflight.checks_system import (
    PF_EARLYOOM,
    PF_KERNEL_CMA,
    PF_MEMORY,
    PF_MEMORY_FLOOR,
)
from pairctl.preflight.evidence import Evidence

CHECKS: tuple[CheckSpec, ...] = (
    PF_SSH,
    PF_SELF_IS_SPARK1,
    PF_DISTINCT_NODES,
    PF_FOREIGN_PAIR,
    PF_IMAGE_MATCH,
    PF_IMAGE_STACK,
    PF_IMAGE_VERSIONS,
    PF_MODEL_MATCH,
    PF_MODEL_REVISION,
    PF_PORT_FREE,
    PF_MASTER_PORT_FREE,
    PF_NCCL_IFACE,
    PF_FABRIC_ADDR,
    PF_FABRIC_REACH,
    PF_TILELANG_CACHE,
    PF_JIT_CACHES,
    PF_MEMORY,
    PF_MEMORY_FLOOR,
    PF_KERNEL_CMA,
    PF_EARLYOOM,
    PF_RDMA_DEVICES,
    PF_HCA_2RAIL,
    PF_ROCE_GID,
    PF_ROCE_MTU,
    PF_NO_COMPRESSED_MLA,
    PF_NO_RAY,
    PF_VLLM_ARGS,
    PF_API_KEY,
    PF_OVERLAYS,
    PF_IMAGE_OVERLAYS,
)
BY_ID: dict[str, CheckSpec] = {c.id: c for c in CHECKS}
if len(BY_ID) != len(CHECKS):
    raise AssertionError("two preflight checks share an id")


def decide(pair: ResolvedPair, evidence: Evidence, overlay_want: Mapping[str, str]) -> list[Check]:
    """Every verdict, in ``CHECKS`` order; rank-1 checks SKIP when rank 1 did not answer."""
    inputs = Inputs(pair, evidence, overlay_want)
    return [spec.run(inputs) for spec in CHECKS]


def _cell(text: str) -> str:
    """Plain text into a markdown table cell (a bare | or * would break the row or italicise)."""
    return text.replace("|", r"\|").replace("*", r"\*")


def catalogue_markdown() -> str:
    """launch/README.md's preflight table, generated from ``CHECKS``."""
    rows = [
        "| ID | checks | evidence | FAIL/WARN remedy |",
        "|---|---|---|---|",
    ]
    for c in CHECKS:
        needs = ", ".join(n.value for n in c.needs)
        rows.append(f"| {c.id} | {_cell(c.title)} | {_cell(needs)} | {_cell(c.remedy)} |")
    return "\n".join(rows) + "\n"
