"""A prompt sent as (an earlier prompt, how much of it, the new tokens) over an ordered channel.

Model-agnostic core (no vLLM imports). The API server hands every request's whole prompt to
the engine core (msgpack over zmq): a 500k-token history costs ~8 ms to encode and ~30 ms
to decode into Python ints each turn although only the new turn's tokens are new. The
channel is ordered and loses nothing (one zmq DEALER/ROUTER pair per API server and engine
core), so the sender can know exactly which prompts the receiver holds: the receiver keeps
the last ``2 * window`` prompts of each sender, the sender only refers to one of the last
``window`` it sent. A delta then names the earlier request, the length ``n`` of the shared
prefix (found by the sender with one list comparison against the very list it sent before)
and the tokens after it; the receiver rebuilds ``earlier[:n] + tokens``.

Exactness: by induction over the channel's messages the receiver's list for a request id
is the list the sender sent for it (a full prompt is stored as received; a rebuilt one is
the sender's list by the induction hypothesis and the sender's own comparison). A sampled
check (``verify_rate``) sends the full prompt with the delta; the receiver compares, and on
a difference uses the full prompt, refuses every later delta (the request fails with an
error that names the flag to turn off) and logs why: a wrong prompt must never be served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from .prefix_hashes import TAIL_SCAN, common_prefix_len

WINDOW = 4  # prompts a sender may refer to; receivers keep twice as many per sender
MIN_SHARED = 2048  # a shorter shared prefix is not worth a delta


@dataclass(frozen=True)
class Delta:
    """What travels instead of a prompt: the earlier request, the shared length, the rest."""

    base: str
    shared: int
    total: int


def encode_delta(d: Delta) -> str:
    return f"{d.shared}:{d.total}:{d.base}"


def decode_delta(text: str) -> Delta:
    shared, total, base = text.split(":", 2)
    return Delta(base, int(shared), int(total))


class Sender:
    """The sender's record of what it sent (thread-safe; lists are never mutated)."""

    def __init__(self, window: int = WINDOW, min_shared: int = MIN_SHARED) -> None:
        self.window = window
        self.min_shared = min_shared
        self._sent: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.deltas = 0
        self.full = 0

    def plan(self, tokens: list[int]) -> tuple[Delta | None, list[int]]:
        """(the delta, the tokens to send) for ``tokens``; no delta: send them all."""
        with self._lock:
            cands = list(reversed(self._sent.items()))
        best: tuple[str, int] | None = None
        for rid, prev in cands:
            n = common_prefix_len(prev, tokens)
            if n >= self.min_shared and (best is None or n > best[1]):
                best = (rid, n)
            if n >= min(len(prev), len(tokens)) - TAIL_SCAN:
                break  # all but its tail: an older prompt will not share much more
        if best is None:
            return None, tokens
        rid, n = best
        return Delta(rid, n, len(tokens)), tokens[n:]

    def sent(self, rid: str, tokens: list[int], delta: Delta | None) -> None:
        """Record a prompt the channel accepted (only then may a later delta name it)."""
        with self._lock:
            self._sent[rid] = tokens
            self._sent.move_to_end(rid)
            while len(self._sent) > self.window:
                self._sent.popitem(last=False)
            if delta is None:
                self.full += 1
            else:
                self.deltas += 1


class DeltaError(ValueError):
    """A delta the receiver cannot rebuild exactly; the message says what to do."""


class Receiver:
    """The receiver's prompts, per sender, and the rebuild of deltas (thread-safe)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.keep = 2 * window
        self._by_sender: dict[Hashable, OrderedDict[str, list[int]]] = {}
        self._lock = threading.Lock()
        self.refused = ""  # set after a failed check: every later delta is refused
        self.rebuilt = 0
        self.verified = 0

    def store(self, sender: Hashable, rid: str, tokens: list[int]) -> None:
        with self._lock:
            q = self._by_sender.setdefault(sender, OrderedDict())
            q[rid] = tokens
            q.move_to_end(rid)
            while len(q) > self.keep:
                q.popitem(last=False)

    def base(self, sender: Hashable, delta: Delta) -> list[int] | None:
        """The list a delta names, as held (None if not held)."""
        with self._lock:
            return self._by_sender.get(sender, {}).get(delta.base)

    def rebuild(self, sender: Hashable, delta: Delta, tail: list[int]) -> list[int]:
        """The whole prompt; DeltaError when it cannot be rebuilt exactly."""
        if self.refused:
            raise DeltaError(self.refused)
        with self._lock:
            base = self._by_sender.get(sender, {}).get(delta.base)
        if base is None or len(base) < delta.shared or delta.shared + len(tail) != delta.total:
            raise DeltaError(
                f"prompt delta names request {delta.base!r} ({delta.shared} shared tokens), "
                "which this engine core does not hold; restart with "
                "VLLM_INCREMENTAL_PROMPT_HANDOFF=0"
            )
        self.rebuilt += 1
        out = base[: delta.shared]
        out.extend(tail)
        return out

    def check(self, rebuilt: list[int], full: list[int]) -> bool:
        """A sampled full prompt against the rebuilt one; a difference refuses all later deltas."""
        self.verified += 1
        if rebuilt == full:
            return True
        first = next(
            (i for i, (a, b) in enumerate(zip(rebuilt, full, strict=False)) if a != b),
            min(len(rebuilt), len(full)),
        )
        self.refused = (
            f"a rebuilt prompt differed from the one sent (first at token {first}); prompt "
            "deltas are refused for the life of this engine core: restart with "
            "VLLM_INCREMENTAL_PROMPT_HANDOFF=0"
        )
        return False


def sender_key(request: Any) -> Hashable:
    """Which sender a request came from (one per API server process)."""
    return getattr(request, "client_index", 0)
