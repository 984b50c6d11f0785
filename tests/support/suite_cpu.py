"""Where the suite's CPU goes: a pytest plugin that records, per test, its wall time and the CPU
time of the worker plus the children it reaped, and a report that sums them by module.

Why: on 2 cores the suite is CPU-bound (the machine ~100% busy for the whole run), so its wall
time is its CPU demand divided by two, and a cut must remove CPU, not waiting. ``--durations``
only shows wall time, which under that load mostly measures the other workers.

    make profile-suite                      # the suite with this plugin, then the report
    python -m tests.support.suite_cpu DIR   # the report again: a table, and DIR/report.json

CPU of a process the test never reaps (a daemon re-parented to init: sshd in a netns host, a
server the docker stand-in's supervisor owns) is not counted, and the report's first line says
so: compare its total with the machine's busy time (/proc/stat) over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT_ENV = "DSV4_SUITE_CPU_OUT"


def _cpu() -> tuple[float, float]:
    """(this process, its reaped children): user + system seconds."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    out = os.environ.get(OUT_ENV)
    if not out:
        yield
        return
    t0, (s0, c0) = time.monotonic(), _cpu()
    yield
    t1, (s1, c1) = time.monotonic(), _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    row = {"id": item.nodeid, "worker": worker, "wall": t1 - t0, "self": s1 - s0,
           "children": c1 - c0}  # fmt: skip
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{worker}.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def module_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[p]@group`` -> ``tests/test_x.py``."""
    return nodeid.split("::", 1)[0]


def summarize(rows: list[dict]) -> dict:
    """Per module: tests, wall, CPU (self + reaped children), workers; sorted by CPU."""
    mods: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0,
                                                "workers": set()})  # fmt: skip
    for r in rows:
        m = mods[module_of(r["id"])]
        m["tests"] += 1
        m["wall_s"] += r["wall"]
        m["cpu_s"] += r["self"] + r["children"]
        m["workers"].add(r["worker"])
    ranked = sorted(mods.items(), key=lambda kv: -kv[1]["cpu_s"])
    return {
        "tests": len(rows),
        "cpu_s": sum(m["cpu_s"] for m in mods.values()),
        "modules": [
            {
                "module": name,
                **{k: v for k, v in m.items() if k != "workers"},
                "workers": sorted(m["workers"]),
            }  # fmt: skip
            for name, m in ranked
        ],
    }


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.open()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.support.suite_cpu",
        description="Sum a profiled suite run's CPU by module (see the module's docstring).",
    )
    ap.add_argument("dir", type=Path, help=f"the folder {OUT_ENV} named during the run")
    ap.add_argument("--top", type=int, default=30, help="modules to print (default 30)")
    args = ap.parse_args(argv)
    rows = read_rows(args.dir)
    if not rows:
        print(f"no records in {args.dir}: run pytest with -p tests.support.suite_cpu and "
              f"{OUT_ENV}={args.dir}", file=sys.stderr)  # fmt: skip
        return 2
    rep = summarize(rows)
    (args.dir / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(f"{rep['tests']} tests, {rep['cpu_s'] / 60:.1f} CPU-min counted "
          "(self + reaped children; daemons not reaped by a test are not counted)")  # fmt: skip
    print(f"{'module':48s} {'tests':>5s} {'cpu s':>7s} {'wall s':>7s}  workers")
    for m in rep["modules"][: args.top]:
        print(f"{m['module']:48s} {m['tests']:5d} {m['cpu_s']:7.1f} {m['wall_s']:7.1f}  "
              f"{','.join(m['workers'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
