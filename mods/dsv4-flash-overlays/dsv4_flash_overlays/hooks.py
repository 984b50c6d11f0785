"""Where each overlay attaches, for the engine stack it runs in, and whether it still can.

The plugin runs inside an image whose vLLM is not ours to choose: the seed's image runs a
fork of vLLM 0.21, the official image runs upstream, the rehearsal runs the CPU build.
Their classes differ (upstream's DSpark draft is ``DSparkSpeculator`` +
``DSparkDeepseekV4ForCausalLM``; the fork's is ``DSparkProposer`` +
``DeepSeekV4DSparkModel``), so the hook points are data: the launcher puts the stack's
table (``recipes/stacks/NAME.yaml``, ``overlays:``) into the container variable
``DSV4_OVERLAY_HOOKS`` and this module resolves it: import the module, walk the
qualname, check the role's signature and the anchors (substrings the source must still
contain for the overlay's rewrite to be valid).

Without the variable (a plain ``vllm serve`` with the plugin pip-installed) the built-in
table is upstream's, the line every overlay was written and tested against (vLLM 0.33;
the same hook points hold in 0.27.1 and the CPU build 0.32). That default cannot
misapply: on any other vLLM the anchors or imports fail and the overlay says so.

This module imports nothing from vLLM at import time; ``resolve`` imports what a table
names.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .builtin_hooks import BUILTIN  # the built-in table (hooks.BUILTIN)
from .hookpoint import Hook

HOOKS_ENV = "DSV4_OVERLAY_HOOKS"
BUILTIN_STACK = "upstream"

# What each role means (the overlay modules implement them):
#   factory         a classmethod wrapped so the object it returns gets the cache
#   detok-init      a detokenizer's ``__init__(self, tokenizer, request)``, wrapped so it
#                   primes its decode stream with the prompt's tail
#   validate-ids    ``validate_token_ids(self, token_ids)``, wrapped to check only new ids
#   core-send       the API client's ``add_request_async(self, request)``, wrapped to send
#                   a prompt as a delta of an earlier one
#   core-receive    the engine core's ``preprocess_add_request(self, request)``, wrapped to
#                   rebuild such a prompt first
#   worker-send     the scheduler's ``schedule(self, ...)``, wrapped so new requests' prompts
#                   pickle for the workers as deltas
#   hasher-factory  a module's name for the function that makes the request block hasher,
#                   rebound so the hasher it makes reuses cached chains
#   draft-logits    ``(self, hidden_states) -> logits``, replaced by the fp8 draft head
#   draft-head-arg  a draft function taking the head as ``lm_head``: wrapped, and called
#                   with the fp8 stand-in in its place
#   loader          the speculative draft's loader, wrapped: after it returns, the overlay
#                   acts on the loaded draft (fp8 head: builds its copy before capture;
#                   weight guard: re-checks the parameters left to the target's aliases)
#   weights         ``load_weights(self, model, model_config)`` of the checkpoint loader,
#                   wrapped: what ``model.load_weights`` reports loaded is compared with
#                   the model's parameters
#   exempt          a quant-method class: parameters of a module using it need not come
#                   from the checkpoint (vLLM's KV-cache scales)
#   spin-init       a constructor taking ``busy_loop_s``: wrapped, so a call that leaves it
#                   out gets the spin budget instead of the default
#   check           not patched: its anchors must hold for the rewrite to be valid
ROLES = (
    "factory",
    "detok-init",
    "validate-ids",
    "core-send",
    "core-receive",
    "worker-send",
    "hasher-factory",
    "draft-logits",
    "draft-head-arg",
    "loader",
    "weights",
    "exempt",
    "spin-init",
    "check",
)
# Per overlay: the roles it may use, and groups of which exactly one hook must be given.
ALLOWED: dict[str, frozenset[str]] = {
    "incremental-encode-cache": frozenset({"factory", "check"}),
    "fp8-draft-head": frozenset({"draft-logits", "draft-head-arg", "loader", "check"}),
    "weight-guard": frozenset({"weights", "loader", "exempt", "check"}),
    "incremental-block-hashes": frozenset({"hasher-factory", "check"}),
    "incremental-detokenizer": frozenset({"detok-init", "check"}),
    "incremental-prompt-handoff": frozenset(
        {"validate-ids", "core-send", "core-receive", "worker-send", "check"}
    ),
    "spin-budget": frozenset({"spin-init", "check"}),
}
REQUIRED: dict[str, tuple[frozenset[str], ...]] = {
    "incremental-encode-cache": (frozenset({"factory"}),),
    "fp8-draft-head": (frozenset({"draft-logits", "draft-head-arg"}),),
    "weight-guard": (frozenset({"weights"}),),
    "incremental-block-hashes": (frozenset({"hasher-factory"}),),
    "incremental-detokenizer": (frozenset({"detok-init"}),),
    "incremental-prompt-handoff": (
        frozenset({"validate-ids"}),
        frozenset({"core-send"}),
        frozenset({"core-receive"}),
        frozenset({"worker-send"}),
    ),
    "spin-budget": (frozenset({"spin-init"}),),
}
# Parameters a role's function must take (the rewrite passes or replaces them by name).
ROLE_PARAMS: dict[str, tuple[str, ...]] = {
    "draft-logits": ("self", "hidden_states"),
    "draft-head-arg": ("lm_head", "logits_processor"),
    "weights": ("self", "model", "model_config"),
    "hasher-factory": ("caching_hash_fn",),
    "detok-init": ("self", "tokenizer", "request"),
    "validate-ids": ("self", "token_ids"),
    "core-send": ("self", "request"),
    "core-receive": ("self", "request"),
    "worker-send": ("self",),
    "spin-init": ("self", "is_reader", "busy_loop_s"),
}


@dataclass(frozen=True)
class Table:
    """The hook points of one stack; ``error`` when the variable could not be read."""

    stack: str
    origin: str  # "env" (the launcher's DSV4_OVERLAY_HOOKS) or "built-in"
    hooks: tuple[Hook, ...] = ()
    unavailable: Mapping[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def label(self) -> str:
        if self.origin == "env":
            return f"stack {self.stack}"
        return f"built-in {self.stack} table ({HOOKS_ENV} unset)"

    def for_overlay(self, overlay: str) -> tuple[Hook, ...]:
        return tuple(h for h in self.hooks if h.overlay == overlay)


def builtin_table() -> Table:
    return Table(BUILTIN_STACK, "built-in", BUILTIN)


def parse_table(text: str) -> Table:
    """The table in ``text`` (Stack.hooks_json's format); a Table with ``error`` if bad."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("hooks"), list):
            raise ValueError("expected an object with a 'hooks' list")
        stack = str(data.get("stack") or "?")
        hooks = []
        for raw in data["hooks"]:
            if not isinstance(raw, dict) or not raw.get("module") or not raw.get("qualname"):
                raise ValueError(f"hook {raw!r} needs overlay, module and qualname")
            anchors = raw.get("anchors") or []
            if not isinstance(anchors, list):
                raise ValueError(f"hook {raw['qualname']}: anchors must be a list")
            hooks.append(
                Hook(
                    str(raw.get("overlay", "")),
                    str(raw["module"]),
                    str(raw["qualname"]),
                    str(raw.get("role") or "check"),
                    tuple(str(a) for a in anchors),
                )
            )
        unavailable = data.get("unavailable") or {}
        if not isinstance(unavailable, dict):
            raise ValueError("'unavailable' must map an overlay to its reason")
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return Table("?", "env", error=f"{HOOKS_ENV} is not a hook table ({exc})")
    return Table(stack, "env", tuple(hooks), {str(k): str(v) for k, v in unavailable.items()})


def load_table(environ: Mapping[str, str] | None = None) -> Table:
    """The stack's table from HOOKS_ENV, or the built-in upstream table when it is unset."""
    env = os.environ if environ is None else environ
    text = env.get(HOOKS_ENV, "")
    return parse_table(text) if text.strip() else builtin_table()


class HookError(Exception):
    """A hook point that does not resolve; the message says why, in a few words."""


@dataclass(frozen=True)
class Target:
    """A resolved hook point: the attribute ``attr`` of ``owner`` is ``func``."""

    hook: Hook
    owner: Any
    attr: str
    raw: Any  # what the class holds (a classmethod object stays one)
    func: Any  # the plain function behind it


def _walk(hook: Hook) -> tuple[Any, str, Any]:
    try:
        obj: Any = importlib.import_module(hook.module)
    except Exception as exc:  # any import failure means: not this stack's vLLM
        raise HookError(f"cannot import {hook.module} ({type(exc).__name__}: {exc})") from exc
    parts = hook.qualname.split(".")
    for name in parts[:-1]:
        try:
            obj = getattr(obj, name)
        except AttributeError as exc:
            raise HookError(f"{hook.module} has no {name}") from exc
    try:
        raw = inspect.getattr_static(obj, parts[-1])
    except AttributeError as exc:
        raise HookError(f"{'.'.join([hook.module, *parts[:-1]])} has no {parts[-1]}") from exc
    return obj, parts[-1], raw


def resolve_hook(hook: Hook) -> Target:
    """Import, walk, check the role's shape and the anchors; HookError says what failed."""
    if hook.role not in ROLES:
        raise HookError(f"unknown role {hook.role!r} (known: {', '.join(ROLES)})")
    owner, attr, raw = _walk(hook)
    func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    if hook.role == "factory" and not isinstance(raw, classmethod):
        raise HookError("is not a classmethod")
    if hook.role == "exempt" and not isinstance(raw, type):
        raise HookError("is not a class")
    if hook.role in ROLE_PARAMS:
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError) as exc:
            raise HookError(f"has no signature ({exc})") from exc
        missing = [p for p in ROLE_PARAMS[hook.role] if p not in params]
        if missing:
            raise HookError(f"takes no parameter {', '.join(missing)}")
    if hook.anchors:
        try:
            src = inspect.getsource(func)  # follows __wrapped__: our own wrappers read through
        except (OSError, TypeError) as exc:
            raise HookError(f"source not readable ({exc})") from exc
        missing = [a for a in hook.anchors if a not in src]
        if missing:
            raise HookError(f"does not contain {missing[0]!r}")
    return Target(hook, owner, attr, raw, func)


@dataclass(frozen=True)
class Resolution:
    """An overlay's hook points in this process: targets by role, or why it cannot apply."""

    overlay: str
    table: Table
    targets: tuple[Target, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    def role(self, role: str) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.hook.role == role)


def _shape_reason(overlay: str, hooks: tuple[Hook, ...]) -> str:
    allowed = ALLOWED.get(overlay)
    if allowed is None:
        return f"no overlay called {overlay!r}"
    for h in hooks:
        if h.role not in allowed:
            return f"hook {h.where} has role {h.role!r}, not one of {', '.join(sorted(allowed))}"
    for group in REQUIRED.get(overlay, ()):
        found = [h for h in hooks if h.role in group]
        if len(found) != 1:
            need = " or ".join(sorted(group))
            return f"declares {len(found)} {need} hook points, needs exactly one"
    return ""


def resolve(overlay: str, table: Table | None = None) -> Resolution:
    """Resolve every hook point ``table`` declares for ``overlay`` (first failure wins)."""
    table = load_table() if table is None else table
    if table.error:
        return Resolution(overlay, table, reason=f"{table.label}: {table.error}")
    if overlay in table.unavailable:
        return Resolution(overlay, table, reason=f"{table.label}: {table.unavailable[overlay]}")
    hooks = table.for_overlay(overlay)
    if not hooks:
        return Resolution(overlay, table, reason=f"{table.label} declares no hook points for it")
    shape = _shape_reason(overlay, hooks)
    if shape:
        return Resolution(overlay, table, reason=f"{table.label}: {shape}")
    targets = []
    for hook in hooks:
        try:
            targets.append(resolve_hook(hook))
        except HookError as exc:
            why = f"{table.label}: hook {hook.where} ({hook.role}): {exc}"
            return Resolution(overlay, table, reason=why)
    return Resolution(overlay, table, tuple(targets))


@dataclass(frozen=True)
class Applied:
    """What an overlay's ``apply`` returns: true when installed (now or before), else the
    reason it is not, in a few words (register() logs it in the overlay's one line);
    ``detail`` is what an installed overlay adds to that line (e.g. the value it set)."""

    reason: str = ""
    detail: str = ""

    def __bool__(self) -> bool:
        return not self.reason


def vllm_version(import_it: bool = False) -> str:
    """The running vLLM's version (what the stack's ``vllm:`` names), or 'unknown'."""
    import sys

    mod = sys.modules.get("vllm")
    if mod is None and import_it:
        try:
            mod = importlib.import_module("vllm")
        except Exception:
            mod = None
    if mod is not None and getattr(mod, "__version__", None):
        return str(mod.__version__)
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:
        return "unknown"
