"""Helpers for the twin's process-level tests: start, wait for, talk to and stop twins."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from pairctl.status.metrics import Scrape
from pairctl.status.metrics import parse as parse_metrics

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Twin:
    """One twin process with its log file."""

    def __init__(self, args: list[str], tmp: Path, name: str, env: dict | None = None) -> None:
        self.log_path = tmp / f"{name}.log"
        full_env = dict(os.environ)
        full_env.setdefault("TILELANG_CACHE_DIR", str(tmp / "tilelang"))
        full_env.pop("TWIN_FAULT", None)
        full_env.update(env or {})
        self.t0 = time.monotonic()
        self._fh = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sim.twin", "serve", *args],
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env=full_env,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 10.0) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log():
                return time.monotonic() - self.t0
            if self.proc.poll() is not None and text not in self.log():
                raise AssertionError(
                    f"twin exited {self.proc.returncode} before {text!r}:\n" + self.log()
                )
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.log()}") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.kill()
        try:
            self.proc.wait(5)
        finally:
            self._fh.close()


def wait_http(url: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not healthy within {timeout} s")


def stream(base: str, body: dict, path: str = "/v1/chat/completions") -> tuple[list, list, dict]:
    """POST a streaming request; returns (events, monotonic arrival times, headers)."""
    body = {**body, "stream": True}
    events, times = [], []
    with requests.post(base + path, json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines():
            if not line:
                continue
            assert line.startswith(b"data: "), line
            payload = line[6:]
            times.append(time.monotonic())
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
        return events, times, dict(resp.headers)


def metrics(base: str) -> Scrape:
    """The twin's /metrics, read by the repository's one parser (pairctl.status.metrics)."""
    return parse_metrics(requests.get(base + "/metrics", timeout=5).text)


def metric(snapshot: Scrape, name: str, **labels: str) -> float:
    """Sum of samples named ``name`` whose labels include ``labels`` (0 when there are none)."""
    return snapshot.total(name, **labels) or 0.0
