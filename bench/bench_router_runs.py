"""The measurements of bench/bench_router.py: local routers, the pair map, and the waves.

Outside the engine: when the pairs are simulators, each answer's X-Request-Id finds the
pair's own record of that request (GET /twin/requests: when it was received and when its
first token and its end were produced, on the same monotonic clock as ours). Client time
minus engine time is what the HTTP path costs, with or without the router; the difference
of the two is the router's own added time, free of the batch-to-batch jitter of the
engine's scheduling (which moves a request's TTFT by a whole step).

Routers are started here with exactly the command line the fleet deploys
(pairctl.fleet.router.router_args, default tuning), only bound to 127.0.0.1: one with
`consistent_hash` (affinity on X-Session-ID) and one with `round_robin`. Which pair a
session lands on is read from the pairs' own /metrics (the pair whose prompt-token counter
moved), so the "direct" baseline sends each conversation to the very pair the router chose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.benchlib import promm, prompts
from bench.benchlib.runner import CHAT_PATH, run_threads
from bench.benchlib.stats import request_metrics
from bench.benchlib.stream import open_connection, stream_request
from pairctl.endpoint import Endpoint
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import Tuning


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_router_bin() -> str:
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else "vllm-router"


class LocalRouter:
    """One vllm-router process on loopback with the fleet's settings and `policy`."""

    def __init__(
        self,
        binary: str,
        policy: str,
        pairs: list[Endpoint],
        log_path: Path,
        cpus: str | None = None,
    ) -> None:
        self.policy = policy
        self.port, self.metrics_port = free_port(), free_port()
        self.endpoint = Endpoint.for_host("127.0.0.1", self.port)
        self.url = self.endpoint.base
        workers = [p.base for p in pairs]  # the fleet's router takes worker URLs as text
        pin = ["taskset", "-c", cpus] if cpus else []
        argv = [
            *pin,
            binary,
            *rt.router_args(
                workers,
                policy=policy,
                bind="127.0.0.1",
                port=self.port,
                metrics_bind="127.0.0.1",
                metrics_port=self.metrics_port,
                tuning=Tuning(),
            ),
        ]
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.workers = workers

    def wait_ready(self, timeout_s: float = 60) -> None:
        v = rt.wait_sees(self.url, self.workers, timeout_s, poll_s=0.2)
        if not (v.ready and all(v.workers.get(u) for u in self.workers)):
            raise RuntimeError(
                f"router ({self.policy}) not ready after {timeout_s:.0f}s: {v.detail}; "
                f"log: {self._log.name}"
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def scrape_all(sess: requests.Session, pairs: list[Endpoint]) -> list[promm.Snapshot]:
    return [promm.scrape(sess, p) for p in pairs]


def hits(before: list[promm.Snapshot], after: list[promm.Snapshot]) -> tuple[float, float]:
    """(prefix-cache hit tokens, queried tokens) summed over the pairs between two scrapes."""
    h = q = 0.0
    for b, a in zip(before, after, strict=True):
        d = promm.delta(b, a)
        h += d["prefix_cache_hits"] or 0.0
        q += d["prefix_cache_queries"] or 0.0
    return h, q


def payload(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """Streamed, greedy, fixed-length chat request (vLLM's ignore_eos/min_tokens)."""
    return {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def which_pair(
    sess: requests.Session, pairs: list[Endpoint], router: Endpoint, model: str, sid: str
) -> int:
    """Index of the pair the router sends session `sid` to (its prompt counter moves)."""
    before = scrape_all(sess, pairs)
    msgs = [{"role": "user", "content": f"{prompts.nonce()}Say hello."}]
    r = stream_request(router.with_session(sid), CHAT_PATH, payload(model, msgs, 2))
    if not r.ok:
        raise RuntimeError(f"probe for session {sid} failed: {r.error}")
    after = scrape_all(sess, pairs)
    moved = [
        i
        for i, (b, a) in enumerate(zip(before, after, strict=True))
        if (promm.delta(b, a)["prompt_tokens"] or 0) > 0
    ]
    if len(moved) != 1:
        raise RuntimeError(
            f"cannot tell which pair served session {sid} (counters moved on {moved}): "
            "is someone else using the pairs?"
        )
    return moved[0]


def wave(targets: list[Endpoint], bodies: list[dict], timeout_s: float) -> list[tuple[str, Any]]:
    """One request per target (its X-Session-ID, if any, on it) at once, on connections opened
    beforehand; each carries its own X-Request-Id (vLLM makes it the request id). Returns
    (id, result)."""
    ids = [f"br-{uuid.uuid4().hex}" for _ in targets]
    socks = []
    for ep in targets:
        try:
            socks.append(open_connection(ep, timeout_s))
        except OSError:
            socks.append(None)
    time.sleep(0.02)
    results = run_threads(
        [
            lambda ep=ep, b=b, s=s, i=i: stream_request(
                ep, CHAT_PATH, b, timeout_s=timeout_s, sock=s, headers={"X-Request-Id": i}
            )
            for ep, b, s, i in zip(targets, bodies, socks, ids, strict=True)
        ]
    )
    return list(zip(ids, results, strict=True))


Stamp = tuple[str | None, int | None, int | None, int | None]  # id, request, first, done


def stamps(rid: str, r: Any) -> Stamp:
    """The engine knows the request as chatcmpl-<our X-Request-Id>."""
    return (f"chatcmpl-{rid}", r.t_request_ns, r.t_first_token_ns, r.t_done_ns)


def server_records(sess: requests.Session, pairs: list[Endpoint]) -> dict[str, dict[str, Any]]:
    """The simulator's per-request records of every pair, by request id ({} for real vLLM)."""
    out: dict[str, dict[str, Any]] = {}
    for ep in pairs:
        try:
            r = sess.get(ep.url("/twin/requests"), timeout=30)
        except requests.RequestException:
            continue
        if r.status_code == 200:
            out.update({rec["id"]: rec for rec in r.json()})
    return out


def outside(st: Stamp, recs: dict[str, dict[str, Any]]) -> tuple[float | None, float | None]:
    """(TTFT, end-to-end) minus the engine's own share of them, ms; None without a record."""
    rid, t_req, t_first, t_done = st
    rec = recs.get(rid or "")
    if (
        not rec
        or None in (t_req, t_first, t_done)
        or None
        in (
            rec.get("received_ns"),
            rec.get("first_token_ns"),
            rec.get("finish_ns"),
        )
    ):
        return None, None
    ttft = (t_first - t_req) - (rec["first_token_ns"] - rec["received_ns"])  # type: ignore[operator]
    e2e = (t_done - t_req) - (rec["finish_ns"] - rec["received_ns"])  # type: ignore[operator]
    return ttft / 1e6, e2e / 1e6


@dataclass
class TurnStats:
    """One variant's turn k over every repeat: TTFTs, prompt sizes, prefix-cache tokens."""

    ttft_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    hit_tokens: float = 0.0
    query_tokens: float = 0.0
    errors: list[str] = field(default_factory=list)
    stamps: list[Stamp] = field(default_factory=list)
    outside_ttft_ms: list[float] = field(default_factory=list)

    def settle(self, recs: dict[str, dict[str, Any]]) -> None:
        """Turn the stamps into outside-the-engine TTFTs once the records are fetched."""
        for st in self.stamps:
            ttft, _ = outside(st, recs)
            if ttft is not None:
                self.outside_ttft_ms.append(ttft)
        self.stamps.clear()

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None


def conversations(
    variant: str,
    targets: list[Endpoint],
    model: str,
    pairs: list[Endpoint],
    args: Any,
    seed: int,
    out: dict[int, TurnStats],
) -> None:
    """C conversations in lock-step: turn k of all of them is one wave; history grows."""
    sess = requests.Session()
    n_first = int(args.first_tokens / 1.3)
    n_turn = int(args.turn_tokens / 1.3)
    hist: list[list[dict[str, str]]] = [[] for _ in targets]
    for k in range(args.turns):
        bodies = []
        for i, h in enumerate(hist):
            text = prompts.prose(n_first if k == 0 else n_turn, seed=seed * 10_000 + i * 100 + k)
            tag = prompts.nonce() if k == 0 else ""
            h.append({"role": "user", "content": f"{tag}{text}\n\nWhat stands out?"})
            bodies.append(payload(model, list(h), args.max_tokens))
        before = scrape_all(sess, pairs)
        results = wave(targets, bodies, args.timeout_s)
        after = scrape_all(sess, pairs)
        ts = out.setdefault(k, TurnStats())
        hit, query = hits(before, after)
        ts.hit_tokens += hit
        ts.query_tokens += query
        for h, (rid, r) in zip(hist, results, strict=True):
            m = request_metrics(r)
            if not r.ok or m["ttft_ms"] is None:
                ts.errors.append(f"{variant} turn {k}: {r.error}")
                h.append({"role": "assistant", "content": "OK."})
                continue
            ts.ttft_ms.append(m["ttft_ms"])
            ts.stamps.append(stamps(rid, r))
            ts.prompt_tokens.append(r.prompt_tokens or 0)
            h.append({"role": "assistant", "content": r.content or "OK."})
    recs = server_records(sess, pairs)
    for ts in out.values():
        ts.settle(recs)


@dataclass
class OverheadStats:
    """Short requests to one pair, direct or through the router, at one concurrency."""

    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stamps: list[Stamp] = field(default_factory=list)
    outside_ttft_ms: list[float] = field(default_factory=list)
    outside_e2e_ms: list[float] = field(default_factory=list)

    def settle(self, recs: dict[str, dict[str, Any]]) -> None:
        for st in self.stamps:
            ttft, e2e = outside(st, recs)
            if ttft is not None and e2e is not None:
                self.outside_ttft_ms.append(ttft)
                self.outside_e2e_ms.append(e2e)
        self.stamps.clear()


def overhead(
    target: Endpoint,
    model: str,
    concurrency: int,
    waves: int,
    args: Any,
    out: OverheadStats,
) -> None:
    """`waves` waves of `concurrency` short requests (8 output tokens) to one target."""
    for _ in range(waves):
        bodies = [
            payload(model, [{"role": "user", "content": f"{prompts.nonce()}Count to three."}], 8)
            for _ in range(concurrency)
        ]
        for rid, r in wave([target] * concurrency, bodies, args.timeout_s):
            m = request_metrics(r)
            if not r.ok or m["ttft_ms"] is None or m["e2e_ms"] is None:
                out.errors.append(str(r.error))
                continue
            out.ttft_ms.append(m["ttft_ms"])
            out.e2e_ms.append(m["e2e_ms"])
            out.stamps.append(stamps(rid, r))
