"""The group rehearsal's own steps (`python -m sim.rehearsal --nodes 4`): status from every
rank, and one rank killed.

Why: a pair rehearsal shows `status` and leaves it at that; a group of four must show that
`status` reads every rank (each rank's container, uptime and node memory, over ssh for
ranks 1..3), and that the death of a rank other than rank 1 is handled as the pair's
rank 1 death is (tests/test_watch_e2e.py, sim/rehearsal/real_faults.py): `status` stops
calling the group healthy and names the dead rank; `down` then removes every rank, the
orphaned headless ones included. Both steps read `status --json` (docs/INTERFACES.md).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from sim.rehearsal import hosts

HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"


class GroupStepFailed(RuntimeError):
    """A group step saw something other than what the pair case shows."""


def status_json(pair: hosts.Pair, launcher: Path, timeout: float = 180) -> dict[str, Any]:
    """`dspark_launch.sh status --json` on host 1, parsed (any exit code: it is the verdict's)."""
    assert pair.env_file is not None
    argv = [str(launcher), "status", "--json", "--env-file", str(pair.env_file)]
    res = pair.h1.run(argv, timeout=timeout, cwd=str(launcher.parent))
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise GroupStepFailed(
            f"status --json printed no JSON (exit {res.returncode}): {res.stderr[-1500:]}"
        ) from None


def every_rank_live(doc: dict[str, Any], nodes: int) -> list[str]:
    """What is wrong with a healthy group's status (empty: nothing): every rank 0..N-1 has
    a running container with an uptime, and every node a memory reading."""
    wrong = []
    if doc.get("verdict") != HEALTHY:
        wrong.append(f"verdict {doc.get('verdict')}: {doc.get('reasons')}")
    ranks = {r["rank"]: r for r in doc.get("ranks", [])}
    if sorted(ranks) != list(range(nodes)):
        wrong.append(f"status lists ranks {sorted(ranks)}, not 0..{nodes - 1}")
    for rank, r in sorted(ranks.items()):
        if r.get("state") != "running" or r.get("uptime_s") is None:
            wrong.append(f"rank {rank}: {r.get('container')} {r.get('state')}")
    mem = {m["rank"]: m for m in doc.get("memory", [])}
    for rank in range(nodes):
        m = mem.get(rank)
        if m is None or not m.get("reachable") or not m.get("available_kib"):
            wrong.append(f"rank {rank}: no memory reading ({m})")
    if not (doc.get("serving") or {}):
        wrong.append("no serving figures from /metrics")
    return wrong


def summary(doc: dict[str, Any]) -> str:
    """One line per rank: what status read there."""
    mem = {m["rank"]: m for m in doc.get("memory", [])}
    lines = []
    for r in doc.get("ranks", []):
        m = mem.get(r["rank"], {})
        avail = m.get("available_kib")
        lines.append(
            f"rank {r['rank']} ({r['addr']}): {r['container']} {r['state']}, up "
            f"{r.get('uptime_s') or 0:.0f} s, node MemAvailable "
            f"{(avail or 0) / (1 << 20):.1f} GiB ({m.get('band', '?')})"
        )
    return "\n".join(lines)


def container_pid(host: hosts.Host, name: str) -> int:
    res = host.docker("inspect", "-f", "{{.State.Pid}}", name)
    try:
        return int(res.stdout.strip())
    except ValueError:
        raise GroupStepFailed(f"no pid for {name} on {host.name}: {res.stderr.strip()}") from None


def kill_rank(pair: hosts.Pair, pair_id: str, rank: int) -> str:
    """SIGKILL rank ``rank``'s container init (its engine, and with it the container)."""
    name = f"dsv4-{pair_id}-rank{rank}"
    host = pair.hosts[rank]
    os.kill(container_pid(host, name), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = host.docker("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
        if st != "running":
            return name
        time.sleep(0.2)
    raise GroupStepFailed(f"{name} still runs 20 s after SIGKILL")


def dead_rank_named(doc: dict[str, Any], rank: int) -> list[str]:
    """What is wrong with status after rank ``rank`` died (empty: nothing): not healthy
    (degraded while the head still answers, down once it is gone), exit code 7 or 8, and
    a reason naming the rank."""
    wrong = []
    if doc.get("verdict") not in (DEGRADED, DOWN) or doc.get("exit_code") not in (7, 8):
        wrong.append(f"verdict {doc.get('verdict')} ({doc.get('exit_code')})")
    if not any(reason.startswith(f"rank {rank} ") for reason in doc.get("reasons", [])):
        wrong.append(f"no reason names rank {rank}: {doc.get('reasons')}")
    return wrong
