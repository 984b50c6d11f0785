"""Overlay: the incremental prompt-encoding cache on vLLM's DeepSeek-V4 tokenizer.

Why: in multi-turn chat every request re-sends the whole conversation and the API server
re-tokenizes all of it (~380 ms at 186k tokens on a 2-core box). The cache makes that
cost proportional to the new text (see ``incremental_encode.py`` for the exactness
argument).

How (the narrowest hook we found): ``DeepseekV4Tokenizer.from_pretrained`` (the entry in
vLLM's tokenizer registry for ``--tokenizer-mode deepseek_v4``) builds the tokenizer as
``get_cached_tokenizer(get_deepseek_v4_tokenizer(TokenizersBackend...))``. We wrap that
classmethod: the object it returns gets one more subclass whose ``__call__`` and
``encode`` serve plain single-string requests from an ``IncrementalEncoder``. Both
entry points matter: the chat path calls ``self.encode(prompt, add_special_tokens=False)``
inside ``apply_chat_template``; completions go through ``tokenizer(prompt, **kwargs)``
in ``BaseRenderer._tokenize_prompt``. Anything else (pairs, batches, offsets, padding,
overflow, special-token masks, tensors, split_special_tokens) goes to the original
method unchanged, as does any error in the cached path.

Where: the factory and the anchors are the stack's hook points (``hooks.py``): upstream
(0.27.1-0.33) builds on ``TokenizersBackend``, the fork's vLLM 0.21 base on
``PreTrainedTokenizerFast``; either way the factory returns
``get_cached_tokenizer(get_deepseek_v4_tokenizer(...))``. We patch only if the source
still has the shape we analysed (anchors checked with ``inspect``); otherwise register()
logs one line and vLLM is left untouched.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

from . import hooks
from .incremental_encode import IncrementalEncoder

logger = logging.getLogger("dsv4_flash_overlays.deepseek_v4_tok")

FLAG = "VLLM_INCREMENTAL_ENCODE_CACHE"
PATCH_MARK = "_dsv4_incremental_encode_patch"
ENCODER_ATTR = "_dsv4_incremental_encoder"

NAME = "incremental-encode-cache"
_original_from_pretrained: Any = None  # the classmethod object the factory held
_factory_owner: tuple[Any, str] | None = None  # (class, attribute) it was installed on
_first_call_logged = False
_first_call_lock = threading.Lock()

# Keyword arguments the cached path understands; anything else goes to the original.
_CALL_KWARGS = frozenset(
    {
        "add_special_tokens",
        "padding",
        "truncation",
        "max_length",
        "stride",
        "verbose",
        "return_tensors",
        "return_attention_mask",
        "return_token_type_ids",
        "return_offsets_mapping",
        "return_overflowing_tokens",
        "return_special_tokens_mask",
        "return_length",
        "split_special_tokens",
        "is_split_into_words",
        "padding_side",
        "text_pair",
        "text_target",
        "text_pair_target",
        "pad_to_multiple_of",
    }
)


def apply(res: hooks.Resolution | None = None) -> hooks.Applied:
    """Wrap the stack's tokenizer factory (its ``factory`` hook); idempotent.

    ``res`` is this overlay's resolution (register() passes it); without one the hook
    points come from DSV4_OVERLAY_HOOKS, or the built-in upstream table.
    """
    global _original_from_pretrained, _factory_owner
    res = hooks.resolve(NAME) if res is None else res
    if not res.ok:
        return hooks.Applied(res.reason)
    target = res.role("factory")[0]
    current = target.raw
    if getattr(current.__func__, PATCH_MARK, False):
        return hooks.Applied()  # idempotent: register() called twice, or module re-imported
    original = current

    @functools.wraps(original.__func__)
    def from_pretrained(klass: type, *args: Any, **kwargs: Any) -> Any:
        tokenizer = original.__func__(klass, *args, **kwargs)
        return wrap_tokenizer(tokenizer)

    setattr(from_pretrained, PATCH_MARK, True)
    from_pretrained.__doc__ = "the stack's DSV4 tokenizer factory + incremental encode cache"
    _original_from_pretrained = original
    _factory_owner = (target.owner, target.attr)
    setattr(target.owner, target.attr, classmethod(from_pretrained))
    return hooks.Applied()


def remove() -> None:
    """Undo ``apply`` (tests): restore the original classmethod."""
    global _original_from_pretrained, _factory_owner
    if _original_from_pretrained is None or _factory_owner is None:
        return
    owner, attr = _factory_owner
    setattr(owner, attr, _original_from_pretrained)
    _original_from_pretrained = None
    _factory_owner = None


def wrap_tokenizer(tokenizer: Any, encoder: IncrementalEncoder | None = None) -> Any:
    """Give ``tokenizer`` (an HF fast tokenizer) a cached ``__call__``/``encode``.

    Returns the same object (its class swapped for a subclass), or the tokenizer
    untouched when the cache cannot be exact for it.
    """
    if isinstance(tokenizer, _IncrementalEncodeMixin):
        return tokenizer
    try:
        enc = encoder or IncrementalEncoder(tokenizer, name="deepseek_v4")
    except Exception as exc:
        logger.warning("%s: tokenizer not wrapped (%s: %s)", FLAG, type(exc).__name__, exc)
        return tokenizer
    if not enc.enabled:
        logger.warning("%s: tokenizer not wrapped (%s)", FLAG, enc.disabled_reason)
        return tokenizer
    base = type(tokenizer)
    sub = type(f"IncEnc{base.__name__}", (_IncrementalEncodeMixin, base), {})
    tokenizer.__dict__[ENCODER_ATTR] = enc
    tokenizer.__class__ = sub
    return tokenizer


def _log_first_call() -> None:
    global _first_call_logged
    if _first_call_logged:
        return
    with _first_call_lock:
        if not _first_call_logged:
            _first_call_logged = True
            logger.info(
                "%s: first real call served from the cache path (pid %d)", FLAG, os.getpid()
            )


class _Plan:
    """What a supported call asks for, resolved the way transformers would."""

    __slots__ = ("add_special_tokens", "truncate_to", "left", "attention_mask", "type_ids")

    def __init__(self) -> None:
        self.add_special_tokens = True
        self.truncate_to: int | None = None
        self.left = False
        self.attention_mask = False
        self.type_ids = False


def _plan(
    tok: Any, enc: IncrementalEncoder, text: Any, args: tuple, kw: dict, for_call: bool
) -> _Plan | None:
    """A plan when the cached path gives exactly the original result, else None."""
    if args or not isinstance(text, str) or not enc.enabled:
        return None
    if not _CALL_KWARGS.issuperset(kw):
        return None
    for name in (
        "text_pair",
        "text_target",
        "text_pair_target",
        "return_tensors",
        "padding_side",
        "pad_to_multiple_of",
    ):
        if kw.get(name) is not None:
            return None
    for name in (
        "return_offsets_mapping",
        "return_overflowing_tokens",
        "return_special_tokens_mask",
        "return_length",
        "is_split_into_words",
    ):
        if kw.get(name):
            return None
    if kw.get("stride", 0) != 0:
        return None
    split = kw.get("split_special_tokens", getattr(tok, "split_special_tokens", False))
    if split:
        return None
    plan = _Plan()
    plan.add_special_tokens = bool(kw.get("add_special_tokens", True))
    if plan.add_special_tokens and not enc.supports_special_tokens:
        return None
    from transformers.tokenization_utils_base import PaddingStrategy, TruncationStrategy

    padding, truncation, max_length, _ = tok._get_padding_truncation_strategies(
        padding=kw.get("padding", False),
        truncation=kw.get("truncation"),
        max_length=kw.get("max_length"),
        verbose=kw.get("verbose", True),
    )
    if padding != PaddingStrategy.DO_NOT_PAD:
        return None
    if truncation != TruncationStrategy.DO_NOT_TRUNCATE:
        if truncation not in (TruncationStrategy.LONGEST_FIRST, TruncationStrategy.ONLY_FIRST):
            return None
        if not isinstance(max_length, int) or max_length < 0:
            return None
        side = getattr(tok, "truncation_side", "right")
        if side not in ("left", "right"):
            return None
        plan.truncate_to = max_length
        plan.left = side == "left"
    if for_call:
        names = getattr(tok, "model_input_names", ["input_ids", "attention_mask"])
        ram = kw.get("return_attention_mask")
        rtt = kw.get("return_token_type_ids")
        plan.attention_mask = ("attention_mask" in names) if ram is None else bool(ram)
        plan.type_ids = ("token_type_ids" in names) if rtt is None else bool(rtt)
    return plan


def _ids(enc: IncrementalEncoder, text: str, plan: _Plan) -> list[int]:
    ids = enc.encode(text)
    m = plan.truncate_to
    if m is not None and len(ids) > m:
        ids = ids[len(ids) - m :] if plan.left else ids[:m]
    return ids


class _IncrementalEncodeMixin:
    """Serves plain single-string ``__call__``/``encode`` from the incremental cache."""

    def __call__(self, text: Any = None, *args: Any, **kwargs: Any) -> Any:
        enc = self.__dict__.get(ENCODER_ATTR)
        if enc is not None:
            try:
                plan = _plan(self, enc, text, args, kwargs, for_call=True)
                if plan is not None:
                    ids = _ids(enc, text, plan)
                    from transformers import BatchEncoding

                    data: dict[str, list[int]] = {"input_ids": ids}
                    if plan.type_ids:
                        data["token_type_ids"] = [0] * len(ids)
                    if plan.attention_mask:
                        data["attention_mask"] = [1] * len(ids)
                    _log_first_call()
                    return BatchEncoding(data)
            except Exception as exc:
                enc.note_fallback()
                logger.debug("%s: cached __call__ fell back (%s)", FLAG, exc)
        return super().__call__(text, *args, **kwargs)  # type: ignore[misc]

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        enc = self.__dict__.get(ENCODER_ATTR)
        if enc is not None:
            try:
                plan = _plan(self, enc, text, args, kwargs, for_call=False)
                if plan is not None:
                    ids = _ids(enc, text, plan)
                    _log_first_call()
                    return ids
            except Exception as exc:
                enc.note_fallback()
                logger.debug("%s: cached encode fell back (%s)", FLAG, exc)
        return super().encode(text, *args, **kwargs)  # type: ignore[misc]
