"""Block-hash prefix cache, so multi-turn prompts prefill only their uncached suffix.

Like vLLM's automatic prefix caching: a prompt is cut into full blocks of `block_size`
tokens, each block's hash chains the previous one, and the longest run of leading blocks
already seen is a hit. At least one token is always recomputed (the last one), as in vLLM.
Only prompt blocks are cached (the twin's output token ids are not real tokens).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of every full block of ``tokens``."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(array("q", tokens[start : start + block_size]).tobytes())
        prev = h.digest()
        out.append(prev)
    return out


class PrefixCache:
    """LRU set of block hashes with a capacity in blocks."""

    def __init__(self, block_size: int, capacity_blocks: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.enabled = enabled
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, hashes: list[bytes], prompt_len: int) -> int:
        """Cached prompt tokens (a multiple of block_size, < prompt_len)."""
        if not self.enabled:
            return 0
        hit = 0
        with self._lock:
            for h in hashes:
                if h not in self._blocks:
                    break
                self._blocks.move_to_end(h)
                hit += 1
        cached = hit * self.block_size
        if cached >= prompt_len:
            cached -= self.block_size  # always recompute the last block
        return max(cached, 0)

    def insert(self, hashes: list[bytes]) -> None:
        if not self.enabled:
            return
        with self._lock:
            for h in hashes:
                self._blocks[h] = None
                self._blocks.move_to_end(h)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
