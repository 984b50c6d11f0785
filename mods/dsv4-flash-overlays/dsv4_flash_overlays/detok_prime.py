"""Overlay: the detokenizer of a new request is primed with the prompt's tail, not all of it.

Why: vLLM's fast incremental detokenizer primes ``tokenizers.decoders.DecodeStream`` with
the whole prompt (``DecodeStream(ids=request.prompt_token_ids, ...)`` in
vllm/v1/engine/detokenizer.py ``FastIncrementalDetokenizer.__init__``), and the stream's
first ``step`` decodes every primed id: the first output token of a turn costs a decode of
the whole history on the API server (130 ms at 477k tokens, measured with tokenizers
0.23.3 and the DeepSeek-V4 tokenizer; 200 ms and more in a loaded server).

Exactness argument. A step's text is ``decode(ids[p:] + [t])`` minus ``decode(ids[p:])``
(the stream's prefix), after which the stream keeps only the ids after the prompt. With a
``ByteLevel`` decoder (the only one we accept: the tokenizer's decoder is checked), decoding
is: each kept token's bytes, concatenated, then UTF-8 with replacement. Cut the prompt at
a token whose bytes begin a character (its own decode is non-empty and does not begin with
U+FFFD, so its first byte is no continuation byte): the byte stream before the cut then
ends where a character starts, lossy UTF-8 decoding of the concatenation is the
concatenation of the decodings, and every step's text is the same whether the stream was
primed with the whole prompt or with the ids from the cut on, provided the prompt itself
ends where a character ends: a prompt ending inside a character makes the whole-primed
stream's first step return the whole decoded prompt (tokenizers 0.23.3, measured), so such
a prompt is primed whole. Special tokens skipped by
``skip_special_tokens`` contribute no bytes either way. We look for the cut among the last
``TAIL`` tokens, and prime with the whole prompt when there is none.

A sampled check (VLLM_INCREMENTAL_DETOKENIZER_VERIFY_RATE) primes a second pair of streams,
whole and tail, steps both with the prompt's last tokens and compares; a difference turns
the overlay off for the process.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import random
from typing import Any

from . import hooks

logger = logging.getLogger("dsv4_flash_overlays.detok_prime")

NAME = "incremental-detokenizer"
FLAG = "VLLM_INCREMENTAL_DETOKENIZER"
ENV_VERIFY_RATE = "VLLM_INCREMENTAL_DETOKENIZER_VERIFY_RATE"
DEFAULT_VERIFY_RATE = 0.01
PATCH_MARK = "_dsv4_detok_prime"
TAIL = 64  # tokens searched for a cut, from the end
MIN_PROMPT = 2 * TAIL  # shorter prompts are primed whole: nothing to gain
PROBES = 4  # prompt tokens stepped by the sampled check

_state: dict[str, Any] = {"enabled": True, "reason": "", "verified": 0, "tails": 0}
_rng = random.Random()
_installed: tuple[Any, str, Any] | None = None


def _verify_rate() -> float:
    try:
        return min(1.0, max(0.0, float(os.environ.get(ENV_VERIFY_RATE, "") or DEFAULT_VERIFY_RATE)))
    except ValueError:
        return DEFAULT_VERIFY_RATE


_DECODERS: dict[int, bool] = {}


def byte_level_decoder(tok: Any) -> bool:
    """True when ``tok`` (a tokenizers.Tokenizer) decodes with a lone ByteLevel decoder."""
    known = _DECODERS.get(id(tok))
    if known is not None:
        return known
    try:
        dec = tok.decoder
        ok = dec is not None and json.loads(dec.__getstate__()).get("type") == "ByteLevel"
    except Exception:
        ok = False
    _DECODERS[id(tok)] = ok  # vLLM keeps one tokenizer per process
    return ok


def safe_cut(tok: Any, ids: list[int], skip_special_tokens: bool, tail: int = TAIL) -> int | None:
    """The last index ``j`` among the last ``tail`` ids where a token starting a character
    begins (see the module docstring), or None; None too when the prompt ends inside a
    character (its decoded tail ends with U+FFFD), where the whole-primed stream's first
    step is not a difference of decodings."""
    for j in range(len(ids) - 1, max(0, len(ids) - tail) - 1, -1):
        s = tok.decode([ids[j]], skip_special_tokens=skip_special_tokens)
        if s and not s.startswith("\ufffd"):
            end = tok.decode(ids[j:], skip_special_tokens=skip_special_tokens)
            return None if end.endswith("\ufffd") else j
    return None


class _PromptTail:
    """The request as FastIncrementalDetokenizer.__init__ sees it: its prompt is the tail."""

    __slots__ = ("_request", "prompt_token_ids")

    def __init__(self, request: Any, tail: list[int]) -> None:
        self._request = request
        self.prompt_token_ids = tail

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def _steps(stream_cls: Any, tok: Any, ids: list[int], probes: list[int], skip: bool) -> list[Any]:
    s = stream_cls(ids=ids, skip_special_tokens=skip)
    out = []
    for t in probes:
        try:
            out.append(s.step(tok, t))
        except Exception as exc:  # the error is part of the behaviour compared
            out.append(f"error: {exc}")
    return out


def check(stream_cls: Any, tok: Any, ids: list[int], j: int, skip: bool) -> bool:
    """Whole-prompt and tail priming give the same steps for the prompt's last tokens."""
    probes = ids[-PROBES:]
    return _steps(stream_cls, tok, ids, probes, skip) == _steps(
        stream_cls, tok, ids[j:], probes, skip
    )


def _disable(reason: str) -> None:
    _state["enabled"] = False
    _state["reason"] = reason
    logger.error(
        "%s: self-check MISMATCH (%s); priming with whole prompts for this process (pid %d)",
        NAME,
        reason,
        os.getpid(),
    )


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Wrap the stack's detokenizer constructor (its ``detok-init`` hook); idempotent."""
    global _installed
    res = hooks.resolve(NAME) if res is None else res
    if not res.ok:
        return hooks.Applied(res.reason)
    target = res.role("detok-init")[0]
    original = target.raw
    if getattr(original, PATCH_MARK, False):
        return hooks.Applied()
    # Our view replaces prompt_token_ids only where the constructor primes the stream: the
    # constructor must read it once, and the base class's constructor not at all.
    src = inspect.getsource(original)
    if src.count("prompt_token_ids") != 1:
        return hooks.Applied(f"{target.hook.where} reads prompt_token_ids more than once")
    for base in target.owner.__mro__[1:]:
        init = base.__dict__.get("__init__")
        if init is not None and getattr(init, "__module__", "") == target.owner.__module__:
            if "prompt_token_ids" in inspect.getsource(init):
                return hooks.Applied(f"{base.__name__}.__init__ reads prompt_token_ids")
    import tokenizers.decoders

    rate = _verify_rate()

    @functools.wraps(original)
    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        ids = getattr(request, "prompt_token_ids", None)
        tok = getattr(tokenizer, "_tokenizer", None)
        params = getattr(request, "sampling_params", None)
        if (
            not _state["enabled"]
            or not isinstance(ids, list)
            or len(ids) < MIN_PROMPT
            or tok is None
            or params is None
            or not byte_level_decoder(tok)
        ):
            return original(self, tokenizer, request)
        skip = bool(params.skip_special_tokens)
        j = safe_cut(tok, ids, skip)
        if not j:
            return original(self, tokenizer, request)
        if rate > 0 and _rng.random() < rate:
            _state["verified"] += 1
            if not check(tokenizers.decoders.DecodeStream, tok, ids, j, skip):
                _disable(f"{len(ids)} prompt tokens, cut at {j}")
                return original(self, tokenizer, request)
        _state["tails"] += 1
        return original(self, tokenizer, _PromptTail(request, ids[j:]))

    setattr(__init__, PATCH_MARK, True)
    _installed = (target.owner, target.attr, original)
    setattr(target.owner, target.attr, __init__)
    return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests)."""
    global _installed
    if _installed is not None:
        owner, attr, original = _installed
        setattr(owner, attr, original)
        _installed = None
