"""A real two-node TP=2 vLLM pair on loopback, for the peer-loss probes.

Node 0 serves (``VLLM_HOST_IP=127.0.0.1``), node 1 is ``--headless``
(``VLLM_HOST_IP=127.0.0.2``), ``--distributed-executor-backend mp --nnodes 2``, as the
launcher starts them on two Sparks. Each node runs in its own process group, so a
"docker kill" of a node is one SIGKILL to the group and nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

SPEC = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'
ENV = {
    "TORCH_COMPILE_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


@dataclass
class PairConfig:
    vllm: Path  # the engine venv's `vllm`
    model: Path
    port: int
    master_port: int
    logs: Path  # directory for rank logs
    plugin_path: str = ""  # PYTHONPATH for our vLLM plugin, if it should load

    def argv(self, rank: int) -> list[str]:
        out = [str(self.vllm), "serve", str(self.model), "--tokenizer-mode", "deepseek_v4"]
        out += ["--enforce-eager", "--speculative-config", SPEC, "--tensor-parallel-size", "2"]
        out += ["--distributed-executor-backend", "mp", "--nnodes", "2"]
        out += ["--node-rank", str(rank), "--master-addr", "127.0.0.1"]
        out += ["--master-port", str(self.master_port)]
        if rank == 0:
            return [*out, "--host", "127.0.0.1", "--port", str(self.port)]
        return [*out, "--headless"]


class Pair:
    """Both nodes of one pair, started together, stopped together."""

    def __init__(self, cfg: PairConfig, tag: str, extra_env: dict[str, str] | None = None) -> None:
        self.cfg, self.tag = cfg, tag
        self.base = f"http://127.0.0.1:{cfg.port}"
        self.procs: list[subprocess.Popen] = []
        self.log_paths = [cfg.logs / f"{tag}-rank{r}.log" for r in (0, 1)]
        for rank in (0, 1):
            env = {**os.environ, **ENV, **(extra_env or {}), "VLLM_HOST_IP": f"127.0.0.{rank + 1}"}
            if cfg.plugin_path:
                env["PYTHONPATH"] = cfg.plugin_path
            with open(self.log_paths[rank], "w") as fh:
                self.procs.append(
                    subprocess.Popen(
                        cfg.argv(rank),
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until rank 0's /health answered 200; raises if a node died first."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for rank, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"rank {rank} exited {p.returncode} while booting")
            if self.health() == 200:
                return time.monotonic() - t0
            time.sleep(1)
        raise TimeoutError(f"pair not ready in {timeout:.0f} s; see {self.log_paths[0]}")

    def health(self) -> int | str:
        try:
            return requests.get(self.base + "/health", timeout=3).status_code
        except requests.RequestException as exc:
            return type(exc).__name__

    def kill(self, rank: int, sig: int = signal.SIGKILL, group: bool = True) -> None:
        """``group``: the whole node (docker kill); else the main process only (docker stop
        sends SIGTERM to the container's init, the `vllm serve` process)."""
        p = self.procs[rank]
        try:
            if group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        except ProcessLookupError:
            pass

    def wait_exit(self, rank: int, timeout: float) -> int | None:
        try:
            return self.procs[rank].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        for rank in (0, 1):
            self.kill(rank)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                pass
