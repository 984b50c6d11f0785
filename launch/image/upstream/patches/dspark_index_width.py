#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""DSpark's non-causal SWA index width, rounded to a width FlashInfer's SM12x kernels have.

Why: vLLM 0.27.1 sizes the DSpark draft block's sliding-window index list as the next
multiple of 128 above window + drafts (``vllm/v1/attention/backends/mla/sparse_swa.py``,
``noncausal_index_width``): 128 + 5 gives 256. FlashInfer's SM120/SM121 sparse-MLA DSv4
decode kernel is instantiated only for top-k 128, 512 and 1024
(``csrc/sparse_mla_sm120_decode_dsv4.cu``), so a 256-wide decode call falls through to the
prefill-only path and the first decode dies with "Check failed: num_tokens > 64 (5 vs 64)"
(ecohash-co/deepseek-v4-flash-dgx-spark-vllm027 ``docs/01-blockers.md``, blocker 2). The
prefill dispatch has 128/512/1024/2048 and no 256 either (flashinfer-ai/flashinfer#3828,
the prefill half #3834 and the decode half #3817). This patch rounds up to the next width
both have. The unused index slots are already -1 and the active length is capped by
``swa_topk_lens``, so the wider list only adds empty chunks (the peer measured < 0.5 ms per
step); with no drafts the width stays 128, and non-DSpark models never reach it.

Usage (the Dockerfile runs it; FILE is the image's installed sparse_swa.py):
    python3 dspark_index_width.py FILE            # or --site SITE_PACKAGES_DIR
    python3 dspark_index_width.py --check FILE    # 0 if patched, 3 if not
"""

from __future__ import annotations

import sys

# Run as a script (the Dockerfile's RUN python3 .../dspark_index_width.py), Python puts
# this file's folder first on the import path, so the shared library beside it imports.
from _patchlib import Edit, Patch, main

MARKER = "dsv4-patch dspark-index-width"

# The statement as vLLM 0.27.1 writes it (DeepseekSparseSWAMetadataBuilder.__init__),
# quoted in the peer's docs/01-blockers.md.
ANCHOR = """\
        self.noncausal_index_width = (
            cdiv(self.window_size + self.num_speculative_tokens, 128) * 128
            if self.is_dspark
            else 0
        )
"""

REPLACEMENT = f"""\
        # {MARKER}: a width FlashInfer's SM12x sparse-MLA kernels exist for
        self.noncausal_index_width = (
            _dsv4_dspark_index_width(self.window_size + self.num_speculative_tokens)
            if self.is_dspark
            else 0
        )
"""

HELPER = f"""
# {MARKER} (DSv4-Flash-spark launch/image/upstream/patches/):
# FlashInfer's SM120 sparse-MLA DSv4 kernels are built for these top-k widths (decode:
# 128/512/1024; prefill also 2048). Rounding to a multiple of 128 gives 256 for a 128-token
# window plus 5 drafts, which neither has; the padding slots stay -1.
_DSV4_DSPARK_INDEX_WIDTHS = (128, 512, 1024)


def _dsv4_dspark_index_width(min_width: int) -> int:
    for width in _DSV4_DSPARK_INDEX_WIDTHS:
        if min_width <= width:
            return width
    raise ValueError(
        f"DSpark SWA index width {{min_width}} exceeds the widest FlashInfer SM12x "
        f"sparse-MLA kernel ({{_DSV4_DSPARK_INDEX_WIDTHS[-1]}})"
    )
"""

PATCH = Patch(
    name="dspark-index-width",
    target="vllm/v1/attention/backends/mla/sparse_swa.py",
    marker=MARKER,
    edits=(Edit(ANCHOR, REPLACEMENT),),
    source="vLLM 0.27.1 vllm/v1/attention/backends/mla/sparse_swa.py, as quoted in "
    "ecohash-co/deepseek-v4-flash-dgx-spark-vllm027 docs/01-blockers.md",
    append=HELPER,
)

if __name__ == "__main__":
    sys.exit(main(PATCH))
