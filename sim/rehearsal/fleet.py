"""`make rehearse-fleet`: the fleet command brings up two real vLLM pairs (CPU build, TP=2,
tiny model; `--engine sim`: two simulated pairs) and the real vLLM router on five netns test
hosts, then a multi-turn chat, a failover, the way back, and down.

Steps (each prints a progress line):
  0. (`--engine cpu`, the default) check the CPU engine's venv and the tiny model;
  1. build five test hosts (hosts 1+2 = pair-a, 3+4 = pair-b, 5 = router host + operator);
  2. model dirs, images, overlays and env files for both pairs, the router image on host 5,
     the fleet inventory (sim/rehearsal/fleet_env.py);
  3. on host 5: `launch/dspark_launch.sh fleet up` unchanged; it runs each pair's launcher
     on its head over ssh (in parallel), then the router container (the real vllm-router
     from PyPI, run by the process runtime);
  4. conversations through the router, several turns each, each with its X-Session-ID:
     every turn of a conversation must land on the same pair (which pair answered: the
     simulator's header, or the real pairs' own counters, sim/rehearsal/whichpair.py);
  5. `fleet status`;
  6. failover: kill pair-b's head mid-conversation; print the router's reaction time and
     the client errors (only requests in flight on pair-b may fail);
  7. `fleet up` again brings pair-b back; the router counts both pairs healthy and pair-b's
     conversations return to it;
  8. `fleet down`, then check nothing is left on any host (containers, processes, new
     /dev/shm segments of the engines); remove everything (also on failure and Ctrl-C).
Prints the total time and the peak memory (sim/rehearsal/memwatch.py). Needs root.
`--no-failover` skips 6-7. Exit 0 when every step passed, else 1 (or the
failing fleet command's exit code).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sim.rehearsal import chat, failover, fleet_env, hosts, leaks, memwatch, pairenv, provision
from sim.rehearsal.rehearse import (
    LAUNCHER,
    REPO,
    T0,
    StepFailed,
    _raise_interrupt,
    nothing_left_on,
    prepare_engine,
    run_steps,
    say,
    stream_on_host,
)

SESSIONS = [f"conv-{i}" for i in range(6)]


def fleet_cmd(fh: fleet_env.FleetHosts, *args: str, timeout: float = 600) -> int:
    """Run `launch/dspark_launch.sh fleet ARGS` on the router host, output streaming."""
    argv = [str(LAUNCHER), "fleet", *args[:1], "--inventory", str(fh.inventory), *args[1:]]
    return stream_on_host(fh.router, "host 5", argv, REPO, timeout, f"fleet {args[0]}")


def fleet_ok(fh: fleet_env.FleetHosts, *args: str, timeout: float = 600) -> None:
    rc = fleet_cmd(fh, *args, timeout=timeout)
    if rc != 0:
        raise StepFailed(f"`fleet {' '.join(args)}` exited {rc}", rc)


def fleet_status_json(fh: fleet_env.FleetHosts) -> dict:
    argv = [str(LAUNCHER), "fleet", "status", "--json", "--inventory", str(fh.inventory)]
    res = fh.router.run(argv, cwd=str(REPO), timeout=120)
    if res.returncode != 0:
        raise StepFailed(f"fleet status --json exited {res.returncode}: {res.stderr[-500:]}")
    return json.loads(res.stdout)


def ask(
    fh: fleet_env.FleetHosts, send: Callable[[], chat.ChatResult]
) -> tuple[chat.ChatResult, str]:
    """One request through the router (nothing else in flight) and the pair that answered:
    the simulator's header, else the pair whose own finished-request counter went up."""
    counters = fh.counters()
    if counters is None:
        r = send()
        return r, r.pair or "?"
    r, pair = counters.served(send)
    return r, r.pair or pair or "?"


def conversations(fh: fleet_env.FleetHosts, sessions: list[str], turns: int) -> dict[str, str]:
    """Turns of each conversation through the router; returns session -> pair (one each)."""
    model = chat.first_model(fh.router_url)
    where: dict[str, str] = {}
    for s in sessions:
        history: list[dict[str, str]] = []
        seen = []
        for n in range(turns):
            q = f"Turn {n}: one more reason to keep a conversation on one pair?"
            r, pair = ask(
                fh,
                lambda q=q, h=history, s=s: chat.stream_chat(
                    fh.router_url, q, 24, history=h, session_id=s, model=model
                ),
            )
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": r.content}]
            seen.append(pair)
        grown = r.usage.get("prompt_tokens")
        say(f"{s}: {turns} turns answered by {' '.join(seen)} (last prompt {grown} tokens)")
        if "?" in seen:
            raise StepFailed(f"{s}: could not tell which pair answered a turn: {seen}")
        if len(set(seen)) != 1:
            raise StepFailed(f"{s} moved between pairs without a failure: {seen}")
        where[s] = seen[0]
    return where


def kill_head(fh: fleet_env.FleetHosts, pair_id: str) -> None:
    """SIGKILL the pair's rank-0 container init (the twin, or real vLLM's API server), as a
    crashed head dies: it is PID 1 of the container's PID namespace (sim/rehearsal/
    supervise.py), so every process of rank 0 (a real head's engine core too) dies with it."""
    head = fh.nodes(pair_id)[0]
    res = head.docker("inspect", f"dsv4-{pair_id}-rank0")
    pid = json.loads(res.stdout)[0]["State"]["Pid"] if res.returncode == 0 else 0
    if not pid:
        raise StepFailed(f"{pair_id} rank 0 is not running on {head.name}: {res.stderr}")
    say(f"killing {pair_id}'s head process (pid {pid} on {head.name}) mid-conversation")
    os.kill(pid, signal.SIGKILL)


def run_failover(fh: fleet_env.FleetHosts, victim: str = "pair-b") -> failover.Report:
    t = fleet_env.REHEARSAL_TUNING
    limit = t["health_check_interval_s"] * (t["health_failure_threshold"] + 2) + 5
    rep = failover.run(
        fh.router_url,
        chat.first_model(fh.router_url),
        SESSIONS,
        victim,
        fh.endpoint(victim),
        lambda: kill_head(fh, victim),
        mark_down_limit_s=limit,
        counters=fh.counters(),
    )
    for line in rep.lines():
        say(line)
    return rep


def check_failover(rep: failover.Report) -> None:
    if rep.marked_down_s is None:
        raise StepFailed("the router never marked the killed pair unhealthy")
    if rep.unexpected:
        raise StepFailed(f"{len(rep.unexpected)} request(s) failed besides those in flight")
    bad = [s for s, p in rep.moved.items() if rep.home[s] != rep.killed or p != ["pair-a"]]
    if bad:
        raise StepFailed(f"conversations that should not have moved did: {bad}")
    if rep.counted_from is not None:  # attributed by counters: their premises must hold
        if rep.victim_answers:
            raise StepFailed(f"{rep.killed}'s head still answers after being killed")
        answered = rep.answered_since(rep.counted_from)
        if rep.survivor_finished is None or rep.survivor_finished < answered:
            raise StepFailed(
                f"{rep.survivor}'s own counter finished {rep.survivor_finished} requests "
                f"after the kill, fewer than the {answered} turns answered then"
            )


def come_back(fh: fleet_env.FleetHosts, rep: failover.Report, timeout: int = 300) -> None:
    """`fleet up` again: the dead pair is rebuilt, the router counts it, sessions return."""
    fleet_ok(fh, "up", "--timeout", str(timeout), timeout=timeout + 300)
    st = fleet_status_json(fh)
    if not all(st["router"]["workers_by_pair"].get(p) for p in fleet_env.PAIR_IDS):
        raise StepFailed(f"router does not count both pairs healthy: {st['router']}")
    model = chat.first_model(fh.router_url)
    deadline = time.monotonic() + 60  # the circuit breaker re-admits a pair after cb_timeout_s
    pending = dict(rep.home)
    while pending and time.monotonic() < deadline:
        for s, home in list(pending.items()):
            _, pair = ask(
                fh,
                lambda s=s: chat.stream_chat(fh.router_url, "Back?", 8, session_id=s, model=model),
            )
            if pair == home:
                del pending[s]
        time.sleep(0.5)
    if pending:
        raise StepFailed(f"conversations not back on their pair after recovery: {pending}")
    say("fleet whole again: both pairs healthy in the router's view, every conversation home")


def check_nothing_left(fh: fleet_env.FleetHosts, shm_before: set[str] | None = None) -> None:
    """No container or process on any host; with ``shm_before`` (the machine's /dev/shm
    before `fleet up`), no new engine segment that nobody holds either."""
    nothing_left_on(fh.pair.hosts, "fleet down", "any of the five hosts")
    if shm_before is not None:
        leaked = leaks.new_engine_segments(shm_before)
        if leaked:
            raise StepFailed(f"after fleet down, /dev/shm segments left behind: {leaked}")
        say("after fleet down: no engine segment left in /dev/shm")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sim.rehearsal.fleet",
        description="Offline fleet rehearsal: `launch/dspark_launch.sh fleet` brings up two "
        "real vLLM pairs (CPU build, TP=2, tiny model; or two simulated pairs) and the real "
        "vLLM router on five netns hosts; conversations, failover, recovery, down. Needs root.",
        epilog="See docs/fleet.md and docs/rehearsal.md.",
    )
    ap.add_argument("--prefix", default="dsv4f", help="netns/link/temp dir name prefix")
    ap.add_argument(
        "--engine",
        choices=pairenv.ENGINES,
        default="cpu",
        help="what the pairs' vllm is: cpu = real vLLM, CPU build, on a tiny model "
        "(default); sim = the spark twin simulator",
    )
    ap.add_argument(
        "--timeout", type=int, default=300, help="seconds for each pair's `up` (default 300)"
    )
    ap.add_argument("--no-failover", action="store_true", help="skip the failover steps")
    ap.add_argument("--keep", action="store_true", help="leave the fleet up at the end")
    return ap.parse_args(argv)


def timed(t0: float) -> str:
    """Minutes and seconds since ``t0`` (time.monotonic)."""
    s = int(time.monotonic() - t0)
    return f"{s // 60} min {s % 60:02d} s"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    try:
        model = prepare_engine(args.engine)
        say("building five test hosts (netns + veth + bridge, an sshd each)")
        pair = provision.build_pair(args.prefix, say, n_hosts=fleet_env.N_HOSTS)
    except hosts.HarnessError as exc:
        print(f"rehearse-fleet: {exc}", file=sys.stderr)
        return 1

    def steps() -> bool:
        with memwatch.MemWatch(pair.hosts) as mem:
            try:
                return walk(pair, args, model)
            finally:
                say(mem.peak.line())
                say(f"total time {timed(T0)}")

    return run_steps(pair, steps)


def walk(pair: hosts.Pair, args: argparse.Namespace, model: Path | None) -> bool:
    """Steps 2-8 (module doc); True when the fleet is left up (--keep)."""
    fh = fleet_env.prepare(pair, REPO, engine=args.engine, model=model)
    what = "real vLLM (CPU build, TP=2)" if args.engine == "cpu" else "simulated"
    say(f"{what} pairs {', '.join(fleet_env.PAIR_IDS)} on hosts 1+2 and 3+4; router on host 5")
    say(f"inventory {fh.inventory}")
    shm_before = set(leaks.shm_entries())
    fleet_ok(fh, "plan")
    t_up = time.monotonic()
    fleet_ok(fh, "up", "--timeout", str(args.timeout), timeout=args.timeout + 300)
    say(f"fleet up (both pairs in parallel, then the router) took {time.monotonic() - t_up:.0f} s")
    where = conversations(fh, SESSIONS[:4], 3)
    say(f"conversation affinity held: {where}")
    fleet_ok(fh, "status")
    if not args.no_failover:
        rep = run_failover(fh)
        check_failover(rep)
        come_back(fh, rep, args.timeout)
        fleet_ok(fh, "status")
    if args.keep:
        say(
            f"left up (--keep): clients at {fh.router_url}/v1; remove with "
            f"{sys.executable} -m sim.rehearsal --prefix {pair.prefix} --clean"
        )
        return True
    fleet_ok(fh, "down")
    check_nothing_left(fh, shm_before)
    say("fleet rehearsal passed")
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
