"""Does the image run the recipe's engine stack, with no component known to be bad?

The image probe (``pairctl.preflight.imageprobe``) ran the image's own interpreter on each
node; these checks judge what it read (``pairctl.preflight.imagejudge``): which declared
stack the image's vLLM is (a recipe/image mismatch is refused, naming both and the fix),
the stack's known-bad versions (each refusal with its fix and source), and which overlays
the plugin's own check says will apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pairctl.engine import stack as stacks
from pairctl.engine.stack import Stack
from pairctl.pair.config import ConfigError
from pairctl.preflight import imagejudge as judge
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN, Check, CheckSpec, Need
from pairctl.preflight.imageprobe import NOT_ON_NODE, ImageProbe

STACK_FIX = (
    "make the pair's stack and its image agree: name the stack the image runs "
    "(ENGINE_STACK=NAME in the env file, or stack: NAME in the recipe; recipes/stacks/ "
    "declares them), or set IMAGE to an image of the pair's stack (the detail names it; "
    "launch/dspark_launch.sh image ship copies it to rank 1)"
)


def declared_stacks() -> list[Stack]:
    """Every stack in recipes/stacks/ that loads (a broken one cannot identify an image)."""
    out = []
    for name in stacks.names():
        try:
            out.append(stacks.load_stack(name))
        except ConfigError:
            continue
    return out


def _probed(probes: Mapping[str, ImageProbe]) -> tuple[list[ImageProbe], list[str]]:
    """The probes that ran, and one line per node whose probe failed (a node without the
    image is PF-IMAGE-MATCH's to report, not a failure here)."""
    ordered = [p for _, p in sorted(probes.items())]
    ran = [p for p in ordered if p.ran and p.findings]
    failed = [f"{p.where}: {p.detail}" for p in ordered if not p.ran and p.detail != NOT_ON_NODE]
    return ran, failed


def _nodes(probes: Sequence[ImageProbe]) -> str:
    return " and ".join(p.where.split(" (")[0] for p in probes)


def _image_ref(s: Stack) -> str:
    return s.image_default or s.pull or (f"built from {s.dockerfile}" if s.dockerfile else s.name)


def check_stack(
    image: str, want: Stack, declared: Sequence[Stack], probes: Mapping[str, ImageProbe]
) -> Check:
    """PF-IMAGE-STACK: the probed vLLM identifies ``want``, on every node probed."""
    ran, failed = _probed(probes)
    if not ran and not failed:
        return PF_IMAGE_STACK.verdict(SKIP, f"{image} is on no node yet (see PF-IMAGE-MATCH)")
    if failed:
        return PF_IMAGE_STACK.verdict(
            FAIL,
            f"the image's interpreter {want.interpreter} (stack {want.name}) did not run: "
            + "; ".join(failed)
            + f". An image of stack {want.name} has it; is {image} one?",
        )
    versions = {p.findings.vllm for p in ran if p.findings}
    if None in versions:
        errs = "; ".join(f"{p.where}: {p.findings.vllm_error}" for p in ran if p.findings)
        return PF_IMAGE_STACK.verdict(
            FAIL, f"{want.interpreter} in {image} has no vLLM ({errs}); stack {want.name} runs one"
        )
    if len(versions) > 1:
        seen = ", ".join(f"{p.where} {p.findings.vllm}" for p in ran if p.findings)
        return PF_IMAGE_STACK.verdict(FAIL, f"the nodes run different vLLMs: {seen}")
    version = next(iter(versions))
    others = [s for s in judge.identify(version, declared) if s.name != want.name]
    # a stack whose own vllm is this version wins over one whose wider pattern admits it
    closer = [s for s in others if judge.exact(version, s)]
    if judge.matches_stack(version, want) and (judge.exact(version, want) or not closer):
        how = "" if judge.exact(version, want) else f" (its vllm_match {want.vllm_match})"
        return PF_IMAGE_STACK.verdict(
            PASS, f"{image} runs vLLM {version} on {_nodes(ran)}: stack {want.name}{how}"
        )
    others = closer or others
    head = (
        f"the pair's stack {want.name} runs vLLM {judge.vllm_wanted(want)}, but {image} runs vLLM "
        f"{version} ({_nodes(ran)})"
    )
    if others:
        is_ = " or ".join(s.name for s in others)
        return PF_IMAGE_STACK.verdict(
            FAIL,
            f"{head}, which is stack {is_}: set ENGINE_STACK={others[0].name} in the env file "
            f"(or stack: {others[0].name} in the recipe), or IMAGE= an image of stack "
            f"{want.name} ({_image_ref(want)})",
        )
    known = ", ".join(f"{s.name} {judge.vllm_wanted(s)}" for s in declared) or "none"
    return PF_IMAGE_STACK.verdict(
        FAIL,
        f"{head}, which no declared stack runs (declared: {known}): set IMAGE= an image of "
        f"stack {want.name} ({_image_ref(want)}), or declare the image's stack in recipes/stacks/",
    )


PF_IMAGE_STACK = CheckSpec(
    "PF-IMAGE-STACK",
    title="the image's own interpreter (the stack's, in a --rm container, cached by image "
    "ID) reports the vLLM version of the pair's engine stack (ENGINE_STACK, else the "
    "recipe's stack:), on every node probed",
    remedy=STACK_FIX,
    needs=(Need.CONFIG, Need.IMAGE),
    decide=lambda v: check_stack(v.pair.image, v.pair.stack, declared_stacks(), v.image_probes),
)


def check_versions(want: Stack, probes: Mapping[str, ImageProbe]) -> Check:
    """PF-IMAGE-VERSIONS: none of the stack's known-bad versions; drift from its declared
    components only warns."""
    ran, _ = _probed(probes)
    if not ran:
        return PF_IMAGE_VERSIONS.verdict(SKIP, "the image was not probed (see PF-IMAGE-STACK)")
    bad: list[str] = []
    unknown: list[str] = []
    drifted: list[str] = []
    for p in ran:
        assert p.findings is not None
        hits, unk = judge.known_bad_hits(p.findings, want)
        bad += [f"{p.where.split(' (')[0]}: {h.line()}" for h in hits]
        unknown += [f"{p.where.split(' (')[0]}: {u}" for u in unk]
        drifted += [f"{p.where.split(' (')[0]}: {d}" for d in judge.drift(p.findings, want)]
    bad, unknown, drifted = _dedup(bad), _dedup(unknown), _dedup(drifted)
    if bad:
        return PF_IMAGE_VERSIONS.verdict(FAIL, " | ".join(bad))
    if unknown or drifted:
        return PF_IMAGE_VERSIONS.verdict(WARN, "not judged: " + " | ".join(unknown + drifted))
    first = ran[0].findings
    assert first is not None
    return PF_IMAGE_VERSIONS.verdict(
        PASS,
        f"{len(want.known_bad)} known-bad rule(s) of stack {want.name} clear; "
        + summary(first)
        + (" (cached)" if all(p.cached for p in ran) else ""),
    )


def _dedup(lines: list[str]) -> list[str]:
    """Both ranks saying the same thing once: "rank 0 and rank 1: ..."."""
    by_text: dict[str, list[str]] = {}
    for line in lines:
        where, _, text = line.partition(": ")
        by_text.setdefault(text, []).append(where)
    return [f"{' and '.join(w)}: {t}" for t, w in by_text.items()]


def summary(f) -> str:  # noqa: ANN001 - ImageFindings
    """What the image carries, in one line."""
    comps = judge.components(f)
    parts = []
    for name in ("vllm", "torch", "nccl", "flashinfer-python", "nvidia-cutlass-dsl", "deep-gemm"):
        vals = "/".join(r.value for r in comps[name]) or "none"
        parts.append(f"{name} {vals}")
    return ", ".join(parts)


PF_IMAGE_VERSIONS = CheckSpec(
    "PF-IMAGE-VERSIONS",
    title="no component of the image (NCCL, nvidia-cutlass-dsl, FlashInfer's SM12x TOPK=256 "
    "kernels, torch vs the torch vLLM was built against, ...) matches a known-bad entry of "
    "the pair's stack (recipes/stacks/NAME.yaml known_bad)",
    remedy="each refusal names its fix and source: rebuild or re-pull the image with the "
    "fixed component (or pick a stack whose image has it), then re-run",
    needs=(Need.CONFIG, Need.IMAGE),
    decide=lambda v: check_versions(v.pair.stack, v.image_probes),
)


def check_overlays_apply(probes: Mapping[str, ImageProbe]) -> Check:
    """PF-IMAGE-OVERLAYS: which overlays the plugin's own check says will apply."""
    ran, _ = _probed(probes)
    if not ran:
        return PF_IMAGE_OVERLAYS.verdict(SKIP, "the image was not probed (see PF-IMAGE-STACK)")
    lines: list[str] = []
    warn = False
    for p in ran:
        f = p.findings
        assert f is not None
        where = p.where.split(" (")[0]
        if not f.overlays_ran:
            lines.append(f"{where}: {f.overlays_detail or 'plugin check unavailable'}")
            warn = True
            continue
        states = judge.overlay_states(f.overlays)
        on = [s.name for s in states if s.enabled and s.applies]
        off = [
            f"{s.name} ({s.reason or 'does not apply'})"
            for s in states
            if s.enabled and not s.applies
        ]
        disabled = [s.name for s in states if not s.enabled]
        warn = warn or bool(off)
        table = (f.overlays or {}).get("table")
        text = f"will apply: {', '.join(on) or 'none'}"
        if off:
            text += f"; will NOT apply: {', '.join(off)}"
        if disabled:
            text += f"; switched off: {', '.join(disabled)}"
        if table:
            text += f" (hook points: {table})"
        lines.append(f"{where}: {text}")
    return PF_IMAGE_OVERLAYS.verdict(WARN if warn else PASS, " | ".join(_dedup(lines)))


PF_IMAGE_OVERLAYS = CheckSpec(
    "PF-IMAGE-OVERLAYS",
    title="the overlay plugin's own check (python -m dsv4_flash_overlays.check, in the image "
    "probe) says which overlays will apply; one that cannot apply WARNs and the pair still "
    "serves without it",
    remedy="run launch/dspark_launch.sh sync-overlays --env-file FILE (an old plugin has no "
    "check); an overlay that does not apply names why (its hook point is not in this "
    "stack's vLLM): the pair serves without it",
    needs=(Need.IMAGE,),
    decide=lambda v: check_overlays_apply(v.image_probes),
)
