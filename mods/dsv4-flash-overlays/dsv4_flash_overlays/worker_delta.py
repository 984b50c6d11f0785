"""The scheduler's hand-off to the workers with only a prompt's new tokens (part of
incremental-prompt-handoff).

Why: a new request's ``NewRequestData`` carries its whole prompt to every worker; the
multiprocess executor pickles the scheduler output into its shared-memory broadcast queue
(vllm/distributed/device_communicators/shm_broadcast.py ``MessageQueue.enqueue``) and each
worker unpickles it: ~40 ms for 500k ids, every turn.

How: after ``Scheduler.schedule`` (the ``worker-send`` hook), each new request's
``prompt_token_ids`` becomes a ``WorkerPrompt``: the same list (the engine core, connectors
and an in-process executor read it unchanged), which pickles as a call of ``rebuild`` with
(request id, earlier request id, shared length, the new tokens) when the prompt was rebuilt
by handoff.py from a prompt the workers already hold, else with the whole list. Unpickling in
a worker calls ``rebuild``, which keeps the last prompts it rebuilt and returns a plain list.
The broadcast reaches every worker, in order, so the engine core knows which prompts they
hold (its record keeps ``WINDOW`` of them, each worker twice as many). Exact by the same
induction as prompt_delta.py; a worker that lacks a named prompt raises (the engine stops)
rather than guess.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .prompt_delta import WINDOW

# Engine core: request id -> (earlier request id, shared length), set by handoff.receive.
RELATIONS: OrderedDict[str, tuple[str, int]] = OrderedDict()
_SENT: OrderedDict[str, None] = OrderedDict()  # what the workers hold (engine core's record)
_HELD: OrderedDict[str, list[int]] = OrderedDict()  # a worker's prompts
_lock = threading.Lock()
KEEP_RELATIONS = 256


def relate(rid: str, base: str, shared: int) -> None:
    with _lock:
        RELATIONS[rid] = (base, shared)
        while len(RELATIONS) > KEEP_RELATIONS:
            RELATIONS.popitem(last=False)


class WorkerPrompt(list):
    """A prompt as the engine core sees it (a list), pickled for the workers as a delta."""

    __slots__ = ("rid", "base", "shared")

    def __init__(self, ids: list[int], rid: str, base: str | None, shared: int) -> None:
        super().__init__(ids)
        self.rid, self.base, self.shared = rid, base, shared

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[Any, ...]]:
        if self.base is None:
            return rebuild, (self.rid, None, 0, list(self))
        return rebuild, (self.rid, self.base, self.shared, self[self.shared :])


def rebuild(rid: str, base: str | None, shared: int, tail: list[int]) -> list[int]:
    """In a worker: the whole prompt, from the prompt it holds for ``base`` and ``tail``."""
    if base is None:
        ids = tail
    else:
        with _lock:
            held = _HELD.get(base)
        if held is None or len(held) < shared:
            raise RuntimeError(
                f"incremental-prompt-handoff: this worker does not hold the prompt of {base!r}"
                f" that request {rid!r} extends; restart with VLLM_INCREMENTAL_PROMPT_HANDOFF=0"
            )
        ids = held[:shared]
        ids.extend(tail)
    with _lock:
        _HELD[rid] = ids
        _HELD.move_to_end(rid)
        while len(_HELD) > 2 * WINDOW:
            _HELD.popitem(last=False)
    return ids


def mark(scheduler_output: Any) -> None:
    """Turn each first-time new request's prompt into a WorkerPrompt (engine core)."""
    for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
        ids = getattr(new, "prompt_token_ids", None)
        rid = getattr(new, "req_id", None)
        if type(ids) is not list or rid is None:
            continue
        with _lock:
            if rid in _SENT:
                continue  # resumed after preemption: sent whole, as vLLM sends it
            rel = RELATIONS.pop(rid, None)
            base, shared = rel if rel is not None and rel[0] in _SENT else (None, 0)
            _SENT[rid] = None
            while len(_SENT) > WINDOW:
                _SENT.popitem(last=False)
        new.prompt_token_ids = WorkerPrompt(ids, rid, base, shared)


def wrap_schedule(original: Any) -> Any:
    import functools

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        mark(out)
        return out

    schedule._dsv4_prompt_handoff = True  # type: ignore[attr-defined]
    return schedule
