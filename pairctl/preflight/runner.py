"""Running preflight: every check reported the moment its evidence is in.

``pairctl.preflight.probe.gather`` resolves the names, then probes both nodes at once; this module
runs each registered check as soon as the evidence it declares has arrived (config-only
checks at once, rank-0 checks when the local probe returns, rank-1 checks when ssh does),
so an operator watching a slow or unreachable rank 1 sees everything else already judged
and what is still awaited. The verdicts are exactly ``registry.decide``'s on the same
evidence, plus one rule no single check can apply: a PASS about a node whose name does not
resolve on this machine is not a PASS (it becomes SKIP, naming the name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight.check import PASS, SKIP, Check, CheckSpec, Inputs, Need
from pairctl.preflight.evidence import ArgvCheck, Evidence
from pairctl.preflight.probe import ARGV, IMAGE, NAMES, RANK0, RANK1, REACH, gather
from pairctl.preflight.registry import CHECKS

# The gather() stage after which each kind of evidence is complete.
STAGE_OF: dict[Need, str] = {
    Need.CONFIG: NAMES,
    Need.OVERLAY_SRC: NAMES,
    Need.NAMES: NAMES,
    Need.RANK0: RANK0,
    Need.SSH: RANK1,
    Need.RANK1: RANK1,
    Need.RANK1_IF_REACHED: RANK1,
    Need.ARGV: ARGV,
    Need.REACH: REACH,
    Need.IMAGE: IMAGE,
}


def unresolved_skip(spec: CheckSpec, check: Check, pair: ResolvedPair, ev: Evidence) -> Check:
    """A PASS judged on a node whose name does not resolve here becomes SKIP.

    Rank 0's probe runs on this machine whatever SPARK1 says, so with SPARK1 unresolvable
    a "port free on SPARK1" would really be about this machine. FAIL and WARN stand.
    """
    if check.status != PASS:
        return check
    names = []
    if Need.RANK0 in spec.needs and ev.resolved.get("SPARK1") is None:
        names.append(f"SPARK1 ({pair.spark1})")
    rank1 = {Need.RANK1, Need.RANK1_IF_REACHED} & set(spec.needs)
    if rank1 and ev.resolved.get("SPARK2") is None:
        names.append(f"SPARK2 ({pair.spark2})")
    if not names:
        return check
    return replace(
        check,
        status=SKIP,
        detail=f"not judged: {' and '.join(names)} does not resolve on this machine",
        remedy="",
    )


def run(
    pair: ResolvedPair,
    overlay_want: Mapping[str, str],
    emit: Callable[[Check], None],
    progress: Callable[[str], None] | None = None,
    specs: tuple[CheckSpec, ...] = CHECKS,
    probe_rank1: bool = True,
    local_argv: ArgvCheck | None = None,
) -> tuple[list[Check], Evidence]:
    """Gather evidence and ``emit`` each verdict as soon as it can be decided.

    Returns the verdicts in ``specs`` order (the report and JSON order) and the evidence.
    The argv check (vLLM's parser) runs only when some spec needs it: ``local_argv`` when a
    local vLLM already read the argv, else the image's parser once rank 0 is probed.
    """
    arrived: set[str] = set()
    verdicts: dict[str, Check] = {}

    def decide_ready(ev: Evidence, everything: bool = False) -> None:
        inputs = Inputs(pair, ev, overlay_want)
        for spec in specs:
            if spec.id in verdicts:
                continue
            if not everything and any(STAGE_OF[n] not in arrived for n in spec.needs):
                continue
            check = unresolved_skip(spec, spec.run(inputs), pair, ev)
            verdicts[spec.id] = check
            emit(check)

    def on_stage(stage: str, ev: Evidence) -> None:
        arrived.add(stage)
        decide_ready(ev)

    needs_argv = any(Need.ARGV in s.needs for s in specs)
    evidence = gather(
        pair,
        on_stage,
        progress,
        probe_rank1=probe_rank1,
        check_args=needs_argv,
        local_argv=local_argv,
        check_reach=any(Need.REACH in s.needs for s in specs),
        check_image=any(Need.IMAGE in s.needs for s in specs),
    )
    decide_ready(evidence, everything=True)  # rank 1 not probed: decide on what there is
    return [verdicts[s.id] for s in specs], evidence
