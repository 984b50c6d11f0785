"""Engine stacks as data: which vLLM an image runs, and everything that depends on it.

A recipe says what to serve; a stack says what serves it. The seed's image runs a fork of
vLLM 0.21 from a micromamba env at ``/opt/env``; the official image runs upstream vLLM from
``/usr/local``; the offline rehearsal runs the CPU build. Each is one YAML file in
``recipes/stacks/`` and this module is the only reader: the interpreter and entrypoint, the
container env (every variable with its public source), the flags that differ from the
recipe, boot-log markers, overlay hook points, timeouts, the concurrency policy and the
known-bad component versions. Nothing else in the code names a stack's paths or versions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pairctl import home
from pairctl.engine import pep440
from pairctl.pair.config import ConfigError

SUPPORTED_STACK_VERSIONS = (1,)
DEFAULT_STACK = "fork"
# The container variable that carries the stack's overlay hook points to the plugin (which
# runs inside the image and cannot read recipes/stacks/): JSON, see Stack.hooks_json.
HOOKS_ENV = "DSV4_OVERLAY_HOOKS"
STACKS_DIR = Path("recipes") / "stacks"
TOP_KEYS = {
    "stack_version",
    "name",
    "description",
    "vllm",
    "vllm_match",
    "image",
    "interpreter",
    "entrypoint",
    "paths_source",
    "env",
    "flags",
    "kv_cache_dtype",
    "moe_backend",
    "boot_markers",
    "boot_markers_replace",
    "overlays",
    "timeouts",
    "concurrency",
    "components",
    "known_bad",
    "tradeoffs",
}
IMAGE_KEYS = {"default", "obtain", "dockerfile", "pull", "source"}
OBTAIN = ("build", "pull", "rehearsal")
FLAG_ACTIONS = ("set", "add", "drop")
TIMEOUT_KEYS = {"engine_ready_s", "first_boot_s", "source"}
CONCURRENCY_KEYS = {"max_num_seqs", "requires_patch", "without_patch", "source"}
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class EnvVar:
    """One container variable the stack needs, and where a peer (or vLLM) says so.

    ``prepend``: the value goes in front of the image's own value of the variable (``PATH``,
    ``LD_LIBRARY_PATH``: peers ``export PATH=/opt/env/bin:...:$PATH``), joined with ``:``;
    the image's value is read on the node (``docker image inspect``), like PYTHONPATH's.
    """

    name: str
    value: str
    source: str
    prepend: bool = False


@dataclass(frozen=True)
class FlagChange:
    """A ``vllm serve`` flag this stack sets, adds (a switch) or drops relative to the recipe.

    ``set`` with a value replaces the recipe's value or adds the flag; ``add`` adds a switch
    (``--trust-remote-code``); ``drop`` removes the recipe's flag (a GPU-only flag on CPU).
    """

    name: str
    action: str
    value: Any
    source: str


@dataclass(frozen=True)
class BootMarker:
    """A log substring this stack's vLLM prints, the boot phase it starts, and its source."""

    text: str
    phase: str
    source: str


@dataclass(frozen=True)
class HookPoint:
    """Where an overlay attaches in this stack's vLLM: module, attribute path, method."""

    overlay: str
    module: str
    qualname: str
    source: str
    # Substrings the method's source must contain for the overlay's rewrite to be valid
    # (an anchor that moved means the overlay must not apply).
    anchors: tuple[str, ...] = ()
    # What the overlay does there (mods/dsv4-flash-overlays/dsv4_flash_overlays/hooks.py
    # ROLES: factory, draft-logits, draft-head-arg, loader, check); "" reads as check.
    role: str = ""


@dataclass(frozen=True)
class OverlayGap:
    """An overlay this stack cannot carry at all (``overlays: {NAME: {unavailable, source}}``):
    the plugin reports ``why`` instead of resolving anything."""

    overlay: str
    why: str
    source: str


@dataclass(frozen=True)
class KnownBad:
    """A component version this stack must not run with, why, and what to do instead."""

    component: str
    versions: tuple[str, ...]  # exact versions or PEP 440 specifiers ("<0.6", "==2.28.9")
    why: str
    fix: str
    source: str


@dataclass(frozen=True)
class Concurrency:
    """How many sequences the stack may batch: ``max_num_seqs`` when the image carries
    ``requires_patch``, else ``without_patch`` (None: no patch needed)."""

    max_num_seqs: int | None = None
    requires_patch: str | None = None
    without_patch: int | None = None
    source: str = ""


@dataclass(frozen=True)
class Stack:
    """One declared engine stack (``recipes/stacks/NAME.yaml``)."""

    name: str
    path: str
    description: str
    vllm: str  # the version its vLLM reports (``vllm.__version__``); the probe's identity
    image_default: str | None
    obtain: str  # build | pull | rehearsal
    dockerfile: str | None
    pull: str | None
    image_source: str
    interpreter: str  # absolute path of the image's python
    entrypoint: str  # absolute path (or name) of the image's vllm console script
    env: tuple[EnvVar, ...]
    flags: tuple[FlagChange, ...]
    kv_cache_dtype: str | None
    moe_backend: str | None
    boot_markers: tuple[BootMarker, ...]
    overlays: tuple[HookPoint, ...]
    engine_ready_s: int | None
    first_boot_s: int | None
    concurrency: Concurrency
    components: dict[str, str] = field(default_factory=dict)  # expected versions, by name
    known_bad: tuple[KnownBad, ...] = ()
    tradeoffs: str = ""
    # Where the interpreter and entrypoint paths come from, and the timeouts.
    paths_source: str = ""
    timeouts_source: str = ""
    # True: ``boot_markers`` are this vLLM's whole list; False (default): they are added to
    # pairctl.engine.bootlog's vLLM 0.33 needles, a marker with a needle's text replacing it.
    boot_markers_replace: bool = False
    overlay_gaps: tuple[OverlayGap, ...] = ()
    # PEP 440 specifiers for other vLLM versions that are this stack too (the official line
    # after the release it was measured on: ">=0.27.1"); None: ``vllm`` exactly.
    vllm_match: str | None = None

    def summary(self) -> str:
        """One line for ``plan``: which vLLM runs, and how the container starts it."""
        return (
            f"stack {self.name} ({self.path}): vLLM {self.vllm}, entrypoint "
            f"{self.entrypoint}, interpreter {self.interpreter}"
        )

    def env_map(self) -> dict[str, str]:
        return {v.name: v.value for v in self.env}

    def hook_points(self, overlay: str) -> tuple[HookPoint, ...]:
        return tuple(h for h in self.overlays if h.overlay == overlay)

    def hooks_json(self) -> str:
        """The value of HOOKS_ENV: ``{"stack": NAME, "hooks": [{overlay, module, qualname,
        anchors[, role]}, ...][, "unavailable": {overlay: why}]}``, compact, in declaration
        order (role and unavailable only where declared)."""
        hooks = []
        for h in self.overlays:
            entry: dict[str, Any] = {
                "overlay": h.overlay,
                "module": h.module,
                "qualname": h.qualname,
                "anchors": list(h.anchors),
            }
            if h.role:
                entry["role"] = h.role
            hooks.append(entry)
        out: dict[str, Any] = {"stack": self.name, "hooks": hooks}
        if self.overlay_gaps:
            out["unavailable"] = {g.overlay: g.why for g in self.overlay_gaps}
        return json.dumps(out, separators=(",", ":"))


def _err(path: str, msg: str) -> ConfigError:
    return ConfigError(f"stack {path}: {msg}")


def _str(data: dict[str, Any], key: str, path: str, required: bool = True) -> str | None:
    val = data.get(key)
    if val is None and not required:
        return None
    if not isinstance(val, str) or not val.strip():
        raise _err(path, f"{key} must be a non-empty string")
    return val


def _sourced(raw: Any, where: str, path: str) -> str:
    if not isinstance(raw, dict) or not str(raw.get("source") or "").strip():
        raise _err(path, f"{where}: every entry needs a source (a public file, PR or doc)")
    return " ".join(str(raw["source"]).split())


def _overlays(raw_overlays: Any, path: str) -> tuple[tuple[HookPoint, ...], tuple[OverlayGap, ...]]:
    """``overlays:``: each overlay maps to a list of hook points, or to
    ``{unavailable: why, source: ...}`` when this stack cannot carry it."""
    overlays = raw_overlays or {}
    if not isinstance(overlays, dict):
        raise _err(path, "overlays must map an overlay name to its hook points")
    hooks: list[HookPoint] = []
    gaps: list[OverlayGap] = []
    for overlay, points in overlays.items():
        if isinstance(points, dict):
            src = _sourced(points, f"overlays.{overlay}", path)
            why = " ".join(str(points.get("unavailable") or "").split())
            if not why or set(points) - {"unavailable", "source"}:
                raise _err(path, f"overlays.{overlay}: a mapping says unavailable: WHY, source")
            gaps.append(OverlayGap(str(overlay), why, src))
            continue
        for raw in points or []:
            src = _sourced(raw, f"overlays.{overlay}", path)
            if not raw.get("module") or not raw.get("qualname"):
                raise _err(path, f"overlays.{overlay}: each hook point needs module and qualname")
            role = str(raw.get("role") or "")
            if role and not _NAME_RE.match(role):
                raise _err(path, f"overlays.{overlay}: role {role!r} must be a lower-case name")
            anchors = tuple(str(a) for a in raw.get("anchors") or ())
            hooks.append(
                HookPoint(str(overlay), raw["module"], raw["qualname"], src, anchors, role)
            )
    return tuple(hooks), tuple(gaps)


def parse_stack(data: Any, path: str = "<stack>") -> Stack:
    """Validate a loaded YAML document and return a Stack, or raise ConfigError."""
    if not isinstance(data, dict):
        raise _err(path, "must be a YAML mapping")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _err(path, f"unknown key(s) {sorted(unknown)}; allowed {sorted(TOP_KEYS)}")
    if data.get("stack_version") not in SUPPORTED_STACK_VERSIONS:
        raise _err(path, f"stack_version must be one of {list(SUPPORTED_STACK_VERSIONS)}")
    name = _str(data, "name", path)
    assert name is not None
    if not _NAME_RE.match(name):
        raise _err(path, f"name {name!r} must be lower-case letters, digits and '-'")
    image = data.get("image") or {}
    if not isinstance(image, dict) or set(image) - IMAGE_KEYS:
        raise _err(path, f"image must be a mapping with keys {sorted(IMAGE_KEYS)}")
    obtain = image.get("obtain")
    if obtain not in OBTAIN:
        raise _err(path, f"image.obtain must be one of {list(OBTAIN)}")
    if obtain == "build" and not image.get("dockerfile"):
        raise _err(path, "image.obtain build needs image.dockerfile")
    if obtain == "pull" and "@sha256:" not in str(image.get("pull") or ""):
        raise _err(path, "image.obtain pull needs image.pull pinned by digest (repo@sha256:...)")
    env: list[EnvVar] = []
    for raw in data.get("env") or []:
        src = _sourced(raw, "env", path)
        key = raw.get("name")
        if not isinstance(key, str) or not _ENV_RE.match(key) or raw.get("value") is None:
            raise _err(path, f"env entry {raw!r} needs a variable name and a value")
        if set(raw) - {"name", "value", "source", "prepend"}:
            raise _err(path, f"env {key}: keys are name, value, source and prepend")
        prepend = raw.get("prepend", False)
        if not isinstance(prepend, bool):
            raise _err(path, f"env {key}: prepend must be true or false")
        env.append(EnvVar(key, str(raw["value"]), src, prepend))
    if len({v.name for v in env}) != len(env):
        raise _err(path, "env names a variable twice")
    flags: list[FlagChange] = []
    for raw in data.get("flags") or []:
        src = _sourced(raw, "flags", path)
        fname, action = raw.get("name"), raw.get("action")
        if not isinstance(fname, str) or not _FLAG_RE.match(fname):
            raise _err(path, f"flag name {fname!r} must be a vLLM long flag without '--'")
        if action not in FLAG_ACTIONS:
            raise _err(path, f"flag {fname}: action must be one of {list(FLAG_ACTIONS)}")
        if action == "set" and raw.get("value") is None:
            raise _err(path, f"flag {fname}: set needs a value")
        flags.append(FlagChange(fname, action, raw.get("value"), src))
    markers = [
        BootMarker(str(m["text"]), str(m["phase"]), _sourced(m, "boot_markers", path))
        for m in data.get("boot_markers") or []
        if isinstance(m, dict) and m.get("text") and m.get("phase")
    ]
    if len(markers) != len(data.get("boot_markers") or []):
        raise _err(path, "boot_markers entries need text, phase and source")
    replace = data.get("boot_markers_replace", False)
    if not isinstance(replace, bool):
        raise _err(path, "boot_markers_replace must be true or false")
    hooks, gaps = _overlays(data.get("overlays"), path)
    timeouts = data.get("timeouts") or {}
    if not isinstance(timeouts, dict) or set(timeouts) - TIMEOUT_KEYS:
        raise _err(path, f"timeouts must be a mapping with keys {sorted(TIMEOUT_KEYS)}")
    ready, first = timeouts.get("engine_ready_s"), timeouts.get("first_boot_s")
    for key, val in (("engine_ready_s", ready), ("first_boot_s", first)):
        if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val <= 0):
            raise _err(path, f"timeouts.{key} must be a positive number of seconds")
    if ready is not None and first is not None and ready < first:
        raise _err(
            path,
            f"timeouts.engine_ready_s ({ready}) is shorter than the first boot ({first} s): "
            "vLLM's API server would give up on the engine core mid-boot",
        )
    conc = data.get("concurrency") or {}
    if not isinstance(conc, dict) or set(conc) - CONCURRENCY_KEYS:
        raise _err(path, f"concurrency must be a mapping with keys {sorted(CONCURRENCY_KEYS)}")
    known_bad = []
    for raw in data.get("known_bad") or []:
        src = _sourced(raw, "known_bad", path)
        versions = raw.get("versions")
        if not raw.get("component") or not isinstance(versions, list) or not versions:
            raise _err(path, f"known_bad entry {raw!r} needs component and versions")
        if not raw.get("why") or not raw.get("fix"):
            raise _err(path, f"known_bad {raw['component']}: say why and the fix")
        known_bad.append(
            KnownBad(
                str(raw["component"]),
                tuple(str(v) for v in versions),
                " ".join(str(raw["why"]).split()),
                " ".join(str(raw["fix"]).split()),
                src,
            )
        )
    components = data.get("components") or {}
    if not isinstance(components, dict):
        raise _err(path, "components must map a component to its expected version")
    return Stack(
        name=name,
        path=path,
        description=" ".join(str(data.get("description") or "").split()),
        vllm=str(_str(data, "vllm", path)),
        image_default=image.get("default"),
        obtain=obtain,
        dockerfile=image.get("dockerfile"),
        pull=image.get("pull"),
        image_source=" ".join(str(image.get("source") or "").split()),
        interpreter=str(_str(data, "interpreter", path)),
        entrypoint=str(_str(data, "entrypoint", path)),
        env=tuple(env),
        flags=tuple(flags),
        kv_cache_dtype=data.get("kv_cache_dtype"),
        moe_backend=data.get("moe_backend"),
        boot_markers=tuple(markers),
        overlays=tuple(hooks),
        engine_ready_s=ready,
        first_boot_s=first,
        concurrency=Concurrency(
            max_num_seqs=conc.get("max_num_seqs"),
            requires_patch=conc.get("requires_patch"),
            without_patch=conc.get("without_patch"),
            source=" ".join(str(conc.get("source") or "").split()),
        ),
        components={str(k): str(v) for k, v in components.items()},
        known_bad=tuple(known_bad),
        tradeoffs=" ".join(str(data.get("tradeoffs") or "").split()),
        boot_markers_replace=replace,
        paths_source=" ".join(str(data.get("paths_source") or "").split()),
        timeouts_source=" ".join(str(timeouts.get("source") or "").split()),
        overlay_gaps=gaps,
        vllm_match=_vllm_match(data, path),
    )


def _vllm_match(data: dict[str, Any], path: str) -> str | None:
    """``vllm_match``: PEP 440 specifiers (``>=0.27.1``), checked here so a typo is a config
    error and not a stack that silently identifies nothing."""
    raw = data.get("vllm_match")
    if raw is None:
        return None
    text = str(raw)
    if not pep440.is_specifier(text):
        raise _err(path, f"vllm_match {text!r} must be PEP 440 specifiers, e.g. '>=0.27.1'")
    try:
        pep440.check_specifiers(text)
    except pep440.InvalidVersion as exc:
        raise _err(path, f"vllm_match: {exc}") from exc
    return text


def stacks_dir() -> Path:
    return home.project_root() / STACKS_DIR


def names() -> list[str]:
    """The declared stacks, by file name."""
    return sorted(p.stem for p in stacks_dir().glob("*.yaml"))


def load_stack(name: str) -> Stack:
    """The stack called ``name`` (``recipes/stacks/NAME.yaml``), validated."""
    if not _NAME_RE.match(name or ""):
        raise ConfigError(f"stack {name!r}: a stack name is lower-case letters, digits and '-'")
    p = stacks_dir() / f"{name}.yaml"
    if not p.is_file():
        raise ConfigError(
            f"stack {name!r} is not declared ({p} not found); declared: {', '.join(names())}"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise _err(str(p), f"invalid YAML: {exc}") from exc
    stack = parse_stack(data, str(p))
    if stack.name != name:
        raise _err(str(p), f"declares name {stack.name!r}; the file must be {stack.name}.yaml")
    return stack
