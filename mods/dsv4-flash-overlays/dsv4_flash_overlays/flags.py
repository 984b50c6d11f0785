"""The one registry of this plugin's env flags and the patch catalogue.

Our flags are not part of vLLM's torch.compile cache key: when A/B-testing a flag,
use ``VLLM_DISABLE_COMPILE_CACHE=1`` or a separate ``VLLM_CACHE_ROOT`` per variant.
"""

from __future__ import annotations

import os
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


# Kill switch: DSV4_OVERLAYS_DISABLE=1 turns every overlay off whatever its flag says.
KILL_SWITCH = "DSV4_OVERLAYS_DISABLE"

OVERLAYS: tuple[Overlay, ...] = (
    Overlay(
        name="incremental-encode-cache",
        flag="VLLM_INCREMENTAL_ENCODE_CACHE",
        module="deepseek_v4_tok",
        why="multi-turn chat re-tokenizes the whole history on the API-server CPU each turn",
        how="wraps the DSV4 tokenizer vLLM builds so only text past a cached prefix is encoded",
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
)


def flag_enabled(name: str, environ: dict[str, str] | None = None) -> bool:
    """True only for the exact value ``1``; anything else (unset, 0, true) is off."""
    env = os.environ if environ is None else environ
    if env.get(KILL_SWITCH, "") == "1":
        return False
    return env.get(name, "") == "1"
