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

from sim.twin.engine import FOREVER, Engine, Request
from sim.twin.prefix_cache import block_hashes
from sim.twin.profile import Profile
from sim.twin.prompting import PromptEncoder, render_chat
from sim.twin.sampling import AcceptanceDrawer, key_of, natural_length

log = logging.getLogger("twin")


def load_answers(prof: Profile) -> dict[str, str]:
    """Prompt -> exact reply, from the profile's `answers.file` (the quality gate's JSON).

    Lets the offline rehearsal pass the real quality gate; the fault `no-answers` turns it
    off so the gate's failure path can be rehearsed too.
    """
    cfg = prof.section("answers")
    name = cfg.get("file")
    if not name:
        return {}
    path = Path(prof.raw.get("_path", ".")).parent / name
    try:
        doc = json.loads(path.read_text())
        return {str(p["prompt"]): str(p["answer"]) for p in doc.get("prompts", [])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("answers file %s unusable (%s): replies are generated words only", path, exc)
        return {}


class BadRequest(ValueError):
    """A client error, answered with HTTP 400 and vLLM's error shape."""


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

    def __post_init__(self) -> None:
        self.answers = load_answers(self.prof) if self.answers_enabled else {}
        self._sampled = itertools.count()
        out = self.prof.section("output")
        self.eos_lo = int(out.get("eos_min_tokens", 48))
        self.eos_hi = int(out.get("eos_max_tokens", 400))

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        """Render (chat) and tokenize the prompt; a token-id list prompt is taken as is."""
        if chat:
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", True)))
            effort = body.get("reasoning_effort") or kwargs.get("reasoning_effort") or "high"
            try:
                text = render_chat(body.get("messages"), thinking, effort)
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
        raise BadRequest("prompt must be a string or a list of token ids")

    def build(self, body: dict[str, Any], chat: bool, received_ns: int, rid: str) -> Request:
        t0 = time.perf_counter()
        ids = self.prompt_ids(body, chat)
        tok_ms = (time.perf_counter() - t0) * 1000.0
        n = len(ids)
        if n == 0:
            raise BadRequest("the prompt is empty")
        if n >= self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} "
                f"tokens. However, your request has {n} input tokens."
            )
        room = self.max_model_len - n
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = room
        try:
            max_tokens = int(max_tokens)
        except (TypeError, ValueError):
            raise BadRequest("max_tokens must be an integer") from None
        if max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1")
        if max_tokens > room:
            raise BadRequest(
                f"max_tokens={max_tokens} is too large: the prompt has {n} "
                f"tokens and the maximum context length is {self.max_model_len}"
            )
        digest = hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()
        try:
            temp = float(body.get("temperature") or 0.0)
            min_tokens = int(body.get("min_tokens") or 0)
        except (TypeError, ValueError):
            raise BadRequest("temperature must be a number and min_tokens an integer") from None
        variant: object = 0
        if temp > 0:
            req_seed = body.get("seed")
            variant = ("seed", req_seed) if req_seed is not None else ("n", next(self._sampled))
        key = key_of(self.seed, digest, variant)
        if body.get("ignore_eos"):
            target = max_tokens
        else:
            target = min(max_tokens, natural_length(key, self.eos_lo, self.eos_hi))
        target = max(target, min(min_tokens, max_tokens))
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        canned = self._canned(body) if chat else None
        if canned is not None:
            target = min(len(canned), max_tokens)
        drawer = AcceptanceDrawer(
            self.prof.cum_accept(self.gamma), self.prof.sampling, key_of(key, "accept")
        )
        return Request(
            id=rid,
            prompt_len=n,
            hashes=block_hashes(ids, self.block_size),
            target_len=target,
            max_tokens=max_tokens,
            out_key=key,
            drawer=drawer,
            received_ns=received_ns,
            tokenize_ms=tok_ms,
            stop=[str(s) for s in stop],
            canned=canned,
        )

    def _canned(self, body: dict[str, Any]) -> list[str] | None:
        """Token pieces of a known answer when the last message is a known prompt."""
        if not self.answers:
            return None
        msgs = body.get("messages") or []
        last = msgs[-1] if msgs and isinstance(msgs[-1], dict) else {}
        answer = self.answers.get(last.get("content")) if last.get("role") == "user" else None
        return self.encoder.pieces(answer) if answer else None

    def foreign(self, seconds: float, index: int) -> Request:
        """A phantom request: short prompt, decodes until `seconds` have passed."""
        key = key_of(self.seed, "foreign", time.monotonic_ns(), index)
        ids = [1000 + (key >> (i % 48)) % 50000 for i in range(64)]
        return Request(
            id=self.engine.next_id("foreign"),
            prompt_len=len(ids),
            hashes=block_hashes(ids, self.block_size),
            target_len=FOREVER,
            max_tokens=FOREVER,
            out_key=key,
            drawer=AcceptanceDrawer(self.prof.cum_accept(self.gamma), self.prof.sampling, key),
            received_ns=time.monotonic_ns(),
            foreign_until=time.monotonic() + seconds,
        )
