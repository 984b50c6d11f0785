"""Profile loading and the closed-form ground truth the engine is built to reproduce.

The engine (engine.py) and /twin/truth both take their numbers from here, so what a
benchmark measures can be checked against what the twin was told to be.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from pathlib import Path
from typing import Any

import yaml

from sim.twin import DEFAULT_PROFILE, PROFILES_DIR


class ProfileError(ValueError):
    """A profile file is missing, malformed or inconsistent."""


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, val in over.items():
        if isinstance(val, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], val)
        else:
            out[key] = copy.deepcopy(val)
    return out


def resolve_path(name: str | Path | None) -> Path:
    """A profile path, a bare name (``rehearsal``) or None (the default spark-pair)."""
    if name is None or str(name) == "":
        return DEFAULT_PROFILE
    path = Path(name)
    if path.is_file():
        return path
    for cand in (PROFILES_DIR / path, PROFILES_DIR / f"{name}.yaml"):
        if cand.is_file():
            return cand
    raise ProfileError(
        f"twin profile {name!r} not found; pass a path or one of "
        f"{sorted(p.stem for p in PROFILES_DIR.glob('*.yaml'))}"
    )


def load_raw(name: str | Path | None, _depth: int = 0) -> dict[str, Any]:
    """Read a profile, resolving ``base:`` (relative to the file) recursively."""
    path = resolve_path(name)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a mapping")
    base = data.pop("base", None)
    if base:
        if _depth > 5:
            raise ProfileError(f"{path}: base chain too deep")
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        data = _merge(load_raw(base_path, _depth + 1), data)
    data["_path"] = str(path)
    return data


class Profile:
    """Typed view over a profile dict with the performance-model formulas."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        try:
            table = {int(k): float(v) for k, v in raw["decode"]["step_ms_by_batch"].items()}
            self.accept_probs = [float(x) for x in raw["spec_decode"]["accept_prob_by_pos"]]
            self.prefill_tok_s = float(raw["prefill"]["tok_s"])
            self.prefill_base_ms = float(raw["prefill"]["step_base_ms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{raw.get('_path')}: missing or bad key: {exc}") from exc
        if 1 not in table or len(table) < 2:
            raise ProfileError("decode.step_ms_by_batch needs batch 1 and at least one more anchor")
        if not all(0.0 <= p <= 1.0 for p in self.accept_probs) or not self.accept_probs:
            raise ProfileError("spec_decode.accept_prob_by_pos: probabilities in [0, 1]")
        self._batches = sorted(table)
        self._step_ms = [table[b] for b in self._batches]
        self.fp8_saving_ms = float(raw["decode"].get("fp8_draft_head_saving_ms", 0.0))
        self.gamma = int(raw["spec_decode"].get("num_speculative_tokens", 5))
        self.sampling = str(raw["spec_decode"].get("sampling", "quasi"))

    # -- section accessors -------------------------------------------------------------
    def section(self, name: str) -> dict[str, Any]:
        return dict(self.raw.get(name) or {})

    @property
    def name(self) -> str:
        return str(self.raw.get("name", Path(self.raw.get("_path", "?")).stem))

    # -- decode ----------------------------------------------------------------------------
    def step_ms(self, batch: int, fp8_head: bool = False) -> float:
        """Verify-step time for ``batch`` decoding sequences (piecewise-linear anchors)."""
        if batch <= 0:
            return 0.0
        bs, ms = self._batches, self._step_ms
        if batch >= bs[-1]:
            slope = (ms[-1] - ms[-2]) / (bs[-1] - bs[-2])
            val = ms[-1] + slope * (batch - bs[-1])
        else:
            i = max(bisect_right(bs, batch) - 1, 0)
            frac = (batch - bs[i]) / (bs[i + 1] - bs[i])
            val = ms[i] + frac * (ms[i + 1] - ms[i])
        return val - (self.fp8_saving_ms if fp8_head else 0.0)

    def probs(self, gamma: int) -> list[float]:
        """Conditional acceptance for positions 1..gamma (last entry reused)."""
        p = self.accept_probs
        return [p[min(k, len(p) - 1)] for k in range(gamma)]

    def cum_accept(self, gamma: int) -> list[float]:
        """P(position k accepted) = product of the conditionals up to k."""
        out, c = [], 1.0
        for p in self.probs(gamma):
            c *= p
            out.append(c)
        return out

    def mean_accept_len(self, gamma: int) -> float:
        """Tokens per verify step = 1 + expected accepted drafts."""
        return 1.0 + sum(self.cum_accept(gamma))

    def prefill_ms(self, tokens: int) -> float:
        return tokens * 1000.0 / self.prefill_tok_s


def lone_prefill_s(
    prof: Profile, tokens: int, max_num_batched_tokens: int, lpt_threshold: int
) -> float:
    """Engine time from admission to first token for a prompt alone on an idle engine."""
    chunk = (
        max_num_batched_tokens if lpt_threshold <= 0 else min(max_num_batched_tokens, lpt_threshold)
    )
    full, rest = divmod(tokens, chunk)
    steps = [chunk] * full + ([rest] if rest else [])
    return sum(prof.prefill_base_ms + prof.prefill_ms(n) for n in steps) / 1000.0


def load(name: str | Path | None) -> Profile:
    return Profile(load_raw(name))


def derived(
    prof: Profile,
    gamma: int,
    fp8_head: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    lpt_threshold: int,
) -> dict[str, Any]:
    """Closed-form figures for /twin/truth (what an ideal benchmark should measure)."""
    step1 = prof.step_ms(1, fp8_head)
    mal = prof.mean_accept_len(gamma)
    agg = {
        str(b): round(b * mal * 1000.0 / prof.step_ms(b, fp8_head), 3)
        for b in sorted({1, 2, 4, 8, 16, 24, 32, max_num_seqs})
        if b <= max(max_num_seqs, 1)
    }
    spec_tokens = 1 + gamma
    chunk = max(max_num_batched_tokens - spec_tokens, 0)
    if lpt_threshold > 0:
        chunk = min(chunk, lpt_threshold)
    under = step1 + prof.prefill_ms(chunk)
    return {
        "decode_step_ms": round(step1, 4),
        "steps_per_s": round(1000.0 / step1, 4),
        "mean_accept_len": round(mal, 6),
        "accept_rate_by_pos": [round(x, 6) for x in prof.cum_accept(gamma)],
        "single_stream_decode_tok_s": round(mal * 1000.0 / step1, 4),
        "aggregate_decode_tok_s_by_batch": agg,
        "aggregate_decode_ceiling_tok_s": agg[str(max_num_seqs)]
        if str(max_num_seqs) in agg
        else None,
        "prefill_tok_s": prof.prefill_tok_s,
        "prefill_step_base_ms": prof.prefill_base_ms,
        "num_speculative_tokens": gamma,
        "fp8_draft_head": fp8_head,
        "prefill_chunk_tokens_beside_one_decode": chunk,
        "decode_step_ms_beside_prefill_chunk": round(under, 4),
        "decode_tok_s_beside_prefill": round(mal * 1000.0 / under, 4),
        # TTFT of a lone, uncached prompt = real tokenization time + this
        "lone_prefill_s_by_prompt_tokens": {
            str(n): round(lone_prefill_s(prof, n, max_num_batched_tokens, lpt_threshold), 6)
            for n in (1024, 8192, 32768, 131072)
        },
    }
