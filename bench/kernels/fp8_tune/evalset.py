# SPDX-License-Identifier: MIT
"""The accuracy evaluation set: argmax agreement of an fp8 head with the bf16 head.

Synthetic unless a real lm_head shard is given:
  * W [N, K]: Student-t (5 dof) entries, std 0.04, rows scaled by LogNormal(0, 0.25):
    heavier tails than a Gaussian (trained heads have outliers, which stress per-row
    scales) and varying row norms (frequent vs rare tokens).
  * hidden states: h = g + beta * w_t / |w_t| with g ~ N(0, I) (a post-RMSNorm state: logits
    of std ~2.6 nats across the vocabulary) and a target token t; beta is solved (Newton
    steps) so the top-1 margin z_t - max_{n != t} z_n equals a drawn margin.
  * drawn margins model a trained LM's top-1 margin: 75% "confident" LogNormal(median
    4 nats, sigma 0.7) and 25% "uncertain" Exponential(mean 1 nat). Its density near zero
    is what sets the disagreement rate: with per-logit noise of std sigma,
    P(argmax differs) ~ f(0) * E|d_t - d_r| ~ f(0) * 1.13 sigma.
The same rows (same seed) are shown to every path, so agreement rates are comparable and
their differences are not sampling noise of the set.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def synthetic_weight(n: int, k: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Heavy-tailed, row-norm-varying stand-in for a trained lm_head (bf16)."""
    t = torch.distributions.StudentT(torch.tensor(5.0, device=device)).sample((n, k))
    t = t / (5.0 / 3.0) ** 0.5 * 0.04
    rows = torch.exp(0.25 * torch.randn(n, 1, generator=gen)).to(device)
    return (t * rows).to(dtype=torch.bfloat16)


def draw_margins(rows: int, gen: torch.Generator) -> torch.Tensor:
    """Target top-1 margins in nats: 75% LogNormal(ln 4, 0.7), 25% Exponential(mean 1)."""
    confident = torch.exp(torch.log(torch.tensor(4.0)) + 0.7 * torch.randn(rows, generator=gen))
    uncertain = -torch.log(torch.rand(rows, generator=gen).clamp_min(1e-12))
    pick = torch.rand(rows, generator=gen) < 0.75
    return torch.where(pick, confident, uncertain)


def peaked_hidden(
    w: torch.Tensor, margins: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states whose exact top-1 margin (vs W in fp32) is ~``margins``; returns (h, t)."""
    n, k = w.shape
    rows = margins.shape[0]
    dev = w.device
    wf = w.float()
    g = torch.randn(rows, k, generator=gen).to(dev)
    t = torch.randint(0, n, (rows,), generator=gen).to(dev)
    u = wf[t] / wf[t].norm(dim=1, keepdim=True)
    z_g = g @ wf.t()
    z_u = u @ wf.t()
    beta = torch.zeros(rows, device=dev)
    target = margins.to(dev)
    idx = torch.arange(rows, device=dev)
    for _ in range(3):
        z = z_g + beta[:, None] * z_u
        zt = z[idx, t]
        z[idx, t] = float("-inf")
        r = z.argmax(dim=1)
        margin = zt - z[idx, r]
        slope = z_u[idx, t] - z_u[idx, r]
        beta = beta + (target - margin) / slope.clamp_min(1e-3)
    h = g + beta[:, None] * u
    return h.to(torch.bfloat16), t


class EvalSet:
    """Hidden-state chunks and the bf16 head's top-2 on them, built once, shown to each path."""

    def __init__(self, w: torch.Tensor, rows: int, chunk: int = 40, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.w = w
        self.chunk = chunk
        self.rows = rows
        margins = draw_margins(rows, gen)
        wf = w.float()  # once, not per chunk
        self.hidden: list[torch.Tensor] = []
        self.top2: list[torch.return_types.topk] = []
        for start in range(0, rows, chunk):
            h, _ = peaked_hidden(wf, margins[start : start + chunk], gen)
            self.hidden.append(h)
            self.top2.append((h @ w.t()).float().topk(2, dim=1))

    def margins(self) -> torch.Tensor:
        """Achieved bf16 top-1 margins (nats), all rows."""
        return torch.cat([(t.values[:, 0] - t.values[:, 1]).cpu() for t in self.top2])

    def agreement(self, head: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, int]:
        """(share of rows whose argmax equals the bf16 head's, number that differ)."""
        differ = 0
        for h, top2 in zip(self.hidden, self.top2, strict=True):
            differ += int((head(h).float().argmax(dim=1) != top2.indices[:, 0]).sum())
        return 1.0 - differ / self.rows, differ
