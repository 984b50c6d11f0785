"""The request corpus: what clients of a DSV4-Flash pair send, in their own shapes.

Three sources, each case naming its own:
- the OpenAI Python SDK's request shapes (chat and completions, streaming or not,
  ``stream_options.include_usage``, ``n``, logprobs, stop, ``max_completion_tokens``, chat
  in DSV4's thinking mode, the default, and with ``chat_template_kwargs.thinking: false``);
- `vllm bench serve`'s payloads for ``--backend openai`` and ``openai-chat``
  (vllm/benchmarks/lib/endpoint_request_func.py, ``async_request_openai_completions`` and
  ``async_request_openai_chat_completions``: ``repetition_penalty``, ``ignore_eos``,
  ``logprobs: null``, chat content as a list of text parts, an ``x-request-id`` header);
- the bad requests a client makes by mistake (unknown model, ``max_tokens`` beyond the
  context, bad JSON, no ``messages``, a negative temperature, a mistyped field).
Prompts are short and replies capped at a few tokens, so a CPU engine answers in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class Case:
    """One request: where it goes, what it carries, how its answer is read."""

    name: str
    source: str  # sdk | bench | error | server
    method: str
    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None  # sent as-is instead of ``body`` (bad JSON)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def _msgs(text: str = "Say hello in three words.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def build(model: str, max_model_len: int) -> list[Case]:
    """The corpus for a server that serves ``model`` with context ``max_model_len``."""
    chat = {"model": model, "messages": _msgs(), "max_tokens": 6, "temperature": 0}
    comp = {"model": model, "prompt": "The capital of France is", "max_tokens": 6}
    usage = {"include_usage": True}
    no_thinking = {"chat_template_kwargs": {"thinking": False}}
    cases = [
        Case("health", "server", "GET", "/health"),
        Case("models", "server", "GET", "/v1/models"),
        Case("chat", "sdk", "POST", CHAT, chat),
        Case("chat_stream", "sdk", "POST", CHAT, {**chat, "stream": True}),
        Case(
            "chat_stream_usage",
            "sdk",
            "POST",
            CHAT,
            {**chat, "stream": True, "stream_options": usage},
        ),
        Case("chat_n2", "sdk", "POST", CHAT, {**chat, "n": 2, "temperature": 0.8, "seed": 7}),
        Case("chat_logprobs", "sdk", "POST", CHAT, {**chat, "logprobs": True, "top_logprobs": 2}),
        Case(
            "chat_stream_logprobs",
            "sdk",
            "POST",
            CHAT,
            {**chat, "stream": True, "logprobs": True, "top_logprobs": 2},
        ),
        Case("chat_stop", "sdk", "POST", CHAT, {**chat, "stop": ["\n", "."]}),
        # DSV4's chat mode (thinking is the default): with a reasoning parser the reply is
        # content only; in thinking mode 6 tokens end inside the thinking (content null)
        Case("chat_no_thinking", "sdk", "POST", CHAT, {**chat, **no_thinking}),
        Case(
            "chat_stream_no_thinking",
            "sdk",
            "POST",
            CHAT,
            {**chat, **no_thinking, "stream": True, "stream_options": usage},
        ),
        Case(
            "chat_max_completion_tokens",
            "sdk",
            "POST",
            CHAT,
            {"model": model, "messages": _msgs(), "max_completion_tokens": 5},
        ),
        Case("completion", "sdk", "POST", COMPLETIONS, comp),
        Case("completion_stream", "sdk", "POST", COMPLETIONS, {**comp, "stream": True}),
        Case(
            "completion_stream_usage",
            "sdk",
            "POST",
            COMPLETIONS,
            {**comp, "stream": True, "stream_options": usage},
        ),
        Case("completion_n2", "sdk", "POST", COMPLETIONS, {**comp, "n": 2, "seed": 7}),
        Case("completion_logprobs", "sdk", "POST", COMPLETIONS, {**comp, "logprobs": 2}),
        Case("completion_stop", "sdk", "POST", COMPLETIONS, {**comp, "stop": "\n"}),
        Case(
            "completion_token_ids",
            "sdk",
            "POST",
            COMPLETIONS,
            {"model": model, "prompt": [100, 200, 300], "max_tokens": 4},
        ),
        Case(
            "bench_openai",
            "bench",
            "POST",
            COMPLETIONS,
            {
                "model": model,
                "prompt": "Tell me a story about a lighthouse keeper.",
                "repetition_penalty": 1.0,
                "max_tokens": 6,
                "logprobs": None,
                "stream": True,
                "stream_options": usage,
                "ignore_eos": True,
            },
            headers={"x-request-id": "bench-openai-0"},
        ),
        Case(
            "bench_openai_chat",
            "bench",
            "POST",
            CHAT,
            {
                "model": model,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "Tell me about lighthouses."}],
                    }
                ],
                "max_completion_tokens": 6,
                "stream": True,
                "stream_options": usage,
                "ignore_eos": True,
            },
            headers={"x-request-id": "bench-openai-chat-0"},
        ),
        Case("err_unknown_model", "error", "POST", CHAT, {**chat, "model": "no-such-model"}),
        Case(
            "err_unknown_model_completion",
            "error",
            "POST",
            COMPLETIONS,
            {**comp, "model": "no-such-model"},
        ),
        Case(
            "err_max_tokens_too_big",
            "error",
            "POST",
            CHAT,
            {**chat, "max_tokens": max_model_len + 10},
        ),
        Case(
            "err_max_tokens_too_big_completion",
            "error",
            "POST",
            COMPLETIONS,
            {**comp, "max_tokens": max_model_len + 10},
        ),
        Case(
            "err_bad_json",
            "error",
            "POST",
            CHAT,
            raw=b'{"model": "x", "messages": [',
            headers={"Content-Type": "application/json"},
        ),
        Case("err_missing_messages", "error", "POST", CHAT, {"model": model}),
        Case("err_negative_temperature", "error", "POST", CHAT, {**chat, "temperature": -1}),
        Case("err_max_tokens_type", "error", "POST", CHAT, {**chat, "max_tokens": "ten"}),
        Case("err_unknown_route", "error", "GET", "/v1/nothing-here"),
    ]
    return cases
