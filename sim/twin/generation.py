"""One OpenAI request in flight in the twin: its engine requests (n of them) and its events.

With `n` > 1 vLLM runs one engine request per choice (vllm/v1/engine/parallel_sampling.py);
their events meet in one queue, tagged with the choice index, and the HTTP thread streams
them as they come. This module also tells the injector when the first token and the finish
went out (its `first_token` / `finish` triggers).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

from sim.twin import params, shapes
from sim.twin.engine import Engine, Request
from sim.twin.injector import Injector
from sim.twin.thinking import Split, cut_pieces


class Tagged:
    """A child request's event sink: its events go to the response's queue, tagged."""

    def __init__(self, q: queue.Queue, index: int) -> None:
        self.q, self.index = q, index

    def put(self, ev: tuple) -> None:
        self.q.put((self.index, ev))


class Generation:
    """One OpenAI request in flight: its n engine requests and what the response needs."""

    def __init__(
        self,
        reqs: list[Request],
        p: params.Params,
        shape: shapes.Shape,
        engine: Engine,
        injector: Injector,
        spec_metrics: str,
        prompt_details: bool = False,
        parser_thinking: bool | None = None,
        include_reasoning: bool = True,
    ) -> None:
        """``parser_thinking``: with a reasoning parser, whether it starts in reasoning (one
        parser per choice, as vLLM makes them); None: no parser, replies as they are."""
        self.reqs, self.p, self.shape = reqs, p, shape
        self.prompt_details = prompt_details
        self.splits = None
        if parser_thinking is not None:
            self.splits = [Split(parser_thinking) for _ in reqs]
        # include_reasoning=false: reasoning dropped, and logprobs with it (they would show
        # it): vllm/entrypoints/openai/chat_completion/stream_processor.py hide_metadata
        self.include_reasoning = include_reasoning
        self.hide_logprobs = parser_thinking is not None and not include_reasoning
        self.engine, self.injector, self.spec_metrics = engine, injector, spec_metrics
        self.rid = shape.rid
        self.merged: queue.Queue = queue.Queue()
        for i, r in enumerate(reqs):
            r.events = Tagged(self.merged, i)
        self.sent = [0] * len(reqs)  # tokens handed out per choice (logprob index)
        self.text_len = [0] * len(reqs)  # characters per choice (completion text_offset)

    def events(self) -> Iterator[tuple[int, tuple]]:
        """(choice, event) until every choice finished or failed; notifies the injector."""
        open_ = set(range(len(self.reqs)))
        first = False
        while open_:
            try:
                i, ev = self.merged.get(timeout=1.0)
            except queue.Empty:
                if self.engine.dead:
                    yield 0, ("error", f"engine dead: {self.engine.dead}")
                    return
                continue
            if ev[0] == "tokens" and not first:
                first = True
                self.injector.notify("first_token")
            yield i, ev
            if ev[0] == "error":
                return
            if ev[0] == "finish":
                open_.discard(i)
        self.injector.notify("finish")

    def logprobs(self, i: int, ev: tuple) -> dict[str, Any]:
        """The logprobs of a token event of choice i (and advance its token count)."""
        pieces = ev[3] if len(ev) > 3 else [ev[1]]
        top, req, idx = self.p.logprobs or 0, self.reqs[i], self.sent[i]
        self.sent[i] += len(pieces)
        offset = self.text_len[i]
        self.text_len[i] += len(ev[1])
        if self.shape.chat:
            return shapes.chat_logprobs(req, idx, pieces, top)
        return shapes.completion_logprobs(req, idx, pieces, top, offset)

    def reasoning_tokens(self, i: int | None = None) -> int | None:
        """Tokens the parser saw as reasoning (choice i, or all); None without a parser."""
        if self.splits is None:
            return None
        splits = self.splits if i is None else [self.splits[i]]
        return sum(s.reasoning_tokens for s in splits)

    def usage(self, full: bool = False) -> dict[str, Any]:
        details = self.reasoning_tokens()
        return shapes.request_usage(self.reqs, self.prompt_details, full, details)

    def pieces(self, ev: tuple) -> list[str]:
        """A token event's pieces, trimmed to its text when a stop string cut it."""
        pieces = list(ev[3]) if len(ev) > 3 else [ev[1]]
        return pieces if "".join(pieces) == ev[1] else cut_pieces(pieces, ev[1])

    def delta(self, i: int, ev: tuple) -> dict[str, Any] | None:
        """The streamed delta of a token event of choice i, split by the reasoning parser
        (vllm/parser/engine/parser_engine.py parse_delta); None: vLLM sends no delta."""
        assert self.splits is not None
        finished = len(ev) > 4 and bool(ev[4])
        got = self.splits[i].delta(self.pieces(ev), finished)
        if got is None:
            return None
        reasoning, content = got
        if not self.include_reasoning:
            reasoning = None
        out: dict[str, Any] = {}
        if content is not None:
            out["content"] = content
        if reasoning is not None:
            out["reasoning"] = reasoning
        return out or None

    def whole(self, i: int, pieces: list[str]) -> tuple[str | None, str | None]:
        """A non-streamed choice's (reasoning, content): split by the parser, or as is."""
        if self.splits is None:
            return None, "".join(pieces)
        reasoning, content = self.splits[i].whole(pieces)
        return (reasoning if self.include_reasoning else None), content

    def no_logprobs(self) -> dict[str, Any]:
        """The logprobs block of a chunk that carries no token (vLLM's finish chunk carries
        the last token, so its logprobs are an object, never null, when asked for)."""
        if self.shape.chat:
            return {"content": []}
        return {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}

    def with_usage(self, chunk: dict[str, Any], i: int | None = None) -> dict[str, Any]:
        """stream_options.continuous_usage_stats: every chunk carries the usage so far (with
        a parser, choice i's reasoning tokens so far; the role chunk, i None: 0)."""
        if self.p.continuous_usage:
            reasoning = None
            if self.splits is not None:
                reasoning = 0 if i is None else self.reasoning_tokens(i)
            chunk["usage"] = shapes.usage(
                self.reqs[0].prompt_len,
                sum(r.generated for r in self.reqs),
                reasoning=reasoning,
            )
        return chunk

    def metrics(self) -> dict[str, Any] | None:
        """`metrics.speculative_decoding`, single-choice requests only (as vLLM)."""
        if self.spec_metrics == "none" or len(self.reqs) != 1:
            return None
        gamma = self.engine.cfg.gamma
        detailed = self.spec_metrics == "detailed"
        return {"speculative_decoding": shapes.spec_metrics(self.reqs[0], gamma, detailed)}


def merge_logprobs(parts: list[dict[str, Any]], chat: bool) -> dict[str, Any] | None:
    """The per-event logprobs of one choice as the one block a full response carries."""
    if not parts:
        return None
    if chat:
        return {"content": [c for p in parts for c in p["content"]]}
    keys = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
    return {k: [x for p in parts for x in p[k]] for k in keys}
