"""`status` as data (pairctl/status/pair.py) and its views (pairctl/status/view.py): the verdict
and exit code for each kind of pair, docker's timestamps, the text, JSON and rich views,
and the --watch loop."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from rich.console import Console

from pairctl.status import pair as st
from pairctl.status import view
from pairctl.status.metrics import ServingFigures


def rank(r: int, state: str = "running", reachable: bool = True) -> st.RankStatus:
    return st.RankStatus(
        rank=r,
        role="head" if r == 0 else "worker",
        addr=f"10.0.0.{r + 1}",
        reachable=reachable,
        error="" if reachable else "ssh: connect to host 10.0.0.2 port 22: No route to host",
        container=f"dsv4-pair-a-rank{r}",
        state=state if reachable else st.UNKNOWN,
        started_at="2026-11-30T10:00:00Z" if state == "running" else None,
        uptime_s=3725.0 if state == "running" else None,
        others=[],
        plan="abc",
    )


def endpoint(healthy: bool = True) -> st.EndpointStatus:
    return st.EndpointStatus(
        "http://10.0.0.1:8000/v1",
        healthy,
        "ok" if healthy else "connection failed (nothing listening, or host down)",
        ["dsv4"] if healthy else [],
        False,
    )


FIGURES = ServingFigures(
    running=2,
    waiting=1,
    kv_cache_usage=0.125,
    decode_tok_s=54.7,
    ttft_p50_s=0.41,
    ttft_p95_s=0.92,
    prefix_cache_hit_rate=0.375,
    acceptance_per_pos=[0.85, 0.71, 0.6, 0.5, 0.41],
    mean_acceptance_length=4.07,
    window="interval",
    window_s=1.0,
)


@pytest.mark.parametrize(
    ("ranks", "healthy", "want"),
    [
        ((rank(0), rank(1)), True, st.HEALTHY),
        ((rank(0), rank(1, st.MISSING)), True, st.DEGRADED),  # rank 1 gone, head answers
        ((rank(0), rank(1, reachable=False)), True, st.DEGRADED),  # cannot ask rank 1
        ((rank(0), rank(1)), False, st.DEGRADED),  # booting or hung
        ((rank(0, "exited"), rank(1)), False, st.DEGRADED),  # a survivor holds memory
        ((rank(0, st.MISSING), rank(1, st.MISSING)), False, st.DOWN),
        ((rank(0, "exited"), rank(1, reachable=False)), False, st.DOWN),
    ],
)
def test_verdict(ranks, healthy: bool, want: str) -> None:
    name, reasons = st.verdict(list(ranks), endpoint(healthy))
    assert name == want
    assert (reasons == []) == (want == st.HEALTHY)
    assert st.EXIT_CODES[name] == {"healthy": 0, "degraded": 7, "down": 8}[name]


def test_docker_times() -> None:
    t = st.parse_docker_time("2026-11-30T10:00:00.123456789Z")
    assert t == datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC)
    assert st.parse_docker_time("2026-11-30T12:00:00+02:00") == datetime(
        2026, 11, 30, 10, 0, tzinfo=UTC
    )
    assert st.parse_docker_time("0001-01-01T00:00:00Z") is None  # never started
    assert st.parse_docker_time("yesterday") is None


def status_of(ranks, healthy=True, serving=FIGURES) -> st.PairStatus:
    name, reasons = st.verdict(list(ranks), endpoint(healthy))
    return st.PairStatus(
        schema_version=st.SCHEMA_VERSION,
        pair_id="pair-a",
        verdict=name,
        exit_code=st.EXIT_CODES[name],
        reasons=reasons,
        ranks=list(ranks),
        endpoint=endpoint(healthy),
        serving=serving if healthy else None,
        metrics_error="",
        running_plan="abc",
        current_plan="def",
        checked_at="2026-11-30T11:02:05Z",
    )


def test_text_view_shows_every_figure() -> None:
    text = view.render_text(status_of((rank(0), rank(1))))
    for frag in (
        "pair pair-a: HEALTHY",
        "dsv4-pair-a-rank1 running, up 1h02m",
        "healthy, model dsv4",
        "running 2, waiting 1",
        "54.7 tok/s over the last 1.0 s",
        "p50 0.410 s, p95 0.920 s",
        "KV cache: 12.5% used",
        "37.5% of queried prompt tokens hit",
        "0.85 0.71 0.60 0.50 0.41",
        "mean acceptance length 4.07",
        "running plan abc differs from current config def",
    ):
        assert frag in text, (frag, text)
    down = view.render_text(status_of((rank(0, st.MISSING), rank(1, st.MISSING)), False))
    assert "DOWN" in down and "why down: endpoint" in down and "no container" in down


def test_json_view_round_trips_the_dataclass() -> None:
    s = status_of((rank(0), rank(1, reachable=False)))
    doc = json.loads(view.render_json(s))
    assert doc["verdict"] == "degraded" and doc["exit_code"] == 7
    assert doc["ranks"][1]["reachable"] is False and "No route" in doc["ranks"][1]["error"]
    assert doc["serving"]["acceptance_per_pos"] == FIGURES.acceptance_per_pos
    assert set(doc) == {f for f in st.PairStatus.__dataclass_fields__}


def test_rich_view_renders_the_figures() -> None:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(
        view.render_rich(status_of((rank(0), rank(1))))
    )
    text = out.getvalue()
    for frag in ("HEALTHY", "dsv4-pair-a-rank0", "1h02m", "54.7", "0.410 s / 0.920 s", "4.07"):
        assert frag in text, (frag, text)


def test_watch_loop_passes_the_previous_sample_and_returns_the_last_code() -> None:
    seen: list[object] = []
    readings = iter(
        [
            status_of((rank(0), rank(1))),
            status_of((rank(0), rank(1, st.MISSING))),
        ]
    )

    def collect(prev):
        seen.append(prev)
        return next(readings), f"sample{len(seen)}"

    out = io.StringIO()
    code = view.watch(collect, interval_s=0.01, count=2, as_json=True, out=out)
    assert code == 7 and seen == [None, "sample1"]
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["verdict"] for x in lines] == ["healthy", "degraded"]
    out = io.StringIO()
    readings = iter([status_of((rank(0), rank(1)))])
    assert view.watch(collect, 0.01, count=1, out=out) == 0
    assert "HEALTHY" in out.getvalue()


def test_uptime_formatting() -> None:
    assert [view.fmt_duration(s) for s in (None, 5, 65, 3725, 90000)] == [
        "-",
        "5s",
        "1m05s",
        "1h02m",
        "1d01h",
    ]


def test_serving_lines_say_when_a_rate_needs_an_interval() -> None:
    lifetime = replace(FIGURES, decode_tok_s=None, window="lifetime", window_s=None)
    lines = view.serving_lines(lifetime)
    assert any("needs two scrapes" in ln for ln in lines)
