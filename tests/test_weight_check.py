"""The weight guard's rule (dsv4_flash_overlays/weight_check.py), on plain torch modules.

Which parameters a load must fill, which a checkpoint may lack (vLLM's quantized-model
exemptions, tied weights, parameters a load creates or drops, a draft's aliased head),
and what the refusal says. No vLLM here: tests/test_weight_guard.py runs the rule inside
vLLM 0.33's own loader.
"""

from __future__ import annotations

import gc

import pytest
import torch
from dsv4_flash_overlays import weight_check as W
from torch import nn


class _PostProcess:
    """A quant method as vLLM's look: every QuantizeMethodBase has this hook."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None


class _Online(_PostProcess):
    uses_meta_device = True


class _KVCache(_PostProcess):
    pass


class _NoHook:
    """A quant_method attribute without post-processing: vLLM's rule skips the module."""


def _linear(n: int, method: object | None = None, bias: bool = False) -> nn.Linear:
    layer = nn.Linear(n, n, bias=bias)
    if method is not None:
        layer.quant_method = method
    return layer


def test_exemptions_mirror_vllms_quantized_rule() -> None:
    model = nn.Module()
    model.plain = _linear(4, _PostProcess())  # a quantized linear: must load
    model.online = _linear(4, _Online(), bias=True)
    model.attn = nn.Module()
    model.attn.quant_method = _KVCache()
    model.attn.k_scale = nn.Parameter(torch.ones(1))
    model.gptq = _linear(4, _PostProcess())
    model.gptq.qzeros = nn.Parameter(torch.empty(0))
    model.gptq.input_scale_ub = nn.Parameter(torch.ones(1))
    model.nohook = _linear(4, _NoHook())
    model.norm = nn.Module()
    model.norm.weight = nn.Parameter(torch.ones(4))
    got = W.exemptions(model, kv_cache_types=(_KVCache,))
    assert got == {
        "online.weight": "online quantization",
        "online.bias": "online quantization",
        "attn.k_scale": "KV-cache scale",
        "gptq.qzeros": "empty placeholder",
        "gptq.input_scale_ub": "built from the quantization config",
    }
    # without the KV-cache class the scale is an ordinary parameter: it must load
    assert "attn.k_scale" not in W.exemptions(model)


def _verdict(before, after, loaded, exempt=None, draft=False):
    return W.compare("M", before, after, set(loaded), exempt or {}, draft)


def test_an_unfilled_parameter_is_missing_in_model_order() -> None:
    names = ["embed.weight", "layers.0.a.weight", "layers.0.b.weight", "norm.weight"]
    v = _verdict(names, names, {"embed.weight", "norm.weight"})
    assert v.missing == ["layers.0.a.weight", "layers.0.b.weight"]
    assert (v.required, v.filled, v.kind) == (4, 2, "target")
    assert _verdict(names, names, set(names)).missing == []


def test_exempt_ones_are_counted_not_missing() -> None:
    names = ["a.weight", "attn.k_scale"]
    v = _verdict(names, names, {"a.weight"}, {"attn.k_scale": "KV-cache scale"})
    assert v.missing == [] and v.exempt == {"attn.k_scale": "KV-cache scale"}
    assert v.filled == 1


def test_only_parameters_present_before_and_after_the_load_are_required() -> None:
    """DSpark drops an unloaded confidence head inside load_weights; DSV4 post-processing
    may create parameters there: neither is a checkpoint slot."""
    before = ["a.weight", "confidence_head.proj.weight"]
    after = ["a.weight", "a.weight_swizzled"]
    v = _verdict(before, after, {"a.weight"})
    assert v.missing == [] and v.required == 1


def test_a_drafts_head_and_embedding_are_deferred_a_targets_are_not() -> None:
    names = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.3.shared_head.head.weight",
        "model.markov_head.markov_w2.weight",  # DSpark's own: comes from the checkpoint
        "model.layers.0.ffn.shared_experts.gate_up_proj.weight",
    ]
    draft = _verdict(names, names, set(), draft=True)
    assert draft.deferred == names[:3]
    assert draft.missing == names[3:]
    target = _verdict(names, names, set(), draft=False)
    assert target.deferred == [] and target.missing == names


def test_tied_weights_count_once() -> None:
    """named_parameters() yields a parameter shared by two modules once (a tied lm_head)."""
    model = nn.Module()
    model.embed = nn.Embedding(8, 4)
    model.lm_head = nn.Linear(4, 8, bias=False)
    model.lm_head.weight = model.embed.weight
    names = [n for n, _ in model.named_parameters()]
    assert names == ["embed.weight"]
    assert _verdict(names, names, {"embed.weight"}).missing == []


def test_still_unfilled_follows_identity_and_keeps_nothing_alive() -> None:
    own = nn.Parameter(torch.zeros(4))
    target = nn.Parameter(torch.ones(4))
    refs = W.deferred_refs({"lm_head.weight": own, "x.weight": own}, ["lm_head.weight"])
    assert W.still_unfilled(refs, {"lm_head.weight": own}) == ["lm_head.weight"]
    assert W.still_unfilled(refs, {"lm_head.weight": target}) == []
    assert W.still_unfilled(refs, {}) == []  # the module is gone: nothing to fill
    del own
    gc.collect()
    assert refs["lm_head.weight"]() is None  # a replaced head is freed, not kept by us


def test_refusal_names_the_model_the_parameters_and_the_way_out() -> None:
    msg = W.refusal("draft", "DSparkDeepseekV4ForCausalLM", "/models/x", ["a.w", "b.w"], "FLAG")
    assert msg.startswith(
        "weight guard: 2 parameters of the draft model DSparkDeepseekV4ForCausalLM "
        "(checkpoint /models/x) were not filled from the checkpoint: a.w, b.w. "
    )
    assert msg.endswith("FLAG=0 serves anyway.")
    one = W.refusal("target", "M", "/m", ["a.w"], "FLAG")
    assert "1 parameter of the target model M (checkpoint /m) was not filled" in one
    many = W.refusal("target", "M", "/m", [f"p{i}" for i in range(25)], "FLAG")
    assert "p19, and 5 more." in many and "p20" not in many


@pytest.mark.parametrize(
    ("exempt", "deferred", "want"),
    [
        ({}, [], "weight guard: target M: 3 of 3 parameters filled from the checkpoint"),
        (
            {"k": "KV-cache scale"},
            ["lm_head.weight"],
            "weight guard: draft M: 1 of 3 parameters filled from the checkpoint; exempt as "
            "vLLM exempts them: KV-cache scale 1; to be the target's after the draft loader: "
            "lm_head.weight",
        ),
    ],
)
def test_summary_line(exempt, deferred, want) -> None:
    v = W.Verdict("M", bool(deferred), 3, exempt=exempt, deferred=deferred)
    assert W.summary(v) == want
