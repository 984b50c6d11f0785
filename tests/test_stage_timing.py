"""The front-end stage benchmark's measurement: the timing plugin and the TTFT split.

The split (bench/benchlib/stages.py) on a synthetic timeline: its stages add up to the
client's TTFT exactly, nested calls are not counted twice, a foreign request in the window
is reported, a missing anchor is named. The plugin module (stage_timing.py): its wrappers
time sync and async calls and read request ids, the ASGI middleware stamps arrival, body
end and first bytes, and every target resolves in real vLLM 0.33 (needs_vllm) and in the
CPU engine's 0.32 (needs_engine).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from dsv4_flash_overlays import stage_targets, stage_timing

from bench.benchlib import stages
from tests.conftest import ENGINE_PY, NO_CUDA_JIT, REPO
from tests.support import warm

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

MS = 1_000_000


def _ev(stage: str, t0: float, t1: float, rid: str | None = None, pid: int = 1, **extra):
    return stages.Event(stage, int(t0 * MS), int(t1 * MS), rid, pid, extra)


def _timeline(tag: str = "t1") -> list[stages.Event]:
    rid = f"chatcmpl-{tag}-abcd"
    sched = {"new": [rid], "tokens": {rid: 300}}
    return [
        _ev("http", 1, 99, tag, body_end=int(2 * MS), first_body=int(95 * MS)),
        _ev("handler", 5, 60, tag),
        _ev("render", 6, 30, tag),
        _ev("messages", 6, 7, tag),
        _ev("template", 7, 9),
        _ev("tokenize", 9, 20, tag),
        _ev("engine_input", 20, 21, tag),
        _ev("add_request", 32, 45, tag),
        _ev("process_inputs", 33, 38, tag),
        _ev("validate", 34, 36, tag),
        _ev("output_state", 38, 38.5, tag),
        _ev("send", 39, 46, rid),
        _ev("serialise", 39, 41, rid),
        _ev("deserialise", 43, 44, rid, pid=2, ids_sent=0),
        _ev("request_init", 44, 50, rid, pid=2),
        _ev("hash", 45, 48, rid, pid=2, blocks=10, tokens=1300, reused=9),
        _ev("queue", 51, 52, rid, pid=2),
        _ev("schedule", 53, 57, pid=2, **sched),
        _ev("prefix_lookup", 53.5, 54, rid, pid=2, hit_tokens=1024),
        _ev("allocate", 54, 55, rid, pid=2),
        _ev("execute", 58, 80, pid=3, **sched),
        _ev("runner_update", 58, 60, pid=3, **sched),
        _ev("sample", 81, 82, pid=3),
        _ev("update", 83, 84, pid=2, **sched),
        _ev("outputs", 86, 90, rids=[rid]),
    ]


def test_the_stages_add_up_to_the_client_ttft_exactly() -> None:
    split = stages.split(_timeline(), "t1", 0, int(100 * MS))
    assert list(split) == list(stages.STAGE_NAMES)
    assert sum(split.values()) == pytest.approx(100.0)
    assert split["tokenize"] == pytest.approx(11.0)
    assert split["serving"] == pytest.approx(27 - 1 - 2 - 11 - 1)  # render's parts taken out
    assert split["hash"] == pytest.approx(3.0) and split["request_init"] == pytest.approx(3.0)
    assert split["validate"] == pytest.approx(2.0) and split["process_inputs"] == pytest.approx(3.0)
    assert split["output_state"] == pytest.approx(0.5) and split["add_request"] == pytest.approx(
        1.5
    )
    assert split["forward"] == pytest.approx(20.0)  # execute minus runner_update
    assert split["to_worker"] == pytest.approx(1.0)
    facts = stages.facts(_timeline(), "t1", 0, int(100 * MS))
    assert facts == {
        "ids_sent": 0,
        "hashed_blocks": 10,
        "prompt_tokens_seen": 1300,
        "reused_blocks": 9,
        "prefix_hit_tokens": 1024,
    }


def test_a_foreign_request_in_the_window_is_reported() -> None:
    evs = _timeline()
    assert stages.foreign(evs, "t1", 0, int(100 * MS)) == []
    evs.append(_ev("schedule", 70, 71, new=["chatcmpl-other-1"], tokens={}))
    assert stages.foreign(evs, "t1", 0, int(100 * MS)) == ["chatcmpl-other-1"]


def test_a_missing_anchor_is_named() -> None:
    evs = [e for e in _timeline() if e.stage != "update"]
    with pytest.raises(stages.Missing, match="no update event for request t1"):
        stages.split(evs, "t1", 0, int(100 * MS))


def test_tail_reads_only_whole_new_lines(tmp_path: Path) -> None:
    f = tmp_path / "stages-7.jsonl"
    line = json.dumps({"stage": "queue", "t0": 1, "t1": 2, "rid": "x", "pid": 7})
    f.write_text(line + "\n" + line[:10])
    tail = stages.Tail(tmp_path)
    assert len(tail.read()) == 1
    with open(f, "a") as fh:
        fh.write(line[10:] + "\n")
    assert len(tail.read()) == 2


# ----------------------------------------------------------------- the plugin module


class _Req:
    request_id = "chatcmpl-r1-xyz"


class _Thing:
    def sync(self, request: object) -> int:
        return 1

    async def coro(self, request: object) -> int:
        return 2


def test_wrappers_time_sync_and_async_calls_with_their_request(tmp_path: Path) -> None:
    rec = stage_timing.Recorder(str(tmp_path))
    old = stage_timing._REC
    stage_timing._REC = rec
    try:
        t_sync = stage_timing.Target("a", "m", "q", stage_targets._self_request_id)
        t_async = stage_timing.Target("b", "m", "q", stage_targets._self_request_id)
        sync = stage_timing._wrap(_Thing.sync, t_sync)
        coro = stage_timing._wrap(_Thing.coro, t_async)
        assert sync(_Thing(), _Req()) == 1
        assert asyncio.run(coro(_Thing(), _Req())) == 2
    finally:
        stage_timing._REC = old
    evs = stages.load_events(tmp_path)
    assert [(e.stage, e.rid) for e in evs] == [("a", _Req.request_id), ("b", _Req.request_id)]
    assert all(e.t1 >= e.t0 > 0 for e in evs)


def test_arrival_mark_stamps_arrival_body_and_first_bytes(tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    async def app(scope, receive, send):
        await receive()
        seen["rid"] = stage_timing._rid.get()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        return None

    old = stage_timing._REC
    stage_timing._REC = stage_timing.Recorder(str(tmp_path))
    try:
        scope = {
            "type": "http",
            "path": "/v1/chat/completions",
            "headers": [(b"x-request-id", b"t9")],
        }
        asyncio.run(stage_timing.ArrivalMark(app)(scope, receive, send))
    finally:
        stage_timing._REC = old
    (ev,) = stages.load_events(tmp_path)
    assert seen["rid"] == "t9" and ev.rid == "t9" and ev.stage == "http"
    assert ev.t0 <= ev.extra["body_end"] <= ev.extra["first_body"] <= ev.t1


_RESOLVE_ALL = (
    "import json, dsv4_flash_overlays.stage_timing as st\n"
    "bad = {}\n"
    "for t in st.TARGETS:\n"
    "    try:\n"
    "        st._resolve(t.module, t.qualname)\n"
    "    except Exception as e:\n"
    "        bad[t.stage] = repr(e)\n"
    "import importlib\n"
    "m, n = st.HASHER_FACTORY\n"
    "getattr(importlib.import_module(m), n)\n"
    "print(json.dumps(bad))\n"
)


def _resolve_all(python: str) -> dict[str, str]:
    out = warm.run(
        python,
        ["-c", _RESOLVE_ALL],
        env={
            "PYTHONPATH": str(REPO / "mods" / "dsv4-flash-overlays"),
            "PATH": "/usr/bin:/bin",
            **NO_CUDA_JIT,
        },
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.needs_vllm
def test_every_target_resolves_in_vllm_033() -> None:
    import sys

    assert _resolve_all(sys.executable) == {}


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # one interpreter, no server
def test_every_target_resolves_in_the_cpu_engine() -> None:
    assert _resolve_all(str(ENGINE_PY)) == {}


# ----------------------------------------------------------------- the bench's command line


def test_the_recorded_run_redraws_from_its_json(tmp_path: Path, capsys) -> None:
    """--from-json: the recorded run's table and plot again, without a server."""
    from bench import frontend_stages

    recorded = REPO / "bench/results/frontend/frontend_stages.json"
    png = tmp_path / "again.png"
    assert frontend_stages.main(["--from-json", str(recorded), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "arm on: median ms per stage" in out and "goal (on): TTFT at 512000" in out
    assert png.stat().st_size > 10_000
    doc = json.loads(recorded.read_text())
    assert doc["summary"]["problems"] == {"failed": [], "contaminated": [], "different": []}


@pytest.mark.parametrize(
    "argv",
    [["--arms", "off,off"], ["--arms", "fast"], ["--depths", "10k,2k"], ["--ports", "1"]],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    from bench import frontend_stages

    with pytest.raises(SystemExit) as exc:
        frontend_stages.parse_args(argv)
    assert exc.value.code == 2
