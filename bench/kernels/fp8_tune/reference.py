# SPDX-License-Identifier: MIT
"""Exact references, torch emulations and error bounds of the fp8 draft head's arithmetic.

Offline code (tests, ``bench.kernels.eval_fp8_head``, the tuner's exactness check): it
checks the overlay's kernels and never runs in a serving process, so it is not shipped.
The quantizers it builds on are the overlay's own (``dsv4_flash_overlays.fp8_head.quant``),
so a reference sees exactly the operands the kernels multiply.
"""

from __future__ import annotations

import torch
from dsv4_flash_overlays.fp8_head.quant import W8A16, ActNumerics, expand_scales, quantize_act

# fp8 tensor-core accumulation on Hopper keeps about 14 bits (DeepSeek-V3 technical
# report, arXiv 2412.19437, section 3.3.2); modelled as a 2^-13 relative truncation per
# 32-deep MMA step, with exact fp32 promotion every ``promote`` elements of K.
FP8_MMA_UNIT = 2.0**-13


def dequantize_rowwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float64 (the exact value the kernels multiply by)."""
    return q.double() * scale.double()[:, None]


def e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """Spacing of the e4m3 grid at each element of ``q``: 2^(e-3), 2^-9 below 2^-6."""
    a = q.float().abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0**-6)))
    return torch.exp2(e - 3.0)


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
            a_ulp = e4m3_ulp(last) * expand_scales(aq.scale, self.k)
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
