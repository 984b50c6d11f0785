# SPDX-License-Identifier: MIT
"""fp8 (e4m3) weight, bf16 activation GEMM for the DSpark draft lm_head.

Why this exists: the DSpark draft computes full-vocabulary logits every step through the
bf16 lm_head shard (64640 x 4096 at TP=2). With M = 5 * num_reqs rows that GEMM is a
weight-streaming problem; an fp8 copy of the weight halves the bytes.

Numerics (chosen deliberately):
  * weights: e4m3, one fp32 scale per output row (vocab entry), ``scale = amax / 448``.
    Per-row scales follow each token embedding's own magnitude, so rare tokens with small
    rows keep their precision.
  * activations stay bf16: no activation quantization error at all (per-token fp8
    activations would add a second ~2^-4 relative error per element and cost a
    quantization pass). Inside the kernel the weight is widened exactly to fp16 (hardware
    ``cvt``; every e4m3 value is an fp16 value) and multiplied on tensor cores with fp32
    accumulation; the row scale is applied once in the epilogue. The activations are
    widened to fp16 too: exact for |x| in [2^-14, 65504] (bf16 has 8 significant bits,
    fp16 11); smaller values keep an absolute error <= 2^-25 (fp16 subnormals), far below
    the weight rounding. Overflow needs |x| > 65504; the draft head's input is RMSNorm output,
    bounded by sqrt(K) = 64 times the largest norm weight.
  * so the only error beyond bf16 is the weight rounding: |w - s*q| <= 2^-4 |w| (normal
    range) or <= s * 2^-10 (subnormal range) per element. ``ErrorBound`` turns that
    into a per-logit bound used by the accuracy evaluation.

Kernel layout (learned from a first kernel that lost at M >= 80): one program owns a block
of BN weight rows and *all* M activation rows (one or two M sub-tiles), so every weight
byte is read from HBM exactly once. The product is computed transposed (W-tile @ A^T), so
the wide weight block is the MMA's M dimension and the few tokens its N dimension.
With <= 2 warps per program (the tuned choice up to M = 48 on the H200) Triton uses mma.sync,
which gets the e4m3 tile from shared memory in 8-byte loads; 4 warps select Hopper's
warpgroup MMA, whose register operand is fed 2 bytes per load (the repository's
experimental/fp8-head-lab-notes.md has the measurements, including the variants that lost
and were removed: bf16 and integer bit-trick widening, activations as the register operand).

This module holds the quantizer, the Triton kernel, its wrapper, the dispatch with tuned
configs (``fp8_configs.json``) and the float reference ``fp8_head_matmul_ref``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger("dsv4_flash_overlays.fp8_head")

E4M3_MAX = 448.0
# Rows quantized per chunk: bounds the fp32 temporaries to ~64 MB for K = 4096.
_QUANT_CHUNK_ROWS = 4096
CONFIG_PATH = Path(__file__).with_name("fp8_configs.json")

try:  # Triton is present wherever vLLM runs on a GPU; CPU-only installs may lack it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    HAVE_TRITON = False


# --------------------------------------------------------------------------- quantization
def quantize_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w`` [N, K] to e4m3 with one fp32 scale per row.

    Returns ``(q, scale)`` with ``w ~= q.float() * scale[:, None]``. ``scale = amax/448`` so
    the largest element of each row maps to the largest finite e4m3 value; values are
    clamped before the cast because torch turns |x| > 448 into NaN for float8_e4m3fn (the
    division can land a hair above 448). An all-zero row gets scale 1 and q = 0. Rounding
    is torch's round-to-nearest-even. Works in row chunks so a 530 MB shard never needs a
    full fp32 copy.
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    n = w.shape[0]
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scale = torch.empty(n, dtype=torch.float32, device=w.device)
    for start in range(0, n, _QUANT_CHUNK_ROWS):
        wf = w[start : start + _QUANT_CHUNK_ROWS].float()
        if not torch.isfinite(wf).all():
            raise ValueError("weight has non-finite values; refusing to quantize")
        amax = wf.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        q[start : start + wf.shape[0]] = (
            (wf / s[:, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        )
        scale[start : start + wf.shape[0]] = s
    return q, scale


def dequantize_rowwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float64 (the exact value the kernel multiplies by)."""
    return q.double() * scale.double()[:, None]


def e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """Spacing of e4m3 numbers at each element of ``q`` (in units of the scaled value / s).

    Normal e4m3 values 2^e * 1.mmm have spacing 2^(e-3); below 2^-6 (subnormal) it is 2^-9.
    """
    a = q.float().abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0**-6)))
    return torch.exp2(e - 3.0)


# ---------------------------------------------------------------------------- error bound
class ErrorBound:
    """Per-logit bounds on |fp8-head logit - bf16-head logit| for one weight and its fp8 copy.

    Precomputes the per-element weight rounding error once; ``__call__(a)`` returns
    ``(hard, stat)`` [M, N] float32 for activations ``a`` [M, K]:
      * hard: sum_k |a_k| |w_nk - s_n q_nk| (Hoelder: a rigorous bound on the weight-rounding
        term) + fp32 accumulation (K * 2^-24 * sum |a||w|) + the bf16 rounding of both
        stored logits (2^-9 |z| each, so 2^-8 |z|).
      * stat: 6 sigma of the weight rounding modelled as independent uniform errors,
        6 * sqrt(sum_k a_k^2 (s_n ulp_nk)^2 / 12), plus the same output-rounding term: the
        realistic size of the error (the hard bound is ~sqrt(K) looser).
    """

    def __init__(self, w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor):
        self.wf = w.float()
        self.abs_w = self.wf.abs()
        self.err = (self.wf - q.float() * scale[:, None]).abs()
        ulp = e4m3_ulp(q) * scale[:, None]
        self.var = ulp * ulp / 12.0
        self.k = w.shape[1]

    def __call__(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        af = a.float()
        out_round = (af @ self.wf.t()).abs() * 2.0**-8
        hard = af.abs() @ self.err.t() + (af.abs() @ self.abs_w.t()) * (self.k * 2.0**-24)
        stat = 6.0 * torch.sqrt((af * af) @ self.var.t())
        return hard + out_round, stat + out_round


# ------------------------------------------------------------------------------ reference
def fp8_head_matmul_ref(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float64 reference of what the kernel computes: ``a @ (q * scale).T`` (no output cast)."""
    return a.double() @ dequantize_rowwise(q, scale).t()


def emulate_kernel(a: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in torch on the CPU: widen to fp16, fp32 dot, scale, to bf16.

    The weight widening is exact (asserted by the tests), so this differs from the float64
    reference only by fp32 accumulation order and the final bf16 rounding.
    """
    w16 = q.to(torch.float16).float()
    a16 = a.to(torch.float16).float()
    return ((a16 @ w16.t()) * scale[None, :]).to(torch.bfloat16)


# ---------------------------------------------------------------------------------- tiles
def m_tiles(m: int, single_tile: bool = False) -> tuple[int, int]:
    """Split M rows into at most two power-of-two tiles (>= 16) with little padding.

    One program holds all of them, so W is read once whatever M is: 5 -> (16, 0),
    40 -> (32, 16), 80 -> (64, 16), 120 -> (128, 0), 144 -> (128, 16). With
    ``single_tile`` one padded tile (40 -> 64): one MMA per k-step instead of two, which
    wins when the MMA's cost is set by its register-fed weight operand rather than by N.
    """
    if m <= 16:
        return 16, 0
    single = 1 << math.ceil(math.log2(m))
    if single_tile:
        return single, 0
    bm1 = 1 << int(math.floor(math.log2(m)))
    rem = m - bm1
    if rem == 0:
        return bm1, 0
    bm2 = max(16, 1 << math.ceil(math.log2(rem)))
    if single <= bm1 + bm2:
        return single, 0
    return bm1, bm2


MAX_M_PER_LAUNCH = 256


# --------------------------------------------------------------------------------- kernel
if HAVE_TRITON:

    @triton.jit
    def _fp8_head_kernel(
        a_ptr,
        w_ptr,
        s_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_am,
        stride_wn,
        stride_ym,
        BN: tl.constexpr,
        BK: tl.constexpr,
        BM1: tl.constexpr,
        BM2: tl.constexpr,
    ):
        """y[m, n] = s[n] * sum_k a[m, k] * w[n, k]; one program = BN rows of W x all M.

        Requires K % BK == 0 (checked by the wrapper). W rows past N are clamped (read
        twice at the last block, never stored), so W loads carry no mask. W is widened to
        fp16 (exact), A to fp16 (a no-op when the wrapper pre-widened it).
        """
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        rows = tl.minimum(offs_n, N - 1)
        offs_k = tl.arange(0, BK)
        w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
        offs_m1 = tl.arange(0, BM1)
        a1_ptrs = a_ptr + offs_m1[None, :] * stride_am + offs_k[:, None]
        a1_mask = offs_m1[None, :] < M
        acc1 = tl.zeros((BN, BM1), dtype=tl.float32)
        if BM2 > 0:
            offs_m2 = BM1 + tl.arange(0, BM2)
            a2_ptrs = a_ptr + offs_m2[None, :] * stride_am + offs_k[:, None]
            a2_mask = offs_m2[None, :] < M
            acc2 = tl.zeros((BN, BM2), dtype=tl.float32)
        for _k in range(0, K, BK):
            wv = tl.load(w_ptrs).to(tl.float16)
            a1 = tl.load(a1_ptrs, mask=a1_mask, other=0.0).to(tl.float16)
            acc1 = tl.dot(wv, a1, acc1)
            a1_ptrs += BK
            if BM2 > 0:
                a2 = tl.load(a2_ptrs, mask=a2_mask, other=0.0).to(tl.float16)
                acc2 = tl.dot(wv, a2, acc2)
                a2_ptrs += BK
            w_ptrs += BK
        s = tl.load(s_ptr + rows)
        n_mask = offs_n[:, None] < N
        y1 = (acc1 * s[:, None]).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + offs_m1[None, :] * stride_ym + offs_n[:, None], y1, mask=n_mask & a1_mask)
        if BM2 > 0:
            y2 = (acc2 * s[:, None]).to(y_ptr.dtype.element_ty)
            tl.store(
                y_ptr + offs_m2[None, :] * stride_ym + offs_n[:, None],
                y2,
                mask=n_mask & a2_mask,
            )


# Knobs of removed kernel variants, with the only value the remaining kernel implements:
# older result JSONs (bench/results/fp8_head/) carry them, so --seed-json can still read them.
_REMOVED_KNOBS = {"convert": 1, "layout": 0}


@dataclass(frozen=True)
class KernelConfig:
    """One launch configuration of ``_fp8_head_kernel``."""

    bn: int = 128
    bk: int = 128
    num_warps: int = 4
    num_stages: int = 4
    # 1: widen A to fp16 once in the wrapper (one tiny kernel) instead of in every program;
    # each program otherwise re-converts all M x K activations (as many conversions as its
    # weight tile at M ~ BN).
    pre_a: int = 0
    # 1: one padded M tile instead of two (see m_tiles).
    single_tile: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelConfig:
        """Parse one table entry; refuse keys this kernel does not have, naming the fix."""
        fields = cls.__dataclass_fields__
        removed = {k: v for k, v in d.items() if k in _REMOVED_KNOBS}
        for key, value in removed.items():
            if int(value) != _REMOVED_KNOBS[key]:
                raise ValueError(
                    f"kernel config {d} asks for {key}={value}, a variant this version no "
                    "longer has; re-tune with python -m bench.kernels.bench_fp8_head --tune"
                )
        unknown = set(d) - set(fields) - set(removed)
        if unknown:
            raise ValueError(f"kernel config {d} has unknown keys {sorted(unknown)}")
        return cls(**{k: int(d[k]) for k in fields if k in d})

    def as_dict(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.__dataclass_fields__}


def fp8_head_matmul(
    a: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    cfg: KernelConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a`` [M, K] bf16 @ (``q`` [N, K] e4m3 * ``scale`` [N]).T -> [M, N] in a's dtype.

    Launches the Triton kernel (rows of ``a`` in chunks of 256). No host sync, no
    data-dependent allocation: safe inside a CUDA graph capture.
    """
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    cfg = cfg or KernelConfig()
    m, k = a.shape
    n, kw = q.shape
    if k != kw or k % cfg.bk != 0:
        raise ValueError(f"shape mismatch or K={k} not a multiple of BK={cfg.bk}")
    if a.stride(1) != 1 or q.stride(1) != 1:
        raise ValueError("a and q must be contiguous along K")
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if cfg.pre_a:
        a = a.to(torch.float16)
    grid = (triton.cdiv(n, cfg.bn),)
    for start in range(0, m, MAX_M_PER_LAUNCH):
        rows = min(MAX_M_PER_LAUNCH, m - start)
        bm1, bm2 = m_tiles(rows, bool(cfg.single_tile))
        _fp8_head_kernel[grid](
            a[start:],
            q,
            scale,
            out[start:],
            rows,
            n,
            k,
            a.stride(0),
            q.stride(0),
            out.stride(0),
            BN=cfg.bn,
            BK=cfg.bk,
            BM1=bm1,
            BM2=bm2,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


# ------------------------------------------------------------------------------- dispatch
BF16 = "bf16"


@cache
def _load_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        return {}
    return json.loads(p.read_text())


def config_key(device_name: str, n: int, k: int) -> str:
    """Key of the tuned-config table: device name as torch reports it, plus the shape."""
    return f"{device_name}|N={n}|K={k}"


def lookup_table(
    device_name: str, n: int, k: int, path: Path = CONFIG_PATH
) -> dict[int, KernelConfig | str] | None:
    """Tuned per-M table for this device and shape, or None (the caller warns and falls back)."""
    data = _load_config_file(str(path))
    entry = data.get("entries", {}).get(config_key(device_name, n, k))
    if entry is None:
        return None
    table: dict[int, KernelConfig | str] = {}
    for m_str, cfg in entry.items():
        table[int(m_str)] = cfg if cfg == BF16 else KernelConfig.from_dict(cfg)
    return table


def pick(table: dict[int, KernelConfig | str], m: int) -> KernelConfig | str:
    """Entry for the smallest tuned M >= m (the largest tuned M beyond the table)."""
    keys = sorted(table)
    for key in keys:
        if m <= key:
            return table[key]
    return table[keys[-1]]


# On a device without tuned entries: fp8 only where halving the bytes wins on any GPU
# (small M, bandwidth-bound), with a modest shared-memory footprint (~48 KB: fits SM 8.9 and
# GB10's ~99 KB); cuBLAS bf16 above, so an untuned device is never slower than before.
UNTUNED_SMALL_M = KernelConfig(bn=64, bk=128, num_warps=2, num_stages=3, pre_a=1)
UNTUNED_TABLE: dict[int, KernelConfig | str] = {32: UNTUNED_SMALL_M, MAX_M_PER_LAUNCH: BF16}


class Fp8Head:
    """An fp8 copy of one lm_head shard plus the dispatch that uses it.

    Keeps a reference (not a copy) to the bf16 weight: for an M where the tuned table says
    cuBLAS bf16 is faster, it is used instead, so the draft head is never slower than bf16.
    """

    def __init__(self, weight: torch.Tensor, table: dict[int, KernelConfig | str] | None = None):
        self.weight = weight
        self.q, self.scale = quantize_rowwise(weight.detach())
        n, k = weight.shape
        if table is None:
            name = torch.cuda.get_device_name(weight.device) if weight.is_cuda else "cpu"
            table = lookup_table(name, n, k)
            if table is None:
                logger.warning(
                    "fp8 draft head: NO TUNED CONFIG for %s N=%d K=%d in %s; using the "
                    "untuned default (fp8 %s for M <= 32, bf16 above; run "
                    "bench/kernels/bench_fp8_head.py --tune on this device)",
                    name,
                    n,
                    k,
                    CONFIG_PATH.name,
                    UNTUNED_SMALL_M,
                )
                table = dict(UNTUNED_TABLE)
        self.table = table
        # Ms whose kernel launch raised (first eager call, before graph capture): bf16 there.
        self.failed: set[int] = set()

    @property
    def extra_bytes(self) -> int:
        """Device memory the fp8 copy adds: N*K bytes + 4*N for the scales."""
        return self.q.numel() + self.scale.numel() * 4

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        a2 = a.reshape(-1, a.shape[-1])
        m = a2.shape[0]
        choice = BF16 if m in self.failed else pick(self.table, m)
        if choice == BF16:
            out = torch.nn.functional.linear(a2, self.weight)
        else:
            try:
                out = fp8_head_matmul(a2.contiguous(), self.q, self.scale, choice)
            except Exception as exc:  # e.g. OutOfResources on an untuned GPU: never crash
                logger.warning(
                    "fp8 draft head: kernel failed at M=%d with %s (%s: %s); bf16 for this M "
                    "from now on",
                    m,
                    choice,
                    type(exc).__name__,
                    exc,
                )
                self.failed.add(m)
                out = torch.nn.functional.linear(a2, self.weight)
        return out.reshape(*a.shape[:-1], -1)
