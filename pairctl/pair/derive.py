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
from pairctl.engine.stack import DEFAULT_STACK, HOOKS_ENV, Stack
from pairctl.pair.cabling import Setting
from pairctl.pair.config import SECRET_NAMES, ConfigError, PairConfig
from pairctl.pair.recipe import Recipe, serve_argv, substitute
from pairctl.pair.stacked import prepended

# Where the overlay folder is mounted in the container (appended to its PYTHONPATH).
OVERLAY_MOUNT = "/opt/dsv4-flash-overlays"
# Secrets only the API server (rank 0) needs.
HEAD_ONLY_SECRETS = ("VLLM_API_KEY",)
# Secrets no rank's container gets: the ranks run with HF_HUB_OFFLINE=1 from a local
# MODEL_PATH, and only `model fetch` downloads (with HF_TOKEN in its own environment);
# in a container env it would be readable by anyone who may `docker inspect`.
NOT_IN_CONTAINERS = ("HF_TOKEN",)
# vLLM's API server waits this long for the engine core (vllm/envs.py, default 600 s).
ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
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


def resolve_image(cfg: PairConfig, recipe: Recipe, stack: Stack | None = None) -> str:
    """IMAGE from .env wins; then the recipe's container.image when the recipe is written for
    this stack (its ``stack:``, default fork), else the stack's own image.default (a recipe's
    image belongs to its stack: ENGINE_STACK=upstream must not boot the fork's image)."""
    own = stack is None or stack.name == recipe_stack(recipe)
    image = cfg["IMAGE"] or (recipe.image if own else None) or (stack and stack.image_default)
    if not image:
        raise ConfigError("no image: set IMAGE in the env file or container.image in the recipe")
    return image


def recipe_stack(recipe: Recipe) -> str:
    """The stack a recipe is written for: its ``stack:`` key, else the default (fork)."""
    return recipe.stack or DEFAULT_STACK


def stack_name(cfg: PairConfig, recipe: Recipe) -> str:
    """ENGINE_STACK in the env file > the recipe's ``stack:`` > the default (fork)."""
    return cfg["ENGINE_STACK"] or recipe_stack(recipe)


def placeholders(cfg: PairConfig, rank: int) -> dict[str, str]:
    """The recipe's ``${NAME}`` values for one rank: the env file's, plus FABRIC1/FABRIC2 and
    MASTER_ADDR with their defaults, NODE_IP (this rank's fabric address, not its ssh
    address: vLLM binds its cross-node message queue there) and RANK."""
    values = dict(cfg.values)
    for r in range(cfg.nnodes):
        values[f"FABRIC{r + 1}"] = cfg.fabric_addr(r)
    values["MASTER_ADDR"] = cfg.master_addr
    values["NODE_IP"] = cfg.fabric_addr(rank)
    values["RANK"] = str(rank)
    return values


def vllm_args(
    cfg: PairConfig,
    serve_keys: Mapping[str, object],
    rank: int,
    values: Mapping[str, str],
    passthrough: Sequence[str],
    entrypoint: str = "vllm",
) -> list[str]:
    """``ENTRYPOINT serve MODEL <serve args> <per-rank args> <passthrough>``: ``serve_keys``
    are the recipe's serve section with the stack's changes applied
    (pairctl.pair.stacked.serve_keys), so passthrough > stack > recipe (vLLM's argparse
    keeps the last occurrence); ``cfg`` has the recipe's defaults applied (PORT), ``values``
    are the rank's placeholders; ``entrypoint`` is the stack's (its vLLM console script)."""
    serve = dict(serve_keys)
    serve["port"] = int(cfg["PORT"])  # env PORT > recipe port
    argv = [entrypoint, "serve", cfg["MODEL_PATH"]]
    argv += serve_argv(serve, values)
    argv += [
        "--node-rank",
        str(rank),
        "--master-addr",
        cfg.master_addr,
        "--master-port",
        cfg["MASTER_PORT"],
    ]
    if rank != 0:
        argv.append("--headless")
    argv += passthrough
    return argv


def group_serve(serve: Mapping[str, object], nnodes: int) -> tuple[dict[str, object], list[str]]:
    """The serve keys for a group of ``nnodes`` Sparks: one rank per Spark, so TP and
    ``--nnodes`` are the group's size (a recipe written for a pair says 2); one plan note
    per change, none for a pair."""
    out = dict(serve)
    notes = []
    for key in ("tensor-parallel-size", "nnodes"):
        if out.get(key) != nnodes:
            notes.append(
                f"--{key}: {out.get(key, 'unset')} -> {nnodes}: a group of {nnodes} Sparks, "
                "one rank each (TP = nnodes; the recipe is written for a pair)"
            )
            out[key] = nnodes
    return out, notes


def container_env(
    recipe: Recipe,
    rank: int,
    values: Mapping[str, str],
    overlay: bool,
    image: ImageFacts | None = None,
    stack: Stack | None = None,
    cabling: Sequence[Setting] = (),
) -> dict[str, str]:
    """Recipe env with placeholders filled, then the stack's env over it (a stack variable
    replaces the recipe's; ``plan`` notes each: pairctl.pair.stacked.env_notes); empty
    values are dropped (e.g. NCCL_IB_HCA=''). ``values`` are the rank's placeholders: the
    env file's variables among them (the secrets, CONTAINER_USER).

    A stack variable marked ``prepend`` goes in front of the image's own value (``image``,
    read on the node). With the overlays, PYTHONPATH is the image's own PYTHONPATH with the
    overlay mount appended, and DSV4_OVERLAY_HOOKS carries the stack's hook points to the
    plugin.
    """
    env: dict[str, str] = {}
    for k, v in recipe.env.items():
        val = substitute(v, values, f"recipe env {k}")
        if val != "":
            env[k] = val
    for setting in cabling:  # a group of four's cabling (pairctl.pair.cabling); a pair: none
        env[setting.name] = setting.value
    if stack is not None:
        for var in stack.env:
            val = prepended(var, image) if var.prepend else var.value
            if val != "":
                env[var.name] = val
        if stack.engine_ready_s is not None:
            env[ENGINE_READY_ENV] = str(stack.engine_ready_s)
    if overlay:
        env["PYTHONPATH"] = pythonpath(image, OVERLAY_MOUNT)
        if stack is not None:
            env[HOOKS_ENV] = stack.hooks_json()
    user = values["CONTAINER_USER"]
    if user:
        # A UID the image has no passwd entry for gets HOME=/ (not writable): anything
        # that still writes under ~ goes to /tmp instead (the known JIT caches are all
        # mounted and named in the recipe env). getpass.getuser() reads LOGNAME/USER
        # before the passwd file, and torch's cache set-up calls it at import: without
        # them such a UID dies with "getpwuid(): uid not found" (vllm-project/vllm#44548;
        # "uid<N>" is the name vllm-project/vllm#46734 falls back to).
        name = f"uid{user.split(':', 1)[0]}"
        env["HOME"] = "/tmp"
        env["USER"] = name
        env["LOGNAME"] = name
    for name in sorted(SECRET_NAMES):
        if name in NOT_IN_CONTAINERS:
            continue
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
