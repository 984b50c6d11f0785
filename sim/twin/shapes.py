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
from sim.twin.vllm_log import VLLM_VERSION


def usage(
    prompt_len: int,
    completion: int,
    cached: int | None = None,
    full: bool = False,
    reasoning: int | None = None,
) -> dict[str, Any]:
    """UsageInfo. ``cached`` is given only with --enable-prompt-tokens-details (vLLM fills
    prompt_tokens_details only then, serving.py ``enable_prompt_tokens_details``); a full
    response serializes every field, nulls included, a streamed usage chunk only those set
    (vLLM dumps chunks with ``exclude_unset``). ``reasoning`` is given only with a reasoning
    parser: vllm/entrypoints/openai/chat_completion/serving.py sets
    ``completion_tokens_details={"reasoning_tokens": N}`` on every chat usage then
    (``_include_reasoning_tokens_details = bool(reasoning_parser)``)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_len,
        "total_tokens": prompt_len + completion,
        "completion_tokens": completion,
    }
    if full:
        out["prompt_tokens_details"] = None
        out["completion_tokens_details"] = None
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def request_usage(
    reqs: list[Request], details: bool, full: bool = False, reasoning: int | None = None
) -> dict[str, Any]:
    """One response's usage: the prompt once, the completions of every choice summed."""
    cached = reqs[0].cached_tokens if details else None
    return usage(reqs[0].prompt_len, sum(r.generated for r in reqs), cached, full, reasoning)


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


def fingerprint(
    tp: int, config_hash: str, mode: str = "full", custom: str | None = None
) -> str | None:
    """``system_fingerprint`` as vLLM's build_system_fingerprint makes it
    (vllm/entrypoints/serve/utils/fingerprint.py): "none" omits it (null), "custom" is
    ``--fingerprint-value`` as given, "hash" is version and hash8, "full" (the default)
    adds a tensor-parallel degree above 1."""
    if mode == "none":
        return None
    if mode == "custom":
        return custom
    if mode == "hash":
        return f"vllm-{VLLM_VERSION}-{config_hash[:8]}"
    parts = [f"vllm-{VLLM_VERSION}"] + ([f"tp{tp}"] if tp > 1 else [])
    return "-".join([*parts, config_hash[:8]])


class Shape:
    """The chunks and full responses of one request, chat or text completion.

    Field sets are vLLM's as served (recorded from the real engine by `sim.diffcheck`): a
    full response is ``model_dump_json()`` of the response model, so every field is there,
    unset ones null; a stream chunk is dumped with ``exclude_unset`` (vllm/entrypoints/
    openai/chat_completion/serving.py), so it has only what the server set: the first chat
    chunk ``prompt_token_ids``/``prompt_text``, content chunks ``token_ids``, the last
    chunk of the stream ``system_fingerprint``.
    """

    def __init__(
        self,
        rid: str,
        model: str,
        chat: bool,
        created: int,
        fingerprint: str | None = f"vllm-{VLLM_VERSION}",
    ) -> None:
        self.rid, self.model, self.chat, self.created = rid, model, chat, created
        self.fingerprint = fingerprint

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def first_chat_chunk(self, index: int) -> dict[str, Any]:
        """The role chunk: the only one that carries the prompt's echo fields."""
        out = self.chunk({"role": "assistant", "content": ""}, None, index)
        del out["choices"][0]["token_ids"]
        out["prompt_token_ids"] = None
        out["prompt_text"] = None
        return out

    def chunk(
        self,
        delta: Any,
        finish: str | None,
        index: int = 0,
        logprobs: Any = None,
        last: bool = False,
    ) -> dict[str, Any]:
        """A content chunk; ``finish`` set: the choice's last one; ``last``: the stream's."""
        if self.chat:
            if isinstance(delta, str):
                delta = {"content": delta}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {
                "index": index,
                "text": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
            out = {**self._head("text_completion"), "choices": [choice]}
        if last:
            out["system_fingerprint"] = self.fingerprint
        return out

    def usage_chunk(self, use: dict[str, Any], metrics: dict[str, Any] | None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {**self._head(obj), "choices": [], "usage": use}
        out["system_fingerprint"] = self.fingerprint
        if metrics:
            out["metrics"] = metrics
        return out

    def full(
        self,
        choices: list[tuple[str | None, str | None, Any, str | None]],
        use: dict[str, Any],
        metrics: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The non-streamed response: one (text, finish_reason, logprobs, reasoning) per choice.

        ``reasoning`` is the message's vLLM field of that name (ChatMessage in
        vllm/entrypoints/openai/chat_completion/protocol.py; 0.33 has no
        ``reasoning_content``): null unless a reasoning parser split the reply, when
        ``content`` is null if the reply was all reasoning (sim/twin/thinking.py).
        ``weight_versions`` is vLLM 0.33's (null unless ``return_weight_versions``);
        0.32, the CPU engine, has no such field."""
        out_choices = []
        for i, (text, finish, lps, reasoning) in enumerate(choices):
            if self.chat:
                message = {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": reasoning,
                }
                choice = {"index": i, "message": message, "logprobs": lps}
            else:
                choice = {"index": i, "text": text, "logprobs": lps}
            choice.update(
                {
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )
            if not self.chat:
                choice.update({"prompt_logprobs": None, "prompt_token_ids": None})
            out_choices.append(choice)
        obj = "chat.completion" if self.chat else "text_completion"
        out = {
            **self._head(obj),
            "choices": out_choices,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": use,
        }
        if self.chat:
            out.update({"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None})
        out.update({"kv_transfer_params": None, "ec_transfer_params": None, "metrics": metrics})
        return out
