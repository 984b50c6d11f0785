"""One chat reply as the gate, the canary and ``sentinel record`` read it.

A real DeepSeek-V4 behind vLLM 0.33 with the recipe's ``--reasoning-parser deepseek_v4``
answers a thinking-mode request with its thinking in ``message.reasoning`` and only the
answer in ``message.content``; when ``max_tokens`` runs out inside the thinking, ``content``
is null, ``reasoning`` holds everything and ``finish_reason`` is ``length``
(vllm/parser/deepseek_v4.py, vllm/parser/engine/parser_engine.py ``_single_pass_parse``,
vllm/entrypoints/openai/chat_completion/serving.py ``chat_completion_full_generator``).
With the parser, ``usage.completion_tokens_details.reasoning_tokens`` counts the thinking.
The answer is read from ``content`` only; reasoning is never judged. Older vLLM releases
and other servers name the field ``reasoning_content`` (vLLM 0.33 still renames it on
input: protocol.py), so both are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reply:
    content: str | None
    reasoning: str | None
    finish_reason: str | None
    completion_tokens: int | None
    reasoning_tokens: int | None  # usage.completion_tokens_details (with a reasoning parser)

    @property
    def answered(self) -> bool:
        return bool((self.content or "").strip())

    @property
    def all_reasoning(self) -> bool:
        """Reasoning and no answer: thinking mode ran out of tokens before ``</think>``."""
        return not self.answered and bool((self.reasoning or "").strip())

    def reasoning_count(self) -> int:
        """How many tokens the reasoning took: the server's count, else the completion's."""
        if self.reasoning_tokens is not None:
            return self.reasoning_tokens
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len((self.reasoning or "").split())

    def no_answer(self) -> str | None:
        """Why there is no answer to judge, or None when there is one."""
        if self.answered:
            return None
        if self.all_reasoning:
            return (
                f"the reply was all reasoning ({self.reasoning_count()} tokens); "
                "raise max_tokens or ask without thinking"
            )
        return "empty reply (no content)"


def _opt_str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{name} is {type(value).__name__}, not a string")


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def from_body(doc: Any) -> Reply:
    """The first choice of a chat completion body (KeyError/IndexError/TypeError if it is
    not one)."""
    choice = doc["choices"][0]
    msg = choice["message"]
    if not isinstance(msg, dict):
        raise TypeError("message is not an object")
    reasoning = msg.get("reasoning")
    if reasoning is None:
        reasoning = msg.get("reasoning_content")
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("completion_tokens_details")
    details = details if isinstance(details, dict) else {}
    return Reply(
        content=_opt_str(msg.get("content"), "content"),
        reasoning=_opt_str(reasoning, "reasoning"),
        finish_reason=_opt_str(choice.get("finish_reason"), "finish_reason"),
        completion_tokens=_opt_int(usage.get("completion_tokens")),
        reasoning_tokens=_opt_int(details.get("reasoning_tokens")),
    )
