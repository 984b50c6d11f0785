"""The weight guard inside real vLLM 0.33: its DefaultModelLoader, its own check beside ours,
its draft-aliasing functions (tests/support/tiny_drafts.py has the models and loaders).

What must fail: the field's fault in miniature, a DSpark-shaped draft whose loader has no
rule for the shared expert's w1/w3 (vLLM's own check lets it through, quantized or not);
a draft head that vLLM did not replace with the target's; a target missing a tensor.
What must pass: a complete load, a draft whose head and embedding are the target's.
The real CPU engine boots are in tests/test_weight_guard_engine.py.
"""

from __future__ import annotations

import logging
import types

import pytest
from dsv4_flash_overlays import hooks, weight_guard

from pairctl.engine.stack import HOOKS_ENV, load_stack
from tests.support import tiny_drafts as T

pytestmark = pytest.mark.needs_vllm

GAP = "model.layers.0.ffn.shared_experts.gate_up_proj.weight"


@pytest.fixture
def loader(monkeypatch):
    """A real DefaultModelLoader; vLLM's config context stubbed (no EP, no platform here)."""
    import vllm.config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    monkeypatch.setattr(
        vllm.config, "get_current_vllm_config", lambda: types.SimpleNamespace(parallel_config=None)
    )
    pp = types.SimpleNamespace(world_size=1)
    import vllm.v1.spec_decode.llm_base_proposer as v1
    import vllm.v1.worker.gpu.spec_decode.eagle.utils as v2

    monkeypatch.setattr(v1, "get_pp_group", lambda: pp)
    monkeypatch.setattr(v2, "get_pp_group", lambda: pp)
    return lambda **extra: DefaultModelLoader(LoadConfig(model_loader_extra_config=extra))


def _table() -> hooks.Table:
    """Upstream's weight-guard table plus the test speculators as the draft loaders."""
    up = hooks.parse_table(load_stack("upstream").hooks_json())
    own = tuple(h for h in up.for_overlay("weight-guard") if h.role in ("weights", "exempt"))
    mod = "tests.support.tiny_drafts"
    extra = (
        hooks.Hook("weight-guard", mod, "V2Speculator.load_draft_model", "loader"),
        hooks.Hook("weight-guard", mod, "V1Proposer.load_model", "loader"),
    )
    return hooks.Table("test", "env", own + extra)


@pytest.fixture
def guard():
    res = hooks.resolve("weight-guard", _table())
    assert res.ok, res.reason
    assert weight_guard.apply(res)
    yield weight_guard
    weight_guard.remove()


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "weight guard" in r.getMessage()]


@pytest.mark.parametrize(
    ("quantization", "extra"),
    [(None, {}), (None, {"enable_weights_track": True}), ("fp8", {})],
)
def test_vllms_own_check_lets_the_dropped_shared_expert_through(loader, quantization, extra):
    """The gap, in vLLM 0.33 itself: on an unquantized model its check exempts every layer
    with a quant method, asked or not; on a quantized one it does not run unless asked."""
    draft = T.load(
        loader(**extra),
        T.TinyDSparkDraftGap(),
        T.draft_checkpoint(),
        T.model_config("draft", quantization),
    )
    assert isinstance(draft, T.TinyDSparkDraftGap)  # served on an unfilled shared expert


def test_vllms_opt_in_for_quantized_models_refuses_every_dspark_draft(loader) -> None:
    """Asked (enable_weights_track) on a quantized model, vLLM checks every layer, but
    before the draft's head and embedding become the target's: a complete DSpark draft
    fails. Hence the guard's own rule, which defers those two."""
    with pytest.raises(ValueError, match="not initialized from checkpoint") as err:
        T.load(
            loader(enable_weights_track=True),
            T.TinyDSparkDraft(),
            T.draft_checkpoint(),
            T.model_config("draft", "fp8"),
        )
    assert "'lm_head.weight'" in str(err.value) and "'model.embed_tokens.weight'" in str(err.value)
    assert GAP not in str(err.value)


def test_vllms_own_check_does_catch_a_missing_norm(loader) -> None:
    """What vLLM's check covers (a bare parameter, no quant method), so the test above is
    not passing because vLLM's check never runs here."""
    with pytest.raises(ValueError, match="model.norm.weight"):
        T.load(
            loader(),
            T.TinyTarget(),
            T.target_checkpoint(drop=("model.norm.weight",)),
            T.model_config("generate"),
        )


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_the_guard_refuses_the_dropped_shared_expert(loader, guard, quantization) -> None:
    with pytest.raises(guard.UnfilledWeights) as err:
        T.load(
            loader(),
            T.TinyDSparkDraftGap(),
            T.draft_checkpoint(),
            T.model_config("draft", quantization),
        )
    msg = str(err.value)
    assert msg.startswith(
        "weight guard: 1 parameter of the draft model TinyDSparkDraftGap (checkpoint "
        f"/ckpt/tiny) was not filled from the checkpoint: {GAP}. "
    )
    assert "VLLM_DSV4_WEIGHT_GUARD=0 serves anyway" in msg


def test_a_target_missing_a_linear_weight_is_refused(loader, guard) -> None:
    drop = "model.layers.0.ffn.shared_experts.down_proj.weight"
    with pytest.raises(guard.UnfilledWeights, match=f"target model TinyTarget .*: {drop}\\."):
        T.load(
            loader(), T.TinyTarget(), T.target_checkpoint(drop=(drop,)), T.model_config("generate")
        )


def test_a_target_without_its_lm_head_is_refused_not_deferred(loader, guard) -> None:
    with pytest.raises(
        guard.UnfilledWeights, match=r"target model TinyTarget .*: lm_head\.weight\."
    ):
        T.load(
            loader(),
            T.TinyTarget(),
            T.target_checkpoint(drop=("lm_head.weight",)),
            T.model_config("generate"),
        )


@pytest.mark.parametrize("speculator", [T.V2Speculator, T.V1Proposer])
def test_a_complete_draft_whose_head_is_the_targets_passes(loader, guard, speculator, caplog):
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        target = T.load(loader(), T.TinyTarget(), T.target_checkpoint(), T.model_config("generate"))
        spec = speculator(loader(), T.TinyDSparkDraft)
        if speculator is T.V2Speculator:
            draft = spec.load_draft_model(target, set())
        else:
            spec.load_model(target)
            draft = spec.model
    assert draft.lm_head is target.lm_head and draft.model.embed_tokens is target.model.embed_tokens
    assert weight_guard.DEFERRED_ATTR not in draft.__dict__
    assert _lines(caplog)[:3] == [
        "weight guard: target TinyTarget: 6 of 6 parameters filled from the checkpoint "
        f"(pid {_pid()})",
        "weight guard: draft TinyDSparkDraft: 3 of 5 parameters filled from the checkpoint; "
        "to be the target's after the draft loader: model.embed_tokens.weight, lm_head.weight "
        f"(pid {_pid()})",
        "weight guard: draft TinyDSparkDraft: model.embed_tokens.weight, lm_head.weight are the "
        f"target's: every parameter filled (pid {_pid()})",
    ]


def _pid() -> int:
    import os

    return os.getpid()


def test_a_draft_head_vllm_did_not_alias_is_refused(loader, guard) -> None:
    target = T.load(loader(), T.TinyTarget(), T.target_checkpoint(), T.model_config("generate"))
    with pytest.raises(guard.UnfilledWeights) as err:
        T.V2Speculator(loader(), T.TinyDSparkDraft, share=False).load_draft_model(target, set())
    msg = str(err.value)
    assert "2 parameters of the draft model TinyDSparkDraft" in msg
    assert "checkpoint: model.embed_tokens.weight, lm_head.weight." in msg
    assert "vLLM's draft loader did not replace them with the target's" in msg


def test_a_draft_that_claims_its_own_head_but_has_none_is_refused(loader, guard) -> None:
    """vLLM's v1 proposer keeps a draft's own head unless it equals the target's; one the
    checkpoint never filled does not, so it stays: the guard names it."""
    target = T.load(loader(), T.TinyTarget(), T.target_checkpoint(), T.model_config("generate"))
    spec = T.V1Proposer(loader(), T.TinyOwnHeadDraft)
    with pytest.raises(
        guard.UnfilledWeights, match=r"not filled from the checkpoint: lm_head\.weight\."
    ):
        spec.load_model(target)
    assert spec.model.model.embed_tokens is target.model.embed_tokens  # that one was shared


def test_a_kv_cache_scale_is_exempt(loader, guard) -> None:
    import torch
    from torch import nn
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    model = T.TinyTarget()
    attn = nn.Module()
    attn.quant_method = BaseKVCacheMethod.__new__(BaseKVCacheMethod)
    attn.k_scale = nn.Parameter(torch.ones(1), requires_grad=False)
    model.model.layers[0].attn = attn
    T.load(loader(), model, T.target_checkpoint(), T.model_config("generate", "fp8"))


def test_a_model_that_reports_nothing_is_let_through_with_a_warning(loader, guard, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays"):
        T.load(
            loader(),
            T.NoReportModel(),
            T.target_checkpoint(drop=("lm_head.weight",)),
            T.model_config("generate"),
        )
    assert _lines(caplog) == [
        "weight guard: target NoReportModel not checked: its load_weights reports no set of "
        f"loaded names (pid {_pid()})"
    ]


def test_a_bug_in_the_check_itself_never_fails_a_boot(loader, guard, monkeypatch, caplog):
    from dsv4_flash_overlays import weight_check

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(weight_check, "exemptions", broken)
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays"):
        T.load(loader(), T.TinyDSparkDraftGap(), T.draft_checkpoint(), T.model_config("draft"))
    assert _lines(caplog) == [
        "weight guard: draft TinyDSparkDraftGap not checked: the check failed (RuntimeError: "
        f"boom) (pid {_pid()})"
    ]


def test_the_recorder_leaves_the_model_as_it_was(loader, guard) -> None:
    model = T.TinyTarget()
    T.load(loader(), model, T.target_checkpoint(), T.model_config("generate"))
    assert "load_weights" not in model.__dict__


# ------------------------------------------------------------------- the flag, in register()
@pytest.fixture
def fresh(monkeypatch):
    import dsv4_flash_overlays as pkg

    for name in ("VLLM_DSV4_WEIGHT_GUARD", HOOKS_ENV, "DSV4_OVERLAYS_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pkg, "_APPLIED", {})
    weight_guard.remove()
    yield pkg
    weight_guard.remove()


def _load_weights():
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    return DefaultModelLoader.__dict__["load_weights"]


def test_on_by_default_with_one_line(fresh, caplog) -> None:
    before = _load_weights()
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        fresh.register()
    assert fresh.applied()["weight-guard"] is True
    assert _load_weights() is not before and _load_weights().__wrapped__ is before
    lines = [r.getMessage() for r in caplog.records if "weight-guard" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "dsv4-flash-overlays: weight-guard active (built-in upstream table"
    )


@pytest.mark.parametrize("env", [{"VLLM_DSV4_WEIGHT_GUARD": "0"}, {"DSV4_OVERLAYS_DISABLE": "1"}])
def test_off_leaves_the_loader_untouched(fresh, monkeypatch, env) -> None:
    before = _load_weights()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fresh.register()
    assert fresh.applied()["weight-guard"] is False
    assert _load_weights() is before


def test_beside_the_fp8_head_on_one_loader_removal_leaves_vllm_as_it_was(monkeypatch) -> None:
    """Both overlays wrap DSparkSpeculator.load_draft_model (fp8 first, as register()
    applies them); whichever is removed first, none of the two is left behind."""
    from dsv4_flash_overlays import dspark_nvidia as D
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    original = DSparkSpeculator.__dict__["load_draft_model"]
    monkeypatch.setattr(D, "device_reason", lambda device=None: None)
    table = hooks.parse_table(load_stack("upstream").hooks_json())
    try:
        assert D.apply(hooks.resolve("fp8-draft-head", table))
        assert weight_guard.apply(hooks.resolve("weight-guard", table))
        both = DSparkSpeculator.__dict__["load_draft_model"]
        assert both.__wrapped__.__wrapped__ is original
        assert weight_guard.apply(hooks.resolve("weight-guard", table))  # idempotent
        assert DSparkSpeculator.__dict__["load_draft_model"] is both
        D.remove()  # puts the original back under the guard's wrapper
        weight_guard.remove()  # must not put the fp8 wrapper back
        assert DSparkSpeculator.__dict__["load_draft_model"] is original
    finally:
        D.remove()
        weight_guard.remove()
