# SPDX-License-Identifier: MIT
"""Kernel configs, their shared-memory need, and the tuned table (``fp8_configs.json``).

The table maps ``"<GPU name>|N=<n>|K=<k>"`` (the name as torch reports it) to one choice per
tuned M: a W8A16 or W8A8 kernel config, ``"scaled_mm"`` (per-row fp8 activations through
``torch._scaled_mm``) or ``"bf16"`` (cuBLAS, what vLLM runs without the overlay). The entry
for the smallest tuned M >= m is used. ``python -m bench.kernels.fp8_tune`` (run from a
clone of the repository; not shipped) writes it on the GPU it runs on. A config whose shared
memory would not fit the GPU is never chosen, whatever a table says; a GPU without an entry
gets ``UNTUNED_TABLE``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from .quant import GROUP_K, NO_PROMOTE, W8A16, ActNumerics

CONFIG_PATH = Path(__file__).resolve().parent.parent / "fp8_configs.json"
SCHEMA_VERSION = 2
MAX_M_PER_LAUNCH = 256
BF16 = "bf16"
SCALED_MM = "scaled_mm"
SCALED_MM_NUMERICS = ActNumerics(terms=1, group=0, promote=0)


def pad16(m: int) -> int:
    """``m`` rounded up to a multiple of 16: the rows a padded launch runs on (a launch
    whose M is not a multiple of 16 ran slow on an H200; w8a16.py has the numbers)."""
    return -(-m // 16) * 16


def m_tiles(m: int, single_tile: bool = False) -> tuple[int, int]:
    """Split M rows into at most two power-of-two tiles (>= 16) with little padding.

    5 -> (16, 0), 40 -> (32, 16), 80 -> (64, 16), 120 -> (128, 0), 144 -> (128, 16).
    With ``single_tile`` one padded tile (40 -> 64): one MMA per k-step instead of two.
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


# Knobs of removed W8A16 variants, with the only value the kernel implements: older result
# JSONs (bench/results/fp8_head/) carry them.
_REMOVED_KNOBS = {"convert": 1, "layout": 0}


@dataclass(frozen=True)
class _Config:
    path: ClassVar[str]
    bn: int = 128
    bk: int = 128
    num_warps: int = 4
    num_stages: int = 3

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _Config:
        """Parse one table entry; refuse keys this kernel does not have, naming the fix."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k != "path"}
        for key, value in d.items():
            if key in _REMOVED_KNOBS and cls is W8A16Config:
                if int(value) != _REMOVED_KNOBS[key]:
                    raise ValueError(
                        f"kernel config {d} asks for {key}={value}, a variant this version no "
                        "longer has; re-tune with python -m bench.kernels.fp8_tune"
                    )
        unknown = set(d) - names - (set(_REMOVED_KNOBS) if cls is W8A16Config else set())
        if unknown:
            raise ValueError(f"{cls.path} config {d} has unknown keys {sorted(unknown)}")
        return cls(**{k: int(d[k]) for k in names if k in d})

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, **{f.name: int(getattr(self, f.name)) for f in fields(self)}}

    def tiles(self, m: int) -> tuple[int, int]:
        """The M tiles of one launch of ``m`` rows (at most 256), padded where it pads."""
        if self.pads_rows():
            m = pad16(m)
        return m_tiles(min(m, MAX_M_PER_LAUNCH), self.one_tile())

    def pads_rows(self) -> bool:
        """Whether a launch runs on rows padded with zeros to a multiple of 16."""
        return False

    def one_tile(self) -> bool:
        """Whether the rows go in one padded power-of-two tile rather than up to two."""
        return bool(getattr(self, "single_tile", 0))


@dataclass(frozen=True)
class W8A16Config(_Config):
    """Launch config of the W8A16 kernel (``w8a16.py``)."""

    path: ClassVar[str] = "w8a16"
    num_stages: int = 4
    pre_a: int = 0  # 1: widen A to fp16 once in the wrapper instead of in every program
    single_tile: int = 0  # 1: one padded M tile instead of two
    clamp_m: int = 0  # 1: rows past M read row M-1 (no load mask); lost, kept for the record
    pad_m: int = 0  # 1: launch on rows padded with zeros to a multiple of 16 (see w8a16.py)
    tma: int = 0  # tiles loaded by the copy engine (SM >= 9.0): 1 one M tile, 2 up to two

    def numerics(self) -> ActNumerics:
        return W8A16

    def pads_rows(self) -> bool:
        return bool(self.pad_m or self.tma)  # tma: the copy engine's rows padded to 16 too

    def one_tile(self) -> bool:
        return self.tma == 1 if self.tma else bool(self.single_tile)


@dataclass(frozen=True)
class W8A8Config(_Config):
    """Launch config of the W8A8 kernel (``w8a8.py``)."""

    path: ClassVar[str] = "w8a8"
    terms: int = 1  # e4m3 terms per activation: 1, or 2 (hi + residual)
    group: int = 0  # 0: one activation scale per row; 128: per 1 x 128 block
    single_tile: int = 0
    promote: int = 128  # fp8-MMA elements of K per exact fp32 promotion (Hopper); 0: none
    once: int = 0  # 1: activations quantized once per launch, shared by all programs
    tma: int = 0  # with once=1: weight tiles loaded by the copy engine (SM >= 9.0)
    fuse: int = 0  # with once=1, terms=2: both terms in one accumulator per K step

    def numerics(self) -> ActNumerics:
        if self.fuse:  # 2 x BK fp8-MMA elements (both terms) per promotion
            return ActNumerics(self.terms, self.group, 2 * self.bk)
        return ActNumerics(self.terms, self.group, self.kernel_promote() or NO_PROMOTE)

    def kernel_promote(self) -> int:
        """K elements per promotion (<= BK), 0 for none."""
        return min(self.promote, self.bk)

    def triton_promote(self) -> int | None:
        """The kernels' PROMOTE, Triton's ``max_num_imprecise_acc``: None never promotes."""
        return self.kernel_promote() or None

    def pads_rows(self) -> bool:
        return bool(self.once)  # the quantized rows, zeros past M


KernelConfig = W8A16Config  # the name earlier versions used
Choice = W8A16Config | W8A8Config | str


def numerics_of(choice: Choice) -> ActNumerics | None:
    """What a choice does to the activations; None for bf16 (no quantization)."""
    if choice == BF16:
        return None
    if choice == SCALED_MM:
        return SCALED_MM_NUMERICS
    return choice.numerics()


def family(choice: Choice) -> str:
    """Accuracy family: choices in one family round the same way (eligibility is per family)."""
    if choice in (BF16, SCALED_MM):
        return str(choice)
    num = choice.numerics()
    return num.name


def parse_choice(obj: Any) -> Choice:
    """One table value: "bf16", "scaled_mm", or a config dict (no "path" = W8A16, schema 1)."""
    if obj in (BF16, SCALED_MM):
        return obj
    if not isinstance(obj, dict):
        raise ValueError(f"table entry {obj!r} is neither a config nor one of bf16, scaled_mm")
    path = obj.get("path", W8A16Config.path)
    for cls in (W8A16Config, W8A8Config):
        if path == cls.path:
            cfg = cls.from_dict(obj)
            if cfg.bk <= 0 or cfg.bk & (cfg.bk - 1):
                raise ValueError(f"{obj}: BK must be a power of two")
            if isinstance(cfg, W8A8Config) and cfg.group and cfg.bk != GROUP_K:
                raise ValueError(f"{obj}: per-block activation scales need bk={GROUP_K}")
            if isinstance(cfg, W8A8Config) and cfg.once and cfg.group:
                raise ValueError(f"{obj}: once=1 has one activation scale per row (group 0)")
            if isinstance(cfg, W8A8Config) and (cfg.tma or cfg.fuse) and not cfg.once:
                raise ValueError(f"{obj}: tma=1 and fuse=1 are variants of once=1 only")
            if isinstance(cfg, W8A8Config) and cfg.fuse and cfg.terms != 2:
                raise ValueError(f"{obj}: fuse=1 needs terms=2")
            return cfg
    raise ValueError(f"table entry {obj} has unknown path {path!r} (w8a16, w8a8)")


def choice_to_json(choice: Choice) -> Any:
    return choice if isinstance(choice, str) else choice.as_dict()


# --------------------------------------------------------------------------- shared memory
# Per-block opt-in shared-memory limits (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"), for when torch does not report them.
SMEM_LIMIT_BY_SM = {
    (8, 0): 166912,
    (8, 6): 101376,
    (8, 7): 166912,
    (8, 9): 101376,
    (9, 0): 232448,
    (10, 0): 232448,
    (12, 0): 101376,
    (12, 1): 101376,  # GB10 (DGX Spark): 99 KB per block
}


def smem_need(cfg: W8A16Config | W8A8Config, m: int) -> int:
    """Upper estimate of the shared memory (bytes) Triton gives ``cfg`` at ``m`` rows.

    Triton's software pipeliner keeps ``num_stages - 1`` copies of what one loop iteration
    loads: the weight tile (BN x BK e4m3) and the activation tiles (BMt x BK, 2 bytes).
    On top of that, W8A16 stages either the fp16-widened weight tile once for its two MMA
    tiles (mma.sync: 2 BN BK) or the widened activations (warpgroup MMA: 2 BMt BK); W8A8
    stages the weight operand (warpgroup MMA: BN BK) and the quantized activations of the
    larger M tile (<= 2 BM1 BK). Read off what Triton 3.8 compiled for sm_90 and sm_121 over
    624 (config, M) pairs (bench/kernels/fp8_smem_probe.py; on an H200, Triton 3.6, every config
    the tuner compiled): never below, median ~0.9 of the estimate.
    """
    bm1, bm2 = cfg.tiles(m)
    w_tile = cfg.bn * cfg.bk
    a_tiles = (bm1 + bm2) * cfg.bk * 2
    if isinstance(cfg, W8A8Config) and cfg.once:  # e4m3 term(s) of the activations
        return cfg.num_stages * (w_tile + cfg.terms * (bm1 + bm2) * cfg.bk) + 1024
    if getattr(cfg, "tma", 0):  # copy-engine loads: num_stages - 1 buffers + one more
        return cfg.num_stages * (w_tile + a_tiles)  # activation tile + barriers (~48 B)
    need = max(cfg.num_stages - 1, 1) * (w_tile + a_tiles)
    if isinstance(cfg, W8A8Config):
        return need + w_tile + 2 * bm1 * cfg.bk
    return need + max(2 * w_tile if bm2 else 0, a_tiles)


def device_smem_limit(device: Any = None) -> int:
    """Largest shared memory one block may use on ``device`` (opt-in limit), in bytes."""
    import torch

    props = torch.cuda.get_device_properties(device)
    limit = getattr(props, "shared_memory_per_block_optin", 0)
    return int(limit) or SMEM_LIMIT_BY_SM.get((props.major, props.minor), 49152)


def fits(choice: Choice, m: int, limit: int) -> bool:
    """Whether ``choice`` at ``m`` rows fits a GPU with ``limit`` bytes of shared memory."""
    return isinstance(choice, str) or smem_need(choice, m) <= limit


# ----------------------------------------------------------------------------------- tables
def config_key(device_name: str, n: int, k: int) -> str:
    """Key of the tuned-config table: device name as torch reports it, plus the shape."""
    return f"{device_name}|N={n}|K={k}"


@cache
def _load_file(path: str, mtime: float) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_file(path: Path = CONFIG_PATH) -> dict[str, Any]:
    """The whole table file ({} if missing); re-read when the file changes."""
    p = Path(path)
    if not p.exists():
        return {}
    return _load_file(str(p), p.stat().st_mtime)


def lookup_table(
    device_name: str,
    n: int,
    k: int,
    path: Path = CONFIG_PATH,
    smem_limit: int | None = None,
) -> dict[int, Choice] | None:
    """Tuned per-M table for this device and shape, or None (the caller falls back).

    With ``smem_limit``, an entry whose config would not fit becomes bf16.
    """
    entry = load_file(path).get("entries", {}).get(config_key(device_name, n, k))
    if entry is None:
        return None
    table: dict[int, Choice] = {}
    for m_str, obj in entry.items():
        m = int(m_str)
        choice = parse_choice(obj)
        if smem_limit is not None and not fits(choice, m, smem_limit):
            choice = BF16
        table[m] = choice
    return table


def pick(table: dict[int, Choice], m: int) -> Choice:
    """Entry for the smallest tuned M >= m (the largest tuned M beyond the table)."""
    keys = sorted(table)
    for key in keys:
        if m <= key:
            return table[key]
    return table[keys[-1]]


# ----------------------------------------------------------------------------- untuned GPU
# A GPU without a tuned entry: W8A16 with mma.sync (<= 4 warps, no warpgroup MMA needed) and
# <= 64 KB of shared memory at its M (fits SM 8.9 and GB10's 99 KB), only where halving the
# weight bytes wins on any GPU: M <= 64, where the GEMM streams weights. These are the H200
# tuning's choices for those M ranges (bench/results/fp8_head/), >= 1.3x bf16 there on the
# GPU with the most bandwidth per SM we measured, i.e. the least room for the fp8 kernel's
# extra instructions; cuBLAS bf16 above.
UNTUNED_SMALL_M = W8A16Config(bn=64, bk=128, num_warps=2, num_stages=3, pre_a=1, pad_m=1)
UNTUNED_MAX_M = 64
UNTUNED_TABLE: dict[int, Choice] = {
    16: W8A16Config(bn=64, bk=256, num_warps=2, num_stages=3),
    32: W8A16Config(bn=128, bk=128, num_warps=2, num_stages=3, pre_a=1, pad_m=1),
    48: UNTUNED_SMALL_M,
    UNTUNED_MAX_M: W8A16Config(bn=64, bk=128, num_warps=4, num_stages=3, pre_a=1, pad_m=1),
    MAX_M_PER_LAUNCH: BF16,
}
