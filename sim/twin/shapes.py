"""vLLM 0.33's OpenAI response bodies: chat/text completion chunks, usage, logprobs, metrics.

Shapes follow vllm/entrypoints/openai/chat_completion/protocol.py and completion/protocol.py;
the per-request spec-decode block follows vllm/v1/metrics/stats.py
RequestSpecDecodeMetrics.to_dict (sent with --per-request-spec-decode-metrics).
Logprob *values* are synthetic, like the twin's words: a deterministic function of the token.
"""

from __future__ import annotations

from typing import Any

from sim.twin.engine import Request
from sim.twin.sampling import VOCAB, key_of


def usage(prompt_len: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_len,
        "total_tokens": prompt_len + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def request_usage(reqs: list[Request]) -> dict[str, Any]:
    """One response's usage: the prompt once, the completions of every choice summed."""
    return usage(reqs[0].prompt_len, sum(r.generated for r in reqs), reqs[0].cached_tokens)


def spec_metrics(req: Request, gamma: int, detailed: bool) -> dict[str, Any]:
    """RequestSpecDecodeMetrics.to_dict: acceptance of one request's verify steps."""
    hist = req.spec_hist or [0] * (gamma + 1)
    steps = sum(hist)
    accepted = sum(j * c for j, c in enumerate(hist))
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / req.draft_tokens if req.draft_tokens else 0.0,
        "acceptance_histogram": list(hist),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": req.draft_tokens,
        "num_spec_tokens": gamma,
    }
    if detailed and req.spec_steps:
        out["per_step_accepted"] = list(req.spec_steps)
        out["per_step_drafted"] = [gamma] * len(req.spec_steps)
    return out


def _alternatives(key: int, idx: int, piece: str, k: int) -> list[tuple[str, float]]:
    """The sampled token first (greedy: the most likely), then k-1 others, less likely."""
    lp = -(key_of(key, idx, "logprob") % 1000) / 2000.0
    out = [(piece, lp)]
    for j in range(1, k):
        w = " " + VOCAB[key_of(key, idx, "alt", j) % len(VOCAB)]
        out.append((w, lp - 1.0 - j))
    return out


def chat_logprobs(req: Request, first_idx: int, pieces: list[str], top: int) -> dict[str, Any]:
    content = []
    for i, piece in enumerate(pieces):
        alts = _alternatives(req.out_key, first_idx + i, piece, max(top, 1))
        content.append(
            {
                "token": piece,
                "logprob": alts[0][1],
                "bytes": list(piece.encode("utf-8", errors="replace")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", errors="replace"))}
                    for t, lp in alts[:top]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    req: Request, first_idx: int, pieces: list[str], top: int, text_offset: int
) -> dict[str, Any]:
    offsets, lps, tops = [], [], []
    for i, piece in enumerate(pieces):
        alts = _alternatives(req.out_key, first_idx + i, piece, max(top, 1))
        offsets.append(text_offset)
        text_offset += len(piece)
        lps.append(alts[0][1])
        tops.append(dict(alts[: max(top, 1)]))
    return {
        "text_offset": offsets,
        "token_logprobs": lps,
        "tokens": list(pieces),
        "top_logprobs": tops,
    }


class Shape:
    """The chunks and full responses of one request, chat or text completion."""

    def __init__(self, rid: str, model: str, chat: bool, created: int) -> None:
        self.rid, self.model, self.chat, self.created = rid, model, chat, created

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def chunk(
        self, delta: Any, finish: str | None, index: int = 0, logprobs: Any = None
    ) -> dict[str, Any]:
        if self.chat:
            if isinstance(delta, str):
                delta = {"content": delta}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {
            "index": index,
            "text": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, use: dict[str, Any], metrics: dict[str, Any] | None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {**self._head(obj), "choices": [], "usage": use}
        if metrics:
            out["metrics"] = metrics
        return out

    def full(
        self,
        choices: list[tuple[str, str | None, Any]],
        use: dict[str, Any],
        metrics: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The non-streamed response: one (text, finish_reason, logprobs) per choice."""
        out_choices = []
        for i, (text, finish, lps) in enumerate(choices):
            if self.chat:
                out_choices.append(
                    {
                        "index": i,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": None,
                            "tool_calls": [],
                        },
                        "logprobs": lps,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                )
            else:
                out_choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": lps,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                )
        obj = "chat.completion" if self.chat else "text_completion"
        out = {**self._head(obj), "choices": out_choices, "usage": use}
        if metrics:
            out["metrics"] = metrics
        return out
