"""Boot and stop a real two-node TP=2 vLLM pair (the CPU engine) on loopback, for benches.

Why a module: a bench that compares two engine settings end to end needs the pair as the
launcher starts it on two Sparks (sim/diffcheck/pair.py ``PairConfig``: node 0 serves on
127.0.0.1, node 1 is ``--headless`` on 127.0.0.2, ``--distributed-executor-backend mp
--nnodes 2``, ngram drafts), with our plugin on PYTHONPATH and each node a
``bench.realserver.Server``: its own process group and log file, and a stop that leaves no
process or /dev/shm segment behind whatever way the caller exits.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.realserver import OVERLAY_DIR, Server, ServerError
from sim.diffcheck.pair import ENV, PairConfig

SERVED = "tiny-pair"
NODE_IPS = ("127.0.0.1", "127.0.0.2")


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(rank: int, extra: Mapping[str, str], drop: tuple[str, ...]) -> dict[str, str]:
    """The CPU engine's env for one node: ours, minus ``drop``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(ENV)
    env.update({"VLLM_HOST_IP": NODE_IPS[rank], "PYTHONPATH": str(OVERLAY_DIR)})
    env.update(extra)
    return env


@dataclass
class RealPair:
    """Both nodes of one pair: started together, stopped together."""

    nodes: list[Server]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def wait_ready(self, timeout_s: float, log: Callable[[str], None]) -> float:
        """Seconds until node 0 answers /v1/models; ServerError if a node died or timed out."""
        t0 = time.monotonic()
        last = t0
        while True:
            headless = self.nodes[1]
            if headless.proc is None or headless.proc.poll() is not None:
                tail = "\n".join(headless.log_text().splitlines()[-15:])
                raise ServerError(f"node 1 exited during boot; log {headless.log_path}:\n{tail}")
            if self.nodes[0].poll_ready():
                return round(time.monotonic() - t0, 1)
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise ServerError(f"pair not ready after {timeout_s:.0f} s; logs in {self.logs()}")
            if now - last >= 15:
                last = now
                log(f"waiting for the pair: {now - t0:.0f} s")
            time.sleep(1.0)

    def roots(self) -> list[int]:
        """Each node's top process (the tree the benches sample)."""
        return [n.proc.pid for n in self.nodes if n.proc is not None]

    def logs(self) -> list[Path]:
        return [n.log_path for n in self.nodes]

    def stop(self) -> None:
        for node in reversed(self.nodes):  # the headless node first: node 0 then exits cleanly
            node.stop()


def make_pair(
    vllm: Path,
    model: Path,
    log_dir: Path,
    tag: str,
    extra_env: Mapping[str, str] | None = None,
    drop_env: tuple[str, ...] = (),
) -> RealPair:
    """A pair (not started) serving ``model`` with the engine venv's ``vllm``."""
    cfg = PairConfig(vllm, model, free_port(), free_port(), log_dir)
    nodes = []
    for rank in (0, 1):
        argv = [*cfg.argv(rank), "--served-model-name", SERVED]
        env = node_env(rank, extra_env or {}, drop_env)
        name = f"{tag}-rank{rank}"
        nodes.append(Server(name, cfg.port, log_dir / f"{name}.log", argv, env))
    return RealPair(nodes)
