"""Restart without leaks: N `down`/`up` cycles of a rehearsal pair, measured after each.

Restart loops that leak memory and leave orphans are what Spark-pair operators report
(eugr/spark-vllm-docker#257). After every `down` this takes a ``Snapshot`` of both hosts:
containers, processes (the sshd listener aside), listening TCP ports (sshd's aside), the
machine's /dev/shm entries, the pair's launcher lock (held or not, how many lock files),
the resident memory of everything in the hosts' namespaces, and the machine's MemAvailable;
after every `up`, the running pair's resident memory. ``verdicts`` turns the series into
pass/fail lines with the margins stated in ``MARGINS``; tests/test_restart_leaks.py asserts
them, and ``python -m sim.rehearsal.leaks`` prints the table and writes the JSON by hand.

`--engine cpu` runs the same cycles on the real engine (vLLM's CPU build as a TP=2 pair,
sim/engine/), whose processes really allocate, map /dev/shm and exit; the suite's test uses
the simulator (ten real boots take ~10 min), and the recorded real run is in
bench/results/rehearsal/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pairctl.cli import argtypes
from pairctl.contracts import LEAKS_EXITS, codes, exit_line
from pairctl.home import project_root
from sim.engine import local
from sim.rehearsal import hosts, pairenv, provision

_EXIT = codes(LEAKS_EXITS)
EXIT_OK, EXIT_LEAKS = _EXIT["EXIT_OK"], _EXIT["EXIT_LEAKS"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]

REPO = project_root()
SSH_PORT = 22
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

# What "back to baseline" means, stated once (the test and the script print them). The pair's
# own margins are smaller than a leak the test injects for real (tests/test_restart_leaks.py:
# a leaked process holding LEAK_KIB, an eighth of what the simulated pair holds while up):
MARGINS = {
    # resident memory left in both hosts' namespaces after a down vs before the first up:
    # only the sshd listeners should be there (measured: 0.0 MiB after every down, simulator
    # and real engine), and a lingering ssh session is a process left, reported as such
    "netns_rss_kib": 4 * 1024,
    # the machine's MemAvailable after the last down vs after the first down: the box is
    # shared (page cache, other jobs), so a generous floor: max(512 MiB, 2% of MemTotal).
    # Against the first down, not before the first up: the real engine's first boot leaves
    # 0.45-0.75 GiB of the kernel's caches behind once (measured, flat over ten cycles after
    # it), while a restart-loop leak (eugr/spark-vllm-docker#257) grows with every cycle.
    "mem_available_kib_min": 512 * 1024,
    "mem_available_share": 0.02,
    # ... and after the first down vs before the first up: that one-off cost, bounded
    "mem_available_first_cycle_kib": 1024 * 1024,
    # a running pair's resident memory in the last three cycles vs the first three
    # (medians): a restart loop that leaks grows it every cycle. Measured spread: 0.3 MiB of
    # 256 MiB on the simulator, 17 MiB of 6.1 GiB on the real engine; the allowance (2% + 8 MiB)
    # is 13 MiB on the simulator, 130 MiB on the real engine.
    "up_rss_growth": 0.02,
    "up_rss_slack_kib": 8 * 1024,
}


def up_rss_limit(first_kib: float) -> float:
    """The most a running pair may hold in its last cycles, given its first cycles' median."""
    return first_kib * (1 + MARGINS["up_rss_growth"]) + MARGINS["up_rss_slack_kib"]


@dataclass(frozen=True)
class Snapshot:
    """Both hosts after one step (``when``: "baseline", "up N" or "down N")."""

    when: str
    containers: dict[str, list[str]]  # host -> container names
    processes: dict[str, list[str]]  # host -> "pid: cmdline", sshd listener excluded
    ports: dict[str, list[int]]  # host -> listening TCP ports, sshd's excluded
    shm: list[str]  # the machine's /dev/shm entries
    lock_held: bool  # the pair's launcher lock is held by someone
    lock_files: list[str]  # dsv4-launch-*.lock files in host 1's runtime dir
    netns_rss_kib: int  # resident memory of every process in both hosts' namespaces
    mem_available_kib: int  # the machine's MemAvailable
    mem_total_kib: int
    t: float = field(default_factory=time.time)
    # of ``shm``, those a live process held then: another test's engine beside this pair
    shm_held: list[str] = field(default_factory=list)
    # of ``shm_held``, those a process of the pair's hosts held: the pair's own segments
    shm_pair: list[str] = field(default_factory=list)

    def shm_new_since(self, base: Snapshot) -> set[str]:
        """Entries added since ``base`` that nobody held: what a pair that is down left."""
        return set(self.shm) - set(self.shm_held) - set(base.shm)


def rss_kib(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
    except (OSError, ValueError, IndexError):
        return 0  # gone meanwhile


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.split() and rest.split()[0].isdigit():
            out[key] = int(rest.split()[0])
    return out


def listening_ports(host: hosts.Host) -> list[int]:
    res = host.run(["ss", "-Htln"], timeout=30)
    ports = set()
    for line in res.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[3].rsplit(":", 1)[-1].isdigit():
            ports.add(int(cols[3].rsplit(":", 1)[-1]))
    return sorted(ports - {SSH_PORT})


def lock_state(pair: hosts.Pair) -> tuple[bool, list[str]]:
    """Whether the pair's launcher lock is held (``pairctl.lock.busy``, the
    watchdog's own test), and which lock files exist in host 1's runtime dir."""
    from pairctl.lock import busy as lock_busy

    run_dir = pair.h1.on_disk(pair.h1.runtime_dir)
    files = sorted(p.name for p in run_dir.glob("dsv4-launch-*.lock")) if run_dir.is_dir() else []
    return any(lock_busy(str(run_dir / f)) for f in files), files


def containers(host: hosts.Host) -> list[str]:
    res = host.docker("ps", "-a", "--no-trunc", "--format", "{{json .}}")
    if res.returncode != 0:
        raise AssertionError(f"docker ps on {host.name} failed: {res.stderr}")
    return sorted(json.loads(line)["Names"] for line in res.stdout.splitlines() if line.strip())


SHM_SETTLE_S = 5.0  # how long a new /dev/shm entry must stay to count as left behind


def held_shm(pids: Iterable[int] | None = None) -> set[str]:
    """/dev/shm names some live process maps or holds open. /dev/shm is the machine's, not
    the netns hosts': another test's engine beside us holds its segments while it runs. A
    segment left behind by a pair that is down is held by nobody (a pair process still
    holding one is a leaked process, which the process check reports). ``pids``: only
    those processes' (the pair's hosts'), else every process's."""
    names: set[str] = set()
    which = (p for p in os.listdir("/proc") if p.isdigit()) if pids is None else map(str, pids)
    for pid in which:
        try:
            with open(f"/proc/{pid}/maps") as f:
                names |= {ln.split("/dev/shm/", 1)[1].strip() for ln in f if "/dev/shm/" in ln}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    names.add(target[len("/dev/shm/") :].removesuffix(" (deleted)"))
        except OSError:  # the process ended, or is not ours to read
            continue
    return names


def shm_entries() -> list[str]:
    return sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else []


def new_engine_segments(before: set[str]) -> list[str]:
    """vLLM's segments (torch's psm_*, multiprocessing's sem.mp-*) added since ``before``
    that no live process holds: those a stopped engine left behind."""
    held = held_shm()
    return [
        n
        for n in shm_entries()
        if n not in before and n not in held and n.startswith(("psm_", "sem.mp-"))
    ]


def snapshot(pair: hosts.Pair, when: str) -> Snapshot:
    held, files = lock_state(pair)
    procs = {h.name: h.process_cmdlines() for h in pair.hosts}
    rss = sum(rss_kib(pid) for h in pair.hosts for pid in h.pids() if pid != h.sshd_pid())
    mem = meminfo()
    return Snapshot(
        when=when,
        containers={h.name: containers(h) for h in pair.hosts},
        processes=procs,
        ports={h.name: listening_ports(h) for h in pair.hosts},
        shm=shm_entries(),
        lock_held=held,
        lock_files=files,
        netns_rss_kib=rss,
        mem_available_kib=mem.get("MemAvailable", 0),
        mem_total_kib=mem.get("MemTotal", 0),
        shm_held=sorted(held_shm()),
        shm_pair=sorted(held_shm(pid for h in pair.hosts for pid in h.pids())),
    )


def settled(pair: hosts.Pair, when: str, timeout: float = 5.0) -> Snapshot:
    """A snapshot once no process is left (an ssh session may take a moment to close), or
    the last one after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        snap = snapshot(pair, when)
        if not any(snap.processes.values()) or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)


def launcher(pair: hosts.Pair, *args: str, timeout: float = 240) -> tuple[int, str]:
    """launch/dspark_launch.sh on host 1 (as tests/support/rehearsal.run_launcher does)."""
    assert pair.env_file is not None
    argv = [str(REPO / "launch" / "dspark_launch.sh"), *args, "--env-file", str(pair.env_file)]
    env = {"PYTHONUNBUFFERED": "1", "PAIRCTL_POLL_S": "0.5"}
    res = pair.h1.run(argv, env=env, timeout=timeout, cwd=str(REPO / "launch"))
    out = res.stdout + res.stderr
    if pairenv.FAKE_HF_TOKEN in out:
        raise AssertionError("the launcher printed HF_TOKEN")
    return res.returncode, out


def cycles(pair: hosts.Pair, n: int, say=print) -> tuple[Snapshot, list[Snapshot], list[Snapshot]]:
    """Baseline, then ``n`` times up + down; (baseline, snapshots after up, after down).
    A failed up or down raises with the launcher's output."""
    base = settled(pair, "baseline")
    ups, downs = [], []
    for i in range(1, n + 1):
        rc, out = launcher(pair, "up", "--timeout", "300")
        if rc != 0:
            raise AssertionError(f"cycle {i}: up exited {rc}:\n{out[-3000:]}")
        ups.append(snapshot(pair, f"up {i}"))
        rc, out = launcher(pair, "down")
        if rc != 0:
            raise AssertionError(f"cycle {i}: down exited {rc}:\n{out[-3000:]}")
        downs.append(settled(pair, f"down {i}"))
        say(row(ups[-1], downs[-1], base))
    if downs:
        downs[-1] = lasting_shm(downs[-1], base)
    return base, ups, downs


def lasting_shm(snap: Snapshot, base: Snapshot, wait_s: float = SHM_SETTLE_S) -> Snapshot:
    """``snap`` without the new /dev/shm entries that are gone ``wait_s`` later: another
    job's, between its process's exit and its resource tracker's unlink. A leaked segment
    stays (nobody is left to unlink it)."""
    new = snap.shm_new_since(base)
    if not new:
        return snap
    time.sleep(wait_s)
    gone = new - (set(shm_entries()) - held_shm())
    return replace(snap, shm=[n for n in snap.shm if n not in gone])


def verdicts(
    base: Snapshot, ups: list[Snapshot], downs: list[Snapshot], machine_memory: bool = True
) -> list[str]:
    """Every leak found, one line each (empty: none). The margins are ``MARGINS``.

    ``machine_memory=False`` leaves out the machine-wide MemAvailable verdicts, for a run on a
    box that other jobs share (the test suite runs other tests beside this one, which move
    MemAvailable by gigabytes): what stays is all that is the pair's own (its hosts' resident
    memory after each down and while up, containers, processes, ports, /dev/shm, the lock)."""
    bad = []
    for d in downs:
        for host, names in d.containers.items():
            if names:
                bad.append(f"{d.when}: containers left on {host}: {names}")
        for host, procs in d.processes.items():
            if procs:
                bad.append(f"{d.when}: processes left on {host}: {procs}")
        for host, ports in d.ports.items():
            if ports:
                bad.append(f"{d.when}: ports still listening on {host}: {ports}")
        if d.lock_held:
            bad.append(f"{d.when}: the pair's launcher lock is still held")
        if len(d.lock_files) > 1:
            bad.append(f"{d.when}: more than the pair's one lock file: {d.lock_files}")
        if d.netns_rss_kib > base.netns_rss_kib + MARGINS["netns_rss_kib"]:
            bad.append(
                f"{d.when}: {d.netns_rss_kib} kB resident in the hosts vs {base.netns_rss_kib} "
                f"kB before (margin {MARGINS['netns_rss_kib']} kB)"
            )
    # Left behind is what is still there after the last down: a segment a pair leaks has
    # nobody to unlink it, while /dev/shm, the machine's, also holds other jobs' segments
    # for the moment between their process's exit and its resource tracker's unlink.
    # Only segments the pair's own processes were seen holding (while up, or in a leaked
    # process) are the pair's: other tests' killed engines leave theirs on the same /dev/shm
    # for good (a CI run saw six such appear during this pair's cycles).
    ours = {n for snap in (*ups, *downs) for n in snap.shm_pair}
    new_shm = downs[-1].shm_new_since(base) & ours if downs else set()
    if new_shm:
        bad.append(f"/dev/shm entries left behind: {sorted(new_shm)}")
    if downs and machine_memory:
        first, last = downs[0], downs[-1]
        share = MARGINS["mem_available_share"] * base.mem_total_kib
        margin = max(MARGINS["mem_available_kib_min"], share)
        once = max(MARGINS["mem_available_first_cycle_kib"], share)
        if first.mem_available_kib < base.mem_available_kib - once:
            bad.append(
                f"MemAvailable {first.mem_available_kib} kB after the first down vs "
                f"{base.mem_available_kib} kB before the first up (margin {once:.0f} kB)"
            )
        if last.mem_available_kib < first.mem_available_kib - margin:
            bad.append(
                f"MemAvailable {last.mem_available_kib} kB after the last down vs "
                f"{first.mem_available_kib} kB after the first (margin {margin:.0f} kB)"
            )
    if len(ups) >= 6:
        first = statistics.median(u.netns_rss_kib for u in ups[:3])
        late = statistics.median(u.netns_rss_kib for u in ups[-3:])
        limit = up_rss_limit(first)
        if late > limit:
            bad.append(
                f"a running pair's memory grows across restarts: median {late:.0f} kB in the "
                f"last 3 cycles vs {first:.0f} kB in the first 3 (limit {limit:.0f} kB)"
            )
    return bad


HEADER = (
    f"{'cycle':>5}  {'up RSS MiB':>10}  {'down RSS MiB':>12}  {'avail MiB':>9}  "
    f"{'Δavail MiB':>10}  {'containers':>10}  {'procs':>5}  {'ports':>5}  {'shm+':>4}  lock"
)


def row(up: Snapshot, down: Snapshot, base: Snapshot) -> str:
    n = re.sub(r"\D", "", down.when)
    return (
        f"{n:>5}  {up.netns_rss_kib / 1024:>10.1f}  {down.netns_rss_kib / 1024:>12.1f}  "
        f"{down.mem_available_kib / 1024:>9.0f}  "
        f"{(down.mem_available_kib - base.mem_available_kib) / 1024:>+10.0f}  "
        f"{sum(map(len, down.containers.values())):>10}  "
        f"{sum(map(len, down.processes.values())):>5}  "
        f"{sum(map(len, down.ports.values())):>5}  "
        f"{len(down.shm_new_since(base)):>4}  {'held' if down.lock_held else 'free'}"
    )


def report(
    base: Snapshot, ups: list[Snapshot], downs: list[Snapshot], machine_memory: bool = True
) -> dict:
    """The JSON document: the margins, every snapshot, and the verdicts (``verdicts``)."""
    return {
        "schema_version": 1,
        "cycles": len(downs),
        "margins": MARGINS,
        "machine_memory_judged": machine_memory,
        "baseline": asdict(base),
        "after_up": [asdict(u) for u in ups],
        "after_down": [asdict(d) for d in downs],
        "leaks": verdicts(base, ups, downs, machine_memory),
    }


def portable(text: str, pair_dir: Path) -> str:
    """A recorded result without this machine's paths: the clone's repo-relative, the pair's
    temporary directory (every container's and the model's path is in it) as `<pair-dir>`,
    the home directory as `~`. Longer prefixes first, so a clone under either stays relative."""
    subs = {str(REPO) + "/": "", str(pair_dir): "<pair-dir>", str(Path.home()) + "/": "~/"}
    for old, new in sorted(subs.items(), key=lambda kv: -len(kv[0])):
        if old.strip("/"):
            text = text.replace(old, new)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sim.rehearsal.leaks",
        description="Build a rehearsal pair (netns hosts, needs root), run N down/up cycles "
        "of the launcher against the simulator or the real CPU engine (--engine), print a "
        "table per cycle and the leaks found (orphan containers, processes, ports, /dev/shm "
        "files, a held lock, memory not back to its baseline).",
        epilog=exit_line(LEAKS_EXITS),
    )
    ap.add_argument(
        "--cycles", type=argtypes.int_at_least(1), default=10, help="down/up cycles (default 10)"
    )
    ap.add_argument("--json", metavar="FILE", help="write every snapshot and verdict here")
    ap.add_argument("--prefix", default="dsv4k", help="netns name prefix (default dsv4k)")
    ap.add_argument(
        "--engine",
        choices=pairenv.ENGINES,
        default="sim",
        help="sim: the simulator (default); cpu: real vLLM, CPU build (make engine)",
    )
    a = ap.parse_args(argv)
    if not 1 <= a.cycles <= 1000:
        ap.error(f"--cycles must be 1..1000, got {a.cycles}")
    if a.json:
        out = Path(a.json)
        if out.is_dir() or not out.parent.is_dir():
            ap.error(f"--json {a.json}: give a file in an existing directory")
    pair = None
    try:
        print(f"building rehearsal pair {a.prefix} ...", file=sys.stderr, flush=True)
        model = local.built_model() if a.engine == "cpu" else None
        pair = provision.build_free_pair(a.prefix)
        pair.env_file = pairenv.prepare(pair, engine=a.engine, model=model)
        pairenv.copy_overlays(pair, REPO)
        print(HEADER, flush=True)
        base, ups, downs = cycles(pair, a.cycles, say=lambda s: print(s, flush=True))
    except KeyboardInterrupt:
        print("interrupted: the rehearsal pair is removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except local.EngineMissing as exc:
        print(f"leaks: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if pair is not None:
            provision.teardown(pair)
    doc = report(base, ups, downs)
    if a.json and pair is not None:
        Path(a.json).write_text(portable(json.dumps(doc, indent=2) + "\n", pair.base))
    for line in doc["leaks"]:
        print(f"LEAK: {line}")
    print(f"{len(downs)} cycles: {'no leak' if not doc['leaks'] else 'LEAKS FOUND'}")
    return EXIT_LEAKS if doc["leaks"] else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
