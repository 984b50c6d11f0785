"""The fleet inventory: which pairs, and where the router runs. Validated before anything runs.

A fleet is N independent pairs; each keeps its own env file and is brought up by its own
launcher on its own head (SPARK1), exactly as without a fleet. The inventory only adds what
no single pair knows: the list of pairs, how to reach their heads, and the router. Checks
that span pairs live here, because no pair can make them: two pairs must never share a node
or an endpoint (the seed's incident was two pairs pointing at one node).

Relative paths in the inventory are relative to the repository root; on each head the same
file is found under `repo_dir` (absolute paths are used as they are on both sides).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pairctl.contracts import BOOT_TIMEOUT_S, DEFAULT_INVENTORY, DEFAULT_RECIPE_REL, REPO
from pairctl.pair.config import ConfigError, _check, load_env_file
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import ResolvedPair
from pairctl.pair.resolved import resolve as resolve_pair

SUPPORTED_VERSIONS = (1,)
# consistent_hash keys on X-Session-ID (vllm-project/router src/policies/hash_key.rs), so a
# conversation stays on the pair that holds its prefix cache. round_robin is offered only to
# measure what affinity buys (bench/bench_router.py). cache_aware does not key chat requests
# on the conversation (vllm-project/router#213, #219).
POLICIES = ("consistent_hash", "round_robin")
_ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
_MUTABLE_TAGS = {"latest", "nightly", "main"}

TOP_KEYS = {"fleet_version", "fleet_id", "repo_dir", "ssh", "pairs", "router"}
SSH_KEYS = {"user", "port", "identity_file", "known_hosts_file"}
PAIR_KEYS = {"env_file", "recipe"}


@dataclass(frozen=True)
class Tuning:
    """Router health checks, retries and circuit breaker (vllm-router 0.1.17 flags).

    Defaults are for real pairs: a first boot takes ~10 min, and MiaAI-Lab measured a TTFT
    of 1,029 s at 900k tokens, so no timeout may be shorter than the longest request. vLLM
    answers /health from its API server process without waiting for the engine's step
    (vllm/v1/engine/async_llm.py `check_health` only looks at `errored`), so a long
    prefill does not fail health checks. docs/fleet.md explains each value.
    """

    health_check_interval_s: int = 10
    health_check_timeout_s: int = 10
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    worker_startup_timeout_s: int = BOOT_TIMEOUT_S  # a pair may take as long as up waits
    request_timeout_s: int = 7200
    retry_max_retries: int = 4
    cb_failure_threshold: int = 2
    cb_timeout_s: int = 30


TUNING_KEYS = set(Tuning.__dataclass_fields__)
ROUTER_KEYS = {"host", "bind", "port", "metrics_port", "image", "policy"} | TUNING_KEYS


@dataclass(frozen=True)
class Ssh:
    """How the fleet reaches pair heads and the router host (BatchMode, strict host keys)."""

    user: str = ""
    port: str = ""
    identity_file: str = ""
    known_hosts_file: str = ""


@dataclass(frozen=True)
class Router:
    """Where the router runs, its image (pinned) and its settings."""

    host: str
    port: int
    metrics_port: int
    image: str
    policy: str = "consistent_hash"
    bind: str = "0.0.0.0"
    tuning: Tuning = field(default_factory=Tuning)

    @property
    def url(self) -> str:
        """The one endpoint clients use: http://HOST:PORT (append /v1 for OpenAI clients)."""
        return f"http://{_bracket(self.host)}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_bracket(self.host)}:{self.metrics_port}/metrics"


@dataclass(frozen=True)
class PairEntry:
    """One pair of the fleet: its env file (here and on its head) and its config."""

    env_file: Path
    recipe: Path
    remote_env_file: str
    remote_recipe: str
    pair: ResolvedPair

    @property
    def pair_id(self) -> str:
        return self.pair.pair_id

    @property
    def head(self) -> str:
        return self.pair.spark1

    @property
    def endpoint(self) -> str:
        """The pair's own endpoint (rank 0): the router's worker URL for this pair."""
        return self.pair.endpoint


@dataclass(frozen=True)
class Fleet:
    """A validated inventory."""

    path: Path
    fleet_id: str
    repo_dir: str
    ssh: Ssh
    pairs: tuple[PairEntry, ...]
    router: Router

    def by_endpoint(self) -> dict[str, PairEntry]:
        return {p.endpoint: p for p in self.pairs}


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _err(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _mapping(path: Path, where: str, value: Any, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, f"{where} must be a mapping")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise _err(
            path,
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}",
        )
    return value


def _int(path: Path, where: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _err(path, f"{where} must be a whole number {lo}-{hi}, got {value!r}")
    return value


def check_image(image: str) -> str | None:
    """Why `image` is not pinned, or None. A tag that moves (latest, nightly) is not a pin."""
    if not _IMAGE_RE.match(image):
        return "is not an image reference (repo/name:tag or repo/name@sha256:...)"
    if "@sha256:" in image:
        digest = image.split("@sha256:", 1)[1]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            return "has a malformed sha256 digest (64 lowercase hex digits)"
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (docker would use :latest, which moves); pin a tag or a digest"
    if last.rsplit(":", 1)[1] in _MUTABLE_TAGS:
        return "uses a tag that moves; pin a versioned tag or an @sha256: digest"
    return None


def resolve(rel: str, repo_dir: str) -> tuple[Path, str]:
    """(path on this machine, path on a head) for an inventory path."""
    p = Path(rel).expanduser()
    if p.is_absolute():
        return p, str(p)
    return REPO / p, f"{repo_dir.rstrip('/')}/{p.as_posix()}"


def _load_pair(path: Path, i: int, raw: Any, repo_dir: str) -> PairEntry:
    where = f"pairs[{i}]"
    entry = _mapping(path, where, raw, PAIR_KEYS)
    if not isinstance(entry.get("env_file"), str) or not entry["env_file"]:
        raise _err(path, f"{where}: env_file is required (e.g. pairs/pair-a.env)")
    env_local, env_remote = resolve(entry["env_file"], repo_dir)
    rec_local, rec_remote = resolve(str(entry.get("recipe") or DEFAULT_RECIPE_REL), repo_dir)
    hint = (
        f"create it (cp pairs/pair-a.env.example {entry['env_file']}, then set that pair's "
        f"addresses) or fix {where}.env_file in {path}"
    )
    pair = resolve_pair(load_env_file(env_local, hint), load_recipe(rec_local))
    return PairEntry(env_local, rec_local, env_remote, rec_remote, pair)


def _load_router(path: Path, raw: Any) -> Router:
    r = _mapping(path, "router", raw, ROUTER_KEYS)
    for key in ("host", "port", "metrics_port", "image"):
        if key not in r:
            raise _err(path, f"router.{key} is required (see pairs/fleet.yaml.example)")
    host = str(r["host"])
    why = _check("host", host)
    if why:
        raise _err(path, f"router.host={host!r} {why}")
    bind = str(r.get("bind", "0.0.0.0"))
    if _check("host", bind):
        raise _err(path, f"router.bind={bind!r} is not an address")
    image = str(r["image"])
    why = check_image(image)
    if why:
        raise _err(
            path,
            f"router.image={image!r} {why}. Build the pinned router with "
            "`docker build -f launch/vllm-router.Dockerfile -t dsv4-vllm-router:0.1.17 launch/` "
            "on the router host (docs/fleet.md)",
        )
    policy = str(r.get("policy", "consistent_hash"))
    if policy not in POLICIES:
        raise _err(
            path,
            f"router.policy={policy!r}: use consistent_hash (conversation affinity on "
            "X-Session-ID) or round_robin (only to measure what affinity buys); docs/fleet.md",
        )
    tuning: dict[str, int] = {}
    for key in TUNING_KEYS:
        if key in r:
            hi = 31_536_000 if key.endswith("_s") else 1000
            tuning[key] = _int(path, f"router.{key}", r[key], 1, hi)
    port = _int(path, "router.port", r["port"], 1, 65535)
    metrics_port = _int(path, "router.metrics_port", r["metrics_port"], 1, 65535)
    if port == metrics_port:
        raise _err(path, "router.port and router.metrics_port must differ")
    return Router(host, port, metrics_port, image, policy, bind, Tuning(**tuning))


def parse_inventory(data: Any, path: Path) -> Fleet:
    """Validate a parsed inventory; raise ConfigError naming the first problem."""
    top = _mapping(path, "top level", data, TOP_KEYS)
    version = top.get("fleet_version")
    if version not in SUPPORTED_VERSIONS:
        raise _err(path, f"fleet_version must be one of {SUPPORTED_VERSIONS}, got {version!r}")
    fleet_id = str(top.get("fleet_id") or "")
    if not _ID_RE.match(fleet_id):
        raise _err(path, "fleet_id must be 1-32 chars of a-z, 0-9 and '-' (it labels the router)")
    repo_dir = str(top.get("repo_dir") or REPO)
    if not repo_dir.startswith("/"):
        raise _err(
            path, f"repo_dir must be an absolute path (the checkout on every head): {repo_dir!r}"
        )
    raw_ssh = _mapping(path, "ssh", top.get("ssh"), SSH_KEYS)
    ssh = Ssh(**{k: str(v or "") for k, v in raw_ssh.items()})
    for key in ("identity_file", "known_hosts_file"):
        val = getattr(ssh, key)
        if val:
            ssh = replace(ssh, **{key: str(Path(val).expanduser())})
    if ssh.port and _check("port", ssh.port):
        raise _err(path, f"ssh.port={ssh.port!r} must be a port number")
    raw_pairs = top.get("pairs")
    if not isinstance(raw_pairs, list) or not raw_pairs:
        raise _err(path, "pairs must list at least one pair: - env_file: pairs/pair-a.env")
    pairs = tuple(_load_pair(path, i, p, repo_dir) for i, p in enumerate(raw_pairs))
    router = _load_router(path, top.get("router"))
    check_disjoint(path, pairs, router)
    return Fleet(path, fleet_id, repo_dir, ssh, pairs, router)


def check_disjoint(path: Path, pairs: tuple[PairEntry, ...], router: Router) -> None:
    """No two pairs share an id, a node or an endpoint; the router takes no pair's port."""
    seen_ids: dict[str, Path] = {}
    seen_nodes: dict[str, str] = {}
    for p in pairs:
        if p.pair_id in seen_ids:
            raise _err(
                path,
                f"PAIR_ID {p.pair_id!r} appears in {seen_ids[p.pair_id]} and {p.env_file}; "
                "every pair needs its own PAIR_ID",
            )
        seen_ids[p.pair_id] = p.env_file
        for key, node in ((f"SPARK{r + 1}", p.pair.node_addr(r)) for r in p.pair.ranks):
            if node in seen_nodes and seen_nodes[node] != p.pair_id:
                raise _err(
                    path,
                    f"node {node} is in pair {seen_nodes[node]!r} and in pair {p.pair_id!r} "
                    f"({p.env_file} {key}); a node belongs to one pair only",
                )
            seen_nodes[node] = p.pair_id
    by_endpoint = {(p.head, p.pair.port): p.pair_id for p in pairs}
    clash = by_endpoint.get((router.host, router.port)) or by_endpoint.get(
        (router.host, router.metrics_port)
    )
    if clash:
        raise _err(
            path,
            f"router {router.host}:{router.port}/{router.metrics_port} takes pair {clash!r}'s "
            "endpoint port; pick other router ports",
        )


def load_inventory(path: str | Path | None = None) -> Fleet:
    """Read and validate an inventory file (default pairs/fleet.yaml)."""
    p = Path(path) if path else DEFAULT_INVENTORY
    if not p.is_file():
        raise ConfigError(
            f"fleet inventory {p} not found; copy pairs/fleet.yaml.example to pairs/fleet.yaml "
            "and list your pairs (or pass --inventory FILE)"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise _err(p, f"invalid YAML: {exc}") from exc
    return parse_inventory(data, p)
