"""The contamination guard: is anyone else using the endpoint while we measure?

Rule: a wave is contaminated if the server ever reports more requests in flight
(`vllm:num_requests_running + vllm:num_requests_waiting`) than the benchmark itself has in flight.

Getting "ours" right is the whole trick. The server learns of a request after we send it (it has
to be received and tokenized) and forgets it before we see the socket close (it finishes, then the
last bytes travel); its gauges can also lag by a scheduler step. So the tracker counts a request
from before connect until `grace` after the stream closed, and each scrape is compared with the
*peak* of that count over the scrape's own request/response interval. The server's count of our
requests can then never exceed ours (clean waves are never flagged), while any foreign request
visible to the server pushes its count above ours (foreign ones always are, while visible).

Sampling cannot see a foreign request that comes and goes between two samples. The second line
of defence does not depend on timing: once sampling found an attempt clean, the counter deltas
between its before- and after-scrape must equal what our own requests account for (token
conservation, conserve.py); any excess marks the attempt contaminated too.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import requests

from bench.benchlib import conserve, promm
from pairctl.endpoint import Endpoint

T = TypeVar("T")


class InFlightTracker:
    """Thread-safe count of our in-flight requests, with a grace period after each finish."""

    def __init__(self, grace_s: float = 0.5) -> None:
        self._grace_ns = int(grace_s * 1e9)
        self._lock = threading.Lock()
        self._active = 0
        self._finished: deque[int] = deque()
        self._peak = 0
        self.started = 0
        self._socks: set[Any] = set()
        self.aborted = False
        self.results: list[Any] = []  # every finished request of the wave (StreamResult)

    def _effective(self, now: int) -> int:
        while self._finished and self._finished[0] + self._grace_ns <= now:
            self._finished.popleft()
        return self._active + len(self._finished)

    def start(self) -> None:
        with self._lock:
            self._active += 1
            self.started += 1
            self._peak = max(self._peak, self._effective(time.monotonic_ns()))

    def finish(self) -> None:
        with self._lock:
            self._active -= 1
            self._finished.append(time.monotonic_ns())

    def record(self, result: Any) -> None:
        """Keep a finished request's result: its usage is what the wave accounts for."""
        with self._lock:
            self.results.append(result)

    def attach(self, sock: Any) -> None:
        """Register a request's socket, so abort() can end it; refused after an abort."""
        with self._lock:
            if not self.aborted:
                self._socks.add(sock)
                return
        _shutdown(sock)

    def detach(self, sock: Any) -> None:
        with self._lock:
            self._socks.discard(sock)

    def abort(self) -> None:
        """End every attached request now (their threads see EOF); later ones end at once."""
        with self._lock:
            self.aborted = True
            socks, self._socks = list(self._socks), set()
        for s in socks:
            _shutdown(s)

    def count(self) -> int:
        with self._lock:
            return self._effective(time.monotonic_ns())

    def active(self) -> int:
        with self._lock:
            return self._active

    def begin_window(self) -> None:
        """Start a scrape window: the peak restarts at the current count."""
        with self._lock:
            self._peak = self._effective(time.monotonic_ns())

    def end_window(self) -> int:
        """Peak of our count since begin_window (a finish inside the window never lowers it)."""
        with self._lock:
            return max(self._peak, self._effective(time.monotonic_ns()))


def _shutdown(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


@dataclass
class GuardConfig:
    enabled: bool = True
    retries: int = 3
    interval_s: float = 0.15
    grace_s: float = 0.5
    backoff_s: float = 2.0
    backoff_max_s: float = 30.0
    scrape_timeout_s: float = 5.0
    abort_early: bool = True  # cut a wave short as soon as a sample shows foreign traffic


class GuardError(RuntimeError):
    """The guard cannot work (no gauges exported, /metrics unreachable)."""


class Sampler:
    """Takes guard samples: on demand (before/after) and every interval in a background thread."""

    def __init__(
        self, endpoint: Endpoint, tracker: InFlightTracker, cfg: GuardConfig, t0_ns: int
    ) -> None:
        self.endpoint, self.tracker, self.cfg, self.t0_ns = endpoint, tracker, cfg, t0_ns
        self.session = requests.Session()  # no key: vLLM serves /metrics without one
        self.samples: list[dict[str, Any]] = []
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, phase: str) -> promm.Snapshot | None:
        self.tracker.begin_window()
        try:
            snap = promm.scrape(self.session, self.endpoint, self.cfg.scrape_timeout_s)
        except (requests.RequestException, ValueError) as e:
            self.samples.append({"phase": phase, "t_ms": self._t_ms(), "error": str(e)[:300]})
            return None
        ours = self.tracker.end_window()
        server = snap.in_flight
        self.samples.append(
            {
                "phase": phase,
                "t_ms": round((snap.t_ns - self.t0_ns) / 1e6, 1),
                "running": snap.running,
                "waiting": snap.waiting,
                "ours": ours,
            }
        )
        if server is None:
            raise GuardError(
                "server exports neither vllm:num_requests_running nor vllm:num_requests_waiting; "
                "the guard cannot work (use --no-guard to measure unguarded)"
            )
        if server > ours and self.reason is None:
            self.reason = (
                f"{phase}: server had {server:g} in flight (running {snap.running:g}, waiting "
                f"{snap.waiting or 0:g}) but the benchmark had {ours}"
            )
        return snap

    def _t_ms(self) -> float:
        return round((time.monotonic_ns() - self.t0_ns) / 1e6, 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.interval_s):
            try:
                self.sample("during")
            except GuardError as e:
                self.reason = self.reason or str(e)
            if self.reason is not None and self.cfg.abort_early:
                # The wave is lost anyway: stop paying for it (a 128k-token point is minutes).
                self.tracker.abort()
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="guard-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class Attempt:
    """One try at a measured wave: clean or not, why, and every guard sample."""

    clean: bool
    reason: str | None
    samples: list[dict[str, Any]]
    duration_s: float
    conservation: conserve.Verdict | None = None  # None: sampling already rejected it

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "conservation": None if self.conservation is None else self.conservation.to_json(),
            "guard_samples": self.samples,
        }


@dataclass
class GuardedPoint(Generic[T]):
    """The outcome of a guarded measurement: the clean wave's result, or why there is none."""

    status: str  # "ok" | "contaminated" | "error"
    result: T | None = None
    deltas: dict[str, Any] | None = None  # /metrics counter deltas of the clean wave
    attempts: list[Attempt] = field(default_factory=list)
    reason: str | None = None

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    @property
    def conservation(self) -> conserve.Verdict | None:
        """The clean attempt's conservation verdict (None without a clean, guarded attempt)."""
        last = self.attempts[-1] if self.attempts and self.status == "ok" else None
        return None if last is None else last.conservation


def run_guarded(
    endpoint: Endpoint,
    wave: Callable[[InFlightTracker], T],
    cfg: GuardConfig,
    log: Callable[[str], None] = lambda s: None,
    label: str = "",
) -> GuardedPoint[T]:
    """Run `wave(tracker)` until one attempt is clean, at most 1 + cfg.retries times.

    The wave must pass the tracker to every request it sends. An attempt is clean when no sample
    saw foreign requests in flight *and* the counters between its before- and after-scrape hold
    nothing but our own requests (conserve.check). Deltas come from the clean attempt only. With
    the guard disabled the wave runs once, unchecked.
    """
    attempts: list[Attempt] = []
    for attempt in range(cfg.retries + 1 if cfg.enabled else 1):
        if attempt:
            pause = min(cfg.backoff_s * 2 ** (attempt - 1), cfg.backoff_max_s)
            log(
                f"{label}: wave contaminated ({attempts[-1].reason}); retry {attempt} in {pause:g}s"
            )
            time.sleep(pause)
        tracker = InFlightTracker(cfg.grace_s)
        t0 = time.monotonic_ns()
        s = Sampler(endpoint, tracker, cfg, t0)
        if not cfg.enabled:
            result = wave(tracker)
            attempts.append(Attempt(True, "guard disabled", [], (time.monotonic_ns() - t0) / 1e9))
            return GuardedPoint("ok", result, None, attempts)
        pre = s.sample("before")
        if pre is None or s.reason:
            why = s.reason or "could not scrape /metrics before the wave"
            attempts.append(Attempt(False, why, s.samples, (time.monotonic_ns() - t0) / 1e9))
            continue
        s.start()
        try:
            result = wave(tracker)
        finally:
            s.stop()
        # Let our own finished requests age out of the server's gauges, then look once more.
        time.sleep(cfg.grace_s)
        post = s.sample("after")
        if post is None and s.reason is None:
            s.reason = "could not scrape /metrics after the wave"
        verdict, deltas = None, None
        if s.reason is None and post is not None:
            # Second line of defence: every counted request and token must be one of ours.
            deltas = promm.delta(pre, post)
            verdict = conserve.check(deltas, conserve.account(tracker.results), promm.gamma(post))
            s.reason = verdict.reason
        clean = s.reason is None
        elapsed = (time.monotonic_ns() - t0) / 1e9
        attempts.append(Attempt(clean, s.reason, s.samples, elapsed, verdict))
        if clean and deltas is not None:
            return GuardedPoint("ok", result, deltas, attempts)
    why = f"all {len(attempts)} attempts contaminated; last: {attempts[-1].reason}"
    return GuardedPoint("contaminated", None, None, attempts, why)
