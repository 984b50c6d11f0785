# SPDX-License-Identifier: MIT
"""fp8 numerics of the draft head in torch: the quantizers the serving path runs.

Everything here runs on any device (CPU included) and reproduces bit for bit what the
Triton kernels feed their tensor cores. The exact references, torch emulations of the
kernels and the error bounds derived from these rounding errors are offline code and do not
ship: ``bench/kernels/fp8_tune/reference.py`` in the repository.

Weights: e4m3 with one fp32 scale per output row, ``scale = amax / 448`` (round to nearest
even, clamped). Activations, per path (``ActNumerics``):
  * ``terms=0`` (W8A16): bf16 activations widened to fp16 in the kernel: exact for
    |a| >= 2^-14, absolute error <= 2^-25 below (fp16 subnormals).
  * ``terms=1`` (W8A8): e4m3 with one scale per row (``group=0``: the whole K) or per
    1 x 128 block of a row (``group=128``), ``x = a * (448 / amax)`` in fp32, then e4m3.
    Relative error <= 2^-4 per element (3 mantissa bits), like the weights.
  * ``terms=2`` (W8A8, two terms): ``x = a * (28 / amax)``, ``hi = e4m3(x)``,
    ``lo = e4m3(16 (x - hi))``; the kernel multiplies ``16 hi`` (exact, <= 448) and ``lo``
    with the same weight tile into one fp32 accumulator, so it sees ``16 x`` with relative
    error <= 2^-8 (about bf16's 2^-9) at twice the fp8 tensor-core work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn
# Floor for an activation row's amax: keeps 448 / amax finite (an all-zero row quantizes
# to zeros); a power of two so the scale arithmetic stays exact.
TINY = 2.0**-96
# Per-block activation scales cover 1 x GROUP_K elements (DeepSeek-V3's 1 x 128 tiles).
GROUP_K = 128
# Largest x fed to e4m3 per path: 448 for one term; 28 for two, so that 16 * hi <= 448.
QMAX = {1: 448.0, 2: 28.0}
# ``promote`` of a path that never promotes: the tensor core's accumulator over all of K
# (Triton's default for fp8 on SM 9.0, ``max_num_imprecise_acc`` = 2^30; a promotion
# every K step makes ptxas serialize the warpgroup MMAs).
NO_PROMOTE = 2**30
# promotion intervals up to this share one accuracy family (see ``ActNumerics.name``)
PROMOTE_FAMILY = 128
_QUANT_CHUNK_ROWS = 4096


# ------------------------------------------------------------------------------- weights
def quantize_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w`` [N, K] to e4m3 with one fp32 scale per row: ``w ~= q * scale[:, None]``.

    ``scale = amax / 448``; values are clamped before the cast because torch turns
    |x| > 448 into NaN (the division can land a hair above 448). An all-zero row gets scale
    1 and q = 0. Works in row chunks so a 530 MB shard never needs a full fp32 copy.
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    n = w.shape[0]
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(n, dtype=torch.float32, device=w.device)
    for start in range(0, n, _QUANT_CHUNK_ROWS):
        wf = w[start : start + _QUANT_CHUNK_ROWS].float()
        if not torch.isfinite(wf).all():
            raise ValueError("weight has non-finite values; refusing to quantize")
        amax = wf.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        q[start : start + wf.shape[0]] = (wf / s[:, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(FP8)
        scale[start : start + wf.shape[0]] = s
    return q, scale


# --------------------------------------------------------------------------- activations
@dataclass(frozen=True)
class ActNumerics:
    """How a path treats activations and accumulates (see the module docstring)."""

    terms: int = 0  # 0: bf16/fp16 activations (W8A16); 1 or 2: e4m3 terms (W8A8)
    group: int = 0  # 0: one scale per row; GROUP_K: one per 1 x 128 block
    promote: int = 0  # fp8 MMA: K elements per exact fp32 promotion (0: fp32 MMA)

    @property
    def name(self) -> str:
        if self.terms == 0:
            return "w8a16"
        name = f"w8a8-t{self.terms}-{'row' if self.group == 0 else f'g{self.group}'}"
        # promotion every <= 128 elements (DeepSeek-V3's interval) is one family, checked at
        # 128; a longer interval rounds differently, so it is checked on its own
        if self.promote >= NO_PROMOTE:
            return name + "-fastacc"
        return name + (f"-p{self.promote}" if self.promote > PROMOTE_FAMILY else "")


W8A16 = ActNumerics()


def expand_scales(s: torch.Tensor, k: int) -> torch.Tensor:
    """Per-row [M] or per-block [M, K/g] scales -> [M, K] (the quantizer's and the
    tuner's references' one way of applying activation scales)."""
    if s.dim() == 1:
        return s[:, None].expand(-1, k)
    return s.repeat_interleave(k // s.shape[1], dim=1)


def act_amax(a: torch.Tensor, group: int) -> torch.Tensor:
    """fp32 amax of each row (``group=0``) or each 1 x group block, floored at TINY."""
    af = a.float().abs()
    if group:
        m, k = af.shape
        if k % group:
            raise ValueError(f"K={k} is not a multiple of the activation group {group}")
        af = af.view(m, k // group, group)
    return af.amax(dim=-1).clamp_min(TINY)


@dataclass
class ActQuant:
    """Quantized activations as the kernel holds them: ``(hi + lo) * scale`` ~= a."""

    hi: torch.Tensor  # e4m3 [M, K] (16 * hi for two terms)
    lo: torch.Tensor | None  # e4m3 [M, K] or None
    scale: torch.Tensor  # fp32 [M] or [M, K/group]: amax / 448

    def dequantize(self) -> torch.Tensor:
        v = self.hi.double()
        if self.lo is not None:
            v = v + self.lo.double()
        return v * expand_scales(self.scale.double(), v.shape[1])


def quantize_act(a: torch.Tensor, terms: int, group: int = 0) -> ActQuant:
    """The kernels' activation quantizer, bit for bit (IEEE fp32 divide and multiply)."""
    if terms not in QMAX:
        raise ValueError(f"terms must be 1 or 2, got {terms}")
    amax = act_amax(a, group)
    k = a.shape[1]
    # tensor / tensor: IEEE division like the kernel's div_rn (torch turns `scalar / t` and
    # sometimes `t / scalar` into a multiplication by a reciprocal, which rounds differently)
    x = a.float() * expand_scales(torch.full_like(amax, QMAX[terms]) / amax, k)
    scale = amax / torch.full_like(amax, E4M3_MAX)
    if terms == 1:
        return ActQuant(x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8), None, scale)
    hi = x.to(FP8).float()
    return ActQuant((hi * 16.0).to(FP8), ((x - hi) * 16.0).to(FP8), scale)
