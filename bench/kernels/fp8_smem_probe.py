#!/usr/bin/env python3
"""Shared memory Triton gives each fp8 draft-head kernel config, compiled offline (no GPU).

For sm_90 (H200) and sm_121 (GB10), compiles W8A16 and W8A8 configs over BN, BK, warps,
stages, M tiles and (W8A8) activation terms/scales with the installed Triton, and writes
what each compiled kernel declares (``metadata.shared``) next to
``configs.smem_need``'s estimate. The estimate must never be below it: the overlay filters
configs by the estimate against the GPU's limit (tests/test_fp8_configs.py reads the two
recorded outputs, test data in tests/data/fp8_head/). Compiling needs only Triton's bundled
ptxas.

    python -m bench.kernels.fp8_smem_probe \
        --json tests/data/fp8_head/fp8_smem_probe_triton38.json
    python -m bench.kernels.fp8_smem_probe --kernels once \
        --json tests/data/fp8_head/fp8_smem_probe_once_triton38.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import triton
from dsv4_flash_overlays.fp8_head import configs as C
from dsv4_flash_overlays.fp8_head import w8a8, w8a8_once, w8a16
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pairctl.cli import options

SIGNATURE = {
    "a_ptr": "*bf16",
    "w_ptr": "*fp8e4nv",
    "s_ptr": "*fp32",
    "y_ptr": "*bf16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "stride_am": "i32",
    "stride_wn": "i32",
    "stride_ym": "i32",
}
# what the JIT sees at run time: 16-byte aligned pointers, N, K and strides divisible by 16
DIVISIBLE = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5, 6, 7, 8, 9)}
ONCE_SIGNATURE = {
    "a_ptr": "*bf16",
    "w_ptr": "*fp8e4nv",
    "w_desc": "*fp8e4nv",  # ordinary loads here: the copy-engine variant needs a GPU's TMA
    "s_ptr": "*fp32",
    "y_ptr": "*bf16",
    "qa_ptr": "*fp8e4nv",
    "sa_ptr": "*fp32",
    "sync_ptr": "*i32",
    **{k: "i32" for k in ("M", "N", "K", "stride_am", "stride_wn", "stride_ym")},
}
ONCE_DIVISIBLE = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13)}


def compile_shared(cfg: C.W8A16Config | C.W8A8Config, m: int, capability: int) -> int:
    bm1, bm2 = cfg.tiles(m)
    attrs = DIVISIBLE
    if isinstance(cfg, C.W8A8Config) and cfg.once:
        fn, sig, attrs = w8a8_once._w8a8_once_kernel, dict(ONCE_SIGNATURE), ONCE_DIVISIBLE
        const = {"KP": 4096, "TERMS": cfg.terms, "PROMOTE": cfg.triton_promote()}
        const.update(TMA_W=False, FUSE=bool(cfg.fuse))
    elif isinstance(cfg, C.W8A16Config):
        fn, sig = w8a16._w8a16_kernel, {**SIGNATURE, "a_ptr": "*fp16" if cfg.pre_a else "*bf16"}
        const: dict[str, Any] = {"CLAMP_M": bool(cfg.clamp_m)}
    else:
        fn, sig = w8a8._w8a8_kernel, dict(SIGNATURE)
        const = {"TERMS": cfg.terms, "GROUP": bool(cfg.group), "PROMOTE": cfg.triton_promote()}
    const.update(BN=cfg.bn, BK=cfg.bk, BM1=bm1, BM2=bm2)
    sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return int(
        triton.compile(src, target=GPUTarget("cuda", capability, 32), options=opts).metadata.shared
    )


def once_configs() -> list[C.W8A8Config]:
    """W8A8 with the activations quantized once per launch: the tuner's shapes."""
    out = []
    for bn, bk, nw in ((64, 128, 4), (128, 128, 4), (128, 128, 8), (256, 128, 8), (64, 64, 4)):
        for ns in (2, 3, 4):
            out.append(C.W8A8Config(bn, bk, nw, ns, terms=2, once=1, fuse=1))
            out.append(C.W8A8Config(bn, bk, nw, ns, terms=2, once=1, single_tile=1))
            out.append(C.W8A8Config(bn, bk, nw, ns, terms=1, once=1, promote=0))
    return out


def configs() -> list[C.W8A16Config | C.W8A8Config]:
    out: list[C.W8A16Config | C.W8A8Config] = []
    for bn, bk, nw in (
        (64, 256, 2),
        (128, 128, 2),
        (64, 128, 2),
        (64, 128, 4),
        (128, 128, 4),
        (32, 256, 1),
    ):
        out += [C.W8A16Config(bn, bk, nw, ns, pre_a=1) for ns in (2, 3, 4)]
    for bn, nw in ((64, 4), (128, 4), (128, 8), (256, 8), (64, 2)):
        for ns in (2, 3, 4):
            out += [
                C.W8A8Config(bn, 128, nw, ns, terms=t, group=g) for t in (1, 2) for g in (0, 128)
            ]
    return out


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--m", type=int, nargs="+", default=[5, 40, 80, 144])
    p.add_argument("--sm", type=int, nargs="+", default=[90, 121], help="compute capabilities")
    p.add_argument(
        "--kernels",
        choices=("all-m", "once"),
        default="all-m",
        help="all-m: the W8A16 and W8A8 kernels (default); once: W8A8 quantizing once per launch",
    )


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, p = options.namespace(
        argv, add_cli_args, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    rows = []
    for cap in args.sm:
        for cfg in configs() if args.kernels == "all-m" else once_configs():
            for m in args.m:
                row = {"sm": cap, "m": m, "cfg": cfg.as_dict(), "estimate": C.smem_need(cfg, m)}
                try:
                    row["shared"] = compile_shared(cfg, m, cap)
                except Exception as exc:  # recorded: a config Triton refuses is no data point
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    under = [r for r in rows if r.get("shared", 0) > r["estimate"]]
    args.json.write_text(
        json.dumps(
            {"triton": triton.__version__, "rows": rows, "under_estimated": len(under)}, indent=0
        )
    )
    print(f"{len(rows)} configs, estimate below the compiled size for {len(under)}")
    return 1 if under else 0


if __name__ == "__main__":
    sys.exit(main())
