"""Recipes: the serving config as data (vLLM ``--config`` long-flag keys, env, container knobs).

A recipe is validated before use (required ``recipe_version``, known sections, well-formed
keys, no launcher-owned flags) so a typo fails at ``plan`` time with exit 2, not ten minutes
into a boot. Precedence is CLI (args after ``--``) > recipe > vLLM default: passthrough
args are appended after the recipe's, and vLLM's argparse keeps the last occurrence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pairctl import home
from pairctl.pair import imageref
from pairctl.pair.config import ConfigError

SUPPORTED_RECIPE_VERSIONS = (1,)
TOP_KEYS = {
    "recipe_version",
    "name",
    "description",
    "stack",
    "model",
    "container",
    "env",
    "serve",
}
MODEL_KEYS = {"hf_repo", "revision"}
CONTAINER_KEYS = {"image", "shm_size", "ulimits", "mounts"}
# The launcher sets these per rank from the env file; a recipe must not.
LAUNCHER_OWNED = {"model", "node-rank", "headless", "master-addr", "master-port", "config"}
# Secrets never go on a command line (ps, ssh logs, docker inspect's Args would show them):
# the API key travels as VLLM_API_KEY, which vLLM 0.33 reads
# (vllm/entrypoints/serve/middleware/register.py).
SECRET_FLAGS = {"api-key": "VLLM_API_KEY"}
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_ULIMIT_RE = re.compile(r"^[a-z]+=-?\d+(?::-?\d+)?$")
_SHM_RE = re.compile(r"^\d+[bkmg]?$")
_STACK_RE = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Mount:
    """A bind mount ``src:dst[:ro]``."""

    src: str
    dst: str
    ro: bool = False

    def arg(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")


@dataclass
class Recipe:
    """A validated recipe. ``serve`` keeps YAML values; ``serve_argv`` renders them."""

    name: str
    version: int
    path: str
    image: str | None
    shm_size: str | None
    ulimits: list[str]
    mounts: list[Mount]
    env: dict[str, str]
    serve: dict[str, Any] = field(default_factory=dict)
    # The checkpoint to fetch (``model fetch``); MODEL_REPO / MODEL_REVISION in .env win.
    model_repo: str | None = None
    model_revision: str | None = None
    # The engine stack it is written for (recipes/stacks/NAME.yaml); None = the default
    # (pairctl.engine.stack.DEFAULT_STACK). ENGINE_STACK in the env file wins.
    stack: str | None = None


def _err(path: str, msg: str) -> ConfigError:
    return ConfigError(f"recipe {path}: {msg}")


def parse_recipe(data: Any, path: str = "<recipe>") -> Recipe:
    """Validate a loaded YAML document and return a Recipe, or raise ConfigError."""
    if not isinstance(data, dict):
        raise _err(path, "must be a YAML mapping")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _err(path, f"unknown top-level key(s) {sorted(unknown)}; allowed {sorted(TOP_KEYS)}")
    if "recipe_version" not in data:
        raise _err(path, "recipe_version is required (this launcher reads version 1)")
    version = data["recipe_version"]
    if version not in SUPPORTED_RECIPE_VERSIONS:
        raise _err(
            path,
            f"recipe_version {version!r} is not supported "
            f"(supported: {list(SUPPORTED_RECIPE_VERSIONS)})",
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _err(path, "name is required")
    stack = data.get("stack")
    if stack is not None and (not isinstance(stack, str) or not _STACK_RE.match(stack)):
        raise _err(path, f"stack {stack!r} must be a stack name (recipes/stacks/NAME.yaml)")
    container = data.get("container") or {}
    if not isinstance(container, dict):
        raise _err(path, "container must be a mapping")
    bad = set(container) - CONTAINER_KEYS
    if bad:
        raise _err(
            path, f"unknown container key(s) {sorted(bad)}; allowed {sorted(CONTAINER_KEYS)}"
        )
    image = container.get("image")
    if image is not None and (not isinstance(image, str) or not image):
        raise _err(path, "container.image must be a non-empty string")
    if image is not None and (why := imageref.problem(image)):
        raise _err(path, f"container.image {image!r} {why}")
    shm = container.get("shm_size")
    if shm is not None:
        shm = str(shm)
        if not _SHM_RE.match(shm):
            raise _err(path, f"container.shm_size {shm!r} must look like 64g")
    ulimits = [str(u) for u in (container.get("ulimits") or [])]
    for u in ulimits:
        if not _ULIMIT_RE.match(u):
            raise _err(path, f"container.ulimits entry {u!r} must look like memlock=-1")
    mounts = []
    for m in container.get("mounts") or []:
        if not isinstance(m, dict) or not {"src", "dst"} <= set(m) or set(m) - {"src", "dst", "ro"}:
            raise _err(path, f"container.mounts entry {m!r} must be {{src, dst, ro?}}")
        if not str(m["dst"]).startswith("/") or not str(m["src"]).startswith(("/", "${")):
            raise _err(path, f"container.mounts entry {m!r} needs absolute paths")
        mounts.append(Mount(str(m["src"]), str(m["dst"]), bool(m.get("ro", False))))
    model_repo, model_revision = _model_section(data.get("model"), path)
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise _err(path, "env must be a mapping")
    env_out: dict[str, str] = {}
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_RE.match(k):
            raise _err(path, f"env key {k!r} is not a valid variable name")
        if isinstance(v, (dict, list)) or v is None:
            raise _err(path, f"env {k} must be a scalar (quote it)")
        env_out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    serve = data.get("serve")
    if not isinstance(serve, dict) or not serve:
        raise _err(path, "serve must be a non-empty mapping of vLLM long-flag names")
    for k in serve:
        if not isinstance(k, str) or not _FLAG_RE.match(k):
            raise _err(
                path,
                f"serve key {k!r} must be a vLLM long flag name without '--' (e.g. max-num-seqs)",
            )
        if k in LAUNCHER_OWNED:
            raise _err(path, f"serve key {k!r} is set by the launcher per rank; remove it")
        if k in SECRET_FLAGS:
            raise _err(path, _secret_flag_msg(k))
    port = serve.get("port", 8000)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise _err(path, f"serve.port {port!r} must be a port number")
    return Recipe(
        name=name,
        version=version,
        path=path,
        image=image,
        shm_size=shm,
        ulimits=ulimits,
        mounts=mounts,
        env=env_out,
        serve=dict(serve),
        model_repo=model_repo,
        model_revision=model_revision,
        stack=stack,
    )


def _model_section(model: Any, path: str) -> tuple[str | None, str | None]:
    """``model: {hf_repo, revision}``: where ``model fetch`` downloads from."""
    if model is None:
        return None, None
    if not isinstance(model, dict) or set(model) - MODEL_KEYS:
        raise _err(path, f"model must be a mapping with keys {sorted(MODEL_KEYS)}")
    repo, rev = model.get("hf_repo"), model.get("revision")
    if repo is not None and (not isinstance(repo, str) or repo.count("/") != 1):
        raise _err(path, f"model.hf_repo {repo!r} must be a Hugging Face repo id (owner/name)")
    if rev is not None and not re.fullmatch(r"[0-9a-f]{40}", str(rev)):
        raise _err(path, f"model.revision {rev!r} must be a 40-hex commit (or null)")
    return repo, (str(rev) if rev is not None else None)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file."""
    p = Path(path)
    if not p.is_file():
        where = "" if home.found() else f"; {home.hint()}"
        raise ConfigError(f"recipe {p} not found (pass --recipe FILE){where}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise _err(str(p), f"invalid YAML: {exc}") from exc
    return parse_recipe(data, str(p))


def _secret_flag_msg(key: str) -> str:
    return (
        f"--{key} would put a secret on the command line; set {SECRET_FLAGS[key]} in the "
        "env file instead (passed to the container by name, never printed)"
    )


def check_passthrough(args: list[str]) -> None:
    """Extra vLLM args may override tuning, not the pair's wiring (that lives in .env)."""
    owned = {f"--{k}" for k in LAUNCHER_OWNED} | {"--port"}
    for a in args:
        flag = a.split("=", 1)[0]
        if flag in owned:
            where = "PORT in the env file" if flag == "--port" else "the env file"
            raise ConfigError(f"extra vLLM arg {flag} is set by the launcher; use {where}")
        if flag.startswith("--") and flag[2:].replace("_", "-") in SECRET_FLAGS:
            raise ConfigError("extra vLLM args: " + _secret_flag_msg(flag[2:].replace("_", "-")))


def substitute(text: str, values: Mapping[str, str], where: str) -> str:
    """Replace ``${NAME}`` placeholders; an unknown name is a config error."""

    def repl(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise ConfigError(
                f"{where}: unknown placeholder ${{{key}}}; known: {', '.join(sorted(values))}"
            )
        return values[key]

    return _PLACEHOLDER_RE.sub(repl, text)


def serve_argv(serve: dict[str, Any], values: Mapping[str, str] | None = None) -> list[str]:
    """Render serve keys as vLLM CLI args, the same way ``vllm serve --config`` reads them.

    true → ``--flag``; false → ``--no-flag`` (vLLM's BooleanOptionalAction); dict → JSON;
    list → ``--flag a b``; None → omitted.
    """
    values = values or {}
    argv: list[str] = []
    for key, val in serve.items():
        flag = f"--{key}"
        if val is None:
            continue
        if isinstance(val, bool):
            argv.append(flag if val else f"--no-{key}")
        elif isinstance(val, dict):
            argv += [flag, json.dumps(val, separators=(",", ":"))]
        elif isinstance(val, list):
            argv += [flag, *(substitute(str(x), values, f"serve.{key}") for x in val)]
        else:
            argv += [flag, substitute(str(val), values, f"serve.{key}")]
    return argv
