"""Every process's CPU on this machine while the suite runs, read from /proc (`make
profile-suite`, docs/testing.md).

tests/support/suite_cpu.py charges a test the CPU of its worker and of the children it reaps;
a process nobody in the suite reaps is invisible to it: sshd's children on the netns hosts, an
engine a docker stand-in supervises, a library's background build. This samples every process
(/proc/PID/stat) twice a second until SIGTERM, keeping each one's latest CPU, command line,
parent and the test that spawned it (PYTEST_CURRENT_TEST in its environment, inherited from the
worker; a process without one is charged to its nearest ancestor's). A process that lives less
than one interval is missed: its CPU is in the machine's /proc/stat figure only.

    python -m tests.support.proc_sampler record OUT.json    # until SIGTERM
    python -m tests.support.proc_sampler report OUT.json    # by command, by test module
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
TEST_VAR = b"PYTEST_CURRENT_TEST="


def read_stat(pid: int) -> tuple[str, int, float, int] | None:
    """(comm, ppid, CPU seconds of user + system, start time in ticks), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    close = raw.rfind(")")
    fields = raw[close + 2 :].split()
    return (
        raw[raw.find("(") + 1 : close],
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / HZ,
        int(fields[19]),
    )


def _first_seen(pid: int, comm: str, ppid: int) -> dict:
    cmd, test = "", None
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(TEST_VAR):
                test = item[len(TEST_VAR) :].decode(errors="replace")
    except OSError:
        pass
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm,
        "cmd": cmd.strip()[:300],
        "test": test,
        "cpu": 0.0,
    }


def scan(seen: dict[str, dict], first: bool = False) -> None:
    """One pass over /proc: new processes recorded, known ones' CPU brought up to date. On the
    ``first`` pass a process's CPU so far is its baseline: only what it spends later counts."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_stat(int(entry))
        if stat is None:
            continue
        comm, ppid, cpu, start = stat
        key = f"{entry}:{start}"  # a pid reused later is another process
        row = seen.get(key)
        if row is None:
            row = seen[key] = _first_seen(int(entry), comm, ppid)
            row["cpu0"] = cpu if first else 0.0
        row["cpu"] = cpu


def record(out: Path, interval: float, stop: threading.Event) -> None:
    seen: dict[str, dict] = {}
    scan(seen, first=True)
    while not stop.wait(interval):
        scan(seen)
    scan(seen)
    for row in seen.values():
        row["cpu"] = round(row.pop("cpu") - row.pop("cpu0"), 2)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(seen.values())))
    tmp.replace(out)


def kind(row: dict) -> str:
    """What a process was, in a few words: `python -m MOD`, `python -c <first words>`, ..."""
    words = row["cmd"].split()
    if not words:
        return row["comm"]
    if "python" in Path(words[0]).name:
        rest = words[1:]
        while rest and rest[0] in ("-u", "-B", "-S", "-I", "-E"):
            rest = rest[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            return f"python -m {rest[1]}"
        if rest[:1] == ["-c"]:
            return "python -c " + " ".join(rest[1:4])[:40]
        return "python " + (Path(rest[0]).name if rest else "")
    return Path(words[0]).name


def test_module(row: dict, by_pid: dict[int, dict]) -> str:
    """The test module that spawned the process or its nearest ancestor, else '-'."""
    seen = set()
    while row is not None and row["pid"] not in seen:
        if row["test"]:
            return row["test"].split("::")[0]
        seen.add(row["pid"])
        row = by_pid.get(row["ppid"])
    return "-"


def report(rows: list[dict], top: int = 25) -> str:
    by_pid = {r["pid"]: r for r in rows}
    kinds: Counter = Counter()
    counts: Counter = Counter()
    modules: Counter = Counter()
    for r in rows:
        kinds[kind(r)] += r["cpu"]
        counts[kind(r)] += 1
        modules[test_module(r, by_pid)] += r["cpu"]
    lines = [f"{len(rows)} processes, {sum(r['cpu'] for r in rows):.0f} CPU-s in all", ""]
    lines += [f"{'CPU s':>8} {'procs':>6}  command"]
    lines += [f"{v:8.1f} {counts[k]:6d}  {k}" for k, v in kinds.most_common(top)]
    lines += ["", f"{'CPU s':>8}  test module that spawned it ('-': none)"]
    lines += [f"{v:8.1f}  {k}" for k, v in modules.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.support.proc_sampler", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="sample until SIGTERM or SIGINT, then write OUT")
    rec.add_argument("out", type=Path)
    rec.add_argument("--interval", type=float, default=0.5, help="seconds between scans")
    rep = sub.add_parser("report", help="print OUT by command and by test module")
    rep.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "report":
        print(report(json.loads(args.out.read_text())))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    record(args.out, args.interval, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
