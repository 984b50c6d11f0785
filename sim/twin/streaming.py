"""The SSE chunks of one streamed completion, in the order vLLM 0.33 sends them.

Split from the HTTP handler (sim/twin/api.py), which writes the headers and frames; here,
what each engine event becomes: ``plain`` for text completions and chat without a reasoning
parser, ``split`` for chat with one (sim/twin/thinking.py). Both end with the usage chunk
(``stream_options.include_usage``) and ``[DONE]``; an engine error is vLLM's error body as
one more ``data:`` event, then the same end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.twin import peerloss
from sim.twin.errors import error
from sim.twin.generation import Generation

Send = Callable[[Any], None]  # one `data:` event (a JSON object, or raw bytes)


def _failed(gen: Generation, send: Send, why: str, peer_lost: bool) -> None:
    if peer_lost:
        peerloss.stream_failed(gen.shape.chat)
    send(error(why, 500, "InternalServerError"))


def _end(gen: Generation, send: Send) -> None:
    if gen.p.include_usage:
        send(gen.shape.usage_chunk(gen.usage(), gen.metrics()))
    send(b"[DONE]")


def plain(gen: Generation, send: Send, peer_lost: Callable[[], bool]) -> None:
    """Tokens as they come (a chat token event with no text sends nothing), then a finish
    chunk per choice; the last one carries ``system_fingerprint`` when no usage follows."""
    shape, open_ = gen.shape, len(gen.reqs)
    for i, ev in gen.events():
        if ev[0] == "tokens":
            if ev[1] or not shape.chat:
                lp = gen.logprobs(i, ev) if gen.p.logprobs is not None else None
                send(gen.with_usage(shape.chunk(ev[1], None, i, lp)))
            else:
                gen.logprobs(i, ev)  # keep the token count of choice i right
        elif ev[0] == "finish":
            open_ -= 1
            delta = "" if not shape.chat else {"content": ""}
            lp = gen.no_logprobs() if gen.p.logprobs is not None else None
            last = open_ == 0 and not gen.p.include_usage
            send(gen.with_usage(shape.chunk(delta, ev[1], i, lp, last=last)))
        else:
            _failed(gen, send, ev[1], peer_lost())
            break
    _end(gen, send)


def split(gen: Generation, send: Send, peer_lost: Callable[[], bool]) -> None:
    """A chat stream split by the reasoning parser, as
    vllm/entrypoints/openai/chat_completion/serving.py streams it: each output's delta from
    the parser; an output the parser turns into nothing (``</think>`` alone, held-back
    whitespace) sends no chunk unless it carries logprobs; a request's last tokens ride in
    its finish chunk (one RequestOutput), whose delta is ``{}`` when they parse to nothing
    (``DeltaMessage()``)."""
    shape, open_ = gen.shape, len(gen.reqs)
    pending: dict[int, tuple[dict[str, Any] | None, Any]] = {}
    want_lp = gen.p.logprobs is not None
    for i, ev in gen.events():
        if ev[0] == "tokens":
            delta = gen.delta(i, ev)
            lp = gen.logprobs(i, ev) if want_lp else None
            if gen.hide_logprobs:
                lp = None
            if len(ev) > 4 and ev[4]:  # its finish comes next: one chunk for both
                pending[i] = (delta, lp)
            elif delta is not None or lp is not None:
                send(gen.with_usage(shape.chunk(delta or {}, None, i, lp), i))
        elif ev[0] == "finish":
            open_ -= 1
            delta, lp = pending.pop(i, (None, None))
            if lp is None and want_lp and not gen.hide_logprobs:
                lp = gen.no_logprobs()
            last = open_ == 0 and not gen.p.include_usage
            send(gen.with_usage(shape.chunk(delta or {}, ev[1], i, lp, last=last), i))
        else:
            _failed(gen, send, ev[1], peer_lost())
            break
    _end(gen, send)
