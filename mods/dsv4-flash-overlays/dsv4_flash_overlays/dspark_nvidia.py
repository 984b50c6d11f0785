# SPDX-License-Identifier: MIT
"""Overlay: DSpark *draft* logits from an fp8 copy of the lm_head shard.

Why: vLLM 0.33's DSpark speculator (``v1/worker/gpu/spec_decode/dspark/speculator.py``,
``DSparkSpeculator._sample_sequential``) calls ``model.compute_draft_logits`` once per
draft step on ``num_reqs * num_speculative_tokens`` rows (5 for one stream, 120 at
``--max-num-seqs 24``; ``num_reqs`` is the CUDA-graph-padded batch). That GEMM streams the
whole bf16 lm_head shard (64640 x 4096 = 530 MB at TP=2) and is bandwidth-bound; an e4m3
copy with per-row scales halves the bytes (the ``fp8_head`` package has the kernels, the
numerics and the per-M choice of GEMM).

What changes: only ``DSparkDeepseekV4ForCausalLM.compute_draft_logits``. It still goes
through the model's own ``LogitsProcessor`` (TP gather, vocab trim, soft-cap, scale) but
with a stand-in lm_head whose ``quant_method.apply`` is the fp8 GEMM. ``compute_logits``,
which the target-side verification and everything else use, stays bf16, so speculative
decoding stays lossless: a worse draft token can only lower acceptance, never change
the output.

When: the fp8 copy is built once, right after the speculator loads the draft (wrapping
``DSparkSpeculator.load_draft_model``: the draft's lm_head is aliased from the target
there), or lazily on the first eager call; never inside a CUDA-graph capture.

Falls back to the original (bf16) and logs why, when: vLLM's source drifted from what
this was written against (markers below), no CUDA device or SM < 8.9 (no e4m3), Triton
missing, the lm_head is not a plain bf16 2-D weight with an unquantized method, the
LogitsProcessor asks for another head dtype, or K is not a multiple of 128.

Memory: N * K bytes + 4 N for the scales per rank: 64640 * 4096 = 265 MB (+0.26 MB) at
TP=2, 530 MB for the unsharded head. The bf16 weight stays (the target needs it). The copy
is made at load time, before vLLM profiles memory, so KV-cache sizing accounts for it.

Not tracked: weights changed in place after load (RL weight sync, sleep-mode level 2
reload). The fp8 copy would then be stale: restart, or ``remove()`` before updating.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any

import torch

logger = logging.getLogger("dsv4_flash_overlays.dspark_nvidia")

FLAG = "VLLM_DSPARK_FP8_DRAFT_HEAD"
PATCH_MARK = "_dsv4_fp8_draft_head_patch"
HEAD_ATTR = "_dsv4_fp8_draft_head"  # per model instance: Fp8Head, or False = use bf16
MIN_CAPABILITY = (8, 9)  # e4m3 conversion instructions (Ada, Hopper, Blackwell, GB10)

# Source markers of the vLLM 0.33 code this overlay relies on (checked with inspect).
MARKERS: dict[str, tuple[str, ...]] = {
    "DSparkDeepseekV4ForCausalLM.compute_draft_logits": ("self.compute_logits(hidden_states)",),
    "DSparkDeepseekV4ForCausalLM.compute_logits": (
        "self.logits_processor(self.lm_head, self.model.norm(hidden_states))",
    ),
    "LogitsProcessor._apply_head": ("lm_head.quant_method.apply(",),
    "LogitsProcessor._get_logits": ("lm_head.tp_size",),
    "DSparkSpeculator._sample_sequential": ("self.model.compute_draft_logits(",),
}

_originals: dict[str, Any] = {}
_lock = threading.Lock()
_first_call_logged = False


# ------------------------------------------------------------------------------ checks
def _targets() -> dict[str, Any]:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    return {
        "DSparkDeepseekV4ForCausalLM.compute_draft_logits": (
            DSparkDeepseekV4ForCausalLM.compute_draft_logits
        ),
        "DSparkDeepseekV4ForCausalLM.compute_logits": DSparkDeepseekV4ForCausalLM.compute_logits,
        "LogitsProcessor._apply_head": LogitsProcessor._apply_head,
        "LogitsProcessor._get_logits": LogitsProcessor._get_logits,
        "DSparkSpeculator._sample_sequential": DSparkSpeculator._sample_sequential,
    }


def source_drift() -> str | None:
    """None if every marker is in the installed vLLM, else a sentence saying what is not."""
    try:
        targets = _targets()
    except Exception as exc:  # import moved or failed: drifted
        return f"cannot import the DSpark classes ({type(exc).__name__}: {exc})"
    for name, markers in MARKERS.items():
        fn = targets[name]
        fn = _originals.get(name, fn)
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError) as exc:
            return f"cannot read the source of {name} ({exc})"
        for marker in markers:
            if marker not in src:
                return f"{name} no longer contains {marker!r}"
    return None


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


def head_reason(model: Any) -> str | None:
    """None if this model's lm_head can get an fp8 copy, else why not."""
    lm_head = getattr(model, "lm_head", None)
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
    hidden = getattr(getattr(model, "config", None), "hidden_size", weight.shape[1])
    if weight.shape[1] != hidden:
        return f"lm_head K={weight.shape[1]} != hidden_size {hidden}"
    lp = getattr(model, "logits_processor", None)
    if getattr(lp, "logits_as_input", False):
        return "logits processor takes logits as input"
    if getattr(lp, "head_dtype", None) not in (None, torch.bfloat16):
        return f"logits processor wants head dtype {lp.head_dtype}"
    return None


# ------------------------------------------------------------------------------- build
class _Fp8LmHead:
    """Stands in for the lm_head inside ``LogitsProcessor``: same ``tp_size``, fp8 GEMM."""

    def __init__(self, lm_head: Any, head: Any):
        self.tp_size = lm_head.tp_size
        self.quant_method = self
        self._head = head

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = self._head(x)
        return y if bias is None else y + bias


def prepare(model: Any) -> bool:
    """Build the fp8 copy for ``model`` (once); False (and one log line) if it must stay bf16."""
    state = model.__dict__.get(HEAD_ATTR)
    if state is not None:
        return state is not False
    reason = head_reason(model)
    if reason is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        logger.warning("fp8 draft head: not built before CUDA-graph capture; this graph keeps bf16")
        return False
    if reason is not None:
        logger.warning("fp8 draft head: staying bf16 (pid %d): %s", os.getpid(), reason)
        model.__dict__[HEAD_ATTR] = False
        return False
    from .fp8_head import Fp8Head

    weight = model.lm_head.weight
    head = Fp8Head(weight)
    model.__dict__[HEAD_ATTR] = head
    logger.info(
        "fp8 draft head: built e4m3 copy of lm_head shard %s on %s, +%.1f MB (pid %d)",
        tuple(weight.shape),
        weight.device,
        head.extra_bytes / 1e6,
        os.getpid(),
    )
    return True


# -------------------------------------------------------------------------------- patch
def _compute_draft_logits(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """Draft logits through the fp8 copy; the original (bf16) when it is not available."""
    global _first_call_logged
    if not prepare(self):
        return _originals["DSparkDeepseekV4ForCausalLM.compute_draft_logits"](self, hidden_states)
    if not _first_call_logged:
        _first_call_logged = True
        logger.info(
            "fp8 draft head: first call, %d rows (pid %d)", hidden_states.shape[0], os.getpid()
        )
    head = self.__dict__[HEAD_ATTR]
    return self.logits_processor(_Fp8LmHead(self.lm_head, head), self.model.norm(hidden_states))


def _load_draft_model(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The speculator's loader, then the fp8 copy while we are still outside graph capture."""
    model = _originals["DSparkSpeculator.load_draft_model"](self, *args, **kwargs)
    try:
        prepare(model)
    except Exception as exc:  # never break a boot: the draft then builds lazily or stays bf16
        logger.warning(
            "fp8 draft head: eager build failed (%s: %s); will retry on first call",
            type(exc).__name__,
            exc,
        )
        model.__dict__.pop(HEAD_ATTR, None)
    return model


def apply() -> bool:
    """Install the overlay; False (vLLM untouched, one warning) if it cannot apply here."""
    with _lock:
        from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM
        from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

        if getattr(DSparkDeepseekV4ForCausalLM, PATCH_MARK, False):
            return True
        drift = source_drift()
        if drift is not None:
            logger.warning("fp8 draft head: vLLM drifted, not applied: %s", drift)
            return False
        reason = device_reason()
        if reason is not None:
            logger.warning("fp8 draft head: not applied in pid %d: %s", os.getpid(), reason)
            return False
        _originals["DSparkDeepseekV4ForCausalLM.compute_draft_logits"] = (
            DSparkDeepseekV4ForCausalLM.compute_draft_logits
        )
        _originals["DSparkSpeculator.load_draft_model"] = DSparkSpeculator.load_draft_model
        DSparkDeepseekV4ForCausalLM.compute_draft_logits = _compute_draft_logits
        DSparkSpeculator.load_draft_model = _load_draft_model
        setattr(DSparkDeepseekV4ForCausalLM, PATCH_MARK, True)
        logger.info("fp8 draft head: installed (pid %d)", os.getpid())
        return True


def remove() -> None:
    """Undo ``apply`` (tests; also a manual kill switch in a live process)."""
    with _lock:
        from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM
        from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

        if not getattr(DSparkDeepseekV4ForCausalLM, PATCH_MARK, False):
            return
        DSparkDeepseekV4ForCausalLM.compute_draft_logits = _originals.pop(
            "DSparkDeepseekV4ForCausalLM.compute_draft_logits"
        )
        DSparkSpeculator.load_draft_model = _originals.pop("DSparkSpeculator.load_draft_model")
        delattr(DSparkDeepseekV4ForCausalLM, PATCH_MARK)
