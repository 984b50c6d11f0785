"""A fake pair for launcher tests: state for tests/fakes/bin tools, an env file, a runner.

The pair's endpoint is the tests' one fake server (tests/fakes/mock_openai.py, `pair_endpoint`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pairctl.engine.stack import DEFAULT_STACK, load_stack
from pairctl.preflight.argcheck import MARK as ARGCHECK_MARK
from pairctl.preflight.imageprobe import MARK as IMAGEPROBE_MARK
from tests.fakes.mock_openai import MockConfig, MockServer

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
FAKES = REPO / "tests" / "fakes" / "bin"
SECRET = "hf_unitTestSecretValue123"
IMAGE = "vllm-dspark:test"
IMAGE_ID = "sha256:" + "ab" * 32


def pair_endpoint() -> MockServer:
    """The served pair as the launcher's health wait and `status` see it (a context manager).

    One model, two requests running and one waiting; it answers chat but does not know the
    quality gate's reference answers.
    """
    return MockServer(MockConfig(model_id="/models/dsv4", running_base=2, waiting_base=1))


def image_probe_reply(stack: str = DEFAULT_STACK, **changes: object) -> dict:
    """What the image probe (pairctl/preflight/inimage.py) prints in a clean image of
    ``stack``: its vLLM and torch as the stack declares them, a good NCCL, cutlass-dsl and
    FlashInfer with both TOPK=256 halves; ``changes`` override sections (``nccl={...}``)."""
    st = load_stack(stack)
    vllm = st.components.get("vllm", st.vllm)
    torch = st.components.get("torch", "2.13.0")
    doc = {
        "probe_version": 1,
        "python": "3.12.3",
        "executable": st.interpreter,
        "vllm": {"version": vllm, "dist": "vllm", "dist_version": vllm, "error": ""},
        "torch_required": {"specifiers": [f"=={torch}"], "raw": [f"torch=={torch}"], "note": ""},
        "torch": {"version": torch, "cuda": "13.0", "nccl": "2.30.7", "error": ""},
        "nccl": {"loaded": "2.30.7", "library": "libnccl.so.2", "dists": {}, "conda": None},
        "flashinfer": {
            "version": st.components.get("flashinfer", "0.6.18"),
            "decode": True,
            "decode_how": "fake",
            "prefill": True,
            "prefill_how": "fake",
        },
        "cutlass_dsl": "4.8.0",
        "deep_gemm": None,
        "overlays": {"ran": False, "result": None, "detail": "plugin check unavailable (fake)"},
    }
    doc.update(changes)
    return {"out": IMAGEPROBE_MARK + json.dumps(doc)}


def free_port(other_than: int | None = None) -> int:
    """A port free now; ``other_than``: never that one (a port just drawn and closed may be
    drawn again, and the launcher refuses MASTER_PORT equal to PORT)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != other_than:
            return port


class Env:
    """A fake pair: state file, call log, env file, and a runner for the launcher."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp = tmp
        self.state_path = tmp / "state.json"
        self.log_path = tmp / "calls.jsonl"
        model = tmp / "model"
        model.mkdir()
        # RDMA devices as the probe sees them: character devices (links to /dev/null, which
        # any user can make; a real node has /dev/infiniband/uverbs*).
        rdma = tmp / "infiniband"
        rdma.mkdir()
        for name in ("uverbs0", "uverbs1"):
            (rdma / name).symlink_to("/dev/null")
        (model / "config.json").write_text('{"model_type": "deepseek_v4"}')
        (model / "tokenizer.json").write_text("{}")
        self.values = {
            "PAIR_ID": "pair-a",
            "SPARK1": "127.0.0.1",
            "SPARK2": "127.0.0.2",
            # free: preflight's PF-FABRIC-REACH listens on it for a moment
            "MASTER_PORT": str(free_port(other_than=port)),
            "PORT": str(port),
            "SSH_USER": "bird",
            "SSH_KNOWN_HOSTS_FILE": str(tmp / "known_hosts"),
            "IMAGE": IMAGE,
            "MODEL_PATH": str(model),
            "OVERLAY_DIR": str(tmp / "overlays"),
            "TILELANG_CACHE_DIR": str(tmp / "tilelang"),
            "VLLM_CACHE_ROOT": str(tmp / "cache" / "vllm"),
            "TRITON_CACHE_DIR": str(tmp / "cache" / "triton"),
            "FLASHINFER_WORKSPACE_BASE": str(tmp / "cache" / "flashinfer"),
            "DG_JIT_CACHE_DIR": str(tmp / "cache" / "deep_gemm"),
            "RDMA_DEVICE_DIR": str(rdma),
            "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_IB_HCA": "",
            "HF_TOKEN": SECRET,
        }
        self.env_file = tmp / "pair.env"
        self.write_env()
        accepted = {"ok": True, "flag": "", "error": ""}
        host = {
            "addrs": [],
            "listen": [],
            "images": {IMAGE: IMAGE_ID},
            "containers": [],
            "throwaway": {
                "out": ARGCHECK_MARK + json.dumps({"vllm": "0.33.0", "results": [accepted] * 2})
            },
            "throwaways": {"imageprobe": image_probe_reply()},
        }
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
        """Containers started (`run -d`): a rank. The argv check's `run --rm` is no start."""
        return [c for c in self.calls() if c["argv"][:1] == ["run"] and "--rm" not in c["argv"]]

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

    def run(
        self,
        *args: str,
        timeout: float = 60,
        path_first: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run the launcher; ``path_first`` puts a test's own stand-ins before the fakes,
        ``env`` adds or overrides environment variables."""
        argv = [str(LAUNCHER)]
        if "--env-file" not in args:
            argv += ["--env-file", str(self.env_file)]
        argv += args
        p = subprocess.run(
            argv,
            env=self.environ(path_first, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert SECRET not in p.stdout + p.stderr, "secret leaked into launcher output"
        return p

    def environ(
        self, path_first: Path | None = None, env: dict[str, str] | None = None
    ) -> dict[str, str]:
        """The launcher's environment in these tests: fakes first on PATH, fast polls."""
        extra = env or {}
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
            # The argv check as on a Spark: the image's parser in a throwaway container,
            # which the fake docker answers from the host's "throwaway" reply (accepted by
            # default). The local vLLM parser costs seconds per argv; tests/test_argcheck.py
            # runs it. Its cache stays in the test's dir, never the user's ~/.cache.
            PAIRCTL_ARGCHECK="image",
            XDG_CACHE_HOME=str(self.tmp / "xdg-cache"),
        )
        if path_first is not None:
            env["PATH"] = f"{path_first}:{env['PATH']}"
        env.update(extra)
        return env


# Fixtures of the launcher tests (tests/test_launcher.py, tests/test_launcher_ops.py);
# tests/conftest.py registers this module as a plugin, so both get the same ones.
@pytest.fixture()
def endpoint():
    with pair_endpoint() as srv:
        yield srv.port


@pytest.fixture()
def pair(tmp_path: Path, endpoint: int) -> Env:
    return Env(tmp_path, endpoint)


@pytest.fixture()
def dead_pair(tmp_path: Path) -> Env:
    """A pair whose endpoint never answers (nothing listens on its port)."""
    return Env(tmp_path, free_port())
