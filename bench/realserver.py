"""Boot and stop a real single-node vLLM (the CPU engine venv) on loopback, for benches and tests.

Why a module: the headline bench (bench/headline_real.py) and the real-engine tokenizer-cache test
both need a real `vllm serve` with our plugin on PYTHONPATH, a readiness wait that notices a dead
server, a log to grep for the overlay's lines, and a stop that leaves no process or /dev/shm
segment behind whatever way the caller exits.

The env is the one the CPU engine needs on a small machine (docs/rehearsal.md): no torch.compile,
eager mode, a 1 GiB KV cache, loopback address, offline hub, no usage stats.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from pairctl.home import project_root

REPO = project_root()
OVERLAY_DIR = REPO / "mods/dsv4-flash-overlays"
ACTIVE_LINE = "dsv4-flash-overlays: incremental-encode-cache active"
# Logged by the overlay's encoder every VLLM_INCREMENTAL_ENCODE_LOG_INTERVAL_S
# (mods/dsv4-flash-overlays/dsv4_flash_overlays/incremental_encode.py, _maybe_log).
STATS_RE = re.compile(
    r"\(APIServer pid=(?P<pid>\d+)\).*incremental-encode\(deepseek_v4\): (?P<kv>calls=.*?) "
    r"\(pid \d+\)"
)


class ServerError(RuntimeError):
    """A server did not come up; the message says what to look at."""


def default_engine_venv() -> Path:
    """REPO/.venv-engine (make engine); a git worktree falls back to the main checkout's."""
    own = REPO / ".venv-engine"
    if own.exists():
        return own
    try:
        common = subprocess.run(
            ["git", "rev-parse", "--git-common-dir"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return own
    if common:
        main = (REPO / common).resolve().parent / ".venv-engine"
        if main.exists():
            return main
    return own


def build_model(venv: Path, spec: str) -> Path:
    """The tiny model's directory (sim/engine/tiny_model.py builds it once and caches it)."""
    out = subprocess.run(
        [str(venv / "bin/python"), "-m", "sim.engine.tiny_model", "--spec", spec],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise ServerError(f"building the tiny model failed: {out.stderr.strip()[-500:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def engine_env(cache_on: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "TORCH_COMPILE_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONPATH": str(OVERLAY_DIR),
        "VLLM_INCREMENTAL_ENCODE_CACHE": "1" if cache_on else "0",
        "VLLM_INCREMENTAL_ENCODE_LOG_INTERVAL_S": "1",
    }
    env.update(extra or {})
    return env


@dataclass
class Server:
    """One `vllm serve` in its own process group, logging to a file."""

    name: str
    port: int
    log_path: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    shm: set[str] = field(default_factory=set)
    started: float = 0.0
    ready_s: float | None = None

    @property
    def served_name(self) -> str:
        return self.argv[self.argv.index("--served-model-name") + 1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: stop() reaches every child
            )
        self.started = time.monotonic()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def poll_ready(self) -> bool:
        """True once /v1/models answers; ServerError if the process died."""
        if self.proc is None or self.proc.poll() is not None:
            tail = "\n".join(self.log_text().splitlines()[-15:])
            raise ServerError(
                f"{self.name} server exited during boot; log {self.log_path}:\n{tail}"
            )
        try:
            r = requests.get(f"{self.url}/v1/models", timeout=2)
            # Ours only: the served name we gave it, from a server whose boot log we write.
            ok = r.status_code == 200 and self.served_name in r.text and bool(self.log_text())
        except requests.RequestException:
            return False
        if ok and self.ready_s is None:
            self.ready_s = round(time.monotonic() - self.started, 1)
        return ok

    def _group_pids(self) -> list[int]:
        if self.proc is None:
            return []
        pgid = self.proc.pid
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if os.getpgid(int(d.name)) == pgid:
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def note_shm(self) -> None:
        """Remember the /dev/shm segments this server's processes map (removed after stop)."""
        for pid in self._group_pids():
            try:
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            for line in maps.splitlines():
                i = line.find("/dev/shm/")
                if i >= 0:
                    self.shm.add(line[i:].split(" (deleted)")[0].strip())

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL what is left after grace_s, then remove its shm segments."""
        if self.proc is None:
            return
        self.note_shm()
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._group_pids():
            self.proc.poll()  # reap the leader, or its zombie keeps the group "alive"
            time.sleep(0.2)
        if self._group_pids():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for path in self.shm:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.proc = None

    def overlay_active(self) -> bool:
        return ACTIVE_LINE in self.log_text()

    def encoder_stats(self) -> dict[str, int | str] | None:
        """The API server's last incremental-encode counter line, as a dict (None: none)."""
        last = None
        for m in STATS_RE.finditer(self.log_text()):
            last = m
        if last is None:
            return None
        out: dict[str, int | str] = {"api_server_pid": int(last["pid"])}
        for kv in last["kv"].split():
            k, _, v = kv.partition("=")
            out[k] = int(v) if v.isdigit() else v
        return out


def serve_argv(venv: Path, model: Path, port: int, served_name: str) -> list[str]:
    return [
        str(venv / "bin/vllm"),
        "serve",
        str(model),
        "--served-model-name",
        served_name,
        "--tokenizer-mode",
        "deepseek_v4",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def wait_all(
    servers: list[Server], timeout_s: float, log: Callable[[str], None], every_s: float = 10.0
) -> None:
    """Wait until every server answers; progress every every_s; ServerError on death/timeout."""
    t0 = time.monotonic()
    last = t0
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.poll_ready()]
        if not pending:
            break
        now = time.monotonic()
        if now - t0 > timeout_s:
            names = ", ".join(f"{s.name} (log {s.log_path})" for s in pending)
            raise ServerError(f"not ready after {timeout_s:.0f} s: {names}")
        if now - last >= every_s:
            last = now
            log(f"waiting for {', '.join(s.name for s in pending)}: {now - t0:.0f} s")
        time.sleep(1.0)
