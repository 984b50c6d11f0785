"""Foreign traffic on cue: `POST /twin/foreign` now, or at an offset from a later event.

The benchmarks' contamination guard must catch other people's requests whatever their timing.
Tests need those requests at the moments that fool a sampler (inside its grace period, between
two samples, just before a short request), so a foreign request can be armed to fire a fixed
offset after the n-th next event of a kind:

    scrape       a GET /metrics was answered (the guard's samples are scrapes)
    request      a generation request arrived over HTTP
    first_token  such a request's first token was handed to its stream
    finish       such a request finished

Foreign requests are engine-level phantoms (no HTTP): they take batch slots and decode capacity
and move every counter as a real request would. This is the twin's test surface, not vLLM's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("twin")

TRIGGERS = ("scrape", "request", "first_token", "finish")


@dataclass(frozen=True)
class ForeignSpec:
    """What to inject: N phantoms decoding for `seconds`, or exactly `tokens` tokens each."""

    requests: int = 1
    seconds: float = 10.0
    tokens: int | None = None
    prompt_tokens: int = 64


@dataclass
class _Armed:
    trigger: str
    nth: int
    offset_s: float
    spec: ForeignSpec
    seen: int = 0


class Injector:
    """Armed triggers; `notify(event)` counts events and fires the ones that are due."""

    def __init__(self, fire: Callable[[ForeignSpec], list[str]]) -> None:
        self._fire = fire
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []

    def arm(self, trigger: str, nth: int, offset_s: float, spec: ForeignSpec) -> None:
        if trigger not in TRIGGERS:
            raise ValueError(f"after must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        if nth < 1 or offset_s < 0:
            raise ValueError("nth must be >= 1 and offset_ms >= 0")
        with self._lock:
            self._armed.append(_Armed(trigger, nth, offset_s, spec))

    def pending(self) -> int:
        with self._lock:
            return len(self._armed)

    def notify(self, event: str) -> None:
        if not self._armed:  # unlocked fast path: nothing armed, nothing to count
            return
        due: list[_Armed] = []
        with self._lock:
            for a in list(self._armed):
                if a.trigger == event:
                    a.seen += 1
                    if a.seen == a.nth:
                        self._armed.remove(a)
                        due.append(a)
        for a in due:
            log.warning(
                "Foreign traffic (armed): %d phantom requests %.1f ms after %s #%d",
                a.spec.requests,
                a.offset_s * 1000,
                event,
                a.nth,
            )
            if a.offset_s <= 0:
                self._fire(a.spec)
            else:
                t = threading.Timer(a.offset_s, self._fire, args=(a.spec,))
                t.daemon = True
                t.start()
