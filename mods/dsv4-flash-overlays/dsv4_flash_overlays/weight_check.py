# SPDX-License-Identifier: MIT
"""Which parameters of a loaded model did the checkpoint not fill: the weight guard's rule.

Why a rule of our own: vLLM's loader (``DefaultModelLoader.load_weights``,
``vllm/model_executor/model_loader/default_loader.py``) compares the names
``model.load_weights`` reports loaded with ``model.named_parameters()``, but only for
unquantized models by default, and there it exempts every parameter of every module
that has a quant method (every linear layer, embedding and MoE has one), so the check
covers norms and bare parameters only. The field's fault (the 0731 DSpark draft's
shared experts left unfilled: a linear layer, in a quantized checkpoint) passes both
ways. The rule here is the one vLLM 0.33 applies to a quantized model when asked
(``--model-loader-extra-config '{"enable_weights_track": true}'``), for every model:
every parameter must come from the checkpoint, except those a checkpoint cannot carry.

Exempt, as vLLM 0.33's ``track_weights_loading`` exempts them (module by module, for a
module whose quant method post-processes weights or quantizes online):

* online quantization (``uses_meta_device``): weights quantized while loading;
* KV-cache quantization (a ``BaseKVCacheMethod``): scales default when absent;
* empty placeholders (``numel() == 0``), e.g. moe_wna16's qzeros for symmetric GPTQ;
* parameters the quantization config builds (``_CONFIG_BUILT_PARAMS``: ``input_scale_ub``).

Not required at all:

* tied weights: ``named_parameters()`` yields a shared parameter once (tied lm_head);
* buffers (rotary caches, ``inv_freq``): not parameters;
* parameters created or removed while loading (compared: the names present both before
  and after ``model.load_weights``; DSpark drops an unloaded confidence head there).

Deferred, for a draft (``model_config.runner_type == "draft"``) only: parameters of the
modules vLLM's proposers replace with the target's after the draft loads, ``lm_head``,
``model.embed_tokens`` and an MTP layer's ``shared_head.head``
(``vllm/v1/spec_decode/llm_base_proposer.py`` ``_maybe_share_embeddings`` /
``_maybe_share_lm_head``; ``vllm/v1/worker/gpu/spec_decode/dspark/utils.py``
``load_dspark_model``). DSpark's draft ships without them (``has_own_lm_head = False``).
Whether vLLM aliased them is observed, not assumed: after the draft loader returns, each
must be another object than the one left unfilled (``still_unfilled``).

Granularity: a parameter counts as filled when the loader reports its name, so a stacked
parameter (``gate_up_proj`` from ``w1`` and ``w3``) with one shard missing, or a fused
MoE weight with some experts missing, passes: vLLM reports names, not shards.

No vLLM import: the caller passes the KV-cache method classes and the config-built names.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# vLLM 0.33 default_loader._CONFIG_BUILT_PARAMS (read from the loader's module when it has it).
CONFIG_BUILT_DEFAULT = ("input_scale_ub",)
# Modules a proposer replaces with the target's after loading the draft (see above).
ALIASED = re.compile(r"^(lm_head|model\.embed_tokens|model\.layers\.[^.]+\.shared_head\.head)\.")
LIST_AT_MOST = 20  # names a refusal spells out before "and N more"


def exemptions(
    model: Any,
    kv_cache_types: tuple[type, ...] = (),
    config_built: Iterable[str] = CONFIG_BUILT_DEFAULT,
) -> dict[str, str]:
    """Parameter name -> why a checkpoint need not carry it (vLLM's quantized-model rule)."""
    built = set(config_built)
    out: dict[str, str] = {}
    for mod_name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        online = bool(getattr(method, "uses_meta_device", False))
        if not (online or getattr(method, "process_weights_after_loading", None)):
            continue
        kv = bool(kv_cache_types) and isinstance(method, kv_cache_types)
        for name, param in module.named_parameters():
            if online:
                why = "online quantization"
            elif kv:
                why = "KV-cache scale"
            elif param.numel() == 0:
                why = "empty placeholder"
            elif name.rsplit(".", 1)[-1] in built:
                why = "built from the quantization config"
            else:
                continue
            out.setdefault(f"{mod_name}.{name}" if mod_name else name, why)
    return out


@dataclass
class Verdict:
    """One model's load: how many parameters, which the checkpoint did not fill."""

    model_class: str
    is_draft: bool
    required: int  # parameters present before and after model.load_weights
    exempt: dict[str, str] = field(default_factory=dict)  # name -> why (required ones only)
    deferred: list[str] = field(default_factory=list)  # draft: the target's, after its loader
    missing: list[str] = field(default_factory=list)  # unfilled, not exempt, not deferred

    @property
    def kind(self) -> str:
        return "draft" if self.is_draft else "target"

    @property
    def filled(self) -> int:
        return self.required - len(self.exempt) - len(self.deferred) - len(self.missing)


def compare(
    model_class: str,
    before: Iterable[str],
    after: Iterable[str],
    loaded: set[str],
    exempt: Mapping[str, str],
    is_draft: bool,
) -> Verdict:
    """The verdict on one load: ``before``/``after`` are parameter names (in model order)
    around ``model.load_weights``, ``loaded`` what it returned."""
    present = set(after)
    required = [n for n in before if n in present]
    verdict = Verdict(model_class, is_draft, len(required))
    for name in required:
        if name in loaded:
            continue
        if name in exempt:
            verdict.exempt[name] = exempt[name]
        elif is_draft and ALIASED.match(name):
            verdict.deferred.append(name)
        else:
            verdict.missing.append(name)
    return verdict


def deferred_refs(params: Mapping[str, Any], names: Iterable[str]) -> dict[str, weakref.ref]:
    """Weak references to the unfilled objects: kept across the draft loader without keeping
    a replaced (possibly 1 GB) tensor alive."""
    return {n: weakref.ref(params[n]) for n in names}


def still_unfilled(refs: Mapping[str, weakref.ref], current: Mapping[str, Any]) -> list[str]:
    """Deferred names whose parameter is still the object the checkpoint left unfilled."""
    return [n for n, ref in refs.items() if n in current and current[n] is ref()]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LIST_AT_MOST])
    more = len(names) - LIST_AT_MOST
    return shown + (f", and {more} more" if more > 0 else "")


CAUSE_LOAD = (
    "The checkpoint lacks these tensors or the loader dropped them (the 0731 DSpark draft "
    "lost its shared experts this way: decode halved, output unchanged)"
)
CAUSE_ALIAS = (
    "The draft's checkpoint has none of them and vLLM's draft loader did not replace them "
    "with the target's"
)


def refusal(
    kind: str,
    model_class: str,
    checkpoint: str,
    names: list[str],
    flag: str,
    cause: str = CAUSE_LOAD,
) -> str:
    """The error that fails the boot: which model, which parameters, why, what to do."""
    n = len(names)
    return (
        f"weight guard: {n} parameter{'s' if n != 1 else ''} of the {kind} model "
        f"{model_class} (checkpoint {checkpoint}) {'were' if n != 1 else 'was'} not filled "
        f"from the checkpoint: {_names(names)}. {cause}. Refusing to serve: fix the "
        "checkpoint (a tensor missing from its safetensors files or index) or the loader's "
        f"name mapping; {flag}=0 serves anyway."
    )


def summary(verdict: Verdict) -> str:
    """The one INFO line of a load that passed."""
    parts = [
        f"weight guard: {verdict.kind} {verdict.model_class}: {verdict.filled} of "
        f"{verdict.required} parameters filled from the checkpoint"
    ]
    if verdict.exempt:
        counts: dict[str, int] = {}
        for why in verdict.exempt.values():
            counts[why] = counts.get(why, 0) + 1
        parts.append(
            "exempt as vLLM exempts them: "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    if verdict.deferred:
        parts.append(f"to be the target's after the draft loader: {_names(verdict.deferred)}")
    return "; ".join(parts)
