"""fleet up / down / status: pairs side by side, each by its own `pairctl` command on its head,
then the router.

`up` brings up every pair that is not healthy, all at once, each with its own `pairctl up` on
its own head (its own lock, preflight and teardown). One pair failing does not stop the
others; the summary names it. The router is started only if it is not already running
(label-selected), and `up` waits until it counts every healthy pair as a healthy worker.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from pairctl import contracts
from pairctl.fleet import (
    EXIT_DEGRADED,
    EXIT_DOWN,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PAIRS,
    EXIT_PREFLIGHT,
    EXIT_ROUTER,
)
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import Fleet, PairEntry
from pairctl.fleet.pairs import PairView, env_file_matches, head, pair_argv, pair_status
from pairctl.fleet.remote import PID_TAG, Machine
from pairctl.lock import fleet_lock_path, held
from pairctl.pair.plan import LABEL_PLAN

# ssh's own failure: the pair's command never ran on its head.
SSH_FAILED = 255


def pair_exit_meaning(rc: int) -> str:
    """What a pair command's exit code means (pairctl.contracts), for the summary."""
    return "ssh to the head failed" if rc == SSH_FAILED else contracts.meaning(rc)


class Out:
    """Serialised printing for several pairs at once, each line tagged with its pair."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def say(self, msg: str) -> None:
        with self._lock:
            print(msg, file=self.stream, flush=True)

    def tagged(self, tag: str, line: str) -> None:
        self.say(f"[{tag}] {line.rstrip()}")


@contextmanager
def fleet_lock(fleet_id: str):
    """One `fleet up`/`down` at a time per fleet on this machine (each pair has its own lock)."""
    with held(fleet_lock_path(fleet_id), "fleet up/down"):
        yield


@dataclass
class PairOutcome:
    """What happened to one pair during up/down."""

    pair_id: str
    before: PairView | None = None
    after: PairView | None = None
    action: str = ""
    rc: int | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.after is not None and self.after.healthy

    def result(self) -> str:
        if self.rc not in (None, 0):
            why = pair_exit_meaning(self.rc or 0)
            note = f"; {self.note}" if self.note else ""
            return f"FAILED: launcher exit {self.rc} ({why}){note}"
        if self.note and not self.ok:
            return f"FAILED: {self.note}"
        return "healthy" if self.ok else f"not healthy ({self.after.detail if self.after else '?'})"


class Running:
    """Pair launchers this run started, so an interrupted fleet can tell each to stop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[str, tuple[Machine, int]] = {}

    def add(self, pair_id: str, m: Machine, pid: int) -> None:
        with self._lock:
            self._procs[pair_id] = (m, pid)

    def done(self, pair_id: str) -> None:
        with self._lock:
            self._procs.pop(pair_id, None)

    def interrupt_all(self, out: Out) -> None:
        with self._lock:
            procs = list(self._procs.items())
        for pair_id, (m, pid) in procs:
            out.tagged(pair_id, f"interrupting its launcher (pid {pid} on {m.label})")
            m.interrupt(pid)


RUNNING = Running()


def pair_launcher(
    fleet: Fleet, pair: PairEntry, command: str, extra: list[str], out: Out
) -> tuple[int, str]:
    """Run the pair's `pairctl command` on its head, its output tagged; (exit code, note)."""
    m = head(fleet, pair)
    argv = pair_argv(fleet, pair, command, *extra)
    out.tagged(pair.pair_id, f"on {m.label}: {' '.join(argv)}")
    proc = m.popen(argv, cwd=fleet.repo_dir if not m.local else None)
    assert proc.stdout is not None
    if m.local:
        RUNNING.add(pair.pair_id, m, proc.pid)
    try:
        for line in proc.stdout:
            if line.startswith(PID_TAG + " "):
                RUNNING.add(pair.pair_id, m, int(line.split()[1]))
                continue
            out.tagged(pair.pair_id, line)
        return proc.wait(), ""
    finally:
        RUNNING.done(pair.pair_id)


def statuses(fleet: Fleet, deps: Deps) -> dict[str, PairView]:
    with ThreadPoolExecutor(max(1, len(fleet.pairs))) as pool:
        views = list(pool.map(deps.status, fleet.pairs))
    return {v.pair_id: v for v in views}


def bring_up(
    fleet: Fleet, pair: PairEntry, before: PairView, timeout_s: int, deps: Deps, out: Out
) -> PairOutcome:
    """One pair: leave it if healthy, else check its env file on the head and run its up."""
    o = PairOutcome(pair.pair_id, before=before)
    if before.healthy:
        o.action, o.after = "already healthy", before
        out.tagged(pair.pair_id, f"already healthy at {pair.endpoint}/v1; left as it is")
        return o
    o.action = "up"
    why = deps.env_check(fleet, pair)
    if why:
        o.note = why
        out.tagged(pair.pair_id, f"not started: {why}")
        o.after = before
        return o
    o.rc, o.note = deps.launcher(fleet, pair, "up", ["--timeout", str(timeout_s)], out)
    o.after = deps.status(pair)
    return o


@dataclass
class RouterOutcome:
    action: str = ""
    error: str = ""
    view: rt.RouterView | None = None
    note: str = ""


@dataclass
class UpResult:
    pairs: list[PairOutcome] = field(default_factory=list)
    router: RouterOutcome = field(default_factory=RouterOutcome)
    code: int = EXIT_OK


def router_preflight(fleet: Fleet) -> str | None:
    """Before any pair boots: the router host answers and has the pinned image."""
    m = rt.machine(fleet)
    found, why = rt.image_id(m, fleet.router.image)
    if found is None:
        return (
            f"router image {fleet.router.image} is not on {m.label} ({why}). Build it there: "
            "docker build -f launch/vllm-router.Dockerfile -t "
            f"{fleet.router.image} launch/  (or fix router.image / router.host)"
        )
    return None


def ensure_router(fleet: Fleet, healthy: list[str], out: Out) -> RouterOutcome:
    """Start the router unless it already runs; wait until it sees every healthy pair."""
    m = rt.machine(fleet)
    ro = RouterOutcome()
    mine, err = rt.containers(m, fleet.fleet_id)
    if err:
        ro.error = err
        return ro
    running = [c for c in mine if c.running]
    want = rt.plan_hash(fleet)
    if running:
        ro.action = "already running"
        have = running[0].labels.get(LABEL_PLAN)
        if have != want:
            ro.note = (
                f"the router runs plan {have}, the inventory gives {want}: run `fleet down "
                "--router-only`, then `fleet up`, to apply it (in-flight requests are cut)"
            )
    else:
        removed, err = rt.remove(m, fleet.fleet_id)
        if err:
            ro.error = err
            return ro
        if removed:
            out.tagged("router", f"removed the fleet's stopped router container(s): {removed}")
        out.tagged("router", f"starting {fleet.router.image} on {m.label}")
        out.tagged("router", "docker " + " ".join(rt.docker_run_argv(fleet)))
        err = rt.start(m, fleet)
        if err:
            ro.error = err
            return ro
        ro.action = "started"
    t = fleet.router.tuning
    wait_s = (t.health_success_threshold + 2) * t.health_check_interval_s + 30
    out.tagged("router", f"waiting up to {wait_s}s for it to count {len(healthy)} pair(s) healthy")
    ro.view = rt.wait_sees(fleet.router.url, healthy, wait_s)
    if not ro.view.ready:
        ro.error = f"router at {fleet.router.url} not ready: {ro.view.detail}"
    elif not all(ro.view.workers.get(u) for u in healthy):
        missing = [u for u in healthy if not ro.view.workers.get(u)]
        ro.error = f"router does not count {', '.join(missing)} healthy yet"
    return ro


def remove_router(fleet: Fleet) -> tuple[list[str], str | None]:
    return rt.remove(rt.machine(fleet), fleet.fleet_id)


@dataclass
class Deps:
    """The side effects ops need, replaceable in unit tests."""

    status: Callable[[PairEntry], PairView] = pair_status
    env_check: Callable[[Fleet, PairEntry], str | None] = env_file_matches
    launcher: Callable[[Fleet, PairEntry, str, list[str], Out], tuple[int, str]] = pair_launcher
    router_view: Callable[[str], rt.RouterView] = rt.view
    router_preflight: Callable[[Fleet], str | None] = router_preflight
    router_up: Callable[[Fleet, list[str], Out], RouterOutcome] = ensure_router
    router_remove: Callable[[Fleet], tuple[list[str], str | None]] = remove_router


def up(fleet: Fleet, timeout_s: int, out: Out, deps: Deps | None = None) -> UpResult:
    deps = deps or Deps()
    res = UpResult()
    why = deps.router_preflight(fleet)
    if why:
        out.say(f"fleet {fleet.fleet_id}: {why}")
        out.say("nothing was started or removed")
        res.code = EXIT_PREFLIGHT
        return res
    before = statuses(fleet, deps)
    todo = [p for p in fleet.pairs if not before[p.pair_id].healthy]
    out.say(
        f"fleet {fleet.fleet_id}: {len(fleet.pairs) - len(todo)} of {len(fleet.pairs)} pair(s) "
        f"healthy; bringing up {', '.join(p.pair_id for p in todo) or 'none'}"
    )
    with ThreadPoolExecutor(max(1, len(fleet.pairs))) as pool:
        futures = [
            pool.submit(bring_up, fleet, p, before[p.pair_id], timeout_s, deps, out)
            for p in fleet.pairs
        ]
        try:
            res.pairs = [f.result() for f in futures]
        except KeyboardInterrupt:
            # Each booting pair's `pairctl up` tears its own boot down on SIGINT;
            # wait for them, so nothing is left half-started.
            out.say("interrupted: telling every booting pair's up to tear its boot down")
            RUNNING.interrupt_all(out)
            for f in futures:
                f.result()
            raise
    healthy = [p.endpoint for p, o in zip(fleet.pairs, res.pairs, strict=True) if o.ok]
    if not healthy:
        res.router.error = "no pair is healthy: the router was not started"
        res.code = EXIT_PAIRS
        return res
    res.router = deps.router_up(fleet, healthy, out)
    if res.router.error:
        res.code = EXIT_ROUTER
    elif not all(o.ok for o in res.pairs):
        res.code = EXIT_PAIRS
    return res


@dataclass
class DownResult:
    router_removed: list[str] = field(default_factory=list)
    router_error: str = ""
    pairs: list[PairOutcome] = field(default_factory=list)
    code: int = EXIT_OK


def down(fleet: Fleet, router_only: bool, out: Out, deps: Deps | None = None) -> DownResult:
    """Remove the router (fleet label only), then each pair via its own `pairctl down`."""
    deps = deps or Deps()
    res = DownResult()
    res.router_removed, err = deps.router_remove(fleet)
    res.router_error = err or ""
    out.tagged("router", err or f"removed {', '.join(res.router_removed) or 'nothing (none ran)'}")
    if not router_only:

        def one(pair: PairEntry) -> PairOutcome:
            rc, note = deps.launcher(fleet, pair, "down", [], out)
            return PairOutcome(pair.pair_id, action="down", rc=rc, note=note)

        with ThreadPoolExecutor(max(1, len(fleet.pairs))) as pool:
            res.pairs = list(pool.map(one, fleet.pairs))
    if res.router_error or any(o.rc for o in res.pairs):
        res.code = EXIT_ERROR
    return res


@dataclass
class FleetStatus:
    pairs: dict[str, PairView]
    router_containers: list[dict[str, Any]]
    router_error: str
    router: rt.RouterView

    @property
    def verdict(self) -> str:
        """As a pair's ``status``: healthy, degraded (something serves) or down."""
        healthy = [v for v in self.pairs.values() if v.healthy]
        if self.router.ready and len(healthy) == len(self.pairs):
            return "healthy"
        if not self.router.ready and not healthy:
            return "down"
        return "degraded"

    @property
    def exit_code(self) -> int:
        return {"healthy": EXIT_OK, "degraded": EXIT_DEGRADED, "down": EXIT_DOWN}[self.verdict]

    def to_json(self, fleet: Fleet) -> dict[str, Any]:
        by_url = {p.endpoint: p.pair_id for p in fleet.pairs}
        # each group's size (2: a pair, 4: four Sparks as one TP=4 engine), from its env file
        sizes = {p.pair_id: p.pair.nnodes for p in fleet.pairs}
        return {
            "fleet_id": fleet.fleet_id,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "endpoint": f"{fleet.router.url}/v1",
            "pairs": {k: dict(v.to_json(), nnodes=sizes.get(k)) for k, v in self.pairs.items()},
            "router": {
                "host": fleet.router.host,
                "containers": self.router_containers,
                "error": self.router_error,
                **self.router.to_json(),
                "workers_by_pair": {by_url.get(u, u): ok for u, ok in self.router.workers.items()},
            },
        }


def status(fleet: Fleet, deps: Deps | None = None) -> FleetStatus:
    deps = deps or Deps()
    pairs = statuses(fleet, deps)
    mine, err = rt.containers(rt.machine(fleet), fleet.fleet_id)
    rows = [{"name": c.name, "state": c.state, "plan": c.labels.get(LABEL_PLAN)} for c in mine]
    return FleetStatus(pairs, rows, err or "", deps.router_view(fleet.router.url))
