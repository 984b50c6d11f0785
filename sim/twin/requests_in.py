"""Turn an OpenAI request body into an engine Request (render, tokenize, lengths, seeds).

Runs on the HTTP thread, like vLLM's API-server renderer, so tokenization CPU time lands
in TTFT.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.twin import params, thinking
from sim.twin.acceptance_model import AcceptanceModel, request_text
from sim.twin.draft_faults import DraftFault
from sim.twin.engine import FOREVER, Engine, Request
from sim.twin.params import BadRequest
from sim.twin.prefix_cache import block_hashes
from sim.twin.profile import Profile
from sim.twin.prompting import PromptEncoder, render_chat
from sim.twin.sampling import AcceptanceDrawer, key_of, natural_length

log = logging.getLogger("twin")
__all__ = ["BadRequest", "Builder", "Prompt", "load_answers"]


@dataclass(frozen=True)
class Prompt:
    """A rendered, tokenized prompt (shared by the n choices of one request)."""

    ids: list[int]
    digest: str
    tokenize_ms: float
    canned: list[str] | None  # the known reply, token by token (quality answers)
    cum_accept: list[float] | None = None  # P(position k accepted) for this content
    thinking: bool = False  # a chat prompt rendered in thinking mode (ends in <think>)


def load_answers(prof: Profile) -> dict[str, str]:
    """Prompt -> exact reply, from the profile's `answers.file` (the quality gate's JSON, or
    a list of such files: the gate's and the output canary's).

    Lets the offline rehearsal pass the real quality gate and canary; the fault `no-answers`
    turns it off so their failure paths can be rehearsed too.
    """
    names = prof.section("answers").get("file") or []
    out: dict[str, str] = {}
    for name in [names] if isinstance(names, str) else list(names):
        path = Path(prof.raw.get("_path", ".")).parent / str(name)
        try:
            doc = json.loads(path.read_text())
            out.update({str(p["prompt"]): str(p["answer"]) for p in doc.get("prompts", [])})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("answers file %s unusable (%s): its prompts get generated words", path, exc)
    return out


@dataclass
class Builder:
    """Everything needed to build requests for one server."""

    engine: Engine
    encoder: PromptEncoder
    prof: Profile
    seed: int
    gamma: int
    max_model_len: int
    block_size: int
    answers_enabled: bool = True
    draft_faults: list[DraftFault] | None = None  # sim/twin/draft_faults.py

    def __post_init__(self) -> None:
        self.answers = load_answers(self.prof) if self.answers_enabled else {}
        self.acceptance = AcceptanceModel(self.prof, self.gamma, self.draft_faults)
        self._sampled = itertools.count()
        out = self.prof.section("output")
        self.eos_lo = int(out.get("eos_min_tokens", 48))
        self.eos_hi = int(out.get("eos_max_tokens", 400))
        self.think_lo = int(out.get("reasoning_min_tokens", 64))
        self.think_hi = int(out.get("reasoning_max_tokens", 640))

    def chat_mode(self, body: dict[str, Any]) -> thinking.Mode:
        """Thinking or chat mode, as vLLM's DSV4 encoder decides it (sim/twin/thinking.py)."""
        return thinking.mode(thinking.template_kwargs(body))

    def prompt_ids(self, body: dict[str, Any], chat: bool, model: str = "") -> list[int]:
        """Render (chat) and tokenize the prompt; a token-id list prompt is taken as is."""
        if chat:
            m = self.chat_mode(body)
            msgs = params.chat_messages(body, model)
            try:
                text = render_chat(msgs, m.thinking, m.effort)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            return self.encoder.encode(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.encoder.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if "prompt" not in body:
            raise params.type_error("prompt", "missing", "Field required", body)
        raise BadRequest("prompt must be a string or a list of token ids")

    def render(self, body: dict[str, Any], chat: bool, model: str) -> Prompt:
        """The prompt as the engine gets it, rendered and tokenized once for all n choices."""
        t0 = time.perf_counter()
        ids = self.prompt_ids(body, chat, model)
        tok_ms = (time.perf_counter() - t0) * 1000.0
        n = len(ids)
        if n == 0:
            raise BadRequest("the prompt is empty")
        if n > self.max_model_len:  # vllm/renderers/params.py _token_len_check
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {n} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                n,
            )
        digest = hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()
        canned = self._canned(body) if chat else None
        cum = self.acceptance.cum_for(request_text(body, chat))
        return Prompt(ids, digest, tok_ms, canned, cum, chat and self.chat_mode(body).thinking)

    def build(
        self,
        prompt: Prompt,
        p: params.Params,
        received_ns: int,
        rid: str,
        index: int = 0,
    ) -> Request:
        """One engine request: choice `index` of a request with sampling parameters `p`."""
        n = len(prompt.ids)
        if p.max_tokens is not None and p.max_tokens > self.max_model_len:
            # vllm/renderers/params.py TokenizeParams (0.32 and 0.33): a limit larger than
            # the whole context is refused before the prompt is looked at.
            raise BadRequest(
                f"max_tokens={p.max_tokens} cannot be greater than "
                f"max_model_len={self.max_model_len}. Please request fewer output tokens.",
                "max_tokens",
                p.max_tokens,
            )
        # vllm/entrypoints/serve/utils/api_utils.py get_max_tokens: what does not fit is cut to
        # the room left, silently; then SamplingParams wants at least 1.
        room = self.max_model_len - n
        max_tokens = room if p.max_tokens is None else min(p.max_tokens, room)
        if max_tokens < 1:
            raise BadRequest(
                f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
            )
        variant: object = 0
        if p.temperature > 0:
            # vllm/v1/engine/parallel_sampling.py: child i of a seeded request uses seed + i.
            variant = ("seed", p.seed + index) if p.seed is not None else ("n", next(self._sampled))
        key = key_of(self.seed, prompt.digest, variant)
        # Thinking mode: the model reasons first, closes it with </think>, then answers
        # (the reply is reasoning tokens, one </think> token, the answer, then EOS).
        think = natural_length(key_of(key, "think"), self.think_lo, self.think_hi)
        think_len = think if prompt.thinking else None
        head = 0 if think_len is None else think_len + 1
        if p.ignore_eos:
            target = max_tokens
        else:
            target = min(max_tokens, head + natural_length(key, self.eos_lo, self.eos_hi))
        target = max(target, min(p.min_tokens, max_tokens))
        if prompt.canned is not None:
            target = min(head + len(prompt.canned), max_tokens)
        drawer = AcceptanceDrawer(
            prompt.cum_accept or self.acceptance.default,
            self.prof.sampling,
            key_of(key, "accept"),
        )
        return Request(
            id=rid,
            prompt_len=n,
            hashes=block_hashes(prompt.ids, self.block_size),
            target_len=target,
            max_tokens=max_tokens,
            out_key=key,
            drawer=drawer,
            received_ns=received_ns,
            tokenize_ms=prompt.tokenize_ms,
            stop=list(p.stop),
            canned=prompt.canned,
            think_len=think_len,
        )

    def _canned(self, body: dict[str, Any]) -> list[str] | None:
        """Token pieces of a known answer when the last message is a known prompt."""
        if not self.answers:
            return None
        msgs = params.chat_messages(body, "")
        last = msgs[-1] if msgs else {}
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, str):
            return None
        answer = self.answers.get(content)
        return self.encoder.pieces(answer) if answer else None

    def foreign(
        self, seconds: float, index: int, tokens: int | None = None, prompt_tokens: int = 64
    ) -> Request:
        """A phantom request: a short prompt, then decode until `seconds` have passed, or
        exactly `tokens` tokens (then it finishes by length, like a request with max_tokens)."""
        key = key_of(self.seed, "foreign", time.monotonic_ns(), index)
        ids = [1000 + (key >> (i % 48)) % 50000 for i in range(max(prompt_tokens, 1))]
        limit = FOREVER if tokens is None else max(int(tokens), 1)
        return Request(
            id=self.engine.next_id("foreign"),
            prompt_len=len(ids),
            hashes=block_hashes(ids, self.block_size),
            target_len=limit,
            max_tokens=limit,
            out_key=key,
            drawer=AcceptanceDrawer(self.acceptance.default, self.prof.sampling, key),
            received_ns=time.monotonic_ns(),
            foreign_until=time.monotonic() + seconds if tokens is None else float("inf"),
        )
