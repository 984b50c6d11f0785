"""Pair configuration from a ``.env`` file (python-dotenv semantics), validated up front.

Every value is checked before anything touches a node, so a typo in the env file is an
exit-2 error naming the variable instead of a half-started pair. The seed's incident (a
launcher copied to pair B still pointing at pair A's worker) starts with a bad env file,
so validation is strict and the pair's identity (``PAIR_ID``) is mandatory.
"""

from __future__ import annotations

import io
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from pairctl import home
from pairctl.pair import imageref
from pairctl.pair.group import CABLINGS, GROUP_SIZES, group_problem


class ConfigError(Exception):
    """A usage/configuration problem: the launcher exits 2 with this message."""


@dataclass(frozen=True)
class Var:
    """One documented env variable: its default (None = required) and a validator name."""

    name: str
    default: str | None
    kind: str
    doc: str
    secret: bool = False


# The single list of variables; .env.example documents the same names (a test checks it).
VARS: tuple[Var, ...] = (
    Var("PAIR_ID", None, "pair_id", "name of this pair; labels every container it owns"),
    Var("SPARK1", None, "host", "rank-0 node address (the node the launcher runs on)"),
    Var("SPARK2", None, "host", "rank-1 node address (reached over ssh)"),
    # A group of four Sparks (one TP=4 engine): both or neither (pairctl.pair.group).
    Var("SPARK3", "", "host_or_empty", "rank-2 node address (a group of 4); empty = a pair"),
    Var("SPARK4", "", "host_or_empty", "rank-3 node address (a group of 4); empty = a pair"),
    Var(
        "FABRIC1",
        "",
        "host_or_empty",
        "rank 0's address on the fabric (the RoCE link); empty = SPARK1",
    ),
    Var(
        "FABRIC2",
        "",
        "host_or_empty",
        "rank 1's address on the fabric (the RoCE link); empty = SPARK2",
    ),
    Var(
        "FABRIC3",
        "",
        "host_or_empty",
        "rank 2's address on the fabric (a group of 4); empty = SPARK3",
    ),
    Var(
        "FABRIC4",
        "",
        "host_or_empty",
        "rank 3's address on the fabric (a group of 4); empty = SPARK4",
    ),
    Var(
        "CABLING",
        "switched",
        "cabling",
        "how a group of 4 is cabled: switched (RoCE switch) or ring (0-1-2-3-0, no switch)",
    ),
    Var("MASTER_ADDR", "", "host_or_empty", "torch.distributed master address; empty = FABRIC1"),
    Var("MASTER_PORT", "29501", "port", "torch.distributed master port on rank 0"),
    Var("PORT", "", "port_or_empty", "OpenAI endpoint port on rank 0; empty = recipe's (8000)"),
    Var("SSH_USER", "", "word_or_empty", "ssh user for every remote node; empty = ssh default"),
    Var("SSH_PORT", "", "port_or_empty", "ssh port for every remote node; empty = ssh default"),
    Var("SSH_IDENTITY_FILE", "", "path_or_empty", "ssh identity file; empty = ssh default"),
    Var("SSH_KNOWN_HOSTS_FILE", "", "path_or_empty", "known_hosts file; empty = ssh default"),
    Var(
        "IMAGE",
        "",
        "image_or_empty",
        "container image; empty = the recipe's container.image (same ID needed on both nodes)",
    ),
    Var(
        "ENGINE_STACK",
        "",
        "stack_or_empty",
        "engine stack (recipes/stacks/NAME.yaml: fork, upstream, cpu); empty = the recipe's",
    ),
    Var("MODEL_PATH", None, "abspath", "model directory, same path on both nodes"),
    Var("OVERLAY_DIR", "/srv/dsv4/overlays", "abspath", "overlay copy on both nodes"),
    Var(
        "TILELANG_CACHE_DIR",
        "/srv/dsv4/cache/tilelang",
        "abspath",
        "persistent TileLang JIT cache on both nodes",
    ),
    # The other JIT caches a restart would otherwise rebuild (CACHE_VARS below):
    # each is mounted at the same path and set under its own name in the container.
    Var("VLLM_CACHE_ROOT", "/srv/dsv4/cache/vllm", "abspath", "vLLM compile cache"),
    Var("TRITON_CACHE_DIR", "/srv/dsv4/cache/triton", "abspath", "Triton kernel cache"),
    Var(
        "FLASHINFER_WORKSPACE_BASE",
        "/srv/dsv4/cache/flashinfer-base",
        "abspath",
        "FlashInfer JIT workspace base (its cache is BASE/.cache/flashinfer)",
    ),
    Var("DG_JIT_CACHE_DIR", "/srv/dsv4/cache/deep_gemm", "abspath", "DeepGEMM JIT cache"),
    Var(
        "RDMA_DEVICE_DIR",
        "/dev/infiniband",
        "abspath",
        "host dir of the RDMA devices (uverbs*) passed to the container as /dev/infiniband",
    ),
    Var(
        "CONTAINER_USER",
        "",
        "user_or_empty",
        "UID:GID both ranks' containers run as (files in the caches stay yours); empty = root",
    ),
    Var(
        "MODEL_REPO",
        "",
        "hf_repo_or_empty",
        "Hugging Face repo of the checkpoint (model fetch); empty = the recipe's model.hf_repo",
    ),
    Var(
        "MODEL_REVISION",
        "",
        "revision_or_empty",
        "Hugging Face commit of the model files (40 hex); preflight checks both nodes have it",
    ),
    Var("NCCL_SOCKET_IFNAME", None, "iflist", "NCCL bootstrap/socket interface(s)"),
    Var("GLOO_SOCKET_IFNAME", None, "iflist", "Gloo interface (torch.distributed CPU side)"),
    Var("NCCL_IB_HCA", "", "hca_or_empty", "2-rail HCA list, one port per card; empty = NCCL auto"),
    Var(
        "NCCL_IB_GID_INDEX",
        "",
        "gid_or_empty",
        "pin NCCL's RoCE GID index (0-255); empty = NCCL picks RoCEv2 itself (preferred)",
    ),
    Var("HF_TOKEN", "", "any", "optional Hugging Face token (never printed)", secret=True),
    Var(
        "VLLM_API_KEY",
        "",
        "token_or_empty",
        "bearer token the endpoint requires on /v1 (never printed)",
        secret=True,
    ),
)
VAR_NAMES = tuple(v.name for v in VARS)
SECRET_NAMES = frozenset(v.name for v in VARS if v.secret)

_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
_PAIR_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_WORD_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_IF_RE = re.compile(r"^[\^=]?[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*$")
_REV_RE = re.compile(r"^[0-9a-f]{40}$")
_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HCA_RE = re.compile(r"^[\^=]?[A-Za-z0-9._-]+(?::\d+)?(?:,[A-Za-z0-9._-]+(?::\d+)?)*$")


def _check(kind: str, value: str) -> str | None:
    """Return why ``value`` is malformed for ``kind``, or None when it is fine."""
    if kind == "any":
        return None
    if kind.endswith("_or_empty"):
        if value == "":
            return None
        kind = kind.removesuffix("_or_empty")
    if value == "":
        return "is empty"
    if kind == "pair_id":
        ok = bool(_PAIR_RE.match(value))
        return None if ok else "must be 1-32 chars of a-z, 0-9 and '-' (e.g. pair-a)"
    if kind == "host":
        try:
            ipaddress.ip_address(value)
            return None
        except ValueError:
            pass
        return None if _HOST_RE.match(value) else "is not an IP address or hostname"
    if kind == "port":
        if not value.isdigit() or not 1 <= int(value) <= 65535:
            return "must be a port number 1-65535"
        return None
    if kind == "word":
        return None if _WORD_RE.match(value) else "must be a plain user name"
    if kind in ("abspath", "path"):
        if kind == "abspath" and not value.startswith("/"):
            return "must be an absolute path"
        return None if "\n" not in value and "," not in value else "is not a single path"
    if kind == "image":  # docker's own grammar (pairctl.pair.imageref)
        return imageref.problem(value)
    if kind == "iflist":
        return None if _IF_RE.match(value) else "must be interface names, comma-separated"
    if kind == "gid":
        if not value.isdigit() or not 0 <= int(value) <= 255:
            return "must be a GID index 0-255 (or empty to let NCCL choose)"
        return None
    if kind == "hca":
        return None if _HCA_RE.match(value) else "must look like dev[:port],dev[:port]"
    if kind == "revision":
        return None if _REV_RE.match(value) else "must be a 40-hex commit hash (or empty)"
    if kind == "user":
        ok = re.fullmatch(r"\d+(?::\d+)?", value)
        return None if ok else "must be UID:GID in numbers, e.g. 1000:1000 (id -u, id -g)"
    if kind == "stack":
        ok = re.fullmatch(r"[a-z][a-z0-9-]*", value)
        return None if ok else "must be a stack name (recipes/stacks/NAME.yaml), e.g. fork"
    if kind == "cabling":
        ok = value in CABLINGS
        return None if ok else f"must be one of {', '.join(CABLINGS)}"
    if kind == "hf_repo":
        return None if _HF_REPO_RE.match(value) else "must be a Hugging Face repo id (owner/name)"
    if kind == "token":
        ok = value.isprintable() and " " not in value
        return None if ok else "must be one printable word (no spaces)"
    raise AssertionError(f"unknown kind {kind}")


# Host caches mounted at the same path and exported under the same name (env file
# variables): a recreated container keeps its compiled kernels and graphs.
CACHE_VARS = (
    "TILELANG_CACHE_DIR",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
    "DG_JIT_CACHE_DIR",
)


@dataclass(frozen=True)
class PairConfig:
    """Validated pair settings; ``values`` holds every variable, defaults applied.

    Read one as ``cfg["SPARK1"]`` (no attribute magic: a typo is a KeyError, not a string
    that happens to be empty)."""

    values: dict[str, str]
    env_file: str
    unknown: tuple[str, ...] = field(default=())

    def __getitem__(self, name: str) -> str:
        """One variable's validated value as the env file gives it (a string; ``""`` for
        an empty optional one). Typed, settled values (int ports, the image, MASTER_ADDR's
        default) are the resolved pair's: ``pairctl.pair.resolved``."""
        return self.values[name]

    @property
    def nnodes(self) -> int:
        """How many Sparks the group has: 4 when SPARK3/SPARK4 are set, else 2 (a pair)."""
        return GROUP_SIZES[1] if self.values.get("SPARK3") else GROUP_SIZES[0]

    def spark(self, rank: int) -> str:
        """A rank's node address: SPARK<rank+1>."""
        return self.values[f"SPARK{rank + 1}"]

    def fabric_addr(self, rank: int) -> str:
        """A rank's engine address on the fabric: FABRIC<R+1>, defaulting to SPARK<R+1>
        (a direct-cabled pair whose ssh addresses are the link's)."""
        return self.values[f"FABRIC{rank + 1}"] or self.spark(rank)

    @property
    def master_addr(self) -> str:
        """MASTER_ADDR, defaulting to rank 0's fabric address (the head runs on rank 0, and
        rank 1 must reach its TCP store over the link)."""
        return self.values["MASTER_ADDR"] or self.fabric_addr(0)

    def ssh_target(self, rank: int = 1) -> str:
        """``[user@]SPARK<rank+1>`` for ssh (rank 1's by default)."""
        user = self.values["SSH_USER"]
        host = self.spark(rank)
        return f"{user}@{host}" if user else host


def parse_env(values: dict[str, str | None], env_file: str = "<dict>") -> PairConfig:
    """Validate raw dotenv values; raise ConfigError naming the first bad variable."""
    out: dict[str, str] = {}
    for var in VARS:
        raw = values.get(var.name)
        if raw is None:
            if var.name in values:  # "KEY" with no '=' — dotenv gives None
                raise ConfigError(f"{env_file}: {var.name} has no value; write {var.name}=...")
            if var.default is None:
                raise ConfigError(
                    f"{env_file}: {var.name} is missing; set it ({var.doc}) — see .env.example"
                )
            raw = var.default
        raw = raw.strip()
        if raw == "" and var.default is None:
            raise ConfigError(f"{env_file}: {var.name} is empty; set it ({var.doc})")
        why = _check(var.kind, raw)
        if why:
            shown = "***" if var.secret else repr(raw)
            raise ConfigError(f"{env_file}: {var.name}={shown} {why}")
        out[var.name] = raw
    if out["SPARK1"].lower() == out["SPARK2"].lower():
        raise ConfigError(
            f"{env_file}: SPARK1 and SPARK2 are both {out['SPARK1']}; a pair is two Sparks: "
            "set SPARK2 to the rank-1 node's address"
        )
    why = group_problem(out)
    if why:
        raise ConfigError(f"{env_file}: {why}")
    unknown = tuple(sorted(k for k in values if k not in VAR_NAMES))
    return PairConfig(values=out, env_file=env_file, unknown=unknown)


LAUNCHER_HINT = "copy .env.example to .env and set your pair's addresses (or pass --env-file FILE)"


def load_env_file(path: str | Path, missing_hint: str = LAUNCHER_HINT) -> PairConfig:
    """Read an env file with python-dotenv (no interpolation surprises) and validate it.

    ``missing_hint`` is the fix named for a file that is not there: the launcher's
    ``.env``/``--env-file``, or what a fleet inventory says instead (it has no such flag).
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"env file {p} is a directory; give the pair's env file inside it")
    if not p.is_file():
        where = "" if home.found() else f"; {home.hint()}"
        raise ConfigError(f"env file {p} not found; {missing_hint}{where}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save the env "
            "file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"env file {p}: {exc.strerror or exc}") from exc
    # python-dotenv only warns about lines it cannot parse and skips them; a skipped line
    # may be the SPARK2 the operator meant to set, so every unparsable line is an error.
    # Its text is not echoed: it may hold a secret (e.g. "HF_TOKEN hf_...").
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            raise ConfigError(
                f"{p}:{binding.original.line}: malformed line; expected "
                "KEY=VALUE (see .env.example)"
            )
    raw = dict(dotenv_values(stream=io.StringIO(text), interpolate=False))
    # ssh files relative to the env file (not to wherever the launcher was started); ~ too.
    for key in ("SSH_IDENTITY_FILE", "SSH_KNOWN_HOSTS_FILE"):
        val = (raw.get(key) or "").strip()
        if val:
            path = Path(val).expanduser()
            raw[key] = str(path if path.is_absolute() else (p.parent / path).resolve())
    return parse_env(raw, env_file=str(p))


def check_port_clash(cfg: PairConfig, endpoint_port: str) -> None:
    """MASTER_PORT and the endpoint port both listen on SPARK1: they must differ.

    ``endpoint_port`` is the port the endpoint really uses (PORT, or the recipe's when PORT
    is empty), so a clash with the recipe's default is caught too.
    """
    if cfg["MASTER_PORT"] != endpoint_port:
        return
    port = (
        f"PORT={endpoint_port}"
        if cfg["PORT"]
        else f"PORT (empty, so the recipe's port {endpoint_port})"
    )
    raise ConfigError(
        f"{cfg.env_file}: MASTER_PORT={cfg['MASTER_PORT']} and {port} are the same port on "
        "SPARK1, where torch.distributed's master and the OpenAI endpoint both listen; "
        "set MASTER_PORT to another free port (the default is 29501) or change PORT"
    )
