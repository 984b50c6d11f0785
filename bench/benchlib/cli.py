"""What every bench script shares: flags, the run protocol, and the result JSON/table/plot.

Run protocol (as vLLM's benchmark does it): wait until the endpoint answers /v1/models, send one
small streamed request that must succeed, run --warmups unmeasured requests, then the measured,
guarded waves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from bench.benchlib import EXIT_CONTAMINATED, EXIT_ERROR, EXIT_OK, SCHEMA_VERSION
from bench.benchlib.guard import GuardConfig, GuardedPoint, GuardError, InFlightTracker, run_guarded
from bench.benchlib.stream import StreamResult, clock_offset_cached, open_connection, stream_request

CHAT_PATH = "/v1/chat/completions"


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Exit codes: 0 ok; 1 endpoint/request failure; 2 usage; 3 refused: a point "
        "stayed contaminated by foreign traffic after every retry (no number printed for it).",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="OpenAI-compatible endpoint")
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token")
    p.add_argument("--runs", type=int, default=1, help="measured repeats per point")
    p.add_argument("--warmups", type=int, default=1, help="unmeasured requests before measuring")
    p.add_argument("--retries", type=int, default=3, help="retries of a contaminated wave")
    p.add_argument("--backoff-s", type=float, default=2.0, help="first backoff; doubles per retry")
    p.add_argument("--guard-interval-ms", type=float, default=150, help="sampling period")
    p.add_argument(
        "--guard-grace-ms",
        type=float,
        default=500,
        help="how long a finished request of ours still counts as ours (server gauge lag)",
    )
    p.add_argument("--no-guard", action="store_true", help="measure unguarded (not recommended)")
    p.add_argument(
        "--no-abort",
        action="store_true",
        help="let a contaminated wave run to its end instead of cutting it short",
    )
    p.add_argument("--timeout-s", type=float, default=900, help="per-request socket timeout")
    p.add_argument(
        "--settle-ms",
        type=float,
        default=20,
        help="pause between opening connections and sending (server accepts them)",
    )
    p.add_argument("--ready-timeout-s", type=float, default=60, help="wait for /v1/models")
    p.add_argument("--seed", type=int, default=0, help="prompt text seed")
    p.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        default=None,
        help="JSON passed as chat_template_kwargs, e.g. '{\"thinking\": false}'",
    )
    p.add_argument("--json", dest="json_path", default=None, help="write results JSON here")
    p.add_argument("--plot", default=None, help="write a PNG plot here (matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def log(msg: str) -> None:
    """Progress and guard messages go to stderr so stdout stays the table."""
    print(msg, file=sys.stderr, flush=True)


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
        self.url = args.url.rstrip("/")
        self.session = requests.Session()
        if args.api_key:
            self.session.headers["Authorization"] = f"Bearer {args.api_key}"
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.models: Any = None
        self.model: str = args.model or ""
        self.guard = GuardConfig(
            enabled=not args.no_guard,
            retries=max(0, args.retries),
            interval_s=args.guard_interval_ms / 1000,
            grace_s=args.guard_grace_ms / 1000,
            backoff_s=args.backoff_s,
            abort_early=not args.no_abort,
        )
        self.points: list[dict[str, Any]] = []
        self.exit_code = EXIT_OK
        # A thread woken by recv() must get the GIL before it can take its timestamp; a short
        # switch interval bounds that wait when another thread (sampler, parser) is running.
        sys.setswitchinterval(0.0002)
        self.exit_reasons: list[str] = []

    # ---- run protocol -------------------------------------------------------------------
    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.args.ready_timeout_s
        last = ""
        while True:
            try:
                r = self.session.get(self.url + "/v1/models", timeout=5)
                if r.status_code == 200:
                    self.models = r.json()
                    if not self.model:
                        self.model = self.models["data"][0]["id"]
                    return
                last = f"HTTP {r.status_code}"
            except (requests.RequestException, ValueError, KeyError, IndexError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise SystemExit(self.fail(f"endpoint not ready after timeout: {last}"))
            time.sleep(1)

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
                socks.append(open_connection(self.url, self.args.timeout_s))
            except OSError:
                socks.append(None)  # stream_request will connect itself and report the error
        time.sleep(self.args.settle_ms / 1000)
        clock_offset_cached(0)  # fresh, measured here rather than under 64 contending threads
        return run_threads(
            [
                lambda p=p, s=s: stream_request(
                    self.url,
                    CHAT_PATH,
                    p,
                    timeout_s=self.args.timeout_s,
                    api_key=self.args.api_key,
                    tracker=tracker,
                    sock=s,
                )
                for p, s in zip(payloads, socks, strict=True)
            ]
        )

    def prepare(self) -> None:
        """Readiness, one test request that must succeed, then warmups."""
        self.wait_ready()
        msgs = [{"role": "user", "content": "Say hello."}]
        r = self.stream(self.chat_payload(msgs, 8), None)
        if not r.ok:
            raise SystemExit(self.fail(f"test request failed: {r.error}"))
        for _ in range(self.args.warmups):
            self.stream(self.chat_payload(msgs, 32), None)

    def guarded(self, label: str, wave: Callable[[InFlightTracker], Any]) -> GuardedPoint:
        try:
            return run_guarded(self.url, wave, self.guard, log=log, label=label)
        except GuardError as e:
            raise SystemExit(self.fail(str(e))) from e

    def fail(self, why: str) -> int:
        log(f"error: {why}")
        self.exit_code = EXIT_ERROR
        self.exit_reasons.append(why)
        self.write_json({})
        return EXIT_ERROR

    # ---- results ------------------------------------------------------------------------
    def add_point(
        self, label: str, gp: GuardedPoint, metrics: dict[str, Any] | None, **extra: Any
    ) -> dict[str, Any]:
        """Record one point; a contaminated or failed point carries no numbers, only why."""
        status = gp.status
        if status == "ok" and metrics is not None and metrics.get("error"):
            status = "error"
        point = {
            "label": label,
            "status": status,
            "retries": gp.retries,
            "reason": gp.reason if status != "error" else metrics["error"],
            **extra,
            "metrics": metrics if status == "ok" else None,
            "server_deltas": gp.deltas if status == "ok" else None,
            "attempts": [a.to_json() for a in gp.attempts],
        }
        if status == "contaminated":
            self.exit_reasons.append(f"{label}: {gp.reason}")
            if self.exit_code == EXIT_OK:
                self.exit_code = EXIT_CONTAMINATED
            log(f"{label}: NO NUMBER — {gp.reason}")
        elif status == "error":
            self.exit_reasons.append(f"{label}: {point['reason']}")
            self.exit_code = EXIT_ERROR
            log(f"{label}: ERROR — {point['reason']}")
        self.points.append(point)
        return point

    def write_json(self, summary: dict[str, Any]) -> None:
        if not self.args.json_path:
            return
        doc = {
            "schema_version": SCHEMA_VERSION,
            "script": self.script,
            "command_line": [sys.executable, *sys.argv],
            "git_sha": git_sha(),
            "url": self.url,
            "model": self.model,
            "models": self.models,
            "started_at": self.started_at,
            "ended_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "params": {k: v for k, v in vars(self.args).items() if k != "api_key"},
            "guard": vars(self.guard),
            "exit_code": self.exit_code,
            "exit_reasons": self.exit_reasons,
            "summary": summary,
            "points": self.points,
        }
        Path(self.args.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")

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


def fmt(v: Any, nd: int = 1) -> str:
    """Table cell: '—' for missing (never 0), fixed decimals for floats."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(
    path: str,
    x: Sequence[Any],
    panels: Sequence[tuple[str, dict[str, Sequence[float | None]]]],
    xlabel: str,
    title: str,
    logx: bool = False,
) -> None:
    """One line chart per (ylabel, {series: ys}) panel, stacked; None points are gaps.

    matplotlib's Agg backend, so no display is needed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), sharex=True)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for name, ys in series.items():
            ax.plot(x, [float("nan") if y is None else y for y in ys], marker="o", label=name)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend()
    axes[-1].set_xlabel(xlabel)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def finish(bench: Bench, summary: dict[str, Any]) -> int:
    bench.write_json(summary)
    if bench.exit_code == EXIT_CONTAMINATED:
        log("refused: some points had no clean wave (exit 3); see reasons above")
    return bench.exit_code
