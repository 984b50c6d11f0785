"""How ``status`` shows a ``PairStatus``: plain text, JSON, and the live ``--watch`` view.

The live view is drawn with ``rich`` (a table redrawn in place every interval); the plain
text is what scripts and logs get. Both read only the ``PairStatus`` data.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pairctl.contracts import EXIT_INTERRUPTED
from pairctl.sentinel import render as sentinel_render
from pairctl.status.metrics import MetricsSample, ServingFigures
from pairctl.status.pair import HEALTHY, PairStatus, RankStatus

VERDICT_COLOUR = {
    "healthy": "bold green",
    "degraded": "bold yellow",
    "down": "bold red",
    "unauthorized": "bold magenta",
}
MEMORY_STYLE = {"warning": "yellow", "critical": "bold red"}


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _num(v: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    return "-" if v is None else fmt.format(v) + unit


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _window(f: ServingFigures) -> str:
    return f"last {f.window_s:.1f} s" if f.window == "interval" else "since start"


def serving_lines(f: ServingFigures) -> list[str]:
    """The serving figures as text lines (shared by the text and live views)."""
    acc = " ".join(f"{a:.2f}" for a in f.acceptance_per_pos) or "-"
    decode = (
        f"{f.decode_tok_s:.1f} tok/s over the {_window(f)}"
        if f.decode_tok_s is not None
        else "- (needs two scrapes: --interval > 0)"
    )
    return [
        f"requests: running {_num(f.running, '{:g}')}, waiting {_num(f.waiting, '{:g}')}",
        f"decode: {decode}",
        f"TTFT: p50 {_num(f.ttft_p50_s, '{:.3f}', ' s')}, p95 {_num(f.ttft_p95_s, '{:.3f}', ' s')}",
        f"KV cache: {_pct(f.kv_cache_usage)} used; prefix cache: "
        f"{_pct(f.prefix_cache_hit_rate)} of queried prompt tokens hit",
        f"DSpark acceptance per draft position: {acc}; mean acceptance length "
        f"{_num(f.mean_acceptance_length, '{:.2f}')}",
    ]


def _rank_line(r: RankStatus) -> str:
    head = f"rank {r.rank} ({r.role}) {r.addr}: "
    if not r.reachable:
        return head + f"cannot ask docker: {r.error}"
    if r.state == "missing":
        line = head + f"no container ({r.container})"
    else:
        up = f", up {fmt_duration(r.uptime_s)}" if r.uptime_s is not None else ""
        line = head + f"{r.container} {r.state}{up}"
    if r.others:
        line += f"; also: {', '.join(r.others)}"
    return line


def render_text(st: PairStatus) -> str:
    lines = [f"pair {st.pair_id}: {st.verdict.upper()} (checked {st.checked_at})"]
    lines += ["  " + _rank_line(r) for r in st.ranks]
    ep = st.endpoint
    sim = " [SIMULATOR]" if ep.simulator else ""
    if ep.healthy:
        lines.append(f"  endpoint {ep.url}: healthy{sim}, model {', '.join(ep.models)}")
    else:
        lines.append(f"  endpoint {ep.url}: not healthy ({ep.detail})")
    if st.serving is not None:
        lines += ["  " + x for x in serving_lines(st.serving)]
    elif st.metrics_error:
        lines.append(f"  metrics: {st.metrics_error}")
    lines += [f"  memory: {m.line()}" for m in st.memory]
    lines += [f"    action: {m.action}" for m in st.memory if m.action]
    lines += ["  " + x for x in sentinel_render.lines(st.acceptance, st.watch_record, st.events)]
    if st.verdict != HEALTHY:
        lines += [f"  why {st.verdict}: {r}" for r in st.reasons]
    if st.running_plan and st.current_plan and st.running_plan != st.current_plan:
        lines.append(
            f"  note: running plan {st.running_plan} differs from current config "
            f"{st.current_plan} (down + up to apply)"
        )
    return "\n".join(lines) + "\n"


def render_json(st: PairStatus) -> str:
    return json.dumps(st.to_dict(), indent=None, sort_keys=False)


def render_rich(st: PairStatus) -> Group:
    """The live view: verdict, a table of ranks, the endpoint, a table of serving figures."""
    title = Text.assemble(
        (f"pair {st.pair_id}  ", "bold"),
        (st.verdict.upper(), VERDICT_COLOUR[st.verdict]),
        f"  {st.checked_at}",
    )
    ranks = Table(box=None, pad_edge=False)
    for col in ("rank", "node", "container", "state", "uptime"):
        ranks.add_column(col)
    for r in st.ranks:
        state = r.state if r.reachable else f"unknown: {r.error[:60]}"
        ranks.add_row(f"{r.rank} {r.role}", r.addr, r.container, state, fmt_duration(r.uptime_s))
    ep = st.endpoint
    sim = " [SIMULATOR]" if ep.simulator else ""
    ep_text = (
        f"endpoint {ep.url}: healthy{sim}, model {', '.join(ep.models)}"
        if ep.healthy
        else f"endpoint {ep.url}: not healthy ({ep.detail})"
    )
    parts: list[RenderableType] = [title, ranks, Text(ep_text)]
    f = st.serving
    if f is not None:
        fig = Table(box=None, pad_edge=False, show_header=False)
        fig.add_column("figure")
        fig.add_column("value")
        fig.add_row("running / waiting", f"{_num(f.running, '{:g}')} / {_num(f.waiting, '{:g}')}")
        fig.add_row(f"decode tok/s ({_window(f)})", _num(f.decode_tok_s))
        fig.add_row(
            "TTFT p50 / p95",
            f"{_num(f.ttft_p50_s, '{:.3f}', ' s')} / {_num(f.ttft_p95_s, '{:.3f}', ' s')}",
        )
        fig.add_row("KV cache used", _pct(f.kv_cache_usage))
        fig.add_row("prefix cache hit rate", _pct(f.prefix_cache_hit_rate))
        fig.add_row(
            "acceptance per position",
            " ".join(f"{a:.2f}" for a in f.acceptance_per_pos) or "-",
        )
        fig.add_row("mean acceptance length", _num(f.mean_acceptance_length, "{:.2f}"))
        parts.append(fig)
    elif st.metrics_error:
        parts.append(Text(f"metrics: {st.metrics_error}"))
    parts += [Text(f"memory: {m.line()}", style=MEMORY_STYLE.get(m.band, "")) for m in st.memory]
    parts += [
        Text(x, style="bold red" if x.startswith("EVENT") else "")
        for x in sentinel_render.lines(st.acceptance, st.watch_record, st.events)
    ]
    parts += [Text(f"why {st.verdict}: {r}", style="yellow") for r in st.reasons]
    return Group(*parts)


Collect = Callable[[MetricsSample | None], tuple[PairStatus, MetricsSample | None]]


def watch(
    collect: Collect,
    interval_s: float,
    count: int | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Redraw the status every ``interval_s`` until Ctrl-C (or ``count`` readings).

    Rates cover the time between two readings. With ``as_json`` one JSON document per line
    instead. Returns the last reading's exit code, or 130 (interrupted) on Ctrl-C, after
    one line on stderr.
    """
    out = out or sys.stdout
    prev: MetricsSample | None = None
    code, n, interrupted = 0, 0, False
    console = Console(file=out)
    live = None if as_json else Live(console=console, auto_refresh=False, transient=False)
    try:
        if live:
            live.start()
        while count is None or n < count:
            st, prev = collect(prev)
            code, n = st.exit_code, n + 1
            if live:
                live.update(render_rich(st), refresh=True)
            else:
                out.write(render_json(st) + "\n")
                out.flush()
            if count is None or n < count:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if live:
            live.stop()
    if interrupted:
        print("status: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code
