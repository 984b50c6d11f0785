"""The one registry of this plugin's env flags and the patch catalogue.

Every variable the plugin reads is listed in ``FLAGS`` (default, meaning, validation);
every patch in ``OVERLAYS`` (why, how, upstream, removal plan). The README's tables are
written from these two. An overlay flag whose default is ``1`` is on unless set to ``0``
(the weight guard: it changes nothing on a load that filled every parameter); the
others are off unless set to ``1``.

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


def _is_abs_path(v: str) -> bool:
    return os.path.isabs(v)


# Kill switch: DSV4_OVERLAYS_DISABLE=1 turns every overlay off whatever its flag says.
KILL_SWITCH = "DSV4_OVERLAYS_DISABLE"
# Measurement only (stage_timing.py): not an overlay, changes no result; off when unset.
STAGE_TIMING_DIR = "DSV4_STAGE_TIMING_DIR"
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
        "VLLM_INCREMENTAL_BLOCK_HASHES",
        "0",
        "1 = a new prompt's prefix-cache block hashes reuse a recent prompt's chain and hash "
        "only the new blocks (engine core)",
        _is_01,
    ),
    Flag(
        "VLLM_INCREMENTAL_BLOCK_HASHES_MB",
        "256",
        "byte budget of the block-hash cache in MiB (LRU eviction; 0 = no caching)",
        _is_nonneg_float,
    ),
    Flag(
        "VLLM_INCREMENTAL_BLOCK_HASHES_VERIFY_RATE",
        "0.01",
        "fraction of prompts with reused hashes re-hashed in full; a difference turns the "
        "cache off for the process",
        _is_rate,
    ),
    Flag(
        "VLLM_INCREMENTAL_DETOKENIZER",
        "0",
        "1 = a new request's detokenizer is primed with the prompt's last tokens, not all of "
        "it (API server)",
        _is_01,
    ),
    Flag(
        "VLLM_INCREMENTAL_DETOKENIZER_VERIFY_RATE",
        "0.01",
        "fraction of requests whose tail priming is checked against whole-prompt priming; a "
        "difference turns the overlay off for the process",
        _is_rate,
    ),
    Flag(
        "VLLM_INCREMENTAL_PROMPT_HANDOFF",
        "0",
        "1 = the API server validates and sends the engine core only a prompt's new tokens "
        "(API server and engine core)",
        _is_01,
    ),
    Flag(
        "VLLM_INCREMENTAL_PROMPT_HANDOFF_VERIFY_RATE",
        "0.01",
        "fraction of delta-sent prompts also sent whole and compared by the engine core; a "
        "difference refuses every later delta (those requests fail) until a restart",
        _is_rate,
    ),
    Flag(
        STAGE_TIMING_DIR,
        "",
        "measurement only: an absolute directory; every process appends the duration of "
        "each front-end stage of each request to stages-PID.jsonl there (stage_timing.py)",
        _is_abs_path,
    ),
    Flag(
        "VLLM_DSPARK_FP8_DRAFT_HEAD",
        "0",
        "1 = DSpark draft logits from an fp8 copy of the local lm_head shard",
        _is_01,
    ),
    Flag(
        "VLLM_DSV4_WEIGHT_GUARD",
        "1",
        "1 = refuse to serve when a parameter of the model or of the speculative draft was "
        "not filled from the checkpoint (0 = serve anyway)",
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
        name="weight-guard",
        flag="VLLM_DSV4_WEIGHT_GUARD",
        module="weight_guard",
        why="a loader that drops checkpoint tensors serves anyway: on the 0731 checkpoint "
        "the DSpark draft's shared experts stayed unfilled, decode halved, output unchanged "
        "(tonyd2wild's Patch 4); vLLM checks only unquantized models, and there only "
        "parameters of layers without a quant method",
        how="wraps DefaultModelLoader.load_weights: the names model.load_weights reports "
        "loaded are compared with the model's parameters (vLLM's quantized-model exemptions; "
        "a draft's embed_tokens/lm_head may be the target's, re-checked after the draft "
        "loader); any other unfilled parameter fails the boot, naming it",
        upstream="vllm-project/vllm#57108 (the quantized-model check behind "
        "enable_weights_track), #41086 (enable_weights_track)",
        removal="drop once vLLM checks every load by default, quantized models and drafts included",
    ),
    Overlay(
        name="incremental-block-hashes",
        flag="VLLM_INCREMENTAL_BLOCK_HASHES",
        module="block_hashes",
        why="every turn the engine core re-hashes every full block of the whole history for "
        "the prefix cache before the request is queued",
        how="rebinds the engine core's get_request_block_hasher; the hasher it makes takes the "
        "hashes of the blocks a recent prompt shares (one list comparison) and hashes only "
        "the rest with vLLM's own hasher",
        upstream="none filed",
        removal="drop once vLLM reuses a previous request's block hashes itself",
    ),
    Overlay(
        name="incremental-detokenizer",
        flag="VLLM_INCREMENTAL_DETOKENIZER",
        module="detok_prime",
        why="the first output token of every turn decodes the whole history: vLLM primes the "
        "detokenizer's DecodeStream with every prompt id",
        how="wraps FastIncrementalDetokenizer.__init__ so the stream is primed from the last "
        "prompt token that starts a character (ByteLevel decoders only); same text out",
        upstream="none filed",
        removal="drop once vLLM primes the stream with a bounded prompt suffix",
    ),
    Overlay(
        name="incremental-prompt-handoff",
        flag="VLLM_INCREMENTAL_PROMPT_HANDOFF",
        module="handoff",
        why="every turn the API server validates, encodes and sends the whole prompt to the "
        "engine core, which decodes it into fresh ints",
        how="validate_token_ids checks only ids after a validated prefix; a prompt sharing "
        ">= 2,048 tokens with a recently sent one goes as (that request, shared length, new "
        "tokens), rebuilt in EngineCore.preprocess_add_request",
        upstream="none filed",
        removal="drop once vLLM sends prompts incrementally to the engine core",
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
    """On for the exact value ``1``, off for ``0``. Unset, empty or invalid (true, yes)
    means the flag's default (register() warns about an invalid one): off for every
    overlay but the weight guard. A flag that carries a value (the spin budget) is on
    for a valid one. The kill switch wins."""
    env = os.environ if environ is None else environ
    if env.get(KILL_SWITCH, "") == "1":
        return False
    value = env.get(name, "")
    flag = next((f for f in FLAGS if f.name == name), None)
    if flag is not None and flag.turns_on is not None:
        return value != "" and flag.turns_on(value)
    if flag is not None and (value == "" or not flag.valid(value)):
        value = flag.default
    return value == "1"


def invalid_flags(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names of registered flags that are set to a value their validator rejects."""
    env = os.environ if environ is None else environ
    return [f.name for f in FLAGS if env.get(f.name, "") != "" and not f.valid(env[f.name])]
