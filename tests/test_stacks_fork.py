"""The fork stack, line by line against a peer's working compose for the same image.

tests/data/peers/miaai-first-compose.yaml is MiaAI-Lab's head container (env, the
command's exports, the `vllm serve` argv) for vllm-dspark-runtime:clean, the image our
launch/image/Dockerfile builds. Our `plan` for the fork stack, given that peer's host values
(its RoCE devices, master address, port), must carry every one of its variables and flags
with the same value, unless the difference is listed below with why. A listed difference
that stopped being one fails too, so the table cannot rot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dotenv import dotenv_values

from pairctl.engine.stack import load_stack
from pairctl.pair.config import parse_env
from pairctl.pair.plan import build_rank
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import ResolvedPair, resolve
from pairctl.pair.stacked import DOCKER_DEFAULT_PATH

REPO = Path(__file__).resolve().parents[1]
PEER = yaml.safe_load((REPO / "tests" / "data" / "peers" / "miaai-first-compose.yaml").read_text())
FORK = load_stack("fork")

# Peer variables we do not set to the peer's value, and why.
ENV_DIFFERENCES = {
    "HF_HOME": "its hub cache volume; our ranks read a local MODEL_PATH (`model fetch`), "
    "mounted read-only at the same path, and never the hub",
    "HF_HUB_OFFLINE": "its compose defaults to 0 (its later .env.dspark.example sets 1); ours "
    "is 1: the weights are local, no hub call or re-download at boot",
    "TRANSFORMERS_OFFLINE": "0 there; HF_HUB_OFFLINE=1 already keeps transformers off the hub "
    "(huggingface_hub constants.py reads either)",
    "HF_HUB_DISABLE_XET": "a download setting; the ranks download nothing (`model fetch` does)",
    "VLLM_B12X_W4A16_FORCE_TILE_CONFIG": 'empty there, which is the fork\'s envs.py default (""); '
    "the launcher drops empty values",
    "VLLM_DSV4_B12X_COMPRESSED_MLA": "0 there (the fork's default); preflight "
    "PF-NO-COMPRESSED-MLA refuses the variable anywhere, since its toggle hang wedged a host's "
    "unified memory (the seed)",
    "NCCL_IB_DISABLE": "0 is NCCL's default; NCCL_NET=IB (both) makes a missing RDMA device a "
    "loud init failure anyway",
    "NCCL_CROSS_NIC": "fabric tuning, not the engine stack's; the recipe's NCCL settings follow "
    "eugr/spark-vllm-docker docs/NETWORKING.md, which sets neither way; not measured here",
    "NCCL_DEBUG": "a log level only",
    "NCCL_NVLS_ENABLE": "NVLink SHARP: a Spark pair has no NVLink switch for NCCL to find",
    "NODE_RANK": "compose plumbing for its command line; vLLM gets --node-rank (same value)",
    "HEADLESS": "compose plumbing for its command line; vLLM gets --headless on rank 1",
    "MASTER_ADDR": "compose plumbing; vLLM gets --master-addr (same value) and initialises "
    "torch.distributed with tcp://, not env://",
    "MASTER_PORT": "compose plumbing; vLLM gets --master-port (same value)",
    "MTP_NUM_TOKENS": "compose plumbing; the recipe's speculative-config says 5",
}
# Peer flags we do not pass with the peer's value, and why.
FLAG_DIFFERENCES = {
    "MODEL": "the hub id through its HF_HOME cache there; ours the local MODEL_PATH",
    "--pipeline-parallel-size": "1 is vLLM's default (vllm/config/parallel.py)",
    "--enable-prefix-caching": "on is vLLM's default (vllm/config/cache.py enable_prefix_caching)",
    "--reasoning-config": "the strings a thinking-token budget forces (vllm/config/reasoning.py); "
    "the recipe sets no budget",
    "--default-chat-template-kwargs": "a server-wide thinking default for clients; ours leaves it "
    "to each request's chat_template_kwargs (the gate and benches send their own)",
}
# Fork-stack items the peer's first compose does not set, and where they come from instead.
OURS_ONLY = {
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "bjk110 .env.unholy-fusion; Anemll",
    "VLLM_ENGINE_READY_TIMEOUT_S": "timeouts.engine_ready_s (vLLM's 600 s < the first boot)",
}


def _pair() -> ResolvedPair:
    values = dict(dotenv_values(REPO / ".env.example"), **PEER["host"])
    return resolve(parse_env(values), load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml"))


def _head() -> tuple[dict[str, str], list[str]]:
    """Rank 0's container env, and its command: the --entrypoint, then what follows the image."""
    rp = build_rank(_pair(), 0)
    argv = list(rp.docker_argv)
    entrypoint = argv[argv.index("--entrypoint") + 1]
    return dict(rp.env), [entrypoint, *argv[argv.index(rp.image) + 1 :]]


def _flags(argv: list[str]) -> dict[str, str]:
    """``serve MODEL --flag v ...`` -> {"MODEL": m, "--flag": "v", "--switch": ""}."""
    out = {"MODEL": argv[1]}
    i = 2
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if has_value else ""
        i += 2 if has_value else 1
    return out


def _same(a: str, b: str) -> bool:
    if a.startswith("{") and b.startswith("{"):
        return json.loads(a) == json.loads(b)
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


@pytest.mark.parametrize("name", sorted(PEER["environment"]))
def test_every_peer_variable_is_ours_or_a_listed_difference(name: str) -> None:
    env, _ = _head()
    theirs = PEER["environment"][name]
    if name in ENV_DIFFERENCES:
        assert env.get(name) != theirs, f"{name} is no longer a difference: drop it from the list"
        return
    assert env.get(name) == theirs, (name, env.get(name), theirs)


@pytest.mark.parametrize("name", sorted(PEER["exports"]))
def test_every_export_of_the_peers_command_is_in_our_env(name: str) -> None:
    env, _ = _head()
    export = PEER["exports"][name]
    if export.get("prepend"):
        # in front of the image's own value (plan reads no image: docker's default PATH)
        base = DOCKER_DEFAULT_PATH if name == "PATH" else ""
        assert env[name] == ":".join(x for x in (export["value"], base) if x)
    else:
        assert env[name] == export["value"]


def test_the_entrypoint_and_every_peer_flag() -> None:
    _, line = _head()
    entrypoint, cmd = line[0], line[1:]
    assert entrypoint == PEER["entrypoint"] == FORK.entrypoint
    ours, theirs = _flags(cmd), _flags(PEER["command"])
    assert cmd[0] == PEER["command"][0] == "serve"
    for flag, value in theirs.items():
        if flag in FLAG_DIFFERENCES:
            assert flag not in ours or not _same(ours[flag], value), f"{flag}: no longer differs"
            continue
        assert flag in ours, f"{flag} {value}: the peer passes it, our plan does not"
        assert _same(ours[flag], value), (flag, ours[flag], value)


def test_every_fork_stack_item_is_the_peers_or_has_a_source() -> None:
    """The other direction: the stack adds nothing the peer lacks without saying where from."""
    peer_env = {**PEER["environment"], **PEER["exports"]}
    peer_flags = _flags(PEER["command"])
    extra = [v.name for v in FORK.env if v.name not in peer_env]
    extra += [f"--{f.name}" for f in FORK.flags if f"--{f.name}" not in peer_flags]
    if FORK.engine_ready_s is not None:
        extra.append("VLLM_ENGINE_READY_TIMEOUT_S")
    assert sorted(extra) == sorted(OURS_ONLY)


def test_the_differences_say_why() -> None:
    for table in (ENV_DIFFERENCES, FLAG_DIFFERENCES, OURS_ONLY):
        assert all(len(why.split()) >= 3 for why in table.values())
