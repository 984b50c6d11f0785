# SPDX-License-Identifier: MIT
"""Overlay: refuse to serve a model or draft whose checkpoint load left a parameter unfilled.

Why: a loader that drops checkpoint tensors serves anyway. On the DeepSeek-V4-Flash 0731
checkpoint the fork's DSpark draft loader skipped the shared experts' ``w1``/``w3`` (a
``logger.debug`` line): the draft ran on uninitialised memory, acceptance fell from 60 %
to 26 %, decode halved, and the output stayed correct because the target verifies every
token (tonyd2wild/DeepSeek-v4-Flash-0731-DSpark-1M-NVFP4-KV-2x-DGX-Spark "Patch 4",
eugr/spark-vllm-docker#331). vLLM's own check does not see it (``weight_check``'s
docstring says why); this one fails the boot in the worker, naming the parameters.

Where (the stack's hook points, ``hooks.py``):

* role ``weights``: ``DefaultModelLoader.load_weights(self, model, model_config)``, which
  loads the target and, through ``get_model``, the draft. For the call it puts a
  recorder on the model instance in front of ``model.load_weights``: the parameter
  names before and after, and the set of loaded names it returns. Then
  ``weight_check.compare``; an unfilled parameter raises ``UnfilledWeights``.
* role ``loader``: the draft's loader (upstream ``DSparkSpeculator.load_draft_model``,
  the fork's ``DSparkProposer.load_model``, the v1 proposers'
  ``SpecDecodeBaseProposer.load_model``). After it returns, the draft's deferred
  parameters (lm_head, embed_tokens: the target's by then) are checked to be aliased.
* role ``exempt``: ``BaseKVCacheMethod``, whose modules' parameters are exempt.

Default on (``VLLM_DSV4_WEIGHT_GUARD``, ``flags.py``): on a load that filled every
parameter it changes nothing but one INFO line per model; the cost is one set difference
over the parameter names. A model whose ``load_weights`` returns no set cannot be checked
and is let through with a warning. Other load formats (``--load-format dummy``,
``runai_streamer``, ``gguf``, ...) have their own loaders and are not checked.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from typing import Any

from . import hooks, weight_check

logger = logging.getLogger("dsv4_flash_overlays.weight_guard")

NAME = "weight-guard"
FLAG = "VLLM_DSV4_WEIGHT_GUARD"
PATCH_MARK = "_dsv4_weight_guard_patch"
# On a draft, until its loader returns: (checkpoint, {name: weakref to the unfilled param}).
DEFERRED_ATTR = "_dsv4_weight_guard_deferred"

# (owner, attr, had_own, previous raw, our wrapper)
_installed: list[tuple[Any, str, bool, Any, Any]] = []
_lock = threading.Lock()


class UnfilledWeights(ValueError):
    """A parameter the checkpoint did not fill: the boot fails with this message."""


class _Recorder:
    """Stands in front of ``model.load_weights`` for one call of the checkpoint loader."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.called = False
        self.before: list[str] = []
        self.params: dict[str, Any] = {}
        self.loaded: Any = None
        self._had_own = "load_weights" in model.__dict__
        self._own = model.__dict__.get("load_weights")

    def __enter__(self) -> _Recorder:
        inner = self.model.load_weights  # the bound method (or an instance override)

        def load_weights(weights: Any, *args: Any, **kwargs: Any) -> Any:
            self.called = True
            self.params = dict(self.model.named_parameters())
            self.before = list(self.params)
            result = inner(weights, *args, **kwargs)
            # a copy: vLLM's own track_weights_loading adds its exempt names to this set
            self.loaded = set(result) if isinstance(result, (set, frozenset)) else result
            return result

        self.model.__dict__["load_weights"] = load_weights
        return self

    def __exit__(self, *exc: object) -> None:
        if self._had_own:
            self.model.__dict__["load_weights"] = self._own
        else:
            self.model.__dict__.pop("load_weights", None)


def _is_draft(model: Any, model_config: Any) -> bool:
    """vLLM builds a draft's ModelConfig with runner="draft" (vllm/config/speculative.py)."""
    return getattr(model_config, "runner_type", None) == "draft"


def _checkpoint(model_config: Any) -> str:
    return str(getattr(model_config, "model", None) or "?")


def _not_checked(kind: str, cls: str, why: str) -> None:
    logger.warning("weight guard: %s %s not checked: %s (pid %d)", kind, cls, why, os.getpid())


def check_load(rec: _Recorder, model_config: Any, kv_types: tuple[type, ...], built: Any) -> None:
    """The verdict on one load; raises UnfilledWeights, or logs one line and returns."""
    model = rec.model
    cls = type(model).__name__
    kind = "draft" if _is_draft(model, model_config) else "target"
    if not rec.called:
        return _not_checked(kind, cls, "the loader did not call model.load_weights")
    if not isinstance(rec.loaded, (set, frozenset)):
        return _not_checked(kind, cls, "its load_weights reports no set of loaded names")
    try:
        after = dict(model.named_parameters())
        exempt = weight_check.exemptions(model, kv_types, built)
        verdict = weight_check.compare(
            cls, rec.before, after, set(rec.loaded), exempt, kind == "draft"
        )
    except Exception as exc:  # our bug must not fail a boot: only an unfilled parameter may
        return _not_checked(kind, cls, f"the check failed ({type(exc).__name__}: {exc})")
    if verdict.missing:
        msg = weight_check.refusal(kind, cls, _checkpoint(model_config), verdict.missing, FLAG)
        logger.error("%s (pid %d)", msg, os.getpid())
        raise UnfilledWeights(msg)
    if verdict.deferred:
        refs = weight_check.deferred_refs(rec.params, verdict.deferred)
        model.__dict__[DEFERRED_ATTR] = (_checkpoint(model_config), refs)
    logger.info("%s (pid %d)", weight_check.summary(verdict), os.getpid())


def recheck_draft(draft: Any) -> None:
    """After the draft loader: every deferred parameter must now be the target's."""
    deferred = getattr(draft, "__dict__", {}).pop(DEFERRED_ATTR, None)
    if not deferred:
        return
    checkpoint, refs = deferred
    cls = type(draft).__name__
    left = weight_check.still_unfilled(refs, dict(draft.named_parameters()))
    if left:
        msg = weight_check.refusal("draft", cls, checkpoint, left, FLAG, weight_check.CAUSE_ALIAS)
        logger.error("%s (pid %d)", msg, os.getpid())
        raise UnfilledWeights(msg)
    logger.info(
        "weight guard: draft %s: %s are the target's: every parameter filled (pid %d)",
        cls,
        ", ".join(refs),
        os.getpid(),
    )


# -------------------------------------------------------------------------------- patch
def _weights_patch(original: Any, kv_types: tuple[type, ...], built: Any) -> Any:
    """Role weights: the checkpoint loader, then the comparison."""

    @functools.wraps(original)
    def load_weights(self: Any, model: Any, model_config: Any, *args: Any, **kwargs: Any) -> Any:
        with _Recorder(model) as rec:
            result = original(self, model, model_config, *args, **kwargs)
        check_load(rec, model_config, kv_types, built)
        return result

    return load_weights


def _loader_patch(original: Any) -> Any:
    """Role loader: the draft loader, then the deferred parameters re-checked."""

    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        draft = result if hasattr(result, "named_parameters") else getattr(self, "model", None)
        if draft is not None:
            recheck_draft(draft)
        return result

    return load


def _config_built(target: hooks.Target) -> tuple[str, ...]:
    """vLLM's own list when its loader module has one (0.32+), else 0.33's."""
    module = sys.modules.get(getattr(target.owner, "__module__", ""))
    built = getattr(module, "_CONFIG_BUILT_PARAMS", None)
    return tuple(built) if built else weight_check.CONFIG_BUILT_DEFAULT


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Install the guard on the stack's hook points; vLLM untouched when it cannot."""
    with _lock:
        res = hooks.resolve(NAME) if res is None else res
        if not res.ok:
            return hooks.Applied(res.reason)
        patched = [t for t in res.targets if t.hook.role in ("weights", "loader")]
        if any(getattr(t.func, PATCH_MARK, False) for t in patched):
            return hooks.Applied()  # idempotent
        kv_types = tuple(t.raw for t in res.role("exempt"))
        (weights,) = res.role("weights")
        built = _config_built(weights)
        for t in patched:
            if t.hook.role == "weights":
                wrapper = _weights_patch(t.func, kv_types, built)
            else:
                wrapper = _loader_patch(t.func)
            setattr(wrapper, PATCH_MARK, True)
            _installed.append((t.owner, t.attr, t.attr in vars(t.owner), t.raw, wrapper))
            setattr(t.owner, t.attr, wrapper)
        return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests; also a manual off switch in a live process). A hook point
    someone else has re-patched or restored since (the fp8 head wraps the same DSpark
    loader) is left as it is: putting our ``raw`` back would resurrect their old patch."""
    with _lock:
        while _installed:
            owner, attr, had_own, raw, wrapper = _installed.pop()
            if vars(owner).get(attr) is not wrapper:
                continue
            if had_own:
                setattr(owner, attr, raw)
            else:
                delattr(owner, attr)  # it was inherited: uncover the base class's again
