"""Tiny target and draft models in the shapes the weight guard meets, for in-process tests.

Plain torch modules with vLLM 0.33's own quant-method objects on their layers (so vLLM's
loader and its track_weights_loading treat them as real layers), and ``load_weights``
methods written like vLLM's: the target maps names one to one; the draft is DSpark's
shape (``mtp.0.*`` checkpoint names, ``shared_experts.w2`` renamed to ``down_proj``,
``w1``/``w3`` stacked into ``gate_up_proj``, unknown names skipped, no own embed or head:
``has_own_embed_tokens = has_own_lm_head = False``), with the 0731 loader's gap as an
option (no ``w1``/``w3`` rule: the shared expert is silently skipped). Two speculators
alias the draft's embed and head to the target's the way vLLM 0.33 does, through its
real functions: the v2 runner's (``load_dspark_model``: ``maybe_share_target_embed``,
``_should_share``) and the v1 proposers' (``SpecDecodeBaseProposer._maybe_share_*``).
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

H, I_, V = 8, 16, 32  # hidden, intermediate, vocab


def _quant(layer: nn.Module, embedding: bool = False) -> nn.Module:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    layer.quant_method = UnquantizedEmbeddingMethod() if embedding else UnquantizedLinearMethod()
    return layer


def _linear(i: int, o: int) -> nn.Module:
    return _quant(nn.Linear(i, o, bias=False))


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(H), requires_grad=False)


class _SharedExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = _linear(H, 2 * I_)
        self.down_proj = _linear(I_, H)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ffn = nn.Module()
        self.ffn.shared_experts = _SharedExperts()
        self.ffn_norm = _Norm()


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = _quant(nn.Embedding(V, H), embedding=True)
        self.layers = nn.ModuleList([_Layer()])


def _copy(params: dict[str, nn.Parameter], name: str, w: torch.Tensor, shard: int | None) -> None:
    with torch.no_grad():
        p = params[name]
        if shard is None:
            p.copy_(w)
        else:
            p[shard * I_ : (shard + 1) * I_].copy_(w)


class TinyTarget(nn.Module):
    """The target: every parameter named as in its checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Inner()
        self.model.norm = _Norm()
        self.lm_head = _linear(H, V)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            if name in params:
                _copy(params, name, w, None)
                loaded.add(name)
        return loaded


class TinyDSparkDraft(nn.Module):
    """DSpark's shape: mtp.0.* names, embed and head left to the target's."""

    has_own_embed_tokens = False
    has_own_lm_head = False
    maps_w13 = True  # False: the 0731 loader's gap (shared_experts w1/w3 fall through)

    def __init__(self) -> None:
        super().__init__()
        self.model = _Inner()
        self.lm_head = _linear(H, V)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            if not name.startswith("mtp.0."):
                continue  # the target's
            name = name.replace("mtp.0.", "model.layers.0.", 1)
            name = name.replace(".shared_experts.w2", ".shared_experts.down_proj")
            shard = None
            if self.maps_w13:
                for ckpt, sid in ((".shared_experts.w1", 0), (".shared_experts.w3", 1)):
                    if ckpt in name:
                        name, shard = name.replace(ckpt, ".shared_experts.gate_up_proj"), sid
            if name not in params:
                continue  # vLLM's loaders log such a name at debug level, if at all
            _copy(params, name, w, shard)
            loaded.add(name)
        return loaded


class TinyDSparkDraftGap(TinyDSparkDraft):
    maps_w13 = False


class TinyOwnHeadDraft(TinyDSparkDraft):
    """A draft that says it has its own head (EAGLE-style) whose checkpoint has none."""

    has_own_lm_head = True


class NoReportModel(TinyTarget):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:  # type: ignore[override]
        super().load_weights(weights)


def target_checkpoint(drop: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    names = {
        "model.embed_tokens.weight": (V, H),
        "model.layers.0.ffn.shared_experts.gate_up_proj.weight": (2 * I_, H),
        "model.layers.0.ffn.shared_experts.down_proj.weight": (H, I_),
        "model.layers.0.ffn_norm.weight": (H,),
        "model.norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    return {n: torch.randn(s, generator=g) for n, s in names.items() if n not in drop}


def draft_checkpoint() -> dict[str, torch.Tensor]:
    """DSpark's draft ships inside the target checkpoint: mtp.* names, no embed, no head."""
    g = torch.Generator().manual_seed(1)
    names = {
        "mtp.0.ffn.shared_experts.w1.weight": (I_, H),
        "mtp.0.ffn.shared_experts.w3.weight": (I_, H),
        "mtp.0.ffn.shared_experts.w2.weight": (H, I_),
        "mtp.0.ffn_norm.weight": (H,),
    }
    return {n: torch.randn(s, generator=g) for n, s in names.items()}


def model_config(runner: str, quantization: str | None = None) -> Any:
    """What DefaultModelLoader.load_weights reads of a ModelConfig (runner_type: vLLM
    builds a draft's with runner="draft", vllm/config/speculative.py)."""
    return types.SimpleNamespace(
        model="/ckpt/tiny",
        runner_type=runner,
        quantization=quantization,
        multimodal_config=None,
        is_moe=False,
    )


def load(loader: Any, model: nn.Module, ckpt: dict[str, torch.Tensor], config: Any) -> nn.Module:
    """vLLM's DefaultModelLoader.load_weights, reading ``ckpt`` instead of files."""
    loader.get_all_weights = lambda model_config, model: iter(ckpt.items())
    loader.load_weights(model, config)
    return model


class V2Speculator:
    """The v2 runner's DSpark loader (vLLM 0.33 load_dspark_model's aliasing, its functions)."""

    def __init__(self, loader: Any, draft_cls: type, share: bool = True) -> None:
        self.loader, self.draft_cls, self.share = loader, draft_cls, share

    def load_draft_model(self, target_model: nn.Module, target_attn_layer_names: set) -> Any:
        from vllm.v1.worker.gpu.spec_decode.eagle.utils import (
            _should_share,
            get_target_lm_head,
            maybe_share_target_embed,
        )

        draft = load(self.loader, self.draft_cls(), draft_checkpoint(), model_config("draft"))
        if self.share:
            maybe_share_target_embed(draft, draft.model, target_model.model)
            head = get_target_lm_head(target_model, target_model)
            if _should_share(draft, "has_own_lm_head", draft.lm_head, head):
                del draft.lm_head
                draft.lm_head = head
        return draft


class V1Proposer:
    """The v1 proposers' loader: SpecDecodeBaseProposer's own _maybe_share_* methods."""

    def __init__(self, loader: Any, draft_cls: type) -> None:
        self.loader, self.draft_cls = loader, draft_cls
        self.model: Any = None
        # what _maybe_share_lm_head reads of the proposer besides the model
        self.vllm_config = types.SimpleNamespace(speculative_config=None)
        self.use_local_argmax_reduction = False

    def load_model(self, target_model: nn.Module) -> None:
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        self.model = load(self.loader, self.draft_cls(), draft_checkpoint(), model_config("draft"))
        SpecDecodeBaseProposer._maybe_share_embeddings(self, target_model)
        SpecDecodeBaseProposer._maybe_share_lm_head(self, target_model)
