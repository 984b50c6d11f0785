# SPDX-License-Identifier: MIT
"""Overlay: DSpark *draft* logits from an fp8 copy of the lm_head shard.

Why: every DSpark draft step multiplies ``num_reqs * num_speculative_tokens`` rows (5 for
one stream, 120 at ``--max-num-seqs 24``) by the whole bf16 lm_head shard (64640 x 4096 =
530 MB at TP=2): bandwidth-bound. An e4m3 copy with per-row scales halves the bytes (the
``fp8_head`` package has the kernels, the numerics and the per-M choice of GEMM).

Where depends on the stack (its hook points, ``hooks.py``):

* upstream (vLLM 0.27.1-0.33, ``v1/worker/gpu/spec_decode/dspark/speculator.py``):
  ``DSparkSpeculator._sample_sequential`` calls ``model.compute_draft_logits``, which is
  ``compute_logits``. Role ``draft-logits``: ``compute_draft_logits`` is replaced by the
  same ``LogitsProcessor`` call with a stand-in lm_head.
* the fork (rafaelcaricio/vllm over vLLM 0.21, ``models/deepseek_v4/nvidia/dspark.py``):
  ``DeepSeekV4DSparkModel.draft(..., lm_head, logits_processor, ...)`` receives the head
  as an argument and uses it through ``logits_processor(lm_head, normed)`` (and, on its
  local-argmax path, ``lm_head.quant_method.apply``). Role ``draft-head-arg``: ``draft``
  is called with the stand-in in place of ``lm_head``.

Either way only the draft's head changes. The stand-in's ``quant_method.apply`` is the fp8
GEMM, it has the real head's ``tp_size`` and hands every other attribute
(``shard_indices``, ``weight``) to the real head, so the model's ``LogitsProcessor`` still
does the TP gather, vocab trim, soft-cap and scale. ``compute_logits``, which target-side
verification uses, stays bf16, so speculative decoding stays lossless: a worse draft token
can only lower acceptance, never change the output.

When: the fp8 copy is built once, right after the draft loads (role ``loader``:
upstream's ``DSparkSpeculator.load_draft_model``, the fork's ``DSparkProposer.load_model``,
after which the draft's lm_head is the target's), or lazily on the first eager call; never
inside a CUDA-graph capture. It is kept on the lm_head module, so a head the draft shares
with the target is copied once.

Falls back to bf16 and says why, when: a hook point does not resolve (register() logs it),
no CUDA device or SM < 8.9 (no e4m3), Triton missing, the lm_head is not a plain bf16 2-D
weight with an unquantized method, the LogitsProcessor asks for another head dtype, or K
is not a multiple of 128.

Memory: N * K bytes + 4 N for the scales per rank: 64640 * 4096 = 265 MB (+0.26 MB) at
TP=2, 530 MB for the unsharded head. The bf16 weight stays (the target needs it). The copy
is made at load time, before vLLM profiles memory, so KV-cache sizing accounts for it.

Not tracked: weights changed in place after load (RL weight sync, sleep-mode level 2
reload). The fp8 copy would then be stale: restart, or ``remove()`` before updating.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from typing import Any

import torch

from . import hooks

logger = logging.getLogger("dsv4_flash_overlays.dspark_nvidia")

NAME = "fp8-draft-head"
FLAG = "VLLM_DSPARK_FP8_DRAFT_HEAD"
PATCH_MARK = "_dsv4_fp8_draft_head_patch"
HEAD_ATTR = "_dsv4_fp8_draft_head"  # on the lm_head module: its stand-in, or False = bf16
MIN_CAPABILITY = (8, 9)  # e4m3 conversion instructions (Ada, Hopper, Blackwell, GB10)

_installed: list[tuple[Any, str, bool, Any]] = []  # (owner, attr, had_own, previous raw)
_lock = threading.Lock()
_first_call_logged = False


# ------------------------------------------------------------------------------ checks
def device_reason(device: torch.device | None = None) -> str | None:
    """None if this process's GPU can run the e4m3 kernel, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device in this process"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return f"GPU is SM {major}.{minor}, fp8 e4m3 needs SM >= 8.9"
    from . import fp8_head

    if not fp8_head.HAVE_TRITON:
        return "triton is not installed"
    return None


def head_reason(lm_head: Any, logits_processor: Any, hidden_size: int | None) -> str | None:
    """None if this lm_head can get an fp8 copy, else why not."""
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return "model has no lm_head.weight tensor"
    if weight.dtype != torch.bfloat16:
        return f"lm_head weight is {weight.dtype}, not bfloat16"
    method = type(getattr(lm_head, "quant_method", None)).__name__
    if method not in ("UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"):
        return f"lm_head is quantized ({method})"
    if weight.dim() != 2 or weight.shape[1] % 128 != 0 or weight.shape[0] == 0:
        return f"unexpected lm_head shape {tuple(weight.shape)}"
    if hidden_size is not None and weight.shape[1] != hidden_size:
        return f"lm_head K={weight.shape[1]} != hidden_size {hidden_size}"
    if getattr(logits_processor, "logits_as_input", False):
        return "logits processor takes logits as input"
    if getattr(logits_processor, "head_dtype", None) not in (None, torch.bfloat16):
        return f"logits processor wants head dtype {logits_processor.head_dtype}"
    return None


# ------------------------------------------------------------------------------- build
class _Fp8LmHead:
    """Stands in for the lm_head inside the draft: fp8 GEMM, the real head's ``tp_size``;
    any other attribute (``shard_indices``, ``weight``, ...) is the real head's."""

    def __init__(self, lm_head: Any, fp8: Any):
        self.tp_size = getattr(lm_head, "tp_size", 1)
        self.quant_method = self
        self.real = lm_head
        self.fp8 = fp8  # the fp8_head.Fp8Head: quantized weight, scales, per-M dispatch

    def __getattr__(self, name: str) -> Any:  # only for what this object lacks
        if name.startswith("__") or name in ("real", "fp8"):
            raise AttributeError(name)
        return getattr(self.real, name)

    @property
    def extra_bytes(self) -> int:
        return self.fp8.extra_bytes

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        _log_first_call(x.shape[0])
        y = self.fp8(x)
        return y if bias is None else y + bias


def prepare(lm_head: Any, logits_processor: Any, hidden_size: int | None) -> _Fp8LmHead | None:
    """The fp8 stand-in for ``lm_head`` (built once, kept on the head), or None (and one
    log line) when it must stay bf16."""
    if lm_head is None:
        return None
    state = lm_head.__dict__.get(HEAD_ATTR)
    if state is not None:
        return state or None
    reason = head_reason(lm_head, logits_processor, hidden_size)
    if reason is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        logger.warning("fp8 draft head: not built before CUDA-graph capture; this graph keeps bf16")
        return None
    if reason is not None:
        logger.warning("fp8 draft head: staying bf16 (pid %d): %s", os.getpid(), reason)
        lm_head.__dict__[HEAD_ATTR] = False
        return None
    from .fp8_head import Fp8Head

    weight = lm_head.weight
    stand_in = _Fp8LmHead(lm_head, Fp8Head(weight))
    lm_head.__dict__[HEAD_ATTR] = stand_in
    logger.info(
        "fp8 draft head: built e4m3 copy of lm_head shard %s on %s, +%.1f MB (pid %d)",
        tuple(weight.shape),
        weight.device,
        stand_in.extra_bytes / 1e6,
        os.getpid(),
    )
    return stand_in


def prepare_model(model: Any) -> _Fp8LmHead | None:
    """``prepare`` for a draft model that owns ``lm_head`` and ``logits_processor``."""
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    return prepare(
        getattr(model, "lm_head", None), getattr(model, "logits_processor", None), hidden
    )


def _log_first_call(rows: int) -> None:
    global _first_call_logged
    if not _first_call_logged:
        _first_call_logged = True
        logger.info("fp8 draft head: first call, %d rows (pid %d)", rows, os.getpid())


# -------------------------------------------------------------------------------- patch
def _draft_logits_patch(original: Any) -> Any:
    """Role draft-logits: ``compute_draft_logits(self, hidden_states)`` through the copy
    (the same LogitsProcessor call as ``compute_logits``, whose anchor the stack checks)."""

    @functools.wraps(original)
    def compute_draft_logits(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        stand_in = prepare_model(self)
        if stand_in is None:
            return original(self, hidden_states)
        return self.logits_processor(stand_in, self.model.norm(hidden_states))

    return compute_draft_logits


def _draft_head_arg_patch(original: Any) -> Any:
    """Role draft-head-arg: the draft function, called with the stand-in as ``lm_head``."""
    sig = inspect.signature(original)

    @functools.wraps(original)
    def draft(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        lm_head = bound.arguments["lm_head"]
        owner = bound.arguments.get("self")
        hidden = getattr(getattr(owner, "config", None), "hidden_size", None)
        stand_in = prepare(lm_head, bound.arguments["logits_processor"], hidden)
        if stand_in is None:
            return original(*args, **kwargs)
        bound.arguments["lm_head"] = stand_in
        return original(*bound.args, **bound.kwargs)

    return draft


def _loader_patch(original: Any) -> Any:
    """Role loader: the draft's loader, then the fp8 copy while still outside graph capture."""

    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        model = result if hasattr(result, "lm_head") else getattr(self, "model", None)
        try:
            prepare_model(model)
        except Exception as exc:  # never break a boot: the draft then builds lazily or stays bf16
            logger.warning(
                "fp8 draft head: eager build failed (%s: %s); will retry on first call",
                type(exc).__name__,
                exc,
            )
            lm_head = getattr(model, "lm_head", None)
            if lm_head is not None:
                lm_head.__dict__.pop(HEAD_ATTR, None)
        return result

    return load


_PATCHES = {
    "draft-logits": _draft_logits_patch,
    "draft-head-arg": _draft_head_arg_patch,
    "loader": _loader_patch,
}


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Install the overlay on the stack's hook points; vLLM untouched when it cannot."""
    with _lock:
        res = hooks.resolve(NAME) if res is None else res
        if not res.ok:
            return hooks.Applied(res.reason)
        patched = [t for t in res.targets if t.hook.role in _PATCHES]
        if any(getattr(t.func, PATCH_MARK, False) for t in patched):
            return hooks.Applied()  # idempotent
        reason = device_reason()
        if reason is not None:
            return hooks.Applied(reason)
        for t in patched:
            wrapper = _PATCHES[t.hook.role](t.func)
            setattr(wrapper, PATCH_MARK, True)
            _installed.append((t.owner, t.attr, t.attr in vars(t.owner), t.raw))
            setattr(t.owner, t.attr, wrapper)
        return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests; also a manual kill switch in a live process)."""
    with _lock:
        while _installed:
            owner, attr, had_own, raw = _installed.pop()
            if had_own:
                setattr(owner, attr, raw)
            else:
                delattr(owner, attr)  # it was inherited: uncover the base class's again
