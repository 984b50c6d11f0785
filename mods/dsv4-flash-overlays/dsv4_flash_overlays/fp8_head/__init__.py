# SPDX-License-Identifier: MIT
"""fp8 DSpark draft head: an e4m3 copy of the lm_head shard and the GEMMs that use it.

Why this exists: the DSpark draft computes full-vocabulary logits every step through the
bf16 lm_head shard (64640 x 4096 at TP=2). With M = 5 * num_reqs rows that GEMM streams
the weight; an fp8 copy halves the bytes. Modules:

* ``quant``: the quantizers (weights per row; activations per row or per block, one or
  two e4m3 terms);
* ``w8a16``: Triton kernel, fp8 weights x bf16 activations (fp16 MMA);
* ``w8a8``: Triton kernel, fp8 weights x activations quantized in the kernel (fp8 MMA);
* ``w8a8_once``: the same product with the activations quantized once per launch by
  ticketed programs and shared through global memory (``W8A8Config(once=1)``);
* ``configs``: kernel configs, their shared-memory need, the tuned table;
* ``dispatch``: ``Fp8Head``, which picks per M among W8A16, W8A8, ``torch._scaled_mm``
  and bf16 cuBLAS from the tuned table.

The tuner that measures all of them on a GPU and writes the table is not part of the
overlay (it never runs in a serving process): ``python -m bench.kernels.fp8_tune`` from a
clone of the repository.
"""

from __future__ import annotations

from .configs import (
    BF16,
    CONFIG_PATH,
    MAX_M_PER_LAUNCH,
    SCALED_MM,
    UNTUNED_SMALL_M,
    UNTUNED_TABLE,
    KernelConfig,
    W8A8Config,
    W8A16Config,
    config_key,
    lookup_table,
    m_tiles,
    pick,
    smem_need,
)
from .dispatch import Fp8Head, scaled_mm_head
from .quant import (
    E4M3_MAX,
    ActNumerics,
    quantize_act,
    quantize_rowwise,
)
from .w8a8 import w8a8_matmul
from .w8a16 import HAVE_TRITON, w8a16_matmul

fp8_head_matmul = w8a16_matmul  # the name earlier versions used

__all__ = [
    "BF16",
    "CONFIG_PATH",
    "E4M3_MAX",
    "HAVE_TRITON",
    "MAX_M_PER_LAUNCH",
    "SCALED_MM",
    "UNTUNED_SMALL_M",
    "UNTUNED_TABLE",
    "ActNumerics",
    "Fp8Head",
    "KernelConfig",
    "W8A16Config",
    "W8A8Config",
    "config_key",
    "fp8_head_matmul",
    "lookup_table",
    "m_tiles",
    "pick",
    "quantize_act",
    "quantize_rowwise",
    "scaled_mm_head",
    "smem_need",
    "w8a16_matmul",
    "w8a8_matmul",
]
