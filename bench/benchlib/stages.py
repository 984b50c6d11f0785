"""One request's TTFT split into stages, from the stage-timing plugin's events and client stamps.

The plugin (mods/dsv4-flash-overlays/dsv4_flash_overlays/stage_timing.py) writes, per process,
one event per timed call of a vLLM function: stage name, start and end in CLOCK_MONOTONIC ns
(one clock for every process of the machine), the request id when the function's arguments
name it. This module picks the events of one request and cuts its time to first token into
consecutive segments that add up to the client's TTFT exactly:

* **measured** stages are a timed function's own time (minus the timed functions it calls):
  their boundaries are exact;
* **gap** stages are the time between two measured boundaries that no timed function covers
  (the client's bytes in flight, the zmq hop to the engine core, the engine loop waking up,
  the hop of the scheduler's output to the worker, the first output's way back); their
  boundaries are exact too, what happens inside them is inferred from vLLM's code and named
  in GAPS.

Events without a request id (the chat template runs in a thread pool, a scheduler step or a
worker call names its requests in its arguments instead) belong to the request whose window
holds them: exact when one request is in flight at a time, which is how the benchmark sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Ordered as a request meets them. Each: (stage, kind, what it is / where in vLLM).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("to_server", "gap", "request bytes client -> uvicorn, until the app is called"),
    ("receive", "gap", "the body's bytes read by the app (ArrivalMark's receive)"),
    ("parse", "gap", "FastAPI: JSON decode and pydantic validation of ChatCompletionRequest"),
    ("messages", "measured", "vllm/renderers/chat_utils.py parse_chat_messages_async"),
    ("template", "measured", "DeepseekV4Renderer._apply_chat_template (encode_messages)"),
    ("tokenize", "measured", "BaseRenderer.tokenize_prompts_async"),
    ("engine_input", "measured", "BaseRenderer.process_for_engine_async"),
    ("serving", "gap", "the rest of OpenAIServingChat until AsyncLLM.add_request"),
    ("validate", "measured", "BaseRenderer.validate_token_ids (max/min over the prompt ids)"),
    ("process_inputs", "measured", "rest of InputProcessor.process_inputs (EngineCoreRequest)"),
    ("output_state", "measured", "OutputProcessor.add_request (request state, detokenizer)"),
    ("delta_plan", "measured", "the hand-off overlay's Sender.plan (prefix comparison)"),
    ("serialise", "measured", "MsgpackEncoder.encode of the EngineCoreRequest"),
    ("add_request", "measured", "rest of AsyncLLM.add_request up to the encode's end"),
    ("to_core", "gap", "zmq to the engine core's input thread"),
    ("deserialise", "measured", "MsgpackDecoder.decode of the EngineCoreRequest"),
    ("rebuild", "measured", "the hand-off overlay's Receiver.rebuild of a delta-sent prompt"),
    ("hash", "measured", "the prefix-cache block hasher on the prompt (Request.__init__)"),
    ("request_init", "measured", "rest of EngineCore.preprocess_add_request"),
    ("core_wakeup", "gap", "input queue -> the engine core's busy loop"),
    ("queue", "measured", "EngineCore.add_request (Scheduler.add_request)"),
    ("wait", "gap", "until the scheduler step that schedules it begins"),
    ("prefix_lookup", "measured", "KVCacheManager.get_computed_blocks"),
    ("allocate", "measured", "KVCacheManager.allocate_slots"),
    ("schedule", "measured", "rest of Scheduler.schedule"),
    ("to_worker", "gap", "the scheduler output's broadcast to the worker (shm queue)"),
    ("runner_update", "measured", "GPUModelRunner._update_states (prompt into the batch)"),
    ("forward", "measured", "rest of GPUModelRunner.execute_model (prefill of new tokens)"),
    ("to_sample", "gap", "between execute_model and sample_tokens"),
    ("sample", "measured", "GPUModelRunner.sample_tokens"),
    ("to_update", "gap", "the worker's output back to the engine core"),
    ("update", "measured", "Scheduler.update_from_output"),
    ("to_api", "gap", "the engine core's output serialised and sent to the API server"),
    ("outputs", "measured", "OutputProcessor.process_outputs (detokenise)"),
    ("to_sse", "gap", "the stream generator until its first bytes leave the app"),
    ("to_client", "gap", "the first chunk's bytes server -> client"),
)
STAGE_NAMES = tuple(s for s, _, _ in STAGES)
KIND = {s: k for s, k, _ in STAGES}


@dataclass
class Event:
    stage: str
    t0: int
    t1: int
    rid: str | None
    pid: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.t1 - self.t0) / 1e6


def load_events(directory: Path) -> list[Event]:
    """Every event in DIR/stages-*.jsonl, in start order (a torn last line is skipped)."""
    out: list[Event] = []
    for path in sorted(directory.glob("stages-*.jsonl")):
        out.extend(parse_lines(path.read_text().splitlines()))
    out.sort(key=lambda e: e.t0)
    return out


class Tail:
    """The events appended to a directory's stage files since the last read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.events: list[Event] = []

    def read(self) -> list[Event]:
        """Every event read so far, in start order (new lines parsed, whole lines only)."""
        new: list[Event] = []
        for path in sorted(self.directory.glob("stages-*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            new.extend(parse_lines(data[:end].decode(errors="replace").splitlines()))
        if new:
            self.events = sorted([*self.events, *new], key=lambda e: e.t0)
        return self.events


def parse_lines(lines: Iterable[str]) -> list[Event]:
    out: list[Event] = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or str(d.get("stage", "_")).startswith("_"):
            continue
        extra = {k: v for k, v in d.items() if k not in ("stage", "t0", "t1", "rid", "pid")}
        out.append(Event(d["stage"], d["t0"], d["t1"], d.get("rid"), d.get("pid", 0), extra))
    return out


def skipped_targets(directory: Path) -> dict[str, str]:
    """Stages some process could not time (its first line), stage -> why."""
    out: dict[str, str] = {}
    for path in sorted(directory.glob("stages-*.jsonl")):
        for line in path.read_text().splitlines()[:1]:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("stage") == "_targets":
                out.update(d.get("skipped") or {})
    return out


def _mine(e: Event, tag: str) -> bool:
    return e.rid is not None and tag in e.rid


def _first(events: list[Event], stage: str, after: int, pred: Any = None) -> Event | None:
    for e in events:
        if e.stage == stage and e.t0 >= after and (pred is None or pred(e)):
            return e
    return None


def _inside(events: Iterable[Event], stage: str, outer: Event) -> list[Event]:
    return [e for e in events if e.stage == stage and outer.t0 <= e.t0 and e.t1 <= outer.t1]


def _span_ms(evs: list[Event]) -> float:
    return sum(e.ms for e in evs)


class Missing(ValueError):
    """An event the split needs is not in the files; the message names it."""


def split(events: list[Event], tag: str, t_send_ns: int, t_first_ns: int) -> dict[str, float]:
    """Stage -> ms for the request whose id contains ``tag``; the values add up to the
    client's TTFT (t_first_ns - t_send_ns) exactly. Raises Missing if an anchor is absent."""
    win = [e for e in events if t_send_ns <= e.t0 <= t_first_ns]

    def need(e: Event | None, what: str) -> Event:
        if e is None:
            raise Missing(f"no {what} event for request {tag}")
        return e

    http = need(_first(win, "http", t_send_ns, lambda e: _mine(e, tag)), "http")
    handler = need(_first(win, "handler", http.t0, lambda e: _mine(e, tag)), "handler")
    add = need(_first(win, "add_request", handler.t0, lambda e: _mine(e, tag)), "add_request")
    ser = need(_first(win, "serialise", add.t0, lambda e: _mine(e, tag)), "serialise")
    des = need(_first(win, "deserialise", ser.t0, lambda e: _mine(e, tag)), "deserialise")
    init = need(_first(win, "request_init", des.t0, lambda e: _mine(e, tag)), "request_init")
    queue = need(_first(win, "queue", init.t0, lambda e: _mine(e, tag)), "queue")

    def schedules_me(e: Event) -> bool:
        return any(tag in (r or "") for r in e.extra.get("new") or [])

    sched = need(_first(win, "schedule", queue.t0, schedules_me), "schedule")
    execute = need(_first(win, "execute", sched.t0, schedules_me), "execute")
    sample = need(_first(win, "sample", execute.t1, lambda e: e.pid == execute.pid), "sample")
    update = need(_first(win, "update", sample.t0, schedules_me), "update")

    def outputs_me(e: Event) -> bool:
        return any(tag in (r or "") for r in e.extra.get("rids") or [])

    outs = need(_first(win, "outputs", update.t0, outputs_me), "outputs")
    first_body = http.extra.get("first_body") or t_first_ns
    body_end = http.extra.get("body_end") or http.t0

    render_window = Event("render", handler.t0, add.t0, None, 0)
    s: dict[str, float] = {}
    s["to_server"] = (http.t0 - t_send_ns) / 1e6
    s["receive"] = (body_end - http.t0) / 1e6
    s["parse"] = (handler.t0 - body_end) / 1e6
    for stage in ("messages", "template", "tokenize", "engine_input"):
        s[stage] = _span_ms(_inside(win, stage, render_window))
    s["serving"] = (add.t0 - handler.t0) / 1e6 - sum(
        s[k] for k in ("messages", "template", "tokenize", "engine_input")
    )
    proc = _inside(win, "process_inputs", add)
    s["validate"] = sum(_span_ms(_inside(win, "validate", p)) for p in proc)
    s["process_inputs"] = _span_ms(proc) - s["validate"]
    s["output_state"] = _span_ms(_inside(win, "output_state", add))
    s["delta_plan"] = _span_ms(_inside(win, "delta_plan", add))
    s["serialise"] = ser.ms
    s["add_request"] = (ser.t1 - add.t0) / 1e6 - sum(
        s[k] for k in ("validate", "process_inputs", "output_state", "delta_plan", "serialise")
    )
    s["to_core"] = (des.t0 - ser.t1) / 1e6
    s["deserialise"] = des.ms
    s["rebuild"] = _span_ms(_inside(win, "rebuild", init))
    s["hash"] = _span_ms(_inside(win, "hash", init))
    s["request_init"] = (init.t1 - des.t1) / 1e6 - s["hash"] - s["rebuild"]
    s["core_wakeup"] = (queue.t0 - init.t1) / 1e6
    s["queue"] = queue.ms
    s["wait"] = (sched.t0 - queue.t1) / 1e6
    s["prefix_lookup"] = _span_ms(
        [e for e in _inside(win, "prefix_lookup", sched) if _mine(e, tag)]
    )
    s["allocate"] = _span_ms([e for e in _inside(win, "allocate", sched) if _mine(e, tag)])
    s["schedule"] = sched.ms - s["prefix_lookup"] - s["allocate"]
    s["to_worker"] = (execute.t0 - sched.t1) / 1e6
    s["runner_update"] = _span_ms(_inside(win, "runner_update", execute))
    s["forward"] = execute.ms - s["runner_update"]
    s["to_sample"] = (sample.t0 - execute.t1) / 1e6
    s["sample"] = sample.ms
    s["to_update"] = (update.t0 - sample.t1) / 1e6
    s["update"] = update.ms
    s["to_api"] = (outs.t0 - update.t1) / 1e6
    s["outputs"] = outs.ms
    s["to_sse"] = (first_body - outs.t1) / 1e6
    s["to_client"] = (t_first_ns - first_body) / 1e6
    return {k: s[k] for k in STAGE_NAMES}


def foreign(events: list[Event], tag: str, t_send_ns: int, t_first_ns: int) -> list[str]:
    """Ids of other requests seen in the window (a foreign request shared our TTFT)."""
    seen: set[str] = set()
    for e in events:
        if not (t_send_ns <= e.t0 <= t_first_ns):
            continue
        rids = [e.rid, *(e.extra.get("new") or []), *(e.extra.get("rids") or [])]
        seen.update(r for r in rids if r and tag not in r)
    return sorted(seen)


def facts(events: list[Event], tag: str, t_send_ns: int, t_first_ns: int) -> dict[str, Any]:
    """What the stages handled: prompt blocks hashed, prefix-hit tokens, tokens scheduled."""
    win = [e for e in events if t_send_ns <= e.t0 <= t_first_ns and _mine(e, tag)]
    out: dict[str, Any] = {}
    for e in win:
        if e.stage == "hash" and "blocks" in e.extra and "hashed_blocks" not in out:
            out["hashed_blocks"] = e.extra.get("blocks")
            out["prompt_tokens_seen"] = e.extra.get("tokens")
            if "reused" in e.extra:
                out["reused_blocks"] = e.extra["reused"]
        if e.stage == "deserialise" and "ids_sent" in e.extra:
            out.setdefault("ids_sent", e.extra["ids_sent"])
        if e.stage == "prefix_lookup" and "hit_tokens" in e.extra:
            out.setdefault("prefix_hit_tokens", e.extra["hit_tokens"])
    return out
