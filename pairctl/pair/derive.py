"""What ``resolve`` derives from the env file and the recipe: each rank's values and argv.

Pure functions of config + recipe (+ the image's facts for the container env): the PORT
default, the image, each rank's ``${NAME}`` placeholders, its ``vllm serve`` argv and
container env, and the plan hash. ``pairctl.pair.resolved`` computes them once into the
resolved pair; ``pairctl.pair.plan`` builds the ``docker run`` lines from that pair, so
the two never import each other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pairctl.engine.image import ImageFacts, pythonpath
from pairctl.pair.config import SECRET_NAMES, ConfigError, PairConfig
from pairctl.pair.recipe import Recipe, serve_argv, substitute

# Where the overlay folder is mounted in the container (appended to its PYTHONPATH).
OVERLAY_MOUNT = "/opt/dsv4-flash-overlays"
# Secrets only the API server (rank 0) needs.
HEAD_ONLY_SECRETS = ("VLLM_API_KEY",)
_SECRET_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE_KEY)", re.I)


def is_secret(key: str) -> bool:
    """Env keys whose values must never be printed."""
    return key in SECRET_NAMES or bool(_SECRET_RE.search(key))


def with_recipe_defaults(cfg: PairConfig, recipe: Recipe) -> PairConfig:
    """Fill env values the recipe provides defaults for (PORT: env > recipe > 8000)."""
    if cfg["PORT"]:
        return cfg
    values = dict(cfg.values, PORT=str(recipe.serve.get("port", 8000)))
    return replace(cfg, values=values)


def resolve_image(cfg: PairConfig, recipe: Recipe) -> str:
    """IMAGE from .env wins over the recipe's container.image."""
    image = cfg["IMAGE"] or recipe.image
    if not image:
        raise ConfigError("no image: set IMAGE in the env file or container.image in the recipe")
    return image


def placeholders(cfg: PairConfig, rank: int) -> dict[str, str]:
    """The recipe's ``${NAME}`` values for one rank: the env file's, plus FABRIC1/FABRIC2 and
    MASTER_ADDR with their defaults, NODE_IP (this rank's fabric address, not its ssh
    address: vLLM binds its cross-node message queue there) and RANK."""
    values = dict(cfg.values)
    values["FABRIC1"], values["FABRIC2"] = cfg.fabric_addr(0), cfg.fabric_addr(1)
    values["MASTER_ADDR"] = cfg.master_addr
    values["NODE_IP"] = cfg.fabric_addr(rank)
    values["RANK"] = str(rank)
    return values


def vllm_args(
    cfg: PairConfig,
    recipe: Recipe,
    rank: int,
    values: Mapping[str, str],
    passthrough: Sequence[str],
) -> list[str]:
    """``vllm serve MODEL <recipe args> <per-rank args> <passthrough>``; ``cfg`` has the
    recipe's defaults applied (PORT), ``values`` are the rank's placeholders."""
    serve = dict(recipe.serve)
    serve["port"] = int(cfg["PORT"])  # env PORT > recipe port
    argv = ["vllm", "serve", cfg["MODEL_PATH"]]
    argv += serve_argv(serve, values)
    argv += [
        "--node-rank",
        str(rank),
        "--master-addr",
        cfg.master_addr,
        "--master-port",
        cfg["MASTER_PORT"],
    ]
    if rank == 1:
        argv.append("--headless")
    argv += passthrough
    return argv


def container_env(
    recipe: Recipe,
    rank: int,
    values: Mapping[str, str],
    overlay: bool,
    image: ImageFacts | None = None,
) -> dict[str, str]:
    """Recipe env with placeholders filled; empty values are dropped (e.g. NCCL_IB_HCA='').
    ``values`` are the rank's placeholders: the env file's variables among them (the
    secrets, CONTAINER_USER).

    With the overlays, PYTHONPATH is the image's own PYTHONPATH (``image``, read on the
    node) with the overlay mount appended.
    """
    env: dict[str, str] = {}
    for k, v in recipe.env.items():
        val = substitute(v, values, f"recipe env {k}")
        if val != "":
            env[k] = val
    if overlay:
        env["PYTHONPATH"] = pythonpath(image, OVERLAY_MOUNT)
    if values["CONTAINER_USER"]:
        # A UID the image has no passwd entry for gets HOME=/ (not writable): anything
        # that still writes under ~ goes to /tmp instead (the known JIT caches are all
        # mounted and named in the recipe env).
        env["HOME"] = "/tmp"
    for name in sorted(SECRET_NAMES):
        if values.get(name) and (rank == 0 or name not in HEAD_ONLY_SECRETS):
            env[name] = values[name]
    return env


def plan_hash(argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], image: str) -> str:
    """Short fingerprint of what would run (both ranks' vLLM argv and env with the overlay,
    and the image); stored as a label to spot config drift."""
    h = hashlib.sha256()
    for argv, env in zip(argvs, envs, strict=True):
        h.update("\0".join(argv).encode())
        h.update("\0".join(f"{k}={v}" for k, v in sorted(env.items())).encode())
    h.update(image.encode())
    return h.hexdigest()[:12]
