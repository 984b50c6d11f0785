"""Overlay: the API server hands the engine core only a prompt's new tokens.

Why: every turn the API server validates every prompt id (``max``/``min`` over the whole
history in ``BaseRenderer.validate_token_ids``), msgpack-encodes the whole prompt, and the
engine core decodes it into fresh Python ints (~40 ms together at 500k tokens, measured in
bench/frontend_stages.py), although the previous turn's prompt, already validated, sent
and decoded, is all but the last few hundred of those tokens.

How (``prompt_delta.py`` has the protocol and its exactness argument):

* ``validate-ids`` (API server): ``validate_token_ids`` checks only the ids after the prefix
  a recently validated prompt shares (one list comparison; the tokenizer cache's ids are the
  same int objects turn after turn, so it is ~1 ms at 500k). Exact: the whole is in range iff
  the prefix (in range, checked before) and the rest are, and an out-of-range id can only be
  in the rest, so the error names the same id.
* ``core-send`` (API server): ``AsyncMPClient.add_request_async`` sends, for a prompt that
  shares at least 2,048 tokens with one of the last few it sent, ``prompt_token_ids=None``
  and two ``trace_headers`` entries: the earlier request, the shared length, and the new
  tokens. An engine core without this overlay rejects such a request cleanly (vLLM's
  ``Request`` refuses a prompt with neither ids nor embeddings, and the engine core answers
  a preprocessing error), so a half-applied overlay can fail a request but never serve a
  wrong prompt.
* ``core-receive`` (engine core): ``EngineCore.preprocess_add_request`` rebuilds the prompt
  from the prompt it holds for the earlier request before vLLM builds its ``Request``, and
  tells the block-hash cache how much it shares (so it is not compared again).
* ``worker-send`` (engine core): after ``Scheduler.schedule``, a rebuilt prompt travels to
  the workers as a delta too (``worker_delta.py``).

Only plain requests take part: no prompt embeddings, no resumable (streaming-input) session
(whose prompt grows in place), and no trace headers of their own (OpenTelemetry tracing on).
One engine core per API client only (not data parallel: the DP clients pick an engine per
request, so a sender's record would not be one receiver's).
"""

from __future__ import annotations

import functools
import logging
import os
import random
from typing import Any

from . import hooks, worker_delta
from .prefix_hashes import BASE_HINTS, TAIL_SCAN, Hint, common_prefix_len
from .prompt_delta import (
    Delta,
    DeltaError,
    Receiver,
    Sender,
    decode_delta,
    encode_delta,
    sender_key,
)

logger = logging.getLogger("dsv4_flash_overlays.handoff")

NAME = "incremental-prompt-handoff"
FLAG = "VLLM_INCREMENTAL_PROMPT_HANDOFF"
ENV_VERIFY_RATE = "VLLM_INCREMENTAL_PROMPT_HANDOFF_VERIFY_RATE"
DEFAULT_VERIFY_RATE = 0.01
HEADER = "x-dsv4-prompt-delta"
TAIL_HEADER = "x-dsv4-prompt-tail"
PATCH_MARK = "_dsv4_prompt_handoff"
VALIDATED_KEEP = 4

SENDER = Sender()
RECEIVER = Receiver()
_validated: list[tuple[list[int], int]] = []  # (a prompt validated in full, its length then)
_rng = random.Random()
_installed: list[tuple[Any, str, Any]] = []


def _verify_rate() -> float:
    try:
        rate = float(os.environ.get(ENV_VERIFY_RATE, "") or DEFAULT_VERIFY_RATE)
    except ValueError:
        rate = DEFAULT_VERIFY_RATE
    return min(1.0, max(0.0, rate))


def validated_prefix(token_ids: Any) -> int:
    """How many leading ids of ``token_ids`` a recent successful validation covered."""
    if not isinstance(token_ids, list):
        return 0
    best = 0
    for prev, n in reversed(_validated):
        best = max(best, common_prefix_len(prev, token_ids, n))
        if best >= min(n, len(token_ids)) - TAIL_SCAN:
            break  # all but its tail: an older prompt will not cover much more
    return best


def remember_validated(token_ids: Any) -> None:
    if isinstance(token_ids, list) and token_ids:
        _validated.append((token_ids, len(token_ids)))
        del _validated[:-VALIDATED_KEEP]


def wrap_validate(original: Any) -> Any:
    @functools.wraps(original)
    def validate_token_ids(self: Any, token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        skip = validated_prefix(token_ids)
        if skip and skip < len(token_ids):
            original(self, token_ids[skip:], *args, **kwargs)
        elif not skip:
            original(self, token_ids, *args, **kwargs)
        remember_validated(token_ids)  # reached only if valid: original raises otherwise

    setattr(validate_token_ids, PATCH_MARK, True)
    return validate_token_ids


def plain_request(request: Any) -> bool:
    return (
        isinstance(getattr(request, "prompt_token_ids", None), list)
        and getattr(request, "prompt_embeds", None) is None
        and not getattr(request, "resumable", False)
        and not getattr(request, "trace_headers", None)
    )


def wrap_send(original: Any, exact_cls: type, rate: float) -> Any:
    @functools.wraps(original)
    async def add_request_async(self: Any, request: Any) -> None:
        if type(self) is not exact_cls or not plain_request(request):
            return await original(self, request)
        full = request.prompt_token_ids
        delta, tail = SENDER.plan(full)
        if delta is None:
            await original(self, request)
            SENDER.sent(request.request_id, full, None)
            return None
        headers = {HEADER: encode_delta(delta)}
        if not (rate > 0 and _rng.random() < rate):  # else: full ids, the receiver checks
            headers[TAIL_HEADER] = ",".join(map(str, tail))
            request.prompt_token_ids = None
        request.trace_headers = headers
        try:
            await original(self, request)
        finally:
            request.prompt_token_ids = full
            request.trace_headers = None
        SENDER.sent(request.request_id, full, delta)
        return None

    setattr(add_request_async, PATCH_MARK, True)
    return add_request_async


def receive(request: Any) -> None:
    """Rebuild a delta-sent prompt in place and remember every plain prompt."""
    headers = getattr(request, "trace_headers", None) or {}
    sender = sender_key(request)
    if HEADER in headers:
        delta: Delta = decode_delta(headers[HEADER])
        rest = {k: v for k, v in headers.items() if k not in (HEADER, TAIL_HEADER)}
        tail_text = headers.get(TAIL_HEADER)
        request.trace_headers = rest or None
        if tail_text is None:  # a sampled check: the full prompt came too
            full = request.prompt_token_ids
            try:
                ok = RECEIVER.check(RECEIVER.rebuild(sender, delta, full[delta.shared :]), full)
            except DeltaError as exc:
                ok = False
                RECEIVER.refused = RECEIVER.refused or str(exc)
            if not ok:
                logger.error(
                    "%s: self-check MISMATCH: %s (pid %d)", NAME, RECEIVER.refused, os.getpid()
                )
        else:
            tail = [int(x) for x in tail_text.split(",")] if tail_text else []
            base = RECEIVER.base(sender, delta)
            request.prompt_token_ids = RECEIVER.rebuild(sender, delta, tail)
            BASE_HINTS.put(request.request_id, Hint(delta.base, delta.shared, id(base)))
            worker_delta.relate(request.request_id, delta.base, delta.shared)
    if plain_request(request):
        RECEIVER.store(sender, request.request_id, request.prompt_token_ids)


def wrap_receive(original: Any) -> Any:
    @functools.wraps(original)
    def preprocess_add_request(self: Any, request: Any) -> Any:
        receive(request)  # a DeltaError becomes vLLM's preprocessing error for the request
        return original(self, request)

    setattr(preprocess_add_request, PATCH_MARK, True)
    return preprocess_add_request


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Install the wrappers (validate-ids, core-send, core-receive, worker-send); idempotent."""
    res = hooks.resolve(NAME) if res is None else res
    if not res.ok:
        return hooks.Applied(res.reason)
    rate = _verify_rate()
    makers = {
        "validate-ids": wrap_validate,
        "core-send": lambda f, t: wrap_send(f, t.owner, rate),
        "core-receive": wrap_receive,
        "worker-send": worker_delta.wrap_schedule,
    }
    for role, make in makers.items():
        target = res.role(role)[0]
        if getattr(target.raw, PATCH_MARK, False):
            continue
        wrapped = make(target.raw, target) if role == "core-send" else make(target.raw)
        _installed.append((target.owner, target.attr, target.raw))
        setattr(target.owner, target.attr, wrapped)
    return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests)."""
    while _installed:
        owner, attr, raw = _installed.pop()
        setattr(owner, attr, raw)
