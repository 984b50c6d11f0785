"""launch/dspark_launch.sh end to end against fake docker/ssh/ip/ss (tests/fakes).

What must hold: failure paths never reach ``docker run``; ``down`` and cleanup touch only
this pair's labelled containers; secrets are never printed; exit codes follow
docs/INTERFACES.md; ``up`` on a healthy pair changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
            body = b"vllm:num_requests_running{model_name=\"m\"} 2.0\n" \
                   b"vllm:num_requests_waiting{model_name=\"m\"} 1.0\n"
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


@pytest.fixture()
def endpoint():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()


def _free_port() -> int:
    import socket

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
            "PAIR_ID": "pair-a", "SPARK1": "127.0.0.1", "SPARK2": "127.0.0.2",
            "MASTER_PORT": "29501", "PORT": str(port), "SSH_USER": "bird",
            "SSH_KNOWN_HOSTS_FILE": str(tmp / "known_hosts"), "IMAGE": IMAGE,
            "MODEL_PATH": str(model), "OVERLAY_DIR": str(tmp / "overlays"),
            "TILELANG_CACHE_DIR": str(tmp / "tilelang"), "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "", "HF_TOKEN": SECRET,
        }
        self.env_file = tmp / "pair.env"
        self.write_env()
        host = {"addrs": [], "listen": [], "images": {IMAGE: IMAGE_ID}, "containers": []}
        self.state = {"hosts": {"h1": dict(host, addrs=["127.0.0.1"], containers=[]),
                                "h2": dict(host, addrs=["127.0.0.2"], containers=[])},
                      "ssh": {"127.0.0.2": "h2"}, "ssh_fail": ""}
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
        self.state["hosts"][host]["containers"].append({
            "ID": f"{name}-id", "Name": name, "State": state, "ExitCode": 0,
            "Labels": {"dsv4.pair": pair, "dsv4.rank": str(rank),
                       "dsv4.role": "head" if rank == 0 else "worker"},
            "Logs": ["Application startup complete."]})
        self.save()

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(os.environ, PATH=f"{FAKES}:{os.environ['PATH']}",
                   FAKE_STATE=str(self.state_path), FAKE_LOG=str(self.log_path),
                   FAKE_HOST="h1", FAKE_PY=sys.executable, PAIRCTL_PYTHON=sys.executable,
                   PAIRCTL_POLL_S="0.2")
        argv = [str(LAUNCHER)]
        if "--env-file" not in args:
            argv += ["--env-file", str(self.env_file)]
        argv += args
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                           check=False)
        assert SECRET not in p.stdout + p.stderr, "secret leaked into launcher output"
        return p


@pytest.fixture()
def pair(tmp_path: Path, endpoint: int) -> Env:
    return Env(tmp_path, endpoint)


@pytest.fixture()
def dead_pair(tmp_path: Path) -> Env:
    """A pair whose endpoint never answers (nothing listens on its port)."""
    return Env(tmp_path, _free_port())


def test_help_and_bad_args(pair: Env) -> None:
    p = pair.run("--help")
    assert p.returncode == 0 and "preflight" in p.stdout and "Exit codes" in p.stdout
    p = pair.run("frobnicate")
    assert p.returncode == 2 and "unknown argument" in p.stderr
    p = pair.run("up", "--timeout", "soon")
    assert p.returncode == 2 and "--timeout" in p.stderr
    assert pair.calls() == [] and pair.calls("ssh") == []


def test_plan_has_exact_lines_and_masks_secret(pair: Env) -> None:
    p = pair.run("plan", "--", "--max-num-seqs", "16")
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("docker run")]
    assert len(lines) == 2
    worker, head = lines  # rank 1 first: that is the start order
    for line, rank, role in ((worker, 1, "worker"), (head, 0, "head")):
        for frag in (f"--name dsv4-pair-a-rank{rank}", "--label dsv4.pair=pair-a",
                     f"--label dsv4.rank={rank}", f"--label dsv4.role={role}",
                     "--network host --gpus all --ipc host",
                     f"{pair.values['OVERLAY_DIR']}:/opt/dsv4-flash-overlays:ro",
                     "-e PYTHONPATH=/opt/dsv4-flash-overlays",
                     "-e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=600",
                     "-e 'HF_TOKEN=***'", f"--node-rank {rank}", "--master-addr 127.0.0.1",
                     "--long-prefill-token-threshold 4096", "--max-num-seqs 24",
                     f"--port {pair.values['PORT']}"):
            assert frag in line, (frag, line)
        assert line.endswith("--max-num-seqs 16"), "passthrough must come last (CLI wins)"
    assert "--headless" in worker and "--headless" not in head
    assert pair.calls() == [], "plan must not run docker"


@pytest.mark.parametrize("line,needle", [
    ("PORT=eighty", "PORT"),
    ("SPARK2=", "SPARK2"),
    ("this is not an assignment", "malformed line"),
    ("MODEL_PATH=relative/path", "MODEL_PATH"),
])
def test_malformed_env_exits_2_and_touches_nothing(pair: Env, line: str, needle: str) -> None:
    text = pair.env_file.read_text()
    key = line.split("=")[0]
    text = "".join(x + "\n" for x in text.splitlines() if not x.startswith(key + "="))
    pair.env_file.write_text(text + line + "\n")
    cmds = ("up", "down", "plan", "preflight", "status") if needle == "PORT" else ("up", "plan")
    for cmd in cmds:
        p = pair.run(cmd)
        assert p.returncode == 2, (cmd, p.stderr)
        assert needle in p.stderr
    assert pair.calls() == [] and pair.calls("ssh") == []


def test_missing_required_var_named(pair: Env) -> None:
    del pair.values["SPARK1"]
    pair.write_env()
    p = pair.run("plan")
    assert p.returncode == 2 and "SPARK1 is missing" in p.stderr


def test_ssh_failure_is_preflight_fail_without_side_effects(pair: Env) -> None:
    pair.state["ssh_fail"] = "Host key verification failed."
    pair.save()
    p = pair.run("up")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "PF-SSH" in p.stdout and "host key" in p.stdout
    assert pair.runs() == [] and pair.removes() == []
    for c in pair.calls("ssh"):
        assert "BatchMode=yes" in c["argv"] and "StrictHostKeyChecking=yes" in c["argv"]


def test_foreign_pair_on_rank1_fails_and_survives(pair: Env) -> None:
    pair.add_container("h2", "dsv4-pair-b-rank1", "pair-b", 1)
    p = pair.run("up")
    assert p.returncode == 3
    assert "PF-FOREIGN-PAIR" in p.stdout and "pair-b" in p.stdout
    assert pair.runs() == [] and pair.removes() == []
    assert [c["Name"] for c in pair.load()["hosts"]["h2"]["containers"]] == ["dsv4-pair-b-rank1"]


def test_self_not_spark1_fails(pair: Env) -> None:
    pair.state["hosts"]["h1"]["addrs"] = ["10.9.9.9"]
    pair.values["SPARK1"] = "10.9.9.8"
    pair.write_env()
    pair.save()
    p = pair.run("preflight")
    assert p.returncode == 3 and "PF-SELF-IS-SPARK1" in p.stdout
    assert "FAIL  PF-SELF-IS-SPARK1" in p.stdout


def test_port_taken_by_foreign_process_fails(pair: Env) -> None:
    pair.state["hosts"]["h1"]["listen"] = [int(pair.values["PORT"])]
    pair.save()
    p = pair.run("up")
    assert p.returncode == 3 and "FAIL  PF-PORT-FREE" in p.stdout
    assert pair.runs() == []


def test_preflight_json_evidence(pair: Env) -> None:
    out = pair.tmp / "pf.json"
    p = pair.run("preflight", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    ids = {c["id"]: c["status"] for c in data["checks"]}
    assert ids["PF-SSH"] == "PASS" and ids["PF-IMAGE-MATCH"] == "PASS"
    assert ids["PF-OVERLAYS"] == "WARN"  # overlay dir absent: warn only
    assert ids["PF-HCA-2RAIL"] == "WARN"  # empty list
    assert SECRET not in out.read_text()
    assert pair.runs() == []


def test_up_starts_worker_then_head_and_is_idempotent(pair: Env) -> None:
    pair.add_container("h1", "dsv4-pair-a-rank0", "pair-a", 0, state="exited")  # stale
    pair.add_container("h1", "dsv4-pair-b-rank0", "pair-b", 0, state="exited")  # other pair
    p = pair.run("up")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "healthy after" in p.stderr
    runs = pair.runs()
    assert [(r["host"], r["argv"][r["argv"].index("--name") + 1]) for r in runs] == [
        ("h2", "dsv4-pair-a-rank1"), ("h1", "dsv4-pair-a-rank0")]
    assert [r["argv"][2:] for r in pair.removes()] == [["dsv4-pair-a-rank0-id"]]
    assert any("WARN" in x and "without overlays" in x for x in p.stderr.splitlines())
    assert "/opt/dsv4-flash-overlays" not in " ".join(runs[0]["argv"])
    names = {c["Name"] for c in pair.load()["hosts"]["h1"]["containers"]}
    assert "dsv4-pair-b-rank0" in names

    before = len(pair.calls())
    p = pair.run("up")
    assert p.returncode == 0 and "already up and healthy" in p.stdout
    new = pair.calls()[before:]
    assert not [c for c in new if c["argv"][0] in ("run", "rm")]

    p = pair.run("status")
    assert p.returncode == 0
    assert "dsv4-pair-a-rank0 running" in p.stdout and "dsv4-pair-a-rank1 running" in p.stdout
    assert "running 2, waiting 1" in p.stdout


def test_down_touches_only_this_pair(pair: Env) -> None:
    pair.add_container("h1", "dsv4-pair-a-rank0", "pair-a", 0)
    pair.add_container("h2", "dsv4-pair-a-rank1", "pair-a", 1)
    pair.add_container("h1", "dsv4-pair-b-rank0", "pair-b", 0)
    pair.add_container("h2", "dsv4-pair-b-rank1", "pair-b", 1)
    pair.state["hosts"]["h2"]["containers"].append({
        "ID": "unlabelled-id", "Name": "someone-else", "State": "running", "ExitCode": 0,
        "Labels": {}, "Logs": []})
    pair.save()
    p = pair.run("down")
    assert p.returncode == 0, p.stderr
    st = pair.load()
    assert {c["Name"] for c in st["hosts"]["h1"]["containers"]} == {"dsv4-pair-b-rank0"}
    assert {c["Name"] for c in st["hosts"]["h2"]["containers"]} == {
        "dsv4-pair-b-rank1", "someone-else"}
    removed = [a for r in pair.removes() for a in r["argv"][2:]]
    assert sorted(removed) == ["dsv4-pair-a-rank0-id", "dsv4-pair-a-rank1-id"]
    for c in pair.calls():
        if c["argv"][0] == "ps":
            assert any(a.startswith("label=dsv4.pair=pair-a") for a in c["argv"])


def test_rank1_crash_during_boot_tears_down_both(dead_pair: Env) -> None:
    dead_pair.state["hosts"]["h2"]["run"] = "exited"
    dead_pair.save()
    p = dead_pair.run("up", "--timeout", "30")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "rank 1" in p.stderr and "rank crashed (fake)" in p.stderr
    st = dead_pair.load()
    assert st["hosts"]["h1"]["containers"] == [] and st["hosts"]["h2"]["containers"] == []


def test_timeout_tears_down_both(dead_pair: Env) -> None:
    p = dead_pair.run("up", "--timeout", "1")
    assert p.returncode == 5, p.stdout + p.stderr
    assert "TIMEOUT" in p.stderr
    st = dead_pair.load()
    assert st["hosts"]["h1"]["containers"] == [] and st["hosts"]["h2"]["containers"] == []


def test_logs_rank1_goes_over_ssh(pair: Env) -> None:
    pair.add_container("h2", "dsv4-pair-a-rank1", "pair-a", 1)
    p = pair.run("logs", "--rank", "1", "--tail", "5")
    assert p.returncode == 0, p.stderr
    assert "Application startup complete." in p.stdout
    assert pair.calls()[-1]["host"] == "h2"


def test_generated_docker_lines_parse_with_real_docker_client(pair: Env) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on PATH")
    for rank in (0, 1):
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "pairctl_cli.py"), "argv", "--rank",
             str(rank), "--env-file", str(pair.env_file)],
            capture_output=True, check=True).stdout.decode()
        argv = out.rstrip("\0").split("\0")
        env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
        p = subprocess.run([docker, *argv], capture_output=True, text=True, env=env,
                           timeout=30, check=False)
        msg = p.stdout + p.stderr
        assert "unknown flag" not in msg and "invalid argument" not in msg, msg
        assert "Cannot connect to the Docker daemon" in msg or "docker.sock" in msg, msg


def test_shellcheck_clean() -> None:
    sc = shutil.which("shellcheck")
    if sc is None:
        pytest.skip("shellcheck not installed")
    scripts = [LAUNCHER, *sorted((REPO / "scripts").glob("sync_overlays.sh")),
               *sorted(FAKES.iterdir())]
    p = subprocess.run([sc, "-x", *map(str, scripts)], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stdout
