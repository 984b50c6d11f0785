"""`make rehearse-fleet`: the fleet command brings up two simulated pairs and the real vLLM
router on five netns test hosts, then a multi-turn chat, a failover, the way back, and down.

Steps (each prints a progress line):
  1. build five test hosts (hosts 1+2 = pair-a, 3+4 = pair-b, 5 = router host + operator);
  2. model dirs, images, overlays and env files for both pairs, the router image on host 5,
     the fleet inventory (sim/rehearsal/fleet_env.py);
  3. on host 5: `launch/dspark_launch.sh fleet up` unchanged; it runs each pair's launcher
     on its head over ssh (in parallel), then the router container (the real vllm-router
     from PyPI, run by the process runtime);
  4. conversations through the router, several turns each, each with its X-Session-ID:
     every turn of a conversation must land on the same pair;
  5. `fleet status`;
  6. failover: kill pair-b's head mid-conversation; print the router's reaction time and
     the client errors (only requests in flight on pair-b may fail);
  7. `fleet up` again brings pair-b back; the router counts both pairs healthy and pair-b's
     conversations return to it;
  8. `fleet down`, then check nothing is left on any host; remove everything (also on
     failure and Ctrl-C).
Needs root. `--no-failover` skips 6-7. Exit 0 when every step passed, else 1 (or the
failing fleet command's exit code).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from sim.rehearsal import chat, failover, fleet_env, hosts, provision
from sim.rehearsal.rehearse import (
    LAUNCHER,
    REPO,
    StepFailed,
    _raise_interrupt,
    nothing_left_on,
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


def conversations(fh: fleet_env.FleetHosts, sessions: list[str], turns: int) -> dict[str, str]:
    """Turns of each conversation through the router; returns session -> pair (one each)."""
    model = chat.first_model(fh.router_url)
    where: dict[str, str] = {}
    for s in sessions:
        history: list[dict[str, str]] = []
        seen = []
        for n in range(turns):
            q = f"Turn {n}: one more reason to keep a conversation on one pair?"
            r = chat.stream_chat(fh.router_url, q, 24, history=history, session_id=s, model=model)
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": r.content}]
            seen.append(r.pair or "?")
        grown = r.usage.get("prompt_tokens")
        say(f"{s}: {turns} turns answered by {' '.join(seen)} (last prompt {grown} tokens)")
        if len(set(seen)) != 1:
            raise StepFailed(f"{s} moved between pairs without a failure: {seen}")
        where[s] = seen[0]
    return where


def kill_head(fh: fleet_env.FleetHosts, pair_id: str) -> None:
    """SIGKILL the pair's rank-0 container init (its twin), as a crashed head would die."""
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


def come_back(fh: fleet_env.FleetHosts, rep: failover.Report) -> None:
    """`fleet up` again: the dead pair is rebuilt, the router counts it, sessions return."""
    fleet_ok(fh, "up", "--timeout", "300")
    st = fleet_status_json(fh)
    if not all(st["router"]["workers_by_pair"].get(p) for p in fleet_env.PAIR_IDS):
        raise StepFailed(f"router does not count both pairs healthy: {st['router']}")
    model = chat.first_model(fh.router_url)
    deadline = time.monotonic() + 30  # the circuit breaker re-admits a pair after cb_timeout_s
    pending = dict(rep.home)
    while pending and time.monotonic() < deadline:
        for s, home in list(pending.items()):
            r = chat.stream_chat(fh.router_url, "Back?", 8, session_id=s, model=model)
            if r.pair == home:
                del pending[s]
        time.sleep(0.5)
    if pending:
        raise StepFailed(f"conversations not back on their pair after recovery: {pending}")
    say("fleet whole again: both pairs healthy in the router's view, every conversation home")


def check_nothing_left(fh: fleet_env.FleetHosts) -> None:
    nothing_left_on(fh.pair.hosts, "fleet down", "any of the five hosts")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sim.rehearsal.fleet",
        description="Offline fleet rehearsal: `launch/dspark_launch.sh fleet` brings up two "
        "simulated pairs and the real vLLM router on five netns hosts; conversations, "
        "failover, recovery, down. Needs root.",
        epilog="See docs/fleet.md and docs/rehearsal.md.",
    )
    ap.add_argument("--prefix", default="dsv4f", help="netns/link/temp dir name prefix")
    ap.add_argument("--no-failover", action="store_true", help="skip the failover steps")
    ap.add_argument("--keep", action="store_true", help="leave the fleet up at the end")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    try:
        say("building five test hosts (netns + veth + bridge, an sshd each)")
        pair = provision.build_pair(args.prefix, say, n_hosts=fleet_env.N_HOSTS)
    except hosts.HarnessError as exc:
        print(f"rehearse-fleet: {exc}", file=sys.stderr)
        return 1

    def steps() -> bool:
        fh = fleet_env.prepare(pair, REPO)
        say(f"pairs {', '.join(fleet_env.PAIR_IDS)} on hosts 1+2 and 3+4; router on host 5")
        say(f"inventory {fh.inventory}")
        fleet_ok(fh, "plan")
        fleet_ok(fh, "up", "--timeout", "300")
        where = conversations(fh, SESSIONS[:4], 3)
        say(f"conversation affinity held: {where}")
        fleet_ok(fh, "status")
        if not args.no_failover:
            rep = run_failover(fh)
            check_failover(rep)
            come_back(fh, rep)
            fleet_ok(fh, "status")
        if args.keep:
            say(
                f"left up (--keep): clients at {fh.router_url}/v1; remove with "
                f"{sys.executable} -m sim.rehearsal --prefix {pair.prefix} --clean"
            )
            return True
        fleet_ok(fh, "down")
        check_nothing_left(fh)
        say("fleet rehearsal passed")
        return False

    return run_steps(pair, steps)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
