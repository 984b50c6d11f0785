"""Measurement only: time each front-end stage of a request inside a real vLLM server.

Why: a turn's TTFT at long history is the sum of stages that each grow with the history
(JSON parse, chat rendering, tokenising, hand-off to the engine core, prefix-block hashing,
the prefix lookup, scheduling, the worker's copy of the prompt) plus the prefill of the new
tokens. To know which dominates we time vLLM's own functions where they run, without
copying any of them: each target of stage_targets.py is wrapped with a pair of clock reads.

Off unless ``DSV4_STAGE_TIMING_DIR`` names a directory (flags.py). Then every process that
loads the plugin (API server, engine core, workers) appends one JSON line per timed call to
``DIR/stages-<pid>.jsonl``: ``{"stage", "t0", "t1", "rid", "pid", "role", ...}``, times in
ns of CLOCK_MONOTONIC, which is one clock for every process of a machine, so the API
server's, the engine core's and the client's stamps can be set on one timeline
(bench/frontend_stages.py does that).

Request ids: the client sends ``X-Request-Id``; the ASGI middleware ``ArrivalMark``
(``vllm serve --middleware dsv4_flash_overlays.stage_timing.ArrivalMark``, vLLM's own
``--middleware`` option, vllm/entrypoints/serve/middleware/register.py) stamps the arrival,
the first response bytes, and puts the id in a context variable that the API server's
wrappers running in the request's task read. vLLM's own request id contains it
(``chatcmpl-<X-Request-Id>`` plus a suffix, vllm/v1/engine/input_processor.py
assign_request_id); engine-side stages read it from the objects they handle. Calls run in
a thread pool (the chat template) carry no id; they are attributed to the request whose
window holds them, which is exact when one request is in flight at a time (the benchmark
sends one at a time).

A target that does not resolve in the running vLLM is skipped and listed in the
process's first line (``{"stage": "_targets", ...}``), so a missing stage is visible, not
silently zero.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .stage_targets import (
    HASHER_FACTORY,
    TARGETS,
    Target,
    _hash_extra,
    _hasher_rid,
    _prompt_hashing,
    _rid,
)

logger = logging.getLogger("dsv4_flash_overlays.stage_timing")

ENV_DIR = "DSV4_STAGE_TIMING_DIR"
PATCH_MARK = "_dsv4_stage_timing"
HEADER = b"x-request-id"


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns: the same clock in every process of the machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Recorder:
    """Appends one JSON line per event to this process's file (thread-safe)."""

    def __init__(self, directory: str, role: str = "") -> None:
        self.path = os.path.join(directory, f"stages-{os.getpid()}.jsonl")
        self.role = role
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, stage: str, t0: int, t1: int, rid: str | None = None, **extra: Any) -> None:
        rec = {"stage": stage, "t0": t0, "t1": t1, "rid": rid, "pid": os.getpid()}
        if self.role:
            rec["role"] = self.role
        rec.update(extra)
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)


_REC: Recorder | None = None


def _wrap(fn: Callable, target: Target) -> Callable:
    def finish(t0: int, args: tuple, kwargs: dict, result: Any) -> None:
        rec = _REC
        if rec is None:
            return
        t1 = now_ns()
        try:
            rid = target.rid(args, kwargs, result)
            if target.only_if_rid and rid is None:
                return
            if target.keep is not None and not target.keep(args, kwargs, result):
                return
            extra = target.extra(args, kwargs, result) if target.extra else {}
            rec.emit(target.stage, t0, t1, rid, **extra)
        except Exception as exc:  # measurement must never break a request
            logger.debug("stage timing %s: %s", target.stage, exc)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = now_ns()
            result = None
            try:
                result = await fn(*args, **kwargs)
                return result
            finally:
                finish(t0, args, kwargs, result)

        wrapper: Callable = awrapper
    else:

        @functools.wraps(fn)
        def swrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = now_ns()
            result = None
            try:
                result = fn(*args, **kwargs)
                return result
            finally:
                finish(t0, args, kwargs, result)

        wrapper = swrapper
    setattr(wrapper, PATCH_MARK, True)
    return wrapper


def _resolve(module: str, qualname: str) -> tuple[Any, str, Any]:
    obj: Any = importlib.import_module(module)
    parts = qualname.split(".")
    for name in parts[:-1]:
        obj = getattr(obj, name)
    return obj, parts[-1], inspect.getattr_static(obj, parts[-1])


def _install(target: Target) -> str:
    """'' when installed (now or before), else why not."""
    try:
        owner, attr, raw = _resolve(target.module, target.qualname)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    if getattr(fn, PATCH_MARK, False):
        return ""
    if not callable(fn):
        return "not callable"
    wrapped = _wrap(fn, target)
    if isinstance(raw, classmethod):
        wrapped = classmethod(wrapped)
    elif isinstance(raw, staticmethod):
        wrapped = staticmethod(wrapped)
    setattr(owner, attr, wrapped)
    return ""


def _install_hasher_factory() -> str:
    module, name = HASHER_FACTORY
    try:
        mod = importlib.import_module(module)
        factory = getattr(mod, name)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if getattr(factory, PATCH_MARK, False):
        return ""
    target = Target("hash", module, name, _hasher_rid, _hash_extra, keep=_prompt_hashing)

    @functools.wraps(factory)
    def timed_factory(*args: Any, **kwargs: Any) -> Any:
        return _wrap(factory(*args, **kwargs), target)

    setattr(timed_factory, PATCH_MARK, True)
    setattr(mod, name, timed_factory)
    return ""


def apply(directory: str | None = None) -> bool:
    """Install every wrapper that resolves; True if the recorder is on."""
    global _REC
    directory = directory or os.environ.get(ENV_DIR, "")
    if not directory:
        return False
    os.makedirs(directory, exist_ok=True)
    if _REC is None:
        _REC = Recorder(directory)
    skipped: dict[str, str] = {}
    for target in TARGETS:
        why = _install(target)
        if why:
            skipped[target.stage] = why
    why = _install_hasher_factory()
    if why:
        skipped["hash"] = why
    t = now_ns()
    _REC.emit("_targets", t, t, None, skipped=skipped)
    logger.info(
        "dsv4-flash-overlays: stage timing on, %d of %d stages, writing %s (pid %d)",
        len(TARGETS) + 1 - len(skipped),
        len(TARGETS) + 1,
        _REC.path,
        os.getpid(),
    )
    return True


class ArrivalMark:
    """ASGI middleware: the request's arrival, its first response bytes, its id in context.

    Added with ``vllm serve --middleware dsv4_flash_overlays.stage_timing.ArrivalMark``; the
    last middleware added is the outermost (Starlette's add_middleware), so its stamp is the
    earliest the application sees.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or _REC is None:
            await self.app(scope, receive, send)
            return
        t0 = now_ns()
        rid = None
        for k, v in scope.get("headers") or ():
            if k.lower() == HEADER:
                rid = v.decode("latin-1")
                break
        token = _rid.set(rid)
        first: list[int] = []
        body_end: list[int] = []

        async def timed_receive() -> Any:
            msg = await receive()
            if msg.get("type") == "http.request" and not msg.get("more_body"):
                body_end.append(now_ns())
            return msg

        async def timed_send(msg: dict) -> None:
            if not first and msg.get("type") == "http.response.body" and msg.get("body"):
                first.append(now_ns())
            await send(msg)

        try:
            await self.app(scope, timed_receive, timed_send)
        finally:
            _rid.reset(token)
            rec = _REC
            if rec is not None and rid is not None:
                rec.emit(
                    "http",
                    t0,
                    now_ns(),
                    rid,
                    path=scope.get("path"),
                    body_end=body_end[0] if body_end else None,
                    first_body=first[0] if first else None,
                )
