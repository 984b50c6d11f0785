"""One benchmark run against an endpoint: the run protocol, streamed waves, guarded points.

Run protocol (as vLLM's benchmark does it): wait until the endpoint answers /v1/models, send one
small streamed request that must succeed, run --warmups unmeasured requests, then the measured,
guarded waves. Points go to `Bench.results`; `Bench.finish` writes the JSON and gives the exit code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.benchlib import EXIT_CONTAMINATED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, endpoint
from bench.benchlib.cli import endpoint_of, log
from bench.benchlib.guard import GuardConfig, GuardedPoint, GuardError, InFlightTracker, run_guarded
from bench.benchlib.kstamp import clock_offset_cached
from bench.benchlib.results import Results
from bench.benchlib.stream import StreamResult, open_connection, stream_request
from pairctl.endpoint import redacted_argv

CHAT_PATH = "/v1/chat/completions"


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class Bench:
    """One benchmark run: endpoint facts, guarded measurements, and the result document."""

    def __init__(self, script: str, args: argparse.Namespace) -> None:
        self.script, self.args = script, args
        # --url's Endpoint, with the bearer token and X-Session-ID (--session-id: a router
        # keeps the run on one pair) that every request, streamed or not, carries.
        self.endpoint = endpoint_of(args)
        self.session = self.endpoint.session(trust_env=True)  # a user's proxy settings hold
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.models: Any = None
        self.model: str = args.model or ""
        self.identity: endpoint.Identity | None = None
        self.guard = GuardConfig(
            enabled=not args.no_guard,
            retries=max(0, args.retries),
            interval_s=args.guard_interval_ms / 1000,
            grace_s=args.guard_grace_ms / 1000,
            backoff_s=args.backoff_s,
            abort_early=not args.no_abort,
        )
        self.results = Results()
        # A thread woken by recv() must get the GIL before it can take its timestamp; a short
        # switch interval bounds that wait when another thread (sampler, parser) is running.
        sys.setswitchinterval(0.0002)

    # ---- run protocol -------------------------------------------------------------------
    def wait_ready(self) -> None:
        """Wait for /v1/models (progress on stderr); one line naming the URL if it never comes."""
        try:
            self.identity = endpoint.wait_ready(
                self.session, self.endpoint, self.args.ready_timeout_s, log
            )
        except endpoint.NotReady as e:
            raise SystemExit(self.fail(str(e))) from None
        self.models = self.identity.models
        if not self.model:
            self.model = self.identity.model
        banner = self.identity.banner()
        if banner:
            log(banner)

    def chat_payload(
        self, messages: list[dict[str, Any]], max_tokens: int, fixed_length: bool = True
    ) -> dict[str, Any]:
        """Streamed, greedy chat request; fixed_length asks vLLM to ignore EOS (exact output)."""
        p: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        if fixed_length:
            p["ignore_eos"] = True
            p["min_tokens"] = max_tokens
        if self.args.chat_template_kwargs is not None:
            p["chat_template_kwargs"] = self.args.chat_template_kwargs
        return p

    def stream(self, payload: dict[str, Any], tracker: InFlightTracker | None) -> StreamResult:
        """One request on a connection opened (and accepted by the server) beforehand."""
        return self.stream_wave([payload], tracker)[0]

    def stream_wave(
        self, payloads: Sequence[dict[str, Any]], tracker: InFlightTracker | None
    ) -> list[StreamResult]:
        """Send all payloads at once, one thread each, on pre-opened connections.

        Connecting first and letting the server accept (settle) keeps its connection set-up
        out of TTFT; the threads then start together at a barrier and block in recv().
        """
        socks: list[Any] = []
        for _ in payloads:
            try:
                socks.append(open_connection(self.endpoint, self.args.timeout_s))
            except OSError:
                socks.append(None)  # stream_request will connect itself and report the error
        time.sleep(self.args.settle_ms / 1000)
        clock_offset_cached(0)  # fresh, measured here rather than under 64 contending threads
        return run_threads(
            [
                lambda p=p, s=s: stream_request(
                    self.endpoint,
                    CHAT_PATH,
                    p,
                    timeout_s=self.args.timeout_s,
                    tracker=tracker,
                    sock=s,
                )
                for p, s in zip(payloads, socks, strict=True)
            ]
        )

    def prepare(self, check: Callable[[], str | None] | None = None) -> None:
        """Readiness, one test request that must succeed, then warmups.

        ``check`` runs once the server's /v1/models is known and before any other request: a
        message from it refuses the run (exit 2), e.g. a depth above the server's
        max_model_len, instead of building a prompt for a minute to get an HTTP 400."""
        self.wait_ready()
        why = check() if check is not None else None
        if why:
            log(f"refused: {why}")
            raise SystemExit(EXIT_USAGE)
        msgs = [{"role": "user", "content": "Say hello."}]
        r = self.stream(self.chat_payload(msgs, 8), None)
        if not r.ok:
            raise SystemExit(self.fail(f"test request failed: {r.error}"))
        for _ in range(self.args.warmups):
            self.stream(self.chat_payload(msgs, 32), None)

    def guarded(self, label: str, wave: Callable[[InFlightTracker], Any]) -> GuardedPoint:
        try:
            return run_guarded(self.endpoint, wave, self.guard, log=log, label=label)
        except GuardError as e:
            raise SystemExit(self.fail(str(e))) from e

    @property
    def max_model_len(self) -> int | None:
        """The served model's max_model_len as its /v1/models lists it (vLLM's ModelCard)."""
        data = self.models.get("data") if isinstance(self.models, dict) else None
        for card in data or []:
            if isinstance(card, dict) and card.get("id") == self.model:
                v = card.get("max_model_len")
                return v if isinstance(v, int) and v > 0 else None
        return None

    def run(self, body: Callable[[], int]) -> int:
        """``body`` (the script's protocol and report) with Ctrl-C answered: one line, the
        points measured so far written to --json (marked interrupted), exit 130."""
        try:
            return body()
        except KeyboardInterrupt:
            self.results.exit_code = EXIT_INTERRUPTED
            self.results.exit_reasons.append("interrupted (Ctrl-C)")
            self.write_json({})
            where = f"; {len(self.results.points)} point(s) written to {self.args.json_path}"
            log("interrupted" + (where if self.args.json_path else ""))
            return EXIT_INTERRUPTED

    def fail(self, why: str) -> int:
        """Stop the run: record why, write what there is, return exit code 1."""
        self.results.fail(why)
        self.write_json({})
        return EXIT_ERROR

    # ---- results ------------------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        """What the result JSON says about the run itself (every flag but the API key)."""
        return {
            "script": self.script,
            "command_line": redacted_argv([sys.executable, *sys.argv]),  # no --api-key value
            "git_sha": git_sha(),
            "url": self.endpoint.base,
            "model": self.model,
            "models": self.models,
            "started_at": self.started_at,
            "ended_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "params": {k: v for k, v in vars(self.args).items() if k != "api_key"},
            "guard": vars(self.guard),
            "endpoint": None if self.identity is None else self.identity.to_json(),
        }

    def write_json(self, summary: dict[str, Any]) -> None:
        if not self.args.json_path:
            return
        doc = self.results.document(self.facts(), summary)
        try:
            Path(self.args.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        except OSError as e:  # checked writable at start; the directory can still go away
            self.results.fail(f"cannot write --json {self.args.json_path}: {e.strerror or e}")

    def finish(self, summary: dict[str, Any]) -> int:
        """Write the JSON and return the exit code the recorded points add up to."""
        if self.guard.enabled:
            for line in self.results.conservation_lines():
                print(line)
        else:
            print("guard disabled (--no-guard): no sampling, no token conservation checked this")
        banner = self.identity.banner() if self.identity is not None else None
        if banner:
            print(banner)
        self.write_json(summary)
        if self.results.exit_code == EXIT_CONTAMINATED:
            log("refused: some points had no clean wave (exit 3); see reasons above")
        return self.results.exit_code

    def progress(self, total: int, desc: str):
        """A tqdm bar on stderr (a no-op object when disabled or tqdm is missing)."""
        if self.args.no_progress or not sys.stderr.isatty():
            return _NoBar()
        try:
            from tqdm import tqdm
        except ImportError:
            return _NoBar()
        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def run_threads(fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Start every fn at (nearly) the same instant in its own thread; return results in order.

    Threads block in recv() so an arriving chunk is stamped by a thread that was waiting for it.
    """
    out: list[Any] = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def runner(i: int) -> None:
        barrier.wait()
        out[i] = fns[i]()

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
