"""One streamed chat request against the pair's endpoint, as a client would send it.

Used by `make rehearse` (prints the reply as it streams), by the fleet rehearsal (turns of
a conversation through the router, with its X-Session-ID) and by the end-to-end tests
(assert the endpoint really answers, not just that /health is green).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import requests


def sse_data(resp: requests.Response) -> Iterator[str]:
    """The `data:` payloads of a server-sent-event stream, one per event line.

    Lines are split on bytes, not on decoded text: requests' ``iter_lines(decode_unicode=
    True)`` splits with ``str.splitlines``, which also breaks at U+2028, U+0085 and the other
    Unicode line separators, and real vLLM writes its chunks' text unescaped (pydantic's
    JSON keeps non-ASCII as is), so a gibberish reply of the tiny random model cut a chunk's
    JSON in two. ``bytes.splitlines`` breaks only at CR/LF, which is where SSE lines end.
    """
    for raw in resp.iter_lines():
        line = raw.decode("utf-8", errors="replace")
        if line.startswith("data:"):
            yield line[5:].strip()


@dataclass
class ChatResult:
    """What came back: the text, the server's labels, and the usage block."""

    model: str
    content: str = ""
    reasoning: str = ""
    chunks: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    simulator: bool = False
    pair: str | None = None  # X-Spark-Pair: which simulated pair answered (fleet rehearsal)


def first_model(base_url: str, timeout: float = 10) -> str:
    resp = requests.get(f"{base_url}/v1/models", timeout=timeout)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def stream_chat(
    base_url: str,
    prompt: str,
    max_tokens: int = 48,
    on_text: Callable[[str], None] = lambda _t: None,
    timeout: float = 60,
    *,
    history: list[dict[str, str]] | None = None,
    session_id: str | None = None,
    model: str | None = None,
) -> ChatResult:
    """POST /v1/chat/completions with stream + include_usage; returns the assembled reply.

    `history` (earlier turns) is sent before `prompt`; `session_id` goes in X-Session-ID, the
    header a router with session affinity keys on.
    """
    model = model or first_model(base_url, timeout)
    body = {
        "model": model,
        "messages": [*(history or []), {"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = ChatResult(model=model)
    headers = {"X-Session-ID": session_id} if session_id else {}
    with requests.post(
        f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=timeout, headers=headers
    ) as resp:
        resp.raise_for_status()
        result.simulator = resp.headers.get("X-Spark-Twin") == "simulator"
        result.pair = resp.headers.get("X-Spark-Pair")
        for data in sse_data(resp):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result.usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                text = delta.get("content") or ""
                if reasoning or text:
                    result.chunks += 1
                result.reasoning += reasoning
                result.content += text
                if text:
                    on_text(text)
    return result
