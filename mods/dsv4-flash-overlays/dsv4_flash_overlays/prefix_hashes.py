"""Prefix-cache block hashes that cost only the new blocks: reuse a recent prompt's chain.

Model-agnostic core (no vLLM imports). vLLM's engine core hashes every full block of a new
request's prompt for the prefix cache before the request is queued (vllm/v1/request.py
``Request.__init__`` -> ``update_block_hashes`` -> the hasher made by
``vllm/v1/core/kv_cache_utils.py`` ``get_request_block_hasher``): one sha256 of
``(parent hash, block tokens, extra keys)`` per block, chained, so a 500k-token prompt costs
~4k hashes every turn although all but the last turn's blocks were hashed the turn before.

Exactness argument. The hash of block ``i`` is a function of the parent hash (block
``i-1``'s), the tokens of block ``i`` (and, with ``L`` look-ahead tokens in vLLM 0.33, the
``L`` tokens after it) and the block's extra keys (LoRA name, multimodal features in the
block, the cache salt on block 0, prompt-embedding hashes). So if two prompts agree on
their first ``(i + 1) * B + L`` tokens and have the same extra keys, blocks ``0..i`` hash
the same: by induction on ``i``. We reuse a cached chain only for requests whose extra keys
can only be the LoRA name and the cache salt (no multimodal features, no prompt
embeddings), keyed by both, and only over the blocks whose tokens (and look-ahead) we found
equal by comparing the token lists. The remaining blocks are hashed by vLLM's own hasher,
continuing from the reused chain, as it continues a request's chain after each decoded
token. A sampled full rehash (``verify_rate``) re-checks the argument in production and
switches the cache off for the process on any difference.

Comparing a 500k-token prompt with a cached one is one C-level list comparison (about 1 ms
when the token ints are the same objects, as when a prompt was rebuilt from the previous
one, 3 ms when they are equal ints), against ~17 ms for hashing it (measured with vLLM
0.32's own functions, block size 128).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("dsv4_flash_overlays.prefix_hashes")

ENV_CACHE_MB = "VLLM_INCREMENTAL_BLOCK_HASHES_MB"
ENV_VERIFY_RATE = "VLLM_INCREMENTAL_BLOCK_HASHES_VERIFY_RATE"
DEFAULT_CACHE_MB = 256.0
DEFAULT_VERIFY_RATE = 0.01
# Bytes per cached token for the budget: a list slot plus, once the request is gone and the
# cache is the list's last holder, the int object (CPython: 28 bytes for ids < 2**30).
BYTES_PER_TOKEN = 36
BYTES_PER_HASH = 8 + 33 + 32  # list slot, bytes object header, 32-byte digest
MAX_ENTRIES = 64
# Entries tried per lookup, newest first (a conversation's last turn is almost always it).
MAX_CANDIDATES = 4


@dataclass(frozen=True)
class Hint:
    """A prompt rebuilt as ``base_tokens[:shared] + new`` (handoff.py): the earlier request,
    the shared length, and the identity of the very list it was rebuilt from."""

    base: str
    shared: int
    base_list_id: int


class _Hints:
    """Request id -> its Hint, so the block-hash cache takes the shared prefix without
    comparing it. Bounded: unused hints age out."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._d: OrderedDict[str, Hint] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, hint: Hint) -> None:
        with self._lock:
            self._d[rid] = hint
            while len(self._d) > self.keep:
                self._d.popitem(last=False)

    def pop(self, rid: str) -> Hint | None:
        with self._lock:
            return self._d.pop(rid, None)


BASE_HINTS = _Hints()


TAIL_SCAN = 256  # a new turn's prompt usually differs from the last one in its last tokens
CHUNK = 32768  # items per slice compared: small enough to reuse one allocation, no page faults


def common_prefix_len(a: Sequence[Any], b: Sequence[Any], limit: int | None = None) -> int:
    """Length of the common prefix of two lists, by C-level comparisons of slices.

    Slices of ``CHUNK`` items from the start while they are equal, then a halving search
    inside the first unequal one: about the common prefix's length in C comparisons (one
    pointer test per item when the lists share their int objects), never a Python loop over
    more than 16 items. (One slice of a 500k-item list costs 5x the comparison: fresh pages.)
    """
    n = min(len(a), len(b), limit if limit is not None else len(a))
    lo = 0
    while lo < n:
        k = min(CHUNK, n - lo)
        if a[lo : lo + k] == b[lo : lo + k]:
            lo += k
            continue
        hi = lo + k
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        while lo < hi and a[lo] == b[lo]:
            lo += 1
        return lo
    return n


@dataclass
class Entry:
    """One hashed prompt: its tokens (a list never mutated) and its chain of block hashes."""

    key: Hashable
    rid: str
    tokens: Sequence[int]
    ntok: int
    hashes: list[Any]
    nbytes: int


@dataclass
class Stats:
    lookups: int = 0
    hits: int = 0
    reused_blocks: int = 0
    new_blocks: int = 0
    verified: int = 0
    mismatches: int = 0
    evictions: int = 0
    hinted: int = 0


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


class BlockHashCache:
    """Recent prompts' block-hash chains; ``reusable`` says how many blocks a new prompt may
    take from one of them, ``store`` remembers a prompt once hashed. Thread-safe."""

    def __init__(
        self,
        block_size: int,
        lookahead: int = 0,
        *,
        budget_bytes: int | None = None,
        verify_rate: float | None = None,
        seed: int | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.lookahead = max(0, lookahead)
        mb = _env_float(ENV_CACHE_MB, DEFAULT_CACHE_MB) if budget_bytes is None else None
        self.budget_bytes = int(mb * 2**20) if mb is not None else int(budget_bytes or 0)
        rate = (
            _env_float(ENV_VERIFY_RATE, DEFAULT_VERIFY_RATE) if verify_rate is None else verify_rate
        )
        self.verify_rate = min(1.0, max(0.0, rate))
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, Entry] = OrderedDict()
        self._by_rid: dict[str, Entry] = {}
        self._bytes = 0
        self.stats = Stats()
        self.enabled = self.budget_bytes > 0
        self.disabled_reason = "" if self.enabled else "budget is 0"

    def blocks_for(self, ntok: int) -> int:
        """Full blocks of a prompt of ``ntok`` tokens that have a hash (look-ahead included)."""
        return max(0, (ntok - self.lookahead) // self.block_size)

    def reusable(
        self, key: Hashable, tokens: Sequence[int], hint: Hint | None = None
    ) -> tuple[list[Any], int]:
        """(hashes of the longest reusable chain, common token prefix): the first blocks of
        ``tokens`` whose hashes a cached prompt with the same ``key`` already has.

        With a ``hint`` whose base list is the cached entry's own token list, the shared
        prefix is known (the prompt was built from that list) and is not compared again."""
        if not self.enabled:
            return [], 0
        with self._lock:
            self.stats.lookups += 1
            hinted = self._by_rid.get(hint.base) if hint else None
        if (
            hint is not None
            and hinted is not None
            and hinted.key == key
            and id(hinted.tokens) == hint.base_list_id
            and hint.shared <= min(hinted.ntok, len(tokens))
        ):
            n = min(len(hinted.hashes), self.blocks_for(hint.shared))
            if n:
                with self._lock:
                    self.stats.hits += 1
                    self.stats.reused_blocks += n
                    self.stats.hinted += 1
                return hinted.hashes[:n], hint.shared
        with self._lock:
            cands = [] if hinted is None else [hinted]
            for e in reversed(self._lru.values()):
                if len(cands) >= MAX_CANDIDATES:
                    break
                if e is not hinted:
                    cands.append(e)
        best: list[Any] = []
        best_lcp = 0
        first = min(len(tokens), self.block_size + self.lookahead)
        for e in cands:
            if e.key != key or e.ntok < first or e.tokens[:first] != tokens[:first]:
                continue
            lcp = common_prefix_len(e.tokens, tokens, e.ntok)
            n = min(len(e.hashes), self.blocks_for(lcp))
            if n > len(best):
                best, best_lcp = e.hashes[:n], lcp
            if lcp >= min(e.ntok, len(tokens)) - TAIL_SCAN:
                break  # all but its tail: an older entry will not share much more
        if best:
            with self._lock:
                self.stats.hits += 1
                self.stats.reused_blocks += len(best)
        return best, best_lcp

    def store(self, key: Hashable, rid: str, tokens: Sequence[int], hashes: list[Any]) -> None:
        """Remember a prompt and its hashes (``tokens`` must never be mutated afterwards)."""
        if not self.enabled or not hashes:
            return
        ntok = len(tokens)
        nbytes = BYTES_PER_TOKEN * ntok + BYTES_PER_HASH * len(hashes) + 512
        entry = Entry(key, rid, tokens, ntok, list(hashes), nbytes)
        with self._lock:
            if not self.enabled or nbytes > self.budget_bytes:
                return
            # A prompt this one extends is superseded (the conversation's previous turn).
            for old in list(reversed(self._lru.values()))[:MAX_CANDIDATES]:
                if (
                    old.key == key
                    and old.ntok <= ntok
                    and len(old.hashes) <= len(hashes)
                    and old.hashes == hashes[: len(old.hashes)]
                ):
                    self._remove(old)
            self._lru[id(entry)] = entry
            self._by_rid[rid] = entry
            self._bytes += nbytes
            while (self._bytes > self.budget_bytes or len(self._lru) > MAX_ENTRIES) and self._lru:
                _, old = next(iter(self._lru.items()))
                self._remove(old)
                self.stats.evictions += 1

    def _remove(self, entry: Entry) -> None:
        if self._lru.pop(id(entry), None) is None:
            return
        self._bytes -= entry.nbytes
        if self._by_rid.get(entry.rid) is entry:
            del self._by_rid[entry.rid]

    def should_verify(self) -> bool:
        return self.verify_rate > 0 and self._rng.random() < self.verify_rate

    def note_new(self, new: int) -> None:
        """Count the blocks vLLM's hasher still hashed for a prompt."""
        with self._lock:
            self.stats.new_blocks += new

    def mismatch(self, what: str) -> None:
        """A sampled full rehash disagreed: off for the life of the process, memory dropped."""
        with self._lock:
            self.stats.mismatches += 1
            self.enabled = False
            self.disabled_reason = f"self-check mismatch ({what})"
            self._lru.clear()
            self._by_rid.clear()
            self._bytes = 0
        logger.error(
            "incremental-block-hashes: self-check MISMATCH (%s); turning the cache off for "
            "this process (pid %d)",
            what,
            os.getpid(),
        )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            s = dict(self.stats.__dict__)
            s.update(entries=len(self._lru), bytes=self._bytes, enabled=self.enabled)
        return s
