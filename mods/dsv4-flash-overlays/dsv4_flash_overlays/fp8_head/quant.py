# SPDX-License-Identifier: MIT
"""fp8 numerics of the draft head in torch: quantizers, exact emulations, error bounds.

Everything here runs on any device (CPU included) and reproduces bit for bit what the
Triton kernels feed their tensor cores, so the kernels can be checked against it and the
error bounds can be derived from the exact rounding errors.

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
# fp8 tensor-core accumulation on Hopper keeps about 14 bits (DeepSeek-V3 technical
# report, arXiv 2412.19437, section 3.3.2); modelled as a 2^-13 relative truncation per
# 32-deep MMA step, with exact fp32 promotion every ``promote`` elements of K.
FP8_MMA_UNIT = 2.0**-13
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


def dequantize_rowwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float64 (the exact value the kernels multiply by)."""
    return q.double() * scale.double()[:, None]


def e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """Spacing of the e4m3 grid at each element of ``q``: 2^(e-3), 2^-9 below 2^-6."""
    a = q.float().abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0**-6)))
    return torch.exp2(e - 3.0)


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


def _expand(s: torch.Tensor, k: int) -> torch.Tensor:
    """Per-row [M] or per-block [M, K/g] scales -> [M, K]."""
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
        return v * _expand(self.scale.double(), v.shape[1])


def quantize_act(a: torch.Tensor, terms: int, group: int = 0) -> ActQuant:
    """The kernels' activation quantizer, bit for bit (IEEE fp32 divide and multiply)."""
    if terms not in QMAX:
        raise ValueError(f"terms must be 1 or 2, got {terms}")
    amax = act_amax(a, group)
    k = a.shape[1]
    # tensor / tensor: IEEE division like the kernel's div_rn (torch turns `scalar / t` and
    # sometimes `t / scalar` into a multiplication by a reciprocal, which rounds differently)
    x = a.float() * _expand(torch.full_like(amax, QMAX[terms]) / amax, k)
    scale = amax / torch.full_like(amax, E4M3_MAX)
    if terms == 1:
        return ActQuant(x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8), None, scale)
    hi = x.to(FP8).float()
    return ActQuant((hi * 16.0).to(FP8), ((x - hi) * 16.0).to(FP8), scale)


# ------------------------------------------------------------------- references / emulation
def fp8_head_matmul_ref(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float64 ``a @ (q * scale).T``: what the W8A16 kernel computes, before rounding."""
    return a.double() @ dequantize_rowwise(q, scale).t()


def w8a8_ref(
    a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, terms: int, group: int = 0
) -> torch.Tensor:
    """Float64 of what the W8A8 kernel computes: its quantized activations @ fp8 weights."""
    return quantize_act(a, terms, group).dequantize() @ dequantize_rowwise(q, scale).t()


def emulate_kernel(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The W8A16 kernel's arithmetic in torch: widen to fp16, fp32 dot, scale, to bf16."""
    w16 = q.to(torch.float16).float()
    a16 = a.to(torch.float16).float()
    return ((a16 @ w16.t()) * scale[None, :]).to(torch.bfloat16)


def emulate_w8a8(
    a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, terms: int, group: int = 0
) -> torch.Tensor:
    """The W8A8 kernel's arithmetic in torch (fp32 accumulation, no fp8-MMA truncation)."""
    aq = quantize_act(a, terms, group)
    qa = aq.hi.float() if aq.lo is None else aq.hi.float() + aq.lo.float()
    qw = q.float()
    if group == 0:
        y = (qa @ qw.t()) * aq.scale[:, None]
    else:
        y = torch.zeros(a.shape[0], q.shape[0], dtype=torch.float32, device=a.device)
        for g in range(aq.scale.shape[1]):
            sl = slice(g * group, (g + 1) * group)
            y += (qa[:, sl] @ qw[:, sl].t()) * aq.scale[:, g : g + 1]
    return (y * scale[None, :]).to(torch.bfloat16)


# ---------------------------------------------------------------------------- error bound
class ErrorBound:
    """Per-logit bounds on |fp8-head logit - bf16-head logit| for one weight and its copy.

    For activations ``a`` and a path's ``ActNumerics``, ``__call__`` returns ``(hard,
    stat)`` [M, N] float32, with ``a.w - â.ŵ = a.(w - ŵ) + (a - â).ŵ``:
      * hard: sum |a| |w - ŵ| (weight rounding, Hoelder) + sum |a - â| |ŵ| (activation
        rounding) + accumulation (fp32: K 2^-24 sum |â||ŵ|; fp8 MMA: the model of
        ``FP8_MMA_UNIT`` per 32-deep step inside each promotion chunk) + the bf16 rounding
        of both stored logits (2^-8 |z|).
      * stat: 6 sigma of the same rounding errors modelled as independent uniform ones
        (weights: s ulp(q); activations: the last term's ulp times its scale), the fp8
        accumulation likewise per chunk, plus the output rounding: the realistic size.
    """

    def __init__(self, w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor):
        self.wf = w.float()
        self.wq = (q.float() * scale[:, None]).float()
        self.err = (self.wf - self.wq).abs()
        ulp = e4m3_ulp(q) * scale[:, None]
        self.var = ulp * ulp / 12.0
        self.k = w.shape[1]

    def __call__(
        self, a: torch.Tensor, num: ActNumerics = W8A16
    ) -> tuple[torch.Tensor, torch.Tensor]:
        af = a.float()
        out_round = (af @ self.wf.t()).abs() * 2.0**-8
        hard = af.abs() @ self.err.t()
        var = (af * af) @ self.var.t()
        if num.terms == 0:
            a_hat = af
            tiny = (af.abs() < 2.0**-14).float() * 2.0**-25  # fp16 subnormal widening
            hard = hard + tiny @ self.wq.abs().t()
        else:
            aq = quantize_act(a, num.terms, num.group)
            a_hat = aq.dequantize().float()
            last = aq.hi if aq.lo is None else aq.lo
            a_ulp = e4m3_ulp(last) * _expand(aq.scale, self.k)
            hard = hard + (af - a_hat).abs() @ self.wq.abs().t()
            var = var + (a_ulp * a_ulp / 12.0) @ (self.wq * self.wq).t()
        absdot = a_hat.abs() @ self.wq.abs().t()
        if num.promote:
            chunk = min(num.promote, self.k)  # NO_PROMOTE: one chunk, all of K
            steps = chunk // 32
            acc_var = torch.zeros_like(var)
            for c in range(0, self.k, chunk):
                sl = slice(c, c + chunk)
                e_c = (a_hat[:, sl].abs() @ self.wq[:, sl].abs().t()) * (steps * FP8_MMA_UNIT)
                hard = hard + e_c
                acc_var += e_c * e_c / 3.0
            hard = hard + absdot * (self.k // chunk) * 2.0**-24
            var = var + acc_var
        else:
            hard = hard + absdot * (self.k * 2.0**-24)
        stat = 6.0 * torch.sqrt(var)
        return hard + out_round, stat + out_round
