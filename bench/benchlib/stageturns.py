"""bench.frontend_stages' turns: one server per arm, the shared conversation, one measured request.

A request carries ``X-Request-Id`` (its tag), which every stage event of it contains, so its
TTFT can be split (stages.py) from the events its server's processes appended since the last
read; the conversation is the same on every arm, grown with the offline encode benchmark's
mixed text.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.benchlib import prompts, stages
from bench.benchlib.stream import open_connection, stream_request
from bench.kernels.bench_tokenizer_cache import TraceText
from bench.realserver import Server
from pairctl.endpoint import Endpoint

SERVED = "tiny-dsv4"
REPLY = "Noted."


@dataclass
class Arm:
    """One server and what we read of its stage files."""

    name: str
    server: Server
    stage_dir: Path
    endpoint: Endpoint
    tail: stages.Tail = field(init=False)

    def __post_init__(self) -> None:
        self.tail = stages.Tail(self.stage_dir)


@dataclass
class Reply:
    arm: str
    tag: str
    ok: bool
    error: str | None
    ttft_ms: float | None
    prompt_tokens: int | None
    content: str
    stages: dict[str, float] | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    retries: int = 0


def payload(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def send(arm: Arm, messages: list[dict[str, str]], tag: str, args: argparse.Namespace) -> Reply:
    """One request; its stage split when it is measured (the tag names it in every event)."""
    sock = open_connection(arm.endpoint, args.timeout_s)
    time.sleep(0.05)  # the server accepts before the request leaves (kept out of TTFT)
    res = stream_request(
        arm.endpoint,
        "/v1/chat/completions",
        payload(messages, args.max_tokens),
        timeout_s=args.timeout_s,
        sock=sock,
        headers={"X-Request-Id": tag},
    )
    t_first = res.t_first_chunk_ns
    ttft = (
        None if t_first is None or res.t_request_ns is None else (t_first - res.t_request_ns) / 1e6
    )
    reply = Reply(arm.name, tag, res.ok, res.error, ttft, res.prompt_tokens, res.content or "")
    time.sleep(0.2)  # the last events of the request reach the files
    events = arm.tail.read()
    if res.ok and t_first is not None and res.t_request_ns is not None:
        reply.foreign = stages.foreign(events, tag, res.t_request_ns, t_first)
        try:
            reply.stages = stages.split(events, tag, res.t_request_ns, t_first)
            reply.facts = stages.facts(events, tag, res.t_request_ns, t_first)
        except stages.Missing as e:
            reply.error = str(e)
    return reply


class Conversation:
    """The shared history and the text that grows it (the same on every arm)."""

    def __init__(self, seed: int, chars_per_token: float) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.cpt = chars_per_token
        self.history: list[dict[str, str]] = []
        self.tag = prompts.nonce(self.rng)
        self.n = 0

    def text(self, tokens: int) -> str:
        self.n += 1
        return TraceText(self.seed * 100_000 + self.n).block(max(1, int(tokens * self.cpt)))

    def fill(self, tokens: int, per_message: int) -> list[dict[str, str]]:
        """The history plus documents of about ``tokens`` tokens, the last one a user turn."""
        msgs: list[dict[str, str]] = []
        left = tokens
        while left > 0:
            n = min(per_message, left)
            head = self.tag if not self.history and not msgs else ""
            msgs.append({"role": "user", "content": f"{head}Document part:\n\n{self.text(n)}"})
            left -= n
            if left > 0:
                msgs.append({"role": "assistant", "content": REPLY})
        return [*self.history, *msgs]

    def turn(self, tokens: int, attempt: int = 0) -> list[dict[str, str]]:
        body = self.text(tokens)
        mark = f"(attempt {attempt}) " if attempt else ""
        return [*self.history, {"role": "user", "content": f"{mark}{body}\n\nWhat changes?"}]

    def commit(self, messages: list[dict[str, str]]) -> None:
        self.history = [*messages, {"role": "assistant", "content": REPLY}]


def chars_per_token(ep: Endpoint) -> float:
    sample = TraceText(-1).block(40_000)
    with requests.Session() as s:
        n = prompts.count_tokens(s, ep, SERVED, [{"role": "user", "content": sample}])
    return len(sample) / n if n else 4.0
