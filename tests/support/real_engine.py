"""One real single-node vLLM server (the CPU engine, tiny model) for the live tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import requests

from tests.support.twin import REPO

ENGINE_PY = REPO / ".venv-engine" / "bin" / "python"
SPEC = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'
# Boot limits of the real CPU engine in the tests: five times the measured idle boot (docs/
# rehearsal.md, "Measured": a single-node server 44-53 s, a TP=2 pair through `up` 52-54 s on an
# idle 2-core box). The suite runs the heavy modules one at a time (tests/conftest.py), beside the
# light ones on the other worker, so a boot sees at most one core's worth of competition; a limit
# that is reached names the phase that was slow (`up`: pairctl's boot watch; here: the log tail).
IDLE_SERVER_BOOT_S = 53
IDLE_PAIR_BOOT_S = 54
BOOT_HEADROOM = 5
SERVER_BOOT_LIMIT_S = BOOT_HEADROOM * IDLE_SERVER_BOOT_S
PAIR_BOOT_LIMIT_S = BOOT_HEADROOM * IDLE_PAIR_BOOT_S
# A TP=4 group on four netns hosts (docs/rehearsal.md, "A TP=4 group"): measured idle boot.
IDLE_GROUP_BOOT_S = 120
GROUP_BOOT_LIMIT_S = BOOT_HEADROOM * IDLE_GROUP_BOOT_S
# the flags the real snapshot was recorded with (tests/data/real_engine/README.md)
SERVE_FLAGS = ["--tokenizer-mode", "deepseek_v4", "--enforce-eager", "--speculative-config", SPEC]


def tiny_model() -> Path:
    out = subprocess.run(
        [str(ENGINE_PY), "-m", "sim.engine.tiny_model"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return Path(out.stdout.strip().splitlines()[-1])


class RealServer:
    """`vllm serve` in its own process group, so stop() ends its engine and workers too."""

    def __init__(
        self,
        port: int,
        log_path: Path,
        spec: str = SPEC,
        extra: tuple[str, ...] = (),
        *,
        model: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``spec``: the --speculative-config (default the recorded snapshot's ngram one);
        ``extra``: more `vllm serve` flags; ``model``: another checkpoint than the tiny
        model's; ``env``: added last (the overlays' flags, DSV4_OVERLAY_HOOKS)."""
        self.port, self.log_path = port, log_path
        full_env = dict(os.environ)
        full_env.update(
            TORCH_COMPILE_DISABLE="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_HOST_IP="127.0.0.1",
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            PYTHONPATH=str(REPO / "mods" / "dsv4-flash-overlays"),
        )
        full_env.update(env or {})
        flags = [*SERVE_FLAGS[:-1], spec, *extra]  # SERVE_FLAGS ends with the spec config
        argv = [str(ENGINE_PY.parent / "vllm"), "serve", str(model or tiny_model()), *flags]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        self._fh = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=self._fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = SERVER_BOOT_LIMIT_S) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise AssertionError(f"vllm not up in {timeout} s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout: float = SERVER_BOOT_LIMIT_S) -> int:
        """For a boot that must fail: its exit code; AssertionError if it served or hung."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            rc = self.proc.poll()
            if rc is not None:
                return rc
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    raise AssertionError(f"vllm came up:\n{self.log()[-3000:]}")
            except requests.RequestException:
                pass
            time.sleep(1)
        raise AssertionError(f"vllm neither up nor exited in {timeout} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the server (docker stop's signal); its exit code, None if still up."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self._fh.close()
