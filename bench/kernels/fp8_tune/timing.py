# SPDX-License-Identifier: MIT
"""Timing and correctness helpers shared by the tuner and the repository's benchmark.

Method: random data, never zeros (zeros let a GPU skip work); each variant rotates between
weight copies whose total is several times the L2 (so no call is served from cache); calls
are captured in a CUDA graph, as vLLM runs the draft step, and replayed; CUDA events;
medians over replays.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from dsv4_flash_overlays.fp8_head.configs import BF16, Choice, numerics_of
from dsv4_flash_overlays.fp8_head.dispatch import run_choice
from dsv4_flash_overlays.fp8_head.quant import quantize_act, quantize_rowwise

from .reference import dequantize_rowwise


def copies_for(n: int, k: int, l2_bytes: int) -> int:
    """Enough fp8 weight copies that together they are >= 4x the L2 (and at least 2)."""
    return max(2, -(-4 * l2_bytes // (n * k)))


class Problem:
    """Rotated bf16 weights of one shape, their fp8 copies, and fresh activations."""

    def __init__(self, n: int, k: int, copies: int | None = None, seed: int = 1234):
        self.n, self.k = n, k
        if copies is None:
            copies = copies_for(n, k, torch.cuda.get_device_properties().L2_cache_size)
        self.gen = torch.Generator(device="cuda").manual_seed(seed + n)
        self.w = [
            (torch.randn(n, k, device="cuda", generator=self.gen) * 0.02).to(torch.bfloat16)
            for _ in range(copies)
        ]
        self.qs = [quantize_rowwise(w) for w in self.w]
        self._wq0: torch.Tensor | None = None

    def act(self, m: int) -> torch.Tensor:
        return torch.randn(m, self.k, device="cuda", generator=self.gen).to(torch.bfloat16)

    def calls(self, choice: Choice, a: torch.Tensor) -> list[Callable[[], object]]:
        """One call per weight copy, running ``choice`` (bf16 = cuBLAS on the bf16 copy)."""
        if choice == BF16:  # what vLLM's unquantized lm_head runs (and our fallback)
            return [lambda w=w: torch.nn.functional.linear(a, w) for w in self.w]
        return [lambda q=q, s=s: run_choice(choice, a, q, s) for q, s in self.qs]

    def rel_error(self, choice: Choice, a: torch.Tensor) -> float:
        """‖choice(a) - exact‖ / ‖exact‖ on copy 0, exact = fp32 product of the quantized
        operands the path uses (a kernel bug shows up as O(1), rounding as <= 1e-2)."""
        if self._wq0 is None:
            q, s = self.qs[0]
            self._wq0 = dequantize_rowwise(q, s).float()
        num = numerics_of(choice)
        if num is None or num.terms == 0:
            a_hat = a.float()
        else:
            a_hat = quantize_act(a, num.terms, num.group).dequantize().float()
        ref = a_hat @ self._wq0.t()
        q, s = self.qs[0]
        y = run_choice(choice, a, q, s).float()
        if not torch.isfinite(y).all():
            return float("inf")
        return float((y - ref).norm() / ref.norm())


def graph_time_us(calls: list[Callable[[], object]], rounds: int = 2, reps: int = 25) -> float:
    """Median µs per call: capture ``rounds`` passes over ``calls`` in one CUDA graph, replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:  # warm-up: compile, cuBLAS handles, workspaces
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(rounds):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        st = torch.cuda.Event(enable_timing=True)
        en = torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en) * 1000.0 / (rounds * len(calls)))
    del g
    return statistics.median(times)
