# SPDX-License-Identifier: MIT
"""``Fp8Head``: the fp8 copy of one lm_head shard and the per-M choice of GEMM.

For each M the tuned table (``configs.py``) names the fastest path that is accurate
enough on this GPU: the W8A16 or W8A8 Triton kernel, ``torch._scaled_mm`` with per-row fp8
activations, or cuBLAS bf16 on the original weight. The bf16 weight is kept by reference
(not copied), so where bf16 is faster the head is exactly what vLLM runs without the
overlay. A kernel that fails at an M (e.g. out of shared memory on an untuned GPU) falls
back to bf16 for that M, logged, never a crash.
"""

from __future__ import annotations

import logging
import sys

import torch

from .configs import (
    BF16,
    CONFIG_PATH,
    SCALED_MM,
    UNTUNED_MAX_M,
    UNTUNED_SMALL_M,
    UNTUNED_TABLE,
    Choice,
    W8A8Config,
    W8A16Config,
    device_smem_limit,
    fits,
    lookup_table,
    pick,
)
from .quant import quantize_act, quantize_rowwise
from .w8a8 import w8a8_matmul
from .w8a16 import w8a16_matmul

logger = logging.getLogger("dsv4_flash_overlays.fp8_head")

# The tuner is not shipped with the overlay: it runs from a clone of the repository, with
# the interpreter this plugin runs in, i.e. the image's own (the engine stack's: the fork's
# is /opt/env/bin/python, and its image need not have a python3 on PATH).
TUNE_COMMAND = f"{sys.executable or 'python3'} -m bench.kernels.fp8_tune"


def scaled_mm_head(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-row fp8 activations (torch ops, ``quant.quantize_act``) + ``torch._scaled_mm``."""
    aq = quantize_act(a, terms=1, group=0)
    return torch._scaled_mm(
        aq.hi,
        q.t(),
        scale_a=aq.scale[:, None],
        scale_b=scale[None, :],
        out_dtype=a.dtype,
    )


def run_choice(
    choice: Choice, a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """One fp8 GEMM ``a @ (q * scale).T`` by the path ``choice`` names."""
    if isinstance(choice, W8A16Config):
        return w8a16_matmul(a, q, scale, choice)
    if isinstance(choice, W8A8Config):
        return w8a8_matmul(a, q, scale, choice)
    if choice == SCALED_MM:
        return scaled_mm_head(a, q, scale)
    raise ValueError(f"not an fp8 path: {choice!r}")


def table_for(weight: torch.Tensor) -> dict[int, Choice]:
    """The tuned table for this GPU and shape, shared-memory filtered; else the default."""
    n, k = weight.shape
    if weight.is_cuda:
        name = torch.cuda.get_device_name(weight.device)
        limit: int | None = device_smem_limit(weight.device)
    else:
        name, limit = "cpu", None
    table = lookup_table(name, n, k, smem_limit=limit)
    if table is not None:
        return table
    logger.warning(
        "fp8 draft head: NO TUNED CONFIG for %s N=%d K=%d in %s; using the untuned default "
        "(W8A16 %s for M <= %d, bf16 above). Tune on this GPU with `%s` (the overlay "
        "README's fp8 section has the docker command), then sync the overlays",
        name,
        n,
        k,
        CONFIG_PATH.name,
        UNTUNED_SMALL_M,
        UNTUNED_MAX_M,
        TUNE_COMMAND,
    )
    return {
        m: (c if limit is None or fits(c, m, limit) else BF16) for m, c in UNTUNED_TABLE.items()
    }


class Fp8Head:
    """An fp8 copy of one lm_head shard plus the per-M dispatch that uses it."""

    def __init__(self, weight: torch.Tensor, table: dict[int, Choice] | None = None):
        self.weight = weight
        self.q, self.scale = quantize_rowwise(weight.detach())
        self.table = table if table is not None else table_for(weight)
        # Ms whose kernel launch raised (first eager call, before graph capture): bf16 there.
        self.failed: set[int] = set()

    @property
    def extra_bytes(self) -> int:
        """Device memory the fp8 copy adds: N*K bytes + 4*N for the scales."""
        return self.q.numel() + self.scale.numel() * 4

    def choose(self, m: int) -> Choice:
        return BF16 if m in self.failed else pick(self.table, m)

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        a2 = a.reshape(-1, a.shape[-1])
        m = a2.shape[0]
        choice = self.choose(m)
        if choice == BF16:
            out = torch.nn.functional.linear(a2, self.weight)
        else:
            try:
                out = run_choice(choice, a2.contiguous(), self.q, self.scale)
            except Exception as exc:  # e.g. OutOfResources on an untuned GPU: never crash
                logger.warning(
                    "fp8 draft head: %s failed at M=%d (%s: %s); bf16 for this M from now on",
                    choice,
                    m,
                    type(exc).__name__,
                    exc,
                )
                self.failed.add(m)
                out = torch.nn.functional.linear(a2, self.weight)
        return out.reshape(*a.shape[:-1], -1)
