"""spin-budget: how long a shared-memory queue reader busy-spins before it sleeps.

vLLM's ``MessageQueue`` readers (each worker reading the scheduler's broadcasts, the
engine core reading its local worker's replies) wait in ``SpinCondition.wait``: within
``busy_loop_s`` of their last read they ``sched_yield()`` in a loop, after it they park on
the zmq notify socket until the writer pings (``vllm/distributed/device_communicators/
shm_broadcast.py``). vLLM builds every reader with the default ``busy_loop_s=1``, longer
than any gap between decode steps, so during decode a reader never parks: it holds a core
from the first token to the last. On a Spark the Grace cores share the package's power and
thermal budget with the GPU (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark #79, #71,
#74); upstream's change to make the window configurable was closed unmerged
(vllm-project/vllm#51950; #52814 is open).

``apply`` wraps ``SpinCondition.__init__`` (the stack's ``spin-init`` hook point): a call
that leaves ``busy_loop_s`` out, as every caller in vLLM does, gets
``VLLM_DSV4_SPIN_BUDGET_MS`` / 1000 instead. A caller that passes it keeps its own value;
writers (whose ``busy_loop_s`` is 0 and unused) are unaffected. Only queues built after
``register()`` get the budget, which is every queue: vLLM loads general plugins in the
engine core before it builds the executor and in each worker before its queues
(``vllm/v1/engine/core.py``, ``vllm/v1/worker/worker_base.py`` ``init_worker``).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from .flags import SPIN_BUDGET_FLAG
from .hooks import Applied, Resolution

MARK = "_dsv4_spin_budget_s"  # on our wrapper: the budget it installs, in seconds

_installed: tuple[Any, Callable[..., None]] | None = None  # (SpinCondition, original __init__)


def budget_s(environ: Mapping[str, str] | None = None) -> float:
    """The budget the flag asks for, in seconds (register() only calls apply when valid)."""
    env = os.environ if environ is None else environ
    return float(env[SPIN_BUDGET_FLAG]) / 1000.0


def _default_s(init: Callable[..., None]) -> object:
    """vLLM's own default of ``busy_loop_s`` (1 s in every stack read), for the log line."""
    param = inspect.signature(init).parameters["busy_loop_s"]
    return None if param.default is inspect.Parameter.empty else param.default


def _wrap(init: Callable[..., None], budget: float) -> Callable[..., None]:
    sig = inspect.signature(init)

    @functools.wraps(init)  # sets __wrapped__: the resolver's anchors read through us
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            given = "busy_loop_s" in sig.bind_partial(self, *args, **kwargs).arguments
        except TypeError:  # a call vLLM's own __init__ would refuse: let it say so
            given = True
        if not given:
            kwargs["busy_loop_s"] = budget
        init(self, *args, **kwargs)

    setattr(__init__, MARK, budget)
    return __init__


def apply(res: Resolution, environ: Mapping[str, str] | None = None) -> Applied:
    """Install the budget on the resolved ``SpinCondition.__init__``; idempotent."""
    global _installed
    (target,) = res.role("spin-init")
    current = target.owner.__dict__.get(target.attr)
    default = _default_s(target.func)
    budget = budget_s(environ)
    detail = f"readers spin {budget * 1000:g} ms after a message, then sleep (vLLM: {default} s)"
    if getattr(current, MARK, None) is not None:
        return Applied(detail=detail)  # installed before (a second register())
    setattr(target.owner, target.attr, _wrap(target.func, budget))
    _installed = (target.owner, target.func)
    return Applied(detail=detail)


def remove() -> None:
    """Put vLLM's own ``__init__`` back (tests)."""
    global _installed
    if _installed is not None:
        owner, init = _installed
        owner.__init__ = init
        _installed = None
