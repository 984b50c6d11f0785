"""What a preflight check is: its spec, the evidence it may read, its verdict.

One ``CheckSpec`` holds everything about a check: its stable id, what it checks, the
remedy, the evidence it needs and its decision (``pairctl.preflight.registry`` lists them
in report order). ``CheckSpec.run`` is the one place that
SKIPs a check needing rank 1's probe when rank 1 did not answer; a decision never asks.
A decision sees its inputs through a ``View`` that hands out only the evidence its spec
declares, so a wrong declaration fails loudly in the unit tests instead of reading an
unreached node's empty evidence.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pairctl.pair.recipe import Recipe
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight.evidence import ArgvCheck, Evidence, NodeEvidence
from pairctl.preflight.imageprobe import ImageProbe
from pairctl.preflight.reach import Reach

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    """One verdict. ``id`` is stable: docs and tests refer to it."""

    id: str
    status: str
    what: str
    detail: str
    remedy: str = ""


class Need(enum.Enum):
    """Evidence a check may read; the value is its name in launch/README.md's table."""

    CONFIG = "config"  # env file + recipe + extra vLLM args
    NAMES = "name lookup"  # SPARK1, SPARK2, FABRIC1, FABRIC2, MASTER_ADDR resolved here
    SSH = "ssh to SPARK2"  # how the rank-1 probe's transport went
    RANK0 = "rank 0"  # rank 0's probe
    RANK1 = "rank 1"  # rank 1's probe; the check is SKIP when rank 1 did not answer
    RANK1_IF_REACHED = "rank 1 if reached"  # rank 1's probe when it answered, else rank 0 alone
    OVERLAY_SRC = "ship list"  # what mods/dsv4-flash-overlays ships, sha256 per file
    ARGV = "vLLM parser"  # both ranks' argv read by vLLM's parser (pairctl.preflight.argcheck)
    REACH = "rank 1 to master port"  # rank 1 connected to a listener here (preflight.reach)
    IMAGE = "image probe"  # the image's own interpreter on each node (preflight.imageprobe)


@dataclass(frozen=True)
class Inputs:
    """Everything preflight decides on: the resolved pair and the evidence."""

    pair: ResolvedPair
    evidence: Evidence
    overlay_want: Mapping[str, str]  # shipped overlay file -> sha256, from the repo


class UndeclaredEvidence(AssertionError):
    """A decision read evidence its CheckSpec does not declare (a bug in the registry)."""


class View:
    """What one check may read: exactly the evidence its spec declares."""

    def __init__(self, inputs: Inputs, needs: tuple[Need, ...], check_id: str) -> None:
        self._in = inputs
        self._needs = needs
        self._id = check_id

    def _need(self, need: Need) -> None:
        if need not in self._needs:
            raise UndeclaredEvidence(f"{self._id} reads {need.name} but does not declare it")

    @property
    def pair(self) -> ResolvedPair:
        self._need(Need.CONFIG)
        return self._in.pair

    @property
    def recipe(self) -> Recipe:
        return self.pair.recipe

    @property
    def passthrough(self) -> list[str]:
        return list(self.pair.passthrough)

    @property
    def names(self) -> dict[str, str | None]:
        self._need(Need.NAMES)
        return self._in.evidence.resolved

    @property
    def ssh(self) -> NodeEvidence:
        """Rank 1's evidence for its transport fields (reachable, rc, stderr)."""
        self._need(Need.SSH)
        return self._in.evidence.rank1

    @property
    def rank0(self) -> NodeEvidence:
        self._need(Need.RANK0)
        return self._in.evidence.rank0

    @property
    def rank1(self) -> NodeEvidence:
        """Rank 1's probe; ``CheckSpec.run`` only gets here when rank 1 answered."""
        self._need(Need.RANK1)
        return self._in.evidence.rank1

    @property
    def rank1_if_reached(self) -> NodeEvidence | None:
        self._need(Need.RANK1_IF_REACHED)
        n1 = self._in.evidence.rank1
        return n1 if n1.reachable else None

    @property
    def reached(self) -> list[NodeEvidence]:
        """The probes of the nodes that answered, in rank order (rank 0 always)."""
        n1 = self.rank1_if_reached
        return [self.rank0] + ([n1] if n1 else [])

    @property
    def overlay_want(self) -> Mapping[str, str]:
        self._need(Need.OVERLAY_SRC)
        return self._in.overlay_want

    @property
    def reach(self) -> Reach:
        self._need(Need.REACH)
        return self._in.evidence.reach

    @property
    def argv_check(self) -> ArgvCheck:
        self._need(Need.ARGV)
        return self._in.evidence.argv_check

    @property
    def image_probes(self) -> Mapping[str, ImageProbe]:
        """Each probed node's image probe, by rank ("0", "1"; an unreached node has none)."""
        self._need(Need.IMAGE)
        return self._in.evidence.image_probes


@dataclass(frozen=True)
class CheckSpec:
    """One check: id, what it checks, its remedy, the evidence it needs, its decision."""

    id: str
    title: str
    remedy: str
    needs: tuple[Need, ...]
    decide: Callable[[View], Check]

    def verdict(self, status: str, detail: str) -> Check:
        """This check's verdict; the remedy is shown only when there is something to fix."""
        return Check(
            self.id, status, self.title, detail, self.remedy if status in (FAIL, WARN) else ""
        )

    def run(self, inputs: Inputs) -> Check:
        if Need.RANK1 in self.needs and not inputs.evidence.rank1.reachable:
            return self.verdict(SKIP, "rank 1 not reachable")
        check = self.decide(View(inputs, self.needs, self.id))
        if check.id != self.id:
            raise AssertionError(f"{self.id}'s decision returned a verdict for {check.id}")
        return check
