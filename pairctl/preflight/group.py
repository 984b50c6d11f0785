"""Preflight of a group of four: every check, between the head and every headless rank.

Each check is written for a head and one other node (rank 0's probe, the other's, the
fabric and the TCP store between them). A group of four is judged as three such pairs,
the head with rank 1, 2 and 3 (``ResolvedPair.with_head``: the other node keeps its rank
number, so every verdict names the rank it is about), so every node gets every check and
the fabric checks run between the head and every rank. On a ring the head's links to
ranks 1 and 3 are cables and its link to rank 2 goes through a neighbour
(pairctl.pair.cabling.links): the store connection proves that route too. One verdict per
check comes back: the worst of the three, with each rank's detail, so ``up`` starts
nothing when any rank fails any check. A pair is judged once, as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace

from pairctl.pair import cabling
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight import runner
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec
from pairctl.preflight.evidence import ArgvCheck, Evidence
from pairctl.preflight.registry import CHECKS

RING_ID = "PF-RING-NEIGHBOURS"
RING_WHAT = "on a ring, each headless rank reaches its next neighbour's fabric address (ping)"
RING_FIX = (
    "check the cable between the two (each Spark's two ports go to its two neighbours), "
    "both ports' addresses (FABRIC<R>) and IP forwarding on every node"
)
# Worst first: the merged verdict is the first of these any rank got.
_ORDER = (FAIL, WARN, SKIP, PASS)


_SECOND = re.compile(r"\b(rank 1|SPARK2|FABRIC2)\b")


def renamed_word(word: str, rank: int) -> str:
    """ "rank 1"/SPARK2/FABRIC2 as the words for ``rank``."""
    if word == "rank 1":
        return f"rank {rank}"
    return f"{word[:-1]}{rank + 1}"


def renamed(check: Check, rank: int) -> Check:
    """A pair-shaped check's words for its second node ("rank 1", SPARK2, FABRIC2) as the
    rank it was run for, so a verdict about rank 3 says rank 3, SPARK4, FABRIC4."""
    if rank == 1:
        return check

    def fix(text: str) -> str:
        return _SECOND.sub(lambda m: renamed_word(m.group(1), rank), text)

    return replace(check, what=fix(check.what), detail=fix(check.detail), remedy=fix(check.remedy))


def merge(per_rank: Mapping[int, list[Check]]) -> list[Check]:
    """One verdict per check id (in the first list's order): the worst status any rank got,
    the detail of each rank that got it or differs ("rank R: ..."), the remedy of the
    worst."""
    first = next(iter(per_rank.values()))
    out = []
    for i, base in enumerate(first):
        got = {r: checks[i] for r, checks in per_rank.items()}
        worst = min(got.values(), key=lambda c: _ORDER.index(c.status))
        details = list(dict.fromkeys(c.detail for c in got.values()))
        if len(details) == 1:
            detail = details[0]
        else:
            detail = "; ".join(f"rank {r}: {c.status} {c.detail}" for r, c in got.items())
        out.append(replace(base, status=worst.status, detail=detail, remedy=worst.remedy))
    return out


def ring_check(pair: ResolvedPair, timeout: float = 20) -> Check:
    """The ring's cables the head is not on (1-2, 2-3 of 0-1-2-3-0): rank A pings rank B's
    fabric address over ssh; the head's own links are the pair checks' (PF-FABRIC-REACH)."""
    links = [(a, b) for a, b in cabling.links(pair.cabling, pair.nnodes) if a != 0]
    bad, good = [], []
    for a, b in links:
        addr = pair.fabric_addr(b)
        res = pair.nodes[a].run(["ping", "-c", "1", "-W", "3", addr], timeout=timeout)
        if res.rc == 0:
            good.append(f"rank {a} -> rank {b} ({addr})")
        else:
            why = (res.err or res.out).strip().splitlines()[-1:] or [f"rc={res.rc}"]
            bad.append(f"rank {a} -> rank {b} ({addr}): {why[0][:200]}")
    if bad:
        return Check(RING_ID, FAIL, RING_WHAT, "; ".join(bad), RING_FIX)
    return Check(RING_ID, PASS, RING_WHAT, "; ".join(good))


def run(
    pair: ResolvedPair,
    overlay_want: Mapping[str, str],
    emit: Callable[[Check], None],
    progress: Callable[[str], None] | None = None,
    local_argv: ArgvCheck | None = None,
    say: Callable[[str], None] = print,
    specs: tuple[CheckSpec, ...] = CHECKS,
    probe_rank1: bool = True,
) -> tuple[list[Check], Evidence]:
    """``runner.run`` once for a pair; for a group once per headless rank (each verdict
    emitted as it arrives, under a line naming the rank), merged. Returns the merged
    verdicts and the last rank's evidence (the JSON's; each run printed its own).
    ``specs``/``probe_rank1`` as runner.run's (e.g. only the identity checks, as
    sync-overlays and the copies ask before they write to any node); the ring's own check
    runs with the whole preflight only."""
    if pair.nnodes == 2:
        return runner.run(
            pair, overlay_want, emit, progress, specs, probe_rank1, local_argv=local_argv
        )
    per_rank: dict[int, list[Check]] = {}
    evidence: Evidence | None = None
    for r in pair.headless_ranks:
        say(f"-- rank 0 ({pair.spark1}) and rank {r} ({pair.node_addr(r)}) --")

        def shown(check: Check, r: int = r) -> None:
            emit(renamed(check, r))

        def said(line: str, r: int = r) -> None:
            if progress is not None:
                progress(_SECOND.sub(lambda m: renamed_word(m.group(1), r), line))

        checks, evidence = runner.run(
            pair.with_head(r), overlay_want, shown, said, specs, probe_rank1, local_argv
        )
        per_rank[r] = [renamed(c, r) for c in checks]
    assert evidence is not None  # a group has headless ranks
    merged = merge(per_rank)
    last = pair.nnodes - 1
    say(f"-- the group of {pair.nnodes}: each check's worst verdict over ranks 1-{last} --")
    for check in merged:  # what stops the group, once more, together (PASS/SKIP are above)
        if check.status in (FAIL, WARN):
            emit(check)
    if pair.cabling == cabling.RING and specs == CHECKS:
        ring = ring_check(pair)
        emit(ring)
        merged.append(ring)
    return merged, evidence
