"""The one registry of this plugin's env flags and the patch catalogue.

Every variable the plugin reads is listed in ``FLAGS`` (default, meaning, validation);
every patch in ``OVERLAYS`` (why, how, upstream, removal plan). The README's tables are
written from these two.

Our flags are not part of vLLM's torch.compile cache key: when A/B-testing a flag that
changes the model graph, use ``VLLM_DISABLE_COMPILE_CACHE=1`` or a separate
``VLLM_CACHE_ROOT`` per variant.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Overlay:
    """One patch: what it changes, why, and when it can be removed."""

    name: str
    flag: str
    module: str
    why: str
    how: str
    upstream: str
    removal: str


@dataclass(frozen=True)
class Flag:
    """One environment variable the plugin reads."""

    name: str
    default: str
    doc: str
    valid: Callable[[str], bool]
    # Which values turn the flag's overlay on; None: exactly "1" (the on/off flags).
    turns_on: Callable[[str], bool] | None = None


def _is_01(v: str) -> bool:
    return v in ("0", "1")


def _is_nonneg_float(v: str) -> bool:
    try:
        return float(v) >= 0
    except ValueError:
        return False


def _is_budget_ms(v: str) -> bool:
    """A spin budget in ms: finite, 0 (park at once) up to vLLM's own 1000 ms."""
    try:
        return 0.0 <= float(v) <= SPIN_BUDGET_MAX_MS
    except ValueError:
        return False


def _is_rate(v: str) -> bool:
    try:
        return 0.0 <= float(v) <= 1.0
    except ValueError:
        return False


# Kill switch: DSV4_OVERLAYS_DISABLE=1 turns every overlay off whatever its flag says.
KILL_SWITCH = "DSV4_OVERLAYS_DISABLE"
# The spin budget's flag carries its value: unset or empty is off (vLLM's own 1 s), a number
# of milliseconds is on. Above vLLM's default the overlay would only add spinning.
SPIN_BUDGET_FLAG = "VLLM_DSV4_SPIN_BUDGET_MS"
SPIN_BUDGET_MAX_MS = 1000.0

FLAGS: tuple[Flag, ...] = (
    Flag(KILL_SWITCH, "0", "1 = apply no overlay at all (kill switch)", _is_01),
    Flag(
        "VLLM_INCREMENTAL_ENCODE_CACHE",
        "0",
        "1 = incremental tokenizer cache on the DSV4 tokenizer",
        _is_01,
    ),
    Flag(
        "VLLM_INCREMENTAL_ENCODE_CACHE_MB",
        "256",
        "byte budget of the tokenizer cache in MiB (LRU eviction; 0 = no caching)",
        _is_nonneg_float,
    ),
    Flag(
        "VLLM_INCREMENTAL_ENCODE_VERIFY_RATE",
        "0.01",
        "fraction of cached encodes re-checked against a full encode; a mismatch turns "
        "the cache off for the process",
        _is_rate,
    ),
    Flag(
        "VLLM_INCREMENTAL_ENCODE_LOG_INTERVAL_S",
        "60",
        "seconds between counter log lines (hits, misses, bytes, fallbacks); 0 = never",
        _is_nonneg_float,
    ),
    Flag(
        "VLLM_DSPARK_FP8_DRAFT_HEAD",
        "0",
        "1 = DSpark draft logits from an fp8 copy of the local lm_head shard",
        _is_01,
    ),
    Flag(
        SPIN_BUDGET_FLAG,
        "",
        "milliseconds a shared-memory queue reader busy-spins after a message before it "
        "sleeps on its notify socket (0-1000; unset = vLLM's own 1 s)",
        _is_budget_ms,
        _is_budget_ms,
    ),
)

OVERLAYS: tuple[Overlay, ...] = (
    Overlay(
        name="incremental-encode-cache",
        flag="VLLM_INCREMENTAL_ENCODE_CACHE",
        module="deepseek_v4_tok",
        why="multi-turn chat re-tokenizes the whole history on the API-server CPU each turn",
        how="wraps DeepseekV4Tokenizer.from_pretrained; the tokenizer it returns serves "
        "encode()/__call__ from a token-exact prefix cache and encodes only new text",
        upstream="vllm-project/vllm#47582 (RFC), #47583 (PR)",
        removal="drop once an equivalent cache is merged upstream",
    ),
    Overlay(
        name="fp8-draft-head",
        flag="VLLM_DSPARK_FP8_DRAFT_HEAD",
        module="dspark_nvidia",
        why="the DSpark draft reads the full bf16 lm_head shard every step (bandwidth-bound)",
        how="draft logits from an fp8 e4m3 per-row-scaled copy of the local lm_head shard",
        upstream="vllm-project/vllm#47584 (PR)",
        removal="drop if upstream DSpark gains a low-precision draft head",
    ),
    Overlay(
        name="spin-budget",
        flag=SPIN_BUDGET_FLAG,
        module="spin_budget",
        why="each shared-memory queue reader (worker, engine core) sched_yield-spins for 1 s "
        "after every message, so during decode it never sleeps and holds a core",
        how="wraps SpinCondition.__init__: a reader built without an explicit busy_loop_s "
        "gets the budget instead of vLLM's 1 s default",
        upstream="vllm-project/vllm#51950 (closed unmerged), #52814 (open)",
        removal="drop once upstream makes busy_loop_s configurable",
    ),
)


def flag_enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """True only for the exact value ``1`` (anything else, unset, 0, true, is off), or, for
    a flag that carries a value (the spin budget), a valid one."""
    env = os.environ if environ is None else environ
    if env.get(KILL_SWITCH, "") == "1":
        return False
    value = env.get(name, "")
    flag = next((f for f in FLAGS if f.name == name), None)
    if flag is not None and flag.turns_on is not None:
        return value != "" and flag.turns_on(value)
    return value == "1"


def invalid_flags(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names of registered flags that are set to a value their validator rejects."""
    env = os.environ if environ is None else environ
    return [f.name for f in FLAGS if env.get(f.name, "") != "" and not f.valid(env[f.name])]
