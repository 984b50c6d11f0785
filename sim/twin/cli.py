"""`vllm serve`-compatible command line for the twin (plus `--twin-*` flags).

The launcher starts the twin exactly where it would start vLLM, so every flag our recipe
passes must parse. Flags we do not know are logged by name and ignored, never fatal (vLLM
would reject them; the twin is meant to be permissive, and says so in the log); their values
are never logged, since one may be a secret. ``--api-key`` is enforced as vLLM enforces it
(sim/twin/auth.py) and, like vLLM's ``redact_sensitive_args``
(vllm/entrypoints/common/startup.py), shown only as ``***``.
Precedence as in vLLM: command line > ``--config FILE.yaml`` > defaults.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from pairctl.cli.argtypes import int_at_least, port, speculative_config


class UsageError(ValueError):
    """Bad command line or config file; the message says what to fix."""


def build_parser() -> argparse.ArgumentParser:
    """The subset of `vllm serve` flags the twin understands."""
    p = argparse.ArgumentParser(
        prog="python -m sim.twin serve",
        description="Serve a SIMULATED DeepSeek-V4-Flash + DSpark pair (no model is run). "
        "Takes `vllm serve MODEL` flags; unknown flags are logged and ignored.",
    )
    a = p.add_argument
    a("model", nargs="?", default=None, help="model name or path (only used as a label)")
    a("--model", dest="model_flag", default=None, help="same as the positional MODEL")
    a("--config", default=None, help="YAML file whose keys are long flag names")
    a("--host", default="0.0.0.0")
    a("--port", type=port, default=8000)
    a("--served-model-name", nargs="+", default=None)
    # vLLM's configs bound these (ge=1: vllm/config/scheduler.py, vllm/config/parallel.py);
    # the twin divides by them, so a bad one is refused here, before anything boots.
    pos = int_at_least(1)
    a("--api-key", nargs="+", default=None, help="require one of these keys on /v1 (as vLLM)")
    a("--tensor-parallel-size", "-tp", type=pos, default=1)
    a("--pipeline-parallel-size", "-pp", type=pos, default=1)
    a("--distributed-executor-backend", default=None)
    a("--nnodes", type=pos, default=1)
    a("--node-rank", type=int, default=0)
    a("--master-addr", default="127.0.0.1")
    a("--master-port", type=port, default=29501)
    a("--headless", action="store_true")
    a("--max-num-seqs", type=pos, default=None)
    a("--max-num-batched-tokens", type=pos, default=None)
    a("--long-prefill-token-threshold", type=int, default=0)
    a("--max-model-len", type=int, default=None)
    a("--gpu-memory-utilization", type=float, default=0.92)  # vllm/config/cache.py
    a("--kv-cache-dtype", default="auto")
    a("--speculative-config", type=speculative_config, default=None)
    a("--tokenizer", default=None)
    a("--tokenizer-mode", default="auto")
    a("--reasoning-parser", default=None)
    a("--tool-call-parser", default=None)
    a("--enable-auto-tool-choice", action="store_true")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    a("--trust-remote-code", action="store_true")
    a("--seed", type=int, default=0)
    a("--data-parallel-size", "-dp", type=pos, default=1)
    a("--enable-prompt-tokens-details", action="store_true")
    # system_fingerprint's form (vllm/entrypoints/common/cli_args.py fingerprint_mode and
    # fingerprint_value; built as vllm/entrypoints/serve/utils/fingerprint.py does).
    a("--fingerprint-mode", choices=("full", "hash", "custom", "none"), default="full")
    a("--fingerprint-value", default=None)
    a("--per-request-spec-decode-metrics", choices=("none", "summary", "detailed"), default="none")
    a(
        "--twin-profile",
        default=os.environ.get("TWIN_PROFILE") or None,
        help="profile YAML path or name (default: spark-pair; env TWIN_PROFILE)",
    )
    a("--twin-seed", type=int, default=None, help="seed for output text and acceptance draws")
    a(
        "--twin-pair-id",
        default=os.environ.get("TWIN_PAIR_ID") or None,
        help="answer with header X-Spark-Pair: ID (simulator-only; env TWIN_PAIR_ID)",
    )
    a(
        "--twin-fault",
        default=os.environ.get("TWIN_FAULT") or None,
        help="fault spec, see docs/simulator.md (env TWIN_FAULT)",
    )
    return p


# Never logged or served in clear (vLLM's _SENSITIVE_ARG_FIELDS, vllm/entrypoints/common/
# startup.py): the key, and a token should one ever be passed as a flag.
SENSITIVE = frozenset({"api_key", "hf_token"})

# Flags that take no value (so a config-file `true` becomes just the flag).
_NEGATABLE = {"enable_prefix_caching", "enable_chunked_prefill"}


@dataclass
class ServeArgs:
    """Parsed serve arguments plus what was ignored (for the log)."""

    ns: argparse.Namespace
    unknown: list[str] = field(default_factory=list)
    config_unknown: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ns, name)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self.ns).items()}

    def shown(self) -> dict[str, Any]:
        """``as_dict`` for a log or /twin/truth: secrets as ``***`` (set) or None."""
        return {k: ("***" if k in SENSITIVE and v else v) for k, v in vars(self.ns).items()}

    @property
    def unknown_flags(self) -> list[str]:
        """The unknown flags' names only: a value after one may be a secret."""
        return [t.split("=", 1)[0] for t in self.unknown if t.startswith("-")]


def _config_defaults(parser: argparse.ArgumentParser, path: str) -> tuple[dict[str, Any], list]:
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"--config {path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: top level must be a mapping of flag: value")
    by_dest = {act.dest: act for act in parser._actions}
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for key, val in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest == "model":
            dest = "model_flag"
        act = by_dest.get(dest)
        if act is None or dest in ("help", "config"):
            unknown.append(str(key))
            continue
        if dest == "speculative_config" and isinstance(val, str):
            val = speculative_config(val)
        elif act.type is not None and val is not None and not isinstance(val, bool | dict):
            try:
                val = act.type(val) if not isinstance(val, list) else val
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                raise UsageError(f"--config {path}: {key}: {exc}") from exc
        if dest == "served_model_name" and isinstance(val, str):
            val = [val]
        out[dest] = val
    return out, unknown


def parse_serve_args(argv: list[str]) -> ServeArgs:
    """Parse `serve` argv: CLI > --config file > defaults; unknown flags collected."""
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    cfg_unknown: list[str] = []
    if known.config:
        defaults, cfg_unknown = _config_defaults(parser, known.config)
        parser.set_defaults(**defaults)
    ns, unknown = parser.parse_known_args(argv)
    if ns.model_flag and not ns.model:
        ns.model = ns.model_flag
    if not ns.model:
        raise UsageError(
            "no model given: `python -m sim.twin serve MODEL [flags]` (any name works)"
        )
    if ns.nnodes > 1 and ns.node_rank not in range(ns.nnodes):
        raise UsageError(f"--node-rank {ns.node_rank} out of range for --nnodes {ns.nnodes}")
    spec = ns.speculative_config or {}
    ns.num_speculative_tokens = int(spec.get("num_speculative_tokens", 5))
    if ns.num_speculative_tokens < 1:
        raise UsageError("speculative-config num_speculative_tokens must be >= 1")
    return ServeArgs(ns=ns, unknown=unknown, config_unknown=cfg_unknown)
