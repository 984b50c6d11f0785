"""A first boot that finishes: `up` waits while the boot's phases advance, each within its own
limit (longer on a first boot), and ends a stalled phase early, naming it.

The phase tracker is fed real vLLM 0.33 log lines (their sources are checked by
tests/test_bootlog.py) on a fake clock, then the twin's own two-rank boot log over loopback;
``wait_healthy`` runs with its node calls replaced, on the same fake clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pairctl import contracts
from pairctl.engine.bootlog import PHASES, RENDEZVOUS, phase_of
from pairctl.engine.bootwatch import PhaseTracker, _empty_on
from pairctl.lifecycle import steps as lifecycle
from pairctl.nodes.docker import State
from pairctl.nodes.ssh import Node
from pairctl.pair.config import parse_env
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from tests.support.twin import Twin, free_port, wait_http
from tests.test_twin_ranks import pair_args

REPO = Path(__file__).resolve().parents[1]
W = "(Worker_TP0 pid=120) INFO 11-30 10:03:00 "
# (seconds into the boot, a line vLLM 0.33 prints) for a cold first boot of rank 0 that
# takes 23.5 min: past the old single 900 s timeout, but every phase within its own limit.
COLD_BOOT = [
    (0, "(APIServer pid=1) INFO 11-30 10:00:01 [startup.py:96] non-default args: {}"),
    (20, "(EngineCore pid=90) INFO [core.py:139] Initializing a V1 LLM engine (v0.33.0)"),
    (25, "(EngineCore pid=90) INFO [multiproc_executor.py:167] DP group leader: node_rank=0"),
    (
        40,
        "(Worker pid=120) INFO [parallel_state.py:1929] world_size=2 rank=0 local_rank=0 "
        "distributed_init_method=tcp://10.0.0.1:29501 backend=nccl",
    ),
    (
        160,
        "(Worker pid=120) INFO [parallel_state.py:2385] rank 0 in world size 2 is assigned "
        "as DP rank 0, PP rank 0, PCP rank 0, TP rank 0",
    ),
    (170, W + "[model_runner.py:399] Loading model from scratch..."),
    (500, W + "[default_loader.py:506] Loading weights took 320.10 seconds"),
    (510, W + "[monitor.py:40] Starting torch.compile"),
    (1150, W + "[monitor.py:62] torch.compile took 640.31 s in total"),
    (1160, W + "[monitor.py:91] Initial profiling/warmup run took 9.81 s"),
    (1165, W + "[gpu_worker.py:772] Available KV cache memory: 7.90 GiB"),
    (1170, "Capturing CUDA graphs (FULL):  40%|####      | 14/35 [00:09<00:14]"),
    (1390, W + "[model_runner.py:1163] Graph capturing finished in 220 secs, took 0.60 GiB"),
    (
        1400,
        "(EngineCore pid=90) INFO [core.py:405] init engine (profile, create kv cache, warmup "
        "model) took 1351.20 s",
    ),
    (1405, "(APIServer pid=1) INFO [entry.py:139] Starting vLLM server on http://0.0.0.0:8000"),
    (1410, "INFO:     Application startup complete."),
]


def replay(tracker: PhaseTracker, rank: int, lines, end: float, step: float = 5.0):
    """Poll a growing log every ``step`` s as `up` does; the first stall, or None."""
    t, i, text = 0.0, 0, ""
    while t <= end:
        while i < len(lines) and lines[i][0] <= t:
            text += lines[i][1] + "\n"
            i += 1
        tracker.observe(rank, phase_of("\n".join(text.splitlines()[-60:])), t)
        stall = tracker.stalled(t)
        if stall:
            return stall
        t += step
    return None


def test_a_23_minute_first_boot_that_advances_is_not_cut_off() -> None:
    tracker = PhaseTracker(first_boot=True)
    assert replay(tracker, 0, COLD_BOOT, end=1450) is None
    assert tracker.phase[0] == "API server up"


def test_the_same_compile_on_a_warm_boot_is_a_stall_naming_the_phase() -> None:
    """640 s of compiling is fine cold and a stall warm (the caches should have removed it)."""
    stall = replay(PhaseTracker(first_boot=False), 0, COLD_BOOT, end=1450)
    assert stall is not None and stall.rank == 0 and stall.phase == "compiling"
    limit = contracts.phase_limit("compiling", first_boot=False)
    assert stall.limit_s == limit and limit < stall.for_s < limit + 10
    msg = stall.message()
    assert "rank 0 stalled in phase 'compiling'" in msg and "warm-boot limit" in msg


def test_a_boot_stuck_loading_weights_fails_at_that_phases_limit_not_later() -> None:
    stuck = COLD_BOOT[:6]  # "Loading model from scratch..." and then nothing
    stall = replay(PhaseTracker(first_boot=True), 0, stuck, end=contracts.BOOT_TIMEOUT_S)
    assert stall is not None and stall.phase == "loading weights"
    limit = contracts.phase_limit("loading weights", first_boot=True)
    assert 170 + limit < 170 + stall.for_s <= 170 + limit + 5 < contracts.BOOT_TIMEOUT_S


def test_rank1_never_joining_stalls_rank0_in_rendezvous() -> None:
    stall = replay(PhaseTracker(first_boot=True), 0, COLD_BOOT[:4], end=contracts.BOOT_TIMEOUT_S)
    assert stall is not None and stall.phase == RENDEZVOUS


def test_a_phase_only_moves_forward() -> None:
    t = PhaseTracker(first_boot=True)
    assert t.observe(1, "compiling", 0.0) == "compiling"
    # a tail whose needle scrolled out reads as "starting": no step back, no new clock
    assert t.observe(1, "starting", 50.0) == "compiling" and t.since[1] == 0.0
    assert t.observe(1, "profiling memory", 60.0) == "profiling memory" and t.since[1] == 60.0


def test_empty_jit_caches_make_a_first_boot(tmp_path: Path) -> None:
    cfg = parse_env(
        {
            "PAIR_ID": "pair-a",
            "SPARK1": "127.0.0.1",
            "SPARK2": "127.0.0.2",
            "MODEL_PATH": "/m",
            "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
        }
    )
    full, empty, missing = tmp_path / "full", tmp_path / "empty", tmp_path / "missing"
    full.mkdir()
    (full / "kernel.so").write_text("x")
    empty.mkdir()
    got = _empty_on(Node(0, "127.0.0.1", cfg), [str(full), str(empty), str(missing)])
    assert got == [f"rank 0: {empty} empty", f"rank 0: {missing} empty"]


# --- wait_healthy on a fake clock: the node calls are replaced, the decisions are real.

ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "127.0.0.1",
    "SPARK2": "127.0.0.2",
    "MODEL_PATH": "/m",
    "NCCL_SOCKET_IFNAME": "lo",
    "GLOO_SOCKET_IFNAME": "lo",
    "IMAGE": "img:1",
}


class FakeBoot:
    """Both ranks running, each log following ``lines`` on the fake clock; healthy from
    ``healthy_at`` on (never if None)."""

    def __init__(self, lines, healthy_at: float | None) -> None:
        self.t = 0.0
        self.lines = lines
        self.healthy_at = healthy_at

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s

    def logs_tail(self, node, name, n) -> str:
        return "".join(line + "\n" for at, line in self.lines if at <= self.t)

    def health(self, base, timeout=3.0, api_key=""):
        ok = self.healthy_at is not None and self.t >= self.healthy_at
        return lifecycle.Health(ok, ["/m"] if ok else [], False, "ok" if ok else "/health 503")


@pytest.fixture
def fake(monkeypatch):
    def make(lines, healthy_at):
        fb = FakeBoot(lines, healthy_at)
        running = State(True, True, "running", None)
        monkeypatch.setattr(lifecycle, "inspect", lambda node, name: running)
        monkeypatch.setattr(lifecycle, "logs_tail", fb.logs_tail)
        monkeypatch.setattr(lifecycle, "probe_health", fb.health)
        monkeypatch.setattr(lifecycle.time, "sleep", fb.sleep)
        return fb

    return make


def test_wait_healthy_lets_a_long_first_boot_finish(fake, capsys) -> None:
    fb = fake(COLD_BOOT, healthy_at=1412)
    pair = resolve(parse_env(ENV), load_recipe(REPO / "recipes/dsv4-flash-dspark.yaml"))
    rc = lifecycle.wait_healthy(
        pair, contracts.BOOT_TIMEOUT_S, poll_s=5, clock=fb.clock, first_boot=True
    )
    err = capsys.readouterr().err
    assert rc == contracts.EXIT_OK, err
    assert "healthy after 23m" in err and "rank0: compiling" in err


def test_wait_healthy_ends_a_stalled_phase_with_exit_5_naming_it(fake, capsys) -> None:
    fb = fake(COLD_BOOT[:8], healthy_at=None)  # rank 0 starts compiling and stays there
    pair = resolve(parse_env(ENV), load_recipe(REPO / "recipes/dsv4-flash-dspark.yaml"))
    rc = lifecycle.wait_healthy(pair, 100_000, poll_s=5, clock=fb.clock, first_boot=False)
    err = capsys.readouterr().err
    assert rc == contracts.EXIT_TIMEOUT
    assert "STALLED" in err and "rank 0 stalled in phase 'compiling'" in err, err
    assert fb.t < 510 + contracts.phase_limit("compiling", False) + 20


def test_the_twins_boot_log_over_loopback_advances_through_every_phase(tmp_path) -> None:
    """Two twin ranks rendezvous over 127.0.0.1; each log, read as `up` reads it (the last
    60 lines after each new line), moves forward through the phases and never stalls."""
    mport, hport = free_port(), free_port()
    r0 = Twin(pair_args(mport, 0, hport), tmp_path, "r0")
    r1 = Twin(pair_args(mport, 1), tmp_path, "r1")
    try:
        wait_http(f"http://127.0.0.1:{hport}/health", timeout=60)
        r0.wait_log("Application startup complete.", timeout=10)
        logs = {0: r0.log(), 1: r1.log()}
    finally:
        r1.stop()
        r0.stop()
    want = {
        0: [
            "starting",
            "starting engine",
            "starting workers",
            RENDEZVOUS,
            "ranks joined",
            "loading weights",
            "compiling",
            "profiling memory",
            "capturing CUDA graphs",
            "graphs captured",
            "engine ready",
            "starting API server",
            "API server up",
        ],
        1: [
            "starting",
            "starting (headless)",
            RENDEZVOUS,
            "ranks joined",
            "loading weights",
            "compiling",
            "profiling memory",
        ],
    }
    for rank, text in logs.items():
        tracker, seen = PhaseTracker(first_boot=True), []
        lines = text.splitlines()
        for i in range(len(lines) + 1):
            kept = tracker.observe(rank, phase_of("\n".join(lines[max(0, i - 60) : i])), i)
            if not seen or seen[-1] != kept:
                seen.append(kept)
        assert [PHASES.index(p) for p in seen] == sorted(PHASES.index(p) for p in seen)
        assert seen[: len(want[rank])] == want[rank], seen
        # rank 1 (headless) draws no graph progress bar and runs no API server
        assert seen[-1] == ("API server up" if rank == 0 else "graphs captured"), seen
        assert tracker.stalled(len(lines)) is None


def test_a_backstop_timeout_says_which_phase_was_slow() -> None:
    """The whole-wait backstop ran out with no phase past its own limit: the message names
    each rank's current phase and its slowest one, so a slow box is told from a stuck one."""
    t = PhaseTracker(first_boot=True)
    t.observe(0, "starting", 0.0)
    t.observe(0, "loading weights", 20.0)
    t.observe(0, "compiling", 140.0)
    t.observe(1, "starting (headless)", 0.0)
    msg = t.slowest(170.0)
    assert "rank 0 in 'compiling' for 30 s, slowest phase 'loading weights' 120 s" in msg
    assert "rank 1 in 'starting (headless)' for 170 s, slowest phase 'starting (headless)'" in msg
    assert PhaseTracker(first_boot=True).slowest(5.0) == "no rank's log showed a phase"
