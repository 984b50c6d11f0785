"""Overlay: prefix-cache block hashes of a new prompt cost only its new blocks.

Why: every turn of a long conversation re-sends the whole history, and the engine core
hashes every full block of it for the prefix cache before the request is queued (~17 ms
at 500k tokens with vLLM's sha256, block size 128). All but the new turn's blocks were
hashed the turn before.

How: the stack's ``hasher-factory`` hook is the name ``EngineCore.__init__`` calls to make
the request block hasher (``get_request_block_hasher`` in ``vllm.v1.engine.core``, whose
``__init__`` loads the general plugins first). We wrap it: the hasher it returns serves
a request's first call (from ``Request.__init__``, no hashes yet) from ``BlockHashCache``:
the blocks whose tokens equal a recent prompt's (one list comparison) take that prompt's
hashes, and vLLM's own hasher hashes the rest, continuing from them: it starts at
``len(request.block_hashes) * block_size`` from ``request.block_hashes[-1]`` (the anchors
the stack declares), so we hand it the reused chain on the request for the length of the
call and give the request its own empty list back before ``update_block_hashes`` extends
it. Every later call (decoded tokens) and every request with multimodal features, prompt
embeddings or a resumable session goes to vLLM's hasher unchanged. ``prefix_hashes.py``
has the exactness argument; a sampled full rehash (VLLM_INCREMENTAL_BLOCK_HASHES_VERIFY_RATE)
checks it in production and turns the cache off for the process on a difference.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Hashable
from typing import Any

from . import hooks
from .prefix_hashes import BASE_HINTS, BlockHashCache

logger = logging.getLogger("dsv4_flash_overlays.block_hashes")

NAME = "incremental-block-hashes"
FLAG = "VLLM_INCREMENTAL_BLOCK_HASHES"
PATCH_MARK = "_dsv4_incremental_block_hashes"
LOG_EVERY = 100  # requests between counter lines

_installed: tuple[Any, str, Any] | None = None  # (module, attribute, original factory)
CACHES: list[BlockHashCache] = []  # one per hasher made (one per engine core), for tests


def context_key(request: Any) -> Hashable | None:
    """What besides tokens a block hash of this request may depend on, or None when it may
    depend on more (multimodal features, prompt embeddings) or the prompt may change later
    (a resumable session extends its prompt in place)."""
    if getattr(request, "mm_features", None):
        return None
    if getattr(request, "prompt_embeds", None) is not None:
        return None
    if getattr(request, "prompt_is_token_ids", None) is not None:
        return None
    if getattr(request, "resumable", False):
        return None
    lora = getattr(request, "lora_request", None)
    lora_key = (
        None
        if not lora
        else (
            getattr(lora, "lora_name", None),
            getattr(lora, "lora_path", None),
            getattr(lora, "lora_int_id", None),
        )
    )
    return (lora_key, getattr(request, "cache_salt", None))


def cached_hasher(
    original: Callable[[Any], list[Any]], cache: BlockHashCache
) -> Callable[[Any], list[Any]]:
    """vLLM's request block hasher with the first call per request served from ``cache``."""

    def request_block_hasher(request: Any) -> list[Any]:
        if request.block_hashes or not cache.enabled:
            return original(request)
        tokens = getattr(request, "prompt_token_ids", None)
        key = context_key(request)
        if (
            key is None
            or not isinstance(tokens, list)
            or request.num_tokens != len(tokens)
            or len(tokens) < cache.block_size + cache.lookahead
        ):
            return original(request)
        reused, _ = cache.reusable(key, tokens, BASE_HINTS.pop(request.request_id))
        if reused:
            own = request.block_hashes
            request.block_hashes = reused
            try:
                new = original(request)
            finally:
                request.block_hashes = own
            hashes = reused + new
        else:
            new = hashes = original(request)
        cache.note_new(len(new))
        request._dsv4_reused_blocks = len(reused)  # read by stage_timing, if on
        if reused and cache.should_verify():
            full = original(request)  # request.block_hashes is its own empty list again
            cache.stats.verified += 1
            if full != hashes:
                first = next(
                    (i for i, (a, b) in enumerate(zip(full, hashes, strict=False)) if a != b),
                    min(len(full), len(hashes)),
                )
                cache.mismatch(
                    f"request {request.request_id}: {len(tokens)} tokens, {len(reused)} blocks "
                    f"reused, first different block {first}"
                )
                return full
        cache.store(key, request.request_id, tokens, hashes)
        if cache.stats.lookups % LOG_EVERY == 0:
            logger.info("incremental-block-hashes: %s (pid %d)", cache.snapshot(), os.getpid())
        return hashes

    setattr(request_block_hasher, PATCH_MARK, True)
    return request_block_hasher


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Wrap the stack's hasher factory (its ``hasher-factory`` hook); idempotent."""
    global _installed
    res = hooks.resolve(NAME) if res is None else res
    if not res.ok:
        return hooks.Applied(res.reason)
    target = res.role("hasher-factory")[0]
    factory = target.raw
    if getattr(factory, PATCH_MARK, False):
        return hooks.Applied()
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError) as exc:
        return hooks.Applied(f"{target.hook.where} has no signature ({exc})")

    @functools.wraps(factory)
    def get_request_block_hasher(*args: Any, **kwargs: Any) -> Any:
        hasher = factory(*args, **kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
            block_size = int(bound.arguments["hash_block_size"])
            lookahead = int(bound.arguments.get("num_hash_lookahead_tokens", 0) or 0)
            cache = BlockHashCache(block_size, lookahead)
        except Exception as exc:  # never break the engine: vLLM's own hasher then
            logger.warning("%s: not caching (%s: %s)", NAME, type(exc).__name__, exc)
            return hasher
        CACHES.append(cache)
        logger.info(
            "%s: block size %d, look-ahead %d, budget %d MiB, verify rate %g (pid %d)",
            NAME,
            block_size,
            lookahead,
            cache.budget_bytes // 2**20,
            cache.verify_rate,
            os.getpid(),
        )
        return cached_hasher(hasher, cache)

    setattr(get_request_block_hasher, PATCH_MARK, True)
    _installed = (target.owner, target.attr, factory)
    setattr(target.owner, target.attr, get_request_block_hasher)
    return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests)."""
    global _installed
    if _installed is not None:
        owner, attr, factory = _installed
        setattr(owner, attr, factory)
        _installed = None
