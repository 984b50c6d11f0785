"""The engine loop: continuous batching, chunked prefill and DSpark verify steps in real time.

One thread plays the engine core. Each step it schedules, as vLLM's scheduler does, decode
first (each decoding request takes 1 + gamma tokens of the --max-num-batched-tokens budget),
then prefill chunks for running and then waiting requests (one request's chunk capped by
--long-prefill-token-threshold when set), admits up to --max-num-seqs, and sleeps for the
modelled step time:  step = decode_step(batch) + prefill_tokens / prefill_tok_s.
At the end of the step it emits tokens (1 + accepted per decoding request, the first token
for a finished prefill), updates metrics exactly, and wakes the waiting HTTP streams.

Counters move when vLLM 0.33 moves them (a client that checks token conservation relies on it):
`vllm:prompt_tokens` by the whole prompt, cached tokens included, when the first token comes out
(vllm/v1/metrics/stats.py IterationStats.update_from_output, is_prefilling); so a request
aborted before its first token adds no prompt tokens. `vllm:generation_tokens` by every token
handed out. `vllm:request_success` when a request finishes, never for a client abort
(vllm/v1/engine/output_processor.py abort_requests records no finished stats).
`vllm:prefix_cache_queries`/`hits` once per request at admission, and only with prefix caching
on (vllm/v1/core/kv_cache_manager.py record_prefix_cache_stats; scheduler.py "Record at
admission"). Accepted drafts are counted before the output is cut at max_tokens/EOS
(vllm/v1/core/sched/scheduler.py: num_accepted from the sampled ids, then
_update_request_with_output trims), so accepted tokens can exceed what was emitted by up to
gamma on a request's last step.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sim.twin import peerloss, vllm_log
from sim.twin.metrics import Metrics
from sim.twin.prefix_cache import PrefixCache
from sim.twin.profile import Profile
from sim.twin.sampling import AcceptanceDrawer, piece

log = logging.getLogger("twin")
FOREVER = 1 << 60
CATCH_UP_S = 2.0  # host lag up to this much is absorbed by the modelled timeline


class PeerStep(Protocol):
    """The other TP rank's part in a step (sim/twin/ranks.py Link)."""

    def step(self, n: int) -> None: ...

    def wait_step(self, n: int, timeout: float | None) -> str: ...


@dataclass
class EngineConfig:
    """Serve-time knobs (from the command line, defaults from the profile)."""

    gamma: int
    max_num_seqs: int
    max_num_batched_tokens: int
    lpt_threshold: int
    max_model_len: int
    fp8_head: bool
    kv_capacity_tokens: int
    step_timeout_s: float | None  # None: no execute-model timeout (TP=1)
    jit_stall_s: float = 0.0
    stall_steps: dict[int, float] = field(default_factory=dict)  # fault: step no. -> extra s


@dataclass
class Request:
    """One request as the engine sees it (HTTP-side fields filled before submit)."""

    id: str
    prompt_len: int
    hashes: list[bytes]
    target_len: int  # tokens to emit before finishing (EOS, max_tokens or forced length)
    max_tokens: int
    out_key: int
    drawer: AcceptanceDrawer
    received_ns: int
    tokenize_ms: float = 0.0
    stop: list[str] = field(default_factory=list)
    foreign_until: float | None = None
    canned: list[str] | None = None  # fixed reply, one entry per token (quality answers)
    think_len: int | None = None  # thinking mode: reasoning tokens before </think>
    events: Any = field(default_factory=queue.Queue)  # anything with put(); the HTTP side reads
    spec_hist: list[int] = field(default_factory=list)  # verify steps by accepted drafts (0..γ)
    spec_steps: list[int] = field(default_factory=list)  # accepted drafts of each verify step
    draft_tokens: int = 0
    cached_tokens: int = 0
    computed: int = 0
    generated: int = 0
    verify_steps: int = 0
    accepted: int = 0
    text_tail: str = ""
    first_token_ns: int | None = None
    finish_ns: int | None = None
    last_emit: float = 0.0
    finish_reason: str | None = None
    cancelled: bool = False
    submitted_at: float = 0.0  # engine clock when it reached the engine

    def record(self) -> dict:
        return {
            "id": self.id,
            "received_ns": self.received_ns,
            "first_token_ns": self.first_token_ns,
            "finish_ns": self.finish_ns,
            "prompt_tokens": self.prompt_len,
            "completion_tokens": self.generated,
            "cached_tokens": self.cached_tokens,
            "tokenize_ms": round(self.tokenize_ms, 3),
            "verify_steps": self.verify_steps,
            "accepted_tokens": self.accepted,
            "finish_reason": self.finish_reason,
            "foreign": self.foreign_until is not None,
        }


class Engine:
    """Continuous-batching engine driven by a Profile; thread-safe submit()."""

    def __init__(
        self,
        prof: Profile,
        cfg: EngineConfig,
        metrics: Metrics,
        prefix: PrefixCache,
        on_death: Callable[[str], None],
        on_first_step: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        peer: PeerStep | None = None,
    ) -> None:
        self.prof, self.cfg, self.m, self.prefix = prof, cfg, metrics, prefix
        # clock/sleep are injectable so tests can run the same loop on a virtual clock.
        self._clock = clock
        self.on_death, self.on_first_step = on_death, on_first_step
        # TP > 1: every step is a round trip to the other rank (its part of the collective).
        self.peer = peer
        self._cond = threading.Condition()
        self._arrivals: deque[Request] = deque()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.records: dict[str, Request] = {}
        self._order: deque[str] = deque()
        self._stop = threading.Event()
        self.steps = 0
        self._prev_end = -1.0
        self._admitted_at = 0.0
        self.dead: str | None = None
        self.peer_lost: str | None = None  # the TP peer's address once its socket closed
        self.peer_lost_busy = False  # a step was running when it closed
        # True once the engine died the way real vLLM then exits 0 (a step timed out)
        self.clean_shutdown = False
        self._ids = itertools.count(1)
        self._sleep = sleep or self._stop.wait
        self._thread = threading.Thread(target=self._loop, name="engine-core", daemon=True)

    # -- public ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def next_id(self, prefix: str = "cmpl") -> str:
        return f"{prefix}-twin-{next(self._ids)}"

    def submit(self, req: Request) -> None:
        if self.dead:
            raise RuntimeError(f"engine is dead: {self.dead}")
        with self._cond:
            self.records[req.id] = req
            self._order.append(req.id)
            while len(self._order) > 20000:
                self.records.pop(self._order.popleft(), None)
            req.submitted_at = self._clock()
            self._arrivals.append(req)
            self.m.waiting.set(len(self.waiting) + len(self._arrivals))
            self._cond.notify_all()

    def lose_peer(self, peer: str) -> None:
        """The TP peer is gone. Nothing shows until the next step, whose collective fails
        (sim/twin/peerloss.py): an idle engine stays healthy, as vLLM's does."""
        with self._cond:
            self.peer_lost = peer
            self.peer_lost_busy = bool(self.running)
            self._cond.notify_all()

    def cancel(self, req: Request) -> None:
        req.cancelled = True

    def list_records(self) -> list[dict]:
        with self._cond:
            return [self.records[i].record() for i in self._order if i in self.records]

    # -- the loop --------------------------------------------------------------------------
    def _kv_used(self) -> int:
        return sum(r.computed + r.generated for r in self.running)

    def _schedule(self) -> tuple[list[Request], list[tuple[Request, int]]]:
        """Pick this step's decodes and prefill chunks (vLLM-like, decode first)."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        decodes = [r for r in self.running if r.computed >= r.prompt_len]
        budget -= len(decodes) * (1 + cfg.gamma)
        chunks: list[tuple[Request, int]] = []

        def chunk_for(r: Request) -> int:
            n = min(r.prompt_len - r.computed, max(budget, 0))
            if cfg.lpt_threshold > 0:
                n = min(n, cfg.lpt_threshold)
            return n

        for r in self.running:
            if budget <= 0:
                break
            if r.computed < r.prompt_len:
                n = chunk_for(r)
                if n > 0:
                    chunks.append((r, n))
                    budget -= n
        used = self._kv_used()
        self._admitted_at = 0.0
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            if used + r.prompt_len + 1 > cfg.kv_capacity_tokens and self.running:
                break  # no KV room: wait for a running request to finish
            self.waiting.popleft()
            self._admitted_at = max(self._admitted_at, r.submitted_at)
            r.cached_tokens = self.prefix.lookup(r.hashes, r.prompt_len)
            r.computed = r.cached_tokens
            if self.prefix.enabled:  # vLLM records no lookup when caching is off
                self.m.prefix_queries.inc(r.prompt_len)
                self.m.prefix_hits.inc(r.cached_tokens)
            self.running.append(r)
            used += r.prompt_len
            n = chunk_for(r)
            if n > 0:
                chunks.append((r, n))
                budget -= n
        return decodes, chunks

    def _step_seconds(self, n_decode: int, prefill_tokens: int) -> float:
        base = (
            self.prof.step_ms(n_decode, self.cfg.fp8_head)
            if n_decode
            else (self.prof.prefill_base_ms if prefill_tokens else 0.0)
        )
        return (base + self.prof.prefill_ms(prefill_tokens)) / 1000.0

    def _loop(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - an engine bug must kill the server loudly
            log.exception("engine core crashed")
            self._die(f"engine core crashed: {exc}", f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.iterate():
                return

    def iterate(self, idle_wait: float = 0.2) -> bool:
        """One scheduling pass and (if there is work) one step; False once the engine stops.

        The engine thread calls this in a loop; tests call it directly on a virtual clock.
        """
        with self._cond:
            while self._arrivals:
                self.waiting.append(self._arrivals.popleft())
            self._drop_cancelled()
            if not self.running and not self.waiting:
                self._publish_gauges()
                self._prev_end = -1.0  # idle: the next step starts when work arrives
                self._cond.wait(timeout=idle_wait)
                return True
            decodes, chunks = self._schedule()
            self._publish_gauges()
        if self.peer_lost is not None and (decodes or chunks):
            peerloss.step_failed(self.peer_lost, self.peer_lost_busy)
            self._fail(vllm_log.ENGINE_DEAD)
            return False
        if not decodes and not chunks:
            self._sleep(0.01)
            return True
        now = self._clock()
        prev = self._prev_end
        # Busy engine: steps run back to back on the modelled timeline, so a little host
        # lag (GIL, a loaded CPU) is caught up instead of slowing the simulated pair down.
        start = prev if 0.0 <= now - prev < CATCH_UP_S else now
        start = max(start, self._admitted_at)  # never before a request it admits arrived
        dur = self._step_seconds(len(decodes), sum(n for _, n in chunks))
        self.steps += 1
        if self.steps == 1 and self.cfg.jit_stall_s > 0:
            log.info(
                "TileLang JIT: compiling kernels on first use (+%.1f s; no cache "
                "marker in TILELANG_CACHE_DIR)",
                self.cfg.jit_stall_s,
            )
            dur += self.cfg.jit_stall_s
        dur += self.cfg.stall_steps.get(self.steps, 0.0)
        timeout = self.cfg.step_timeout_s
        if timeout is not None and dur > timeout:
            self._sleep(max(start + timeout - self._clock(), 0.0))
            self._timed_out(
                f"execute_model step {self.steps} took longer than "
                f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={timeout:g} "
                f"(modelled {dur:.1f} s); raise it (the recipe uses 600)"
            )
            return False
        end = start + dur
        if self.peer is not None:
            self.peer.step(self.steps)
        self._sleep(max(end - self._clock(), 0.0))
        if self._stop.is_set():
            return False
        if self.peer is not None:
            waited = self._wait_peer(start, end, timeout)
            if waited is None:
                return self.dead is None
            end = waited
        if self.steps == 1 and self.on_first_step:
            self.on_first_step()
        with self._cond:
            self._apply(decodes, chunks, end)
            self._publish_gauges()
        self._prev_end = end
        return True

    def _wait_peer(self, start: float, end: float, timeout: float | None) -> float | None:
        """The step's end once the other rank has taken part: at once when it is running;
        when it is frozen (SIGSTOP, a hung host), as soon as it resumes, however long that
        is, up to the step timeout, which ends the engine as vLLM's executor does (its
        collective_rpc raises TimeoutError). None: the step did not complete (timed out, or
        the peer's socket closed: the next iterate fails it, sim/twin/peerloss.py)."""
        left = None if timeout is None else max(start + timeout - self._clock(), 0.0)
        result = self.peer.wait_step(self.steps, left) if self.peer is not None else "ok"
        if result == "ok":
            now = self._clock()
            # a long stall moves the timeline; ordinary lag stays absorbed (CATCH_UP_S)
            return now if now - end > CATCH_UP_S else end
        if result == "timeout":
            self._timed_out(
                f"execute_model step {self.steps}: TP rank 1 did not answer within "
                f"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS={timeout:g} (frozen or unreachable)"
            )
            return None
        if self.peer_lost is None:
            self._sleep(0.01)  # the socket closed; serve.py's lose_peer is on its way
        return None

    def _drop_cancelled(self) -> None:
        now = self._clock()
        for r in [r for r in self.running if r.cancelled]:
            self._finish(r, "abort", now)
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            r.finish_reason = "abort"
            r.events.put(("finish", "abort"))

    def _publish_gauges(self) -> None:
        self.m.running.set(len(self.running))
        self.m.waiting.set(len(self.waiting) + len(self._arrivals))
        self.m.kv_usage.set(min(self._kv_used() / max(self.cfg.kv_capacity_tokens, 1), 1.0))

    # -- step results ------------------------------------------------------------------------
    def _apply(self, decodes: list[Request], chunks: list[tuple[Request, int]], end: float) -> None:
        end_ns = int(end * 1e9)
        for r, n in chunks:
            r.computed += n
            if r.computed >= r.prompt_len and r.first_token_ns is None:
                self.prefix.insert(r.hashes)
                self.m.prompt_tokens.inc(r.prompt_len)
                r.first_token_ns = end_ns
                self.m.ttft.observe((end_ns - r.received_ns) / 1e9)
                self._emit(r, 1, end)
        for r in decodes:
            if r.finish_reason is not None:
                continue
            drawn = r.drawer.draw()
            # Counted as sampled, before _emit cuts the output at max_tokens/EOS (vLLM does the
            # same: the spec-decode stats come from the sampled ids, the trim comes after).
            r.verify_steps += 1
            r.accepted += drawn
            r.draft_tokens += self.cfg.gamma
            if not r.spec_hist:
                r.spec_hist = [0] * (self.cfg.gamma + 1)
            r.spec_hist[drawn] += 1
            r.spec_steps.append(drawn)
            self.m.drafts.inc()
            self.m.draft_tokens.inc(self.cfg.gamma)
            self.m.accepted.inc(drawn)
            for k in range(drawn):
                self.m.accepted_pos[k].inc()
            self._emit(r, 1 + drawn, end)
        for r in list(self.running):
            if r.foreign_until is not None and end >= r.foreign_until and r.finish_reason is None:
                self._finish(r, "stop", end)

    def _emit(self, r: Request, n: int, end: float) -> int:
        """Emit up to n tokens (length and stop strings cut it short); returns the count.

        Length/EOS cut before anything is counted (vLLM's scheduler check_stop); a stop string
        cuts after `vllm:generation_tokens` counted the whole step (vLLM's output processor
        updates its stats before _trim_surplus_tokens), so usage can be below the counter.
        """
        n = min(n, r.target_len - r.generated)
        sampled = n
        parts: list[str] = []
        reason = None
        for i in range(n):
            idx = r.generated + i
            parts.append(piece(r.out_key, idx, r.canned, r.think_len))
            if r.stop:
                tail = r.text_tail + "".join(parts)
                hit = [tail.index(s) for s in r.stop if s and s in tail]
                if hit:
                    drop = len(tail) - min(hit)  # characters from the stop string on
                    n, reason = i + 1, "stop"
                    joined = "".join(parts)
                    text = joined[: max(len(joined) - drop, 0)]
                    break
        else:
            text = "".join(parts)
        if r.stop:
            r.text_tail = (r.text_tail + text)[-256:]
        r.generated += n
        self.m.generation_tokens.inc(sampled)
        if r.generated > n:  # not the first output: an inter-token gap
            self.m.itl.observe(max(end - r.last_emit, 0.0))
        r.last_emit = end
        if reason is None and r.generated >= r.target_len:
            reason = "length" if r.generated >= r.max_tokens else "stop"
        # (kind, text, tokens, each token's piece: logprobs name them, whether the finish
        # follows: vLLM sends a request's last tokens and its finish_reason in one output)
        r.events.put(("tokens", text, n, parts, reason is not None))
        if reason:
            self._finish(r, reason, end)
        return n

    def _finish(self, r: Request, reason: str, end: float) -> None:
        r.finish_reason = reason
        r.finish_ns = int(end * 1e9)
        if r in self.running:
            self.running.remove(r)
        if reason != "abort":
            self.m.e2e.observe((r.finish_ns - r.received_ns) / 1e9)
            self.m.finished(reason)
        r.events.put(("finish", reason))

    def _timed_out(self, why: str) -> None:
        """A step past VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: vLLM's lines for it, every request
        in flight gets the 500, and the server shuts down cleanly (exit 0), as measured."""
        peerloss.step_timed_out()
        self.clean_shutdown = True
        self._fail(vllm_log.ENGINE_DEAD, why)

    def _die(self, why: str, exc_line: str) -> None:
        """The engine core's death as vLLM logs it (vllm/v1/engine/core.py: the fatal-error
        line, then the traceback, whose last line is ``exc_line``); ``why`` is what the
        requests in flight are told."""
        vllm_log.emit("EngineCore", "engine_fatal")
        print(exc_line, file=sys.stderr, flush=True)
        self._fail(f"engine dead: {why}", why)

    def _fail(self, message: str, why: str | None = None) -> None:
        """Dead: every request in flight is told ``message`` (its HTTP 500 body)."""
        self.dead = why or message
        with self._cond:
            for r in list(self.running) + list(self.waiting) + list(self._arrivals):
                r.events.put(("error", message))
        self.on_death(self.dead)
