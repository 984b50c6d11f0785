"""What stage_timing.py times: the vLLM functions, their stage names, how each finds its request.

vLLM 0.32 (the CPU build) and 0.33 have the same names (tests/test_stage_timing.py resolves
every target in both). Each target's ``rid`` reads the request id from the call (an argument,
the result, or the ASGI middleware's context variable); ``extra`` adds what the stage handled.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_rid: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsv4_stage_rid", default=None)


# -- request ids of the objects each stage handles ------------------------------------------


def _ctx_rid(args: tuple, kwargs: dict, result: Any) -> str | None:
    return _rid.get()


def _self_request_id(args: tuple, kwargs: dict, result: Any) -> str | None:
    """``(self, request, ...)``: the request's ``request_id``."""
    req = args[1] if len(args) > 1 else kwargs.get("request")
    return getattr(req, "request_id", None) or _rid.get()


def _encoded_rid(args: tuple, kwargs: dict, result: Any) -> str | None:
    obj = args[1] if len(args) > 1 else kwargs.get("obj")
    return getattr(obj, "request_id", None) if _is_core_request(obj) else None


def _decoded_rid(args: tuple, kwargs: dict, result: Any) -> str | None:
    return getattr(result, "request_id", None) if _is_core_request(result) else None


def _is_core_request(obj: Any) -> bool:
    return type(obj).__name__ == "EngineCoreRequest"


def _decoded_extra(args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    """How many prompt ids travelled (fewer than the prompt's when sent as a delta)."""
    ids = getattr(result, "prompt_token_ids", None)
    return {"ids_sent": len(ids) if isinstance(ids, list) else 0}


def _sched_extra(args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    """The request ids a scheduler step (or a worker's call) handles, new ones apart."""
    out = result if result is not None and hasattr(result, "scheduled_new_reqs") else None
    if out is None:
        for a in args[1:]:
            if hasattr(a, "scheduled_new_reqs"):
                out = a
                break
    if out is None:
        return {}
    new = [getattr(r, "req_id", None) for r in out.scheduled_new_reqs]
    tokens = dict(getattr(out, "num_scheduled_tokens", {}) or {})
    return {"new": new, "tokens": tokens}


def _blocks_extra(args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    """get_computed_blocks returns (blocks, num_computed_tokens[, ...])."""
    if isinstance(result, tuple) and len(result) >= 2 and isinstance(result[1], int):
        return {"hit_tokens": result[1]}
    return {}


def _outputs_extra(args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    outs = args[1] if len(args) > 1 else kwargs.get("engine_core_outputs")
    try:
        return {"rids": [o.request_id for o in outs]}
    except Exception:
        return {}


def _hash_extra(args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    req = args[0] if args else None
    out = {
        "blocks": len(result) if isinstance(result, list) else None,
        "tokens": getattr(req, "num_tokens", None),
    }
    reused = getattr(req, "_dsv4_reused_blocks", None)  # set by block_hashes.py, if on
    if reused is not None:
        out["reused"] = reused
    return out


def _hasher_rid(args: tuple, kwargs: dict, result: Any) -> str | None:
    return getattr(args[0], "request_id", None) if args else None


def _prompt_hashing(args: tuple, kwargs: dict, result: Any) -> bool:
    """The call from Request.__init__ (no hashes yet); not the one per decoded token."""
    req = args[0] if args else None
    return not getattr(req, "block_hashes", None)


@dataclass(frozen=True)
class Target:
    """One function to time: where it lives, the stage name, how to find its request."""

    stage: str
    module: str
    qualname: str
    rid: Callable[[tuple, dict, Any], str | None] = _ctx_rid
    extra: Callable[[tuple, dict, Any], dict[str, Any]] | None = None
    only_if_rid: bool = False  # record only calls whose rid resolves (encode/decode)
    keep: Callable[[tuple, dict, Any], bool] | None = None  # record only calls it accepts


_SERVING = "vllm.entrypoints.openai.chat_completion.serving"
_SCHED = "vllm.v1.core.sched.scheduler"
_RUNNER = "vllm.v1.worker.gpu_model_runner"
# vLLM 0.32 (CPU build) and 0.33: the same names (checked by tests/test_stage_timing.py).
TARGETS: tuple[Target, ...] = (
    Target("handler", _SERVING, "OpenAIServingChat.create_chat_completion"),
    Target("render", _SERVING, "OpenAIServingChat.render_chat_request"),
    Target("messages", "vllm.renderers.deepseek_v4", "parse_chat_messages_async"),
    Target("template", "vllm.renderers.deepseek_v4", "DeepseekV4Renderer._apply_chat_template"),
    Target("tokenize", "vllm.renderers.base", "BaseRenderer.tokenize_prompts_async"),
    Target("engine_input", "vllm.renderers.base", "BaseRenderer.process_for_engine_async"),
    Target("add_request", "vllm.v1.engine.async_llm", "AsyncLLM.add_request"),
    Target("process_inputs", "vllm.v1.engine.input_processor", "InputProcessor.process_inputs"),
    Target("validate", "vllm.renderers.base", "BaseRenderer.validate_token_ids"),
    Target("output_state", "vllm.v1.engine.output_processor", "OutputProcessor.add_request"),
    # Our own pieces, where the hand-off overlay is on (prompt_delta.py).
    Target("delta_plan", "dsv4_flash_overlays.prompt_delta", "Sender.plan"),
    Target("rebuild", "dsv4_flash_overlays.prompt_delta", "Receiver.rebuild"),
    Target(
        "serialise",
        "vllm.v1.serial_utils",
        "MsgpackEncoder.encode",
        rid=_encoded_rid,
        only_if_rid=True,
    ),
    Target(
        "send", "vllm.v1.engine.core_client", "AsyncMPClient.add_request_async", _self_request_id
    ),
    Target(
        "outputs",
        "vllm.v1.engine.output_processor",
        "OutputProcessor.process_outputs",
        extra=_outputs_extra,
    ),
    Target(
        "deserialise",
        "vllm.v1.serial_utils",
        "MsgpackDecoder.decode",
        rid=_decoded_rid,
        extra=_decoded_extra,
        only_if_rid=True,
    ),
    Target(
        "request_init",
        "vllm.v1.engine.core",
        "EngineCore.preprocess_add_request",
        _self_request_id,
    ),
    Target("queue", "vllm.v1.engine.core", "EngineCore.add_request", _self_request_id),
    Target("schedule", _SCHED, "Scheduler.schedule", extra=_sched_extra),
    Target(
        "prefix_lookup",
        "vllm.v1.core.kv_cache_manager",
        "KVCacheManager.get_computed_blocks",
        _self_request_id,
        _blocks_extra,
    ),
    Target(
        "allocate",
        "vllm.v1.core.kv_cache_manager",
        "KVCacheManager.allocate_slots",
        _self_request_id,
    ),
    Target("update", _SCHED, "Scheduler.update_from_output", extra=_sched_extra),
    Target("runner_update", _RUNNER, "GPUModelRunner._update_states", extra=_sched_extra),
    Target("execute", _RUNNER, "GPUModelRunner.execute_model", extra=_sched_extra),
    Target("sample", _RUNNER, "GPUModelRunner.sample_tokens"),
)
# The block hasher is a closure made by get_request_block_hasher; EngineCore.__init__
# calls that factory through vllm.v1.engine.core's global, after the plugin loaded
# (vllm/v1/engine/core.py: load_general_plugins(), then get_request_block_hasher(...)).
HASHER_FACTORY = ("vllm.v1.engine.core", "get_request_block_hasher")
