"""Run a script that imports vLLM without paying for torch, transformers and the rest of
vLLM's third-party imports each time (~6 of a script's ~10 CPU-s on this machine).

``run(python, argv, ...)`` is ``subprocess.run([python, *argv], capture_output=True,
text=True, ...)`` for the tests' vLLM checks (the argv parser, the overlay check, hook
resolution, the image probe, `vllm bench serve`). The script runs in a fork of a server
process (tests/support/warm_server.py) that imported those modules once: vLLM itself and this
repo's packages still import afresh in every script, with the script's own environment,
working directory, PYTHONPATH, arguments and standard streams, and its exit status is a new
interpreter's. A server is started on first use, one for each interpreter and each set of the
variables that libraries read when imported (HOME, HF_*, OMP_*, ...; a request whose values
differ gets a server of its own), and ends with the test process.

Not for scripts whose point is a bare interpreter (``-S``, ``-I``: run them as they are),
nor for real engines. ``DSV4_WARM_PYTHON=0`` runs every script as a plain child process.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

SERVER = Path(__file__).with_name("warm_server.py")
OFF_ENV = "DSV4_WARM_PYTHON"
# The modules whose third-party imports a server loads (one that a vLLM lacks is skipped).
TARGETS = (
    "vllm.engine.arg_utils",
    "vllm.entrypoints.openai.cli_args",
    "vllm.entrypoints.cli.main",
    "vllm.tokenizers",
)
# Variables nothing a server preloads reads at import: vLLM's and the overlays' own (read by
# vLLM's lazy `envs` and by the plugin, both imported afresh), pytest's, the search paths.
LAZY_PREFIXES = ("VLLM_", "DSV4_", "PYTEST_")
LAZY_NAMES = {"PATH", "PYTHONPATH", "PWD", "OLDPWD", "SHLVL", "_"}
READY_TIMEOUT_S = 600.0


def import_time_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` that a server must have had when it imported its modules."""
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if k not in LAZY_NAMES and not k.startswith(LAZY_PREFIXES)
        )
    )


class _Server:
    def __init__(self, python: str, env: dict[str, str], targets: tuple[str, ...]) -> None:
        self.lock = threading.Lock()
        self._buf = b""
        self.log = tempfile.NamedTemporaryFile(prefix="warm-python-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [python, str(SERVER), json.dumps(targets)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd="/",
            env=env,
            start_new_session=True,
        )
        if json.loads(self._line(READY_TIMEOUT_S) or "{}").get("ready") is not True:
            raise RuntimeError(f"warm python {python} did not start: {self._log_tail()}")

    def _line(self, timeout: float | None) -> str | None:
        """One protocol line, None when ``timeout`` passed first. Read with os.read and a
        buffer of our own: a buffered reader would hold the server's next line where
        select() cannot see it (``pid`` and ``rc`` often arrive in one read)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"warm python server ended: {self._log_tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def _log_tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-2000:]

    def run(self, req: dict, timeout: float | None) -> tuple[int, bool]:
        """The script's exit status and whether ``timeout`` ended it."""
        assert self.proc.stdin is not None
        with self.lock:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            pid = json.loads(self._line(READY_TIMEOUT_S) or "{}")["pid"]
            line = self._line(timeout)
            if line is not None:
                return json.loads(line)["rc"], False
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return json.loads(self._line(60) or '{"rc": -9}')["rc"], True

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.log.close()


_servers: dict[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], _Server] = {}
_servers_lock = threading.Lock()


def _server(python: str, env: Mapping[str, str], targets: tuple[str, ...]) -> _Server:
    key = (python, targets, import_time_env(env))
    with _servers_lock:
        if key not in _servers:
            start_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            _servers[key] = _Server(python, start_env, targets)
        return _servers[key]


def servers() -> int:
    """How many servers this process has started (and not closed)."""
    return len(_servers)


@atexit.register
def close_all(targets: tuple[str, ...] | None = None) -> None:
    """End the servers (those preloading for ``targets`` alone, when given)."""
    with _servers_lock:
        for key in [k for k in _servers if targets is None or k[1] == targets]:
            _servers.pop(key).close()


def run(
    python: str | Path,
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,  # noqa: A002 - subprocess.run's name
    timeout: float | None = None,
    check: bool = False,
    targets: tuple[str, ...] = TARGETS,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, *argv], capture_output=True, text=True, ...)``, served warm
    by a server that preloaded what importing ``targets`` loads."""
    full = [str(python), *argv]
    env = dict(os.environ if env is None else env)
    # served: `-c CODE` and `-m MODULE`, or a script's path; any other flag goes to a new process
    served = bool(argv) and (argv[0] in ("-c", "-m") or not argv[0].startswith("-"))
    if os.environ.get(OFF_ENV) == "0" or not served:
        return subprocess.run(
            full, env=env, cwd=cwd, input=input, timeout=timeout, check=check,
            capture_output=True, text=True,
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="warm-run-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        if input is not None:
            Path(paths["stdin"]).write_text(input)
        req = {
            "argv": argv,
            "env": env,
            "cwd": str(Path(cwd).resolve()) if cwd is not None else os.getcwd(),
            "stdin": paths["stdin"] if input is not None else None,
            "stdout": paths["stdout"],
            "stderr": paths["stderr"],
        }
        rc, timed_out = _server(str(python), env, targets).run(req, timeout)
        out = Path(paths["stdout"]).read_text(errors="replace")
        err = Path(paths["stderr"]).read_text(errors="replace")
    if timed_out:
        raise subprocess.TimeoutExpired(full, timeout or 0, out, err)
    done = subprocess.CompletedProcess(full, rc, out, err)
    if check:
        done.check_returncode()
    return done
