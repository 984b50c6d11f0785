"""Overlay: the incremental prompt-encoding cache on vLLM 0.33's DeepSeek-V4 tokenizer.

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

Drift: we patch only if the vLLM source still has the shape we analysed (source markers
checked with ``inspect``); otherwise one warning and vLLM is left untouched.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any

from .incremental_encode import IncrementalEncoder

logger = logging.getLogger("dsv4_flash_overlays.deepseek_v4_tok")

FLAG = "VLLM_INCREMENTAL_ENCODE_CACHE"
PATCH_MARK = "_dsv4_incremental_encode_patch"
ENCODER_ATTR = "_dsv4_incremental_encoder"

# Source markers of the vLLM code this overlay relies on (checked with inspect).
MARKERS: dict[str, tuple[str, ...]] = {
    "vllm.tokenizers.deepseek_v4:DeepseekV4Tokenizer.from_pretrained": (
        "TokenizersBackend.from_pretrained(",
        "get_cached_tokenizer(get_deepseek_v4_tokenizer(",
    ),
    "vllm.tokenizers.deepseek_v4:get_deepseek_v4_tokenizer": (
        "self.encode(",
        "add_special_tokens=False",
        "dsv4_tokenizer.__class__ = _DeepseekV4Tokenizer",
    ),
}
TESTED_VLLM = ("0.33.",)

_original_from_pretrained: Any = None
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


def _source_drift() -> str | None:
    """None if every marker is present in the installed vLLM, else what is missing."""
    import vllm.tokenizers.deepseek_v4 as mod

    targets = {
        "vllm.tokenizers.deepseek_v4:DeepseekV4Tokenizer.from_pretrained": (
            mod.DeepseekV4Tokenizer.__dict__["from_pretrained"].__func__
        ),
        "vllm.tokenizers.deepseek_v4:get_deepseek_v4_tokenizer": mod.get_deepseek_v4_tokenizer,
    }
    for name, markers in MARKERS.items():
        try:
            src = inspect.getsource(targets[name])
        except (OSError, TypeError) as exc:
            return f"no source for {name} ({exc})"
        missing = [m for m in markers if m not in src]
        if missing:
            return f"{name} no longer contains {missing}"
    from transformers import TokenizersBackend

    for attr in ("_get_padding_truncation_strategies", "__call__", "encode"):
        if not hasattr(TokenizersBackend, attr):
            return f"transformers TokenizersBackend has no {attr}"
    return None


def apply() -> bool:
    """Install the hook; True if installed (now or before), False if refused."""
    global _original_from_pretrained
    try:
        import vllm
        import vllm.tokenizers.deepseek_v4 as mod
    except Exception as exc:
        logger.warning("%s: vLLM's DSV4 tokenizer not importable (%s); not installed", FLAG, exc)
        return False
    cls = mod.DeepseekV4Tokenizer
    current = cls.__dict__.get("from_pretrained")
    if getattr(getattr(current, "__func__", None), PATCH_MARK, False):
        return True  # idempotent: register() called twice, or module re-imported
    version = getattr(vllm, "__version__", "?")
    drift = _source_drift()
    if drift is not None:
        logger.warning(
            "%s: vLLM %s drifted from what this overlay was written for (%s); "
            "not installed, vLLM left untouched",
            FLAG,
            version,
            drift,
        )
        return False
    if not version.startswith(TESTED_VLLM):
        logger.info("%s: vLLM %s is untested but the source markers match", FLAG, version)

    original = current
    _original_from_pretrained = original

    def from_pretrained(klass: type, *args: Any, **kwargs: Any) -> Any:
        tokenizer = original.__func__(klass, *args, **kwargs)
        return wrap_tokenizer(tokenizer)

    setattr(from_pretrained, PATCH_MARK, True)
    from_pretrained.__doc__ = "DeepseekV4Tokenizer.from_pretrained + incremental encode cache"
    cls.from_pretrained = classmethod(from_pretrained)
    logger.info(
        "%s: installed on vllm.tokenizers.deepseek_v4.DeepseekV4Tokenizer (vLLM %s, pid %d)",
        FLAG,
        version,
        os.getpid(),
    )
    return True


def remove() -> None:
    """Undo ``apply`` (tests): restore the original classmethod."""
    global _original_from_pretrained
    if _original_from_pretrained is None:
        return
    import vllm.tokenizers.deepseek_v4 as mod

    mod.DeepseekV4Tokenizer.from_pretrained = _original_from_pretrained
    _original_from_pretrained = None


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
