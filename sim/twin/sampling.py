"""Deterministic output text and DSpark acceptance draws.

Everything is a pure function of (twin seed, request key), so the same prompt with the same
seed gives the same words, the same length and the same acceptance counts, whatever else
the server is doing at the time.
"""

from __future__ import annotations

import hashlib
import math
import random

_SYL = [
    "ka",
    "lo",
    "mi",
    "ren",
    "to",
    "sa",
    "vel",
    "dor",
    "ni",
    "que",
    "bar",
    "li",
    "mon",
    "pra",
    "es",
    "tan",
    "gri",
    "fo",
    "hal",
    "un",
]
# A fixed vocabulary of 400 two-syllable pseudo-words (stable across runs and versions).
VOCAB = [a + b for a in _SYL for b in _SYL]
_PHI = (math.sqrt(5.0) - 1.0) / 2.0  # golden-ratio step of the low-discrepancy sequence


def key_of(*parts: object) -> int:
    """A stable 64-bit key from any parts (Python's hash() is salted per process)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "little")


def word(key: int, index: int) -> str:
    """The index-th output token's text: a space-led word, a comma or a full stop now and then."""
    k = key_of(key, index)
    w = VOCAB[k % len(VOCAB)]
    tail = (k >> 20) % 23
    if index == 0:
        return w.capitalize()
    if tail == 0:
        return "."
    if tail == 1:
        return ","
    return " " + w


END_THINK = "</think>"  # one token of DSV4's vocabulary (sim/twin/thinking.py)


def piece(key: int, idx: int, canned: list[str] | None, think_len: int | None) -> str:
    """The idx-th output token's text: a known answer's piece or a word; in thinking mode
    ``think_len`` reasoning words come first, then ``</think>``, then the answer."""
    if think_len is not None:
        if idx < think_len:
            return word(key_of(key, "think"), idx)
        if idx == think_len:
            return END_THINK
        idx -= think_len + 1
    return canned[idx] if canned is not None else word(key, idx)


def natural_length(key: int, lo: int, hi: int) -> int:
    """Where this request would emit EOS if not told to ignore it."""
    lo, hi = max(1, lo), max(lo, hi)
    return lo + key_of(key, "eos") % (hi - lo + 1)


class AcceptanceDrawer:
    """Accepted-draft counts per verify step for one request.

    One uniform u per step; draft position k is accepted iff u < P(k accepted), where
    P(k accepted) is the product of the conditional acceptances up to k. That gives exactly
    "k accepted only if k-1 was" with the profile's marginals. `quasi` takes u from a
    golden-ratio sequence (error O(1/n) instead of O(1/sqrt n)); `random` draws i.i.d.
    """

    def __init__(self, cum_accept: list[float], mode: str, key: int) -> None:
        self.cum = list(cum_accept)
        self.mode = mode
        self._rng = random.Random(key)
        self._u = self._rng.random()

    def _next_u(self) -> float:
        if self.mode == "random":
            return self._rng.random()
        self._u = (self._u + _PHI) % 1.0
        return self._u

    def draw(self) -> int:
        u = self._next_u()
        n = 0
        for c in self.cum:
            if u < c:
                n += 1
            else:
                break
        return n
