"""Peers' measurements of the field's decode levers: the anchors the model's lever terms use.

Each is one before/after pair as the peer published it, with the setup it was measured on
and where. The model takes a figure as a calibration only where it cannot derive the
effect (the spin budget's throughput, the cost of breakable graphs); the others stand
beside its own prediction (perfmodel/levers.py, docs/performance-model.md "Decode levers").
"""

from __future__ import annotations

from dataclasses import dataclass

MIAAI = "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark"


@dataclass(frozen=True)
class Measured:
    """One peer figure: ``before`` -> ``after`` in ``unit``, on ``setup``, from ``source``."""

    what: str
    before: float
    after: float
    unit: str
    setup: str
    source: str

    @property
    def change(self) -> float:
        """after / before - 1 (+0.099 is 9.9% more)."""
        return self.after / self.before - 1

    def to_json(self) -> dict:
        return {
            "what": self.what,
            "before": self.before,
            "after": self.after,
            "unit": self.unit,
            "change": round(self.change, 6),
            "setup": self.setup,
            "source": self.source,
        }


_SPIN_SETUP = (
    "2x GB10 TP=2 (mp executor), DeepSeek-V4-Flash-0731, vLLM 0.25.2 "
    "(ghcr.io/anemll/dspark-vllm-gx10:0.1.1), GPU clocks capped at 2000 MHz, 5 warm trials "
    "per arm; busy_loop_s 1 s -> 0.002 on both ranks"
)
SPIN_DECODE = Measured(
    "decode, median", 67.8, 74.5, "tok/s", _SPIN_SETUP, f"{MIAAI}#79 (sofiane-belkhodja)"
)
SPIN_HEAD_CPU = Measured(
    "head node CPU", 3.54, 2.95, "cores", _SPIN_SETUP, f"{MIAAI}#79 (sofiane-belkhodja)"
)
SPIN_WORKER_CPU = Measured(
    "worker node CPU", 3.86, 3.88, "cores", _SPIN_SETUP, f"{MIAAI}#79 (sofiane-belkhodja)"
)
SPIN_VLLM_CPU = Measured(
    "vLLM processes' CPU",
    3.33,
    0.89,
    "cores",
    "2x GB10 TP=2 (mp executor), DeepSeek V4 Flash; 'no throughput/latency change'",
    f"{MIAAI}#71 and #74; vllm-project/vllm#51950 (closed unmerged)",
)
GRAPHS_C1 = Measured(
    "C1 decode, warm median, breakable -> regular",
    74.6,
    95.9,
    "tok/s",
    "Anemll ghcr.io/anemll/dspark-vllm-gx10:0.1.1 (breakable graphs on for DeepSeek V4 when "
    "VLLM_USE_BREAKABLE_CUDAGRAPH is unset) vs VLLM_USE_BREAKABLE_CUDAGRAPH=0, 2x GB10 TP=2, "
    "1M context",
    f"{MIAAI} results/RESULTS-2026-08-14.md",
)
GRAPHS_C2 = Measured(
    "C2 aggregate decode, breakable -> regular",
    134.2,
    151.8,
    "tok/s",
    GRAPHS_C1.setup,
    GRAPHS_C1.source,
)
_ADAPTIVE_SETUP = (
    "8x MI355X TP8, DeepSeek-V4 DSpark, ShareGPT, 512 output tokens, fresh server per cell; "
    "fixed K=7 -> adaptive K<=7"
)
_ADAPTIVE_SOURCE = "vllm-project/vllm#52362 (merged; the ROCm port of #47808)"


def _adaptive(concurrency: int, fixed: float, adaptive: float) -> Measured:
    what = f"c{concurrency} output, fixed K=7 -> adaptive"
    return Measured(what, fixed, adaptive, "tok/s", _ADAPTIVE_SETUP, _ADAPTIVE_SOURCE)


ADAPTIVE = (
    _adaptive(4, 970.33, 902.37),
    _adaptive(64, 6712.35, 7144.12),
    _adaptive(256, 7852.42, 13324.67),
)

# TP=2 -> TP=4 on four Sparks: single-stream C1 tok/s per prompt class.
TONY_TP4 = "tonyd2wild/Deepseek-V4-Flash-TP4-4x-DGX-Spark"
_TP4_SETUP = (
    "4x GB10 TP=4 vs 2x GB10 TP=2, vLLM mp backend, switched 200GbE RoCE (MikroTik CRS812), "
    "NCCL_IB_HCA=rocep1s0f0 NCCL_IB_GID_INDEX=3; non-streaming, temperature 0, max_tokens 200, "
    "nonce-front prompts; the README says its tables were measured on its private DSpark k=5 "
    "stack, not the published MTP-2 launcher"
)
TP4_C1 = tuple(
    Measured(what, tp2, tp4, "tok/s", _TP4_SETUP, f"{TONY_TP4} README.md")
    for what, tp2, tp4 in (("count", 87, 120), ("code", 66, 87), ("prose", 42, 46))
)
_LUX = "luxingcom/LuZ0.3.1-DeepSeek-v4-Flash-DSpark-DGXspark-TP4-Ring"
TP4_NCCL = (
    Measured(
        "all-reduce latency, 16 B at TP=2 -> 196 KB at TP=4 ring",
        29.0,
        98.0,
        "us",
        "4x GB10 switchless ring; ring-only NCCL 2.30.7 build, NCCL_ALGO=RING, "
        "NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=4, NCCL_BUFFSIZE=8MB",
        f"{_LUX} docs/01-research-reports/analysis-tp2-tp4-communication-2026-08-09.md; "
        "ar-optimization-2026-08-22.md section 2.2",
    ),
)
