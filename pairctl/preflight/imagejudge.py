"""Judging an image probe against the declared stacks: which stack it is, what is known bad.

Pure functions of ``ImageFindings`` (``pairctl.preflight.imageprobe``) and ``Stack``s
(``pairctl.engine.stack``), so every verdict replays on recorded findings. The probed
values are named as components, the names a stack's ``components`` and ``known_bad``
entries use (``recipes/stacks/NAME.yaml``):

============================  ==========================================================
``vllm``                      ``vllm.__version__``
``torch``, ``torch-cuda``     ``torch.__version__``, ``torch.version.cuda``
``torch-matches-vllm``        ``yes`` / ``no``: torch satisfies the torch requirement the
                              vLLM distribution declares (the torch it was built against)
``nccl``                      every NCCL the image carries: the library vLLM's pynccl
                              loads, torch's, ``nvidia-nccl-cu*``, a conda ``nccl``
``flashinfer-python``         its version
``flashinfer-topk256-decode``  ``present`` / ``missing``: the SM12x TOPK=256 decode kernel
``flashinfer-topk256-prefill`` ``present`` / ``missing``: the TOPK=256 prefill dispatch
``nvidia-cutlass-dsl``        its version
``deep-gemm``                 its version
============================  ==========================================================

A known-bad entry's ``versions`` are PEP 440 specifiers or exact values
(``pairctl.engine.pep440.matches``); a component the image does not carry matches none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pairctl.engine import pep440
from pairctl.engine.stack import KnownBad, Stack
from pairctl.preflight.imageprobe import ImageFindings

PRESENT, MISSING = "present", "missing"
YES, NO = "yes", "no"
# Components whose value is a property the probe may fail to read (None: unknown), unlike
# a version (None: not installed, so nothing bad is installed).
PROPERTIES = ("flashinfer-topk256-decode", "flashinfer-topk256-prefill", "torch-matches-vllm")
# Other spellings a stack file may use for the same component.
ALIASES = {
    "flashinfer": "flashinfer-python",
    "cutlass-dsl": "nvidia-cutlass-dsl",
    "deepgemm": "deep-gemm",
    "nvidia-nccl": "nccl",
}


def canonical(name: str) -> str:
    """A component name as the judge spells it (``deep_gemm`` -> ``deep-gemm``)."""
    key = name.strip().lower().replace("_", "-")
    return ALIASES.get(key, key)


@dataclass(frozen=True)
class Reading:
    """One probed value of a component, and where in the image it was read."""

    value: str
    source: str


def _flag(value: bool | None) -> str | None:
    return None if value is None else (PRESENT if value else MISSING)


def torch_matches(f: ImageFindings) -> str | None:
    """``yes``/``no``: torch against the vLLM distribution's torch requirement; None when
    either is unknown (no torch, no requirement, markers not evaluated)."""
    if not f.torch or not f.torch_required:
        return None
    try:
        ok = all(pep440.contains(f.torch, spec) for spec in f.torch_required)
    except pep440.InvalidVersion:
        return None
    return YES if ok else NO


def components(f: ImageFindings) -> dict[str, list[Reading]]:
    """Every component the probe read → its readings (empty list: not in the image)."""
    nccl: list[Reading] = []
    if f.nccl_loaded:
        nccl.append(Reading(f.nccl_loaded, f"{f.nccl_library or 'libnccl.so.2'} as vLLM loads it"))
    if f.nccl_torch:
        nccl.append(Reading(f.nccl_torch, "torch.cuda.nccl.version()"))
    nccl += [Reading(v, name) for name, v in sorted(f.nccl_dists.items())]
    if f.nccl_conda:
        nccl.append(Reading(f.nccl_conda, "conda package nccl"))
    req = ", ".join(f.torch_required or []) or "none"
    plain = {
        "vllm": (f.vllm, "vllm.__version__"),
        "torch": (f.torch, "torch.__version__"),
        "torch-cuda": (f.torch_cuda, "torch.version.cuda"),
        "torch-matches-vllm": (
            torch_matches(f),
            f"torch {f.torch} vs {f.vllm_dist or 'vllm'} requirement torch{req}",
        ),
        "flashinfer-python": (f.flashinfer, "flashinfer-python"),
        "flashinfer-topk256-decode": (_flag(f.topk256_decode), f.topk256_decode_how),
        "flashinfer-topk256-prefill": (_flag(f.topk256_prefill), f.topk256_prefill_how),
        "nvidia-cutlass-dsl": (f.cutlass_dsl, "nvidia-cutlass-dsl"),
        "deep-gemm": (f.deep_gemm, "deep-gemm"),
    }
    out = {name: [Reading(v, src)] if v else [] for name, (v, src) in plain.items()}
    out["nccl"] = _distinct(nccl)
    return out


def _distinct(readings: Iterable[Reading]) -> list[Reading]:
    """One reading per value, its sources joined (torch and pip's NCCL are usually one)."""
    by_value: dict[str, list[str]] = {}
    for r in readings:
        by_value.setdefault(r.value, []).append(r.source)
    return [Reading(v, ", ".join(srcs)) for v, srcs in by_value.items()]


def matches_stack(version: str | None, stack: Stack) -> bool:
    """Does the probed vLLM version identify ``stack``: its ``vllm`` (a version, or PEP 440
    specifiers), or its declared ``vllm_match`` pattern?"""
    if not version:
        return False
    if pep440.matches(str(version), stack.vllm):
        return True
    return bool(stack.vllm_match) and pep440.matches(str(version), str(stack.vllm_match))


def exact(version: str | None, stack: Stack) -> bool:
    """``stack``'s own ``vllm`` (not only its wider ``vllm_match``) identifies ``version``."""
    return bool(version) and pep440.matches(str(version), stack.vllm)


def vllm_wanted(stack: Stack) -> str:
    """What vLLM ``stack`` runs, as a person reads it: ``0.27.1 (or >=0.27.1)``."""
    return stack.vllm + (f" (or {stack.vllm_match})" if stack.vllm_match else "")


def identify(version: str | None, stacks: Sequence[Stack]) -> list[Stack]:
    """The declared stacks whose vLLM this is (normally one)."""
    return [s for s in stacks if matches_stack(version, s)]


@dataclass(frozen=True)
class Hit:
    """A known-bad entry the image matches, with the reading that matched."""

    bad: KnownBad
    reading: Reading

    def line(self) -> str:
        what = f"{self.bad.component} {self.reading.value} ({self.reading.source})"
        return f"{what}: {self.bad.why} Fix: {self.bad.fix} (source: {self.bad.source})"


def known_bad_hits(f: ImageFindings, stack: Stack) -> tuple[list[Hit], list[str]]:
    """The stack's known-bad entries the image matches, and the ones it could not judge
    (a property the probe could not read)."""
    comps = components(f)
    hits, unknown = [], []
    for bad in stack.known_bad:
        name = canonical(bad.component)
        readings = comps.get(name)
        if readings is None:
            unknown.append(f"{bad.component}: not a probed component ({', '.join(sorted(comps))})")
            continue
        if not readings and name in PROPERTIES:
            unknown.append(f"{bad.component} not read: {_how(f, name)}")
            continue
        for r in readings:
            if any(pep440.matches(r.value, v) for v in bad.versions):
                hits.append(Hit(bad, r))
    return hits, unknown


def _how(f: ImageFindings, component: str) -> str:
    if component == "flashinfer-topk256-decode":
        return f.topk256_decode_how or "no FlashInfer"
    if component == "flashinfer-topk256-prefill":
        return f.topk256_prefill_how or "no FlashInfer"
    return f.torch_required_note or f.torch_error or "torch or vLLM's torch requirement unknown"


def drift(f: ImageFindings, stack: Stack) -> list[str]:
    """Components whose probed version differs from the one the stack declares."""
    comps = components(f)
    out = []
    for name, want in sorted(stack.components.items()):
        readings = comps.get(canonical(name), [])
        values = [r.value for r in readings]
        if not readings:
            out.append(f"{name}: stack {stack.name} declares {want}, the image has none")
        elif not all(pep440.matches(v, want) for v in values):
            have = "/".join(values)
            out.append(f"{name}: stack {stack.name} declares {want}, the image has {have}")
    return out


@dataclass(frozen=True)
class OverlayState:
    """One overlay as the plugin's own check reported it."""

    name: str
    applies: bool
    enabled: bool
    reason: str


def overlay_states(result: Mapping[str, object] | None) -> list[OverlayState]:
    """The plugin check's JSON (mods/dsv4-flash-overlays/dsv4_flash_overlays/check.py:
    ``{"overlays": {NAME: {"flag", "enabled", "resolvable", "reason"}}, "stack", "table"}``)
    → one state per overlay, in its order."""
    if not isinstance(result, Mapping):
        return []
    table = result.get("overlays", result)
    if not isinstance(table, Mapping):
        return []
    out = []
    for name, raw in table.items():
        if isinstance(raw, bool):
            out.append(OverlayState(str(name), raw, True, ""))
        elif isinstance(raw, Mapping):
            applies = raw.get("resolvable", raw.get("applies", raw.get("ok")))
            reason = raw.get("reason") or raw.get("why") or raw.get("detail") or ""
            out.append(
                OverlayState(str(name), bool(applies), bool(raw.get("enabled", True)), str(reason))
            )
    return out
