"""A model of the fork's DSpark draft call pattern, for the fp8 head's fork-shape tests.

Written from what tests/data/overlay_fingerprints/fork-0bf8e4c.json records of
rafaelcaricio/vllm (no source copied): the draft model's ``draft`` receives the head as
``lm_head`` with the ``logits_processor`` and uses it through
``logits_processor(lm_head, normed)``, or on its local-argmax path through
``lm_head.quant_method.apply(lm_head, normed, bias=None)`` and ``lm_head.shard_indices``;
the proposer's inherited ``load_model`` makes the draft's lm_head the target's. The
layers before the head are left out: ``main_hidden`` stands for the normed states.
"""

from __future__ import annotations

import types
from typing import Any

import torch


class ForkStyleDraftModel:
    """Stands for DeepSeekV4DSparkModel: only the head part of ``draft``."""

    def __init__(self, hidden_size: int) -> None:
        self.config = types.SimpleNamespace(hidden_size=hidden_size)
        self.seen_heads: list[Any] = []

    def draft(
        self,
        input_ids: torch.Tensor,
        main_hidden: torch.Tensor,
        main_positions: torch.Tensor,
        lm_head: Any,
        logits_processor: Any,
        *,
        return_logits: bool = True,
        local_argmax: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen_heads.append(lm_head)
        normed = main_hidden
        if local_argmax:
            local = lm_head.quant_method.apply(lm_head, normed, bias=None)
            ids = local.argmax(dim=-1) + lm_head.shard_indices.org_vocab_start_index
            return ids, local
        logits = logits_processor(lm_head, normed)
        return logits.argmax(dim=-1), logits


class ForkStyleBaseProposer:
    """Stands for SpecDecodeBaseProposer: ``load_model`` shares the target's lm_head."""

    def __init__(self, draft: Any) -> None:
        self._draft = draft

    def load_model(self, target_model: Any) -> None:
        self.model = self._draft
        self._share_lm_head(target_model)

    def _share_lm_head(self, target_model: Any) -> None:
        self.model.lm_head = target_model.lm_head


class ForkStyleProposer(ForkStyleBaseProposer):
    """Stands for DSparkProposer, which inherits ``load_model``."""
