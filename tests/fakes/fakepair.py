"""A fake pair for launcher tests: state for tests/fakes/bin tools, an env file, a runner.

Also a tiny OpenAI-ish endpoint (/health, /v1/models, /metrics) for the health wait.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
FAKES = REPO / "tests" / "fakes" / "bin"
SECRET = "hf_unitTestSecretValue123"
IMAGE = "vllm-dspark:test"
IMAGE_ID = "sha256:" + "ab" * 32


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        if self.path == "/health":
            body, ctype = b"", "text/plain"
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "/models/dsv4", "owned_by": "vllm"}]}).encode()
            ctype = "application/json"
        elif self.path == "/metrics":
            body = (
                b'vllm:num_requests_running{model_name="m"} 2.0\n'
                b'vllm:num_requests_waiting{model_name="m"} 1.0\n'
            )
            ctype = "text/plain"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve_endpoint() -> ThreadingHTTPServer:
    """Start the fake endpoint on a free port; caller shuts it down."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Env:
    """A fake pair: state file, call log, env file, and a runner for the launcher."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp = tmp
        self.state_path = tmp / "state.json"
        self.log_path = tmp / "calls.jsonl"
        model = tmp / "model"
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "deepseek_v4"}')
        (model / "tokenizer.json").write_text("{}")
        self.values = {
            "PAIR_ID": "pair-a",
            "SPARK1": "127.0.0.1",
            "SPARK2": "127.0.0.2",
            "MASTER_PORT": "29501",
            "PORT": str(port),
            "SSH_USER": "bird",
            "SSH_KNOWN_HOSTS_FILE": str(tmp / "known_hosts"),
            "IMAGE": IMAGE,
            "MODEL_PATH": str(model),
            "OVERLAY_DIR": str(tmp / "overlays"),
            "TILELANG_CACHE_DIR": str(tmp / "tilelang"),
            "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_IB_HCA": "",
            "HF_TOKEN": SECRET,
        }
        self.env_file = tmp / "pair.env"
        self.write_env()
        host = {"addrs": [], "listen": [], "images": {IMAGE: IMAGE_ID}, "containers": []}
        self.state = {
            "hosts": {
                "h1": dict(host, addrs=["127.0.0.1"], containers=[]),
                "h2": dict(host, addrs=["127.0.0.2"], containers=[]),
            },
            "ssh": {"127.0.0.2": "h2"},
            "ssh_fail": "",
        }
        self.save()

    def write_env(self) -> None:
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state))

    def load(self) -> dict:
        return json.loads(self.state_path.read_text())

    def calls(self, tool: str = "docker") -> list[dict]:
        if not self.log_path.exists():
            return []
        rows = [json.loads(x) for x in self.log_path.read_text().splitlines()]
        return [r for r in rows if r["tool"] == tool]

    def runs(self) -> list[dict]:
        return [c for c in self.calls() if c["argv"][:1] == ["run"]]

    def removes(self) -> list[dict]:
        return [c for c in self.calls() if c["argv"][:1] == ["rm"]]

    def add_container(self, host: str, name: str, pair: str, rank: int, state="running"):
        self.state["hosts"][host]["containers"].append(
            {
                "ID": f"{name}-id",
                "Name": name,
                "State": state,
                "ExitCode": 0,
                "Labels": {
                    "dsv4.pair": pair,
                    "dsv4.rank": str(rank),
                    "dsv4.role": "head" if rank == 0 else "worker",
                },
                "Logs": ["Application startup complete."],
            }
        )
        self.save()

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(
            os.environ,
            PATH=f"{FAKES}:{os.environ['PATH']}",
            FAKE_STATE=str(self.state_path),
            FAKE_LOG=str(self.log_path),
            FAKE_HOST="h1",
            FAKE_PY=sys.executable,
            PAIRCTL_PYTHON=sys.executable,
            PAIRCTL_POLL_S="0.2",
            XDG_RUNTIME_DIR=str(self.tmp),
        )
        argv = [str(LAUNCHER)]
        if "--env-file" not in args:
            argv += ["--env-file", str(self.env_file)]
        argv += args
        p = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert SECRET not in p.stdout + p.stderr, "secret leaked into launcher output"
        return p
