"""The fp8 draft-head overlay against real vLLM 0.33 classes, on the CPU.

The GEMM itself is replaced by its CPU emulation (``fp8_tune.reference.emulate_kernel``); what is
tested here is the patch: where it hooks, what it leaves alone, and how it falls back. Upstream's
shape (``compute_draft_logits`` replaced) runs on vLLM 0.33's own classes; the fork's shape
(``draft(..., lm_head, logits_processor)`` called with the stand-in) on a model of the fork's
call pattern (tests/support/fork_dspark_model.py) with vLLM 0.33's real LogitsProcessor.
"""

from __future__ import annotations

import json
import logging
import types

import pytest
import torch
from dsv4_flash_overlays import hooks

from pairctl.engine.stack import HOOKS_ENV, load_stack

pytestmark = pytest.mark.needs_vllm

N, K = 384, 256


@pytest.fixture
def vllm_mods():
    from vllm.model_executor.layers import logits_processor as lp_mod
    from vllm.models.deepseek_v4.nvidia import dspark
    from vllm.v1.worker.gpu.spec_decode.dspark import speculator

    return types.SimpleNamespace(lp=lp_mod, dspark=dspark, spec=speculator)


@pytest.fixture
def overlay(vllm_mods, monkeypatch):
    """dspark_nvidia with the device check passing and the GEMM emulated; undone after."""
    from dsv4_flash_overlays import dspark_nvidia as D
    from dsv4_flash_overlays import fp8_head as F
    from dsv4_flash_overlays.fp8_head import dispatch

    from bench.kernels.fp8_tune import reference as R

    monkeypatch.setattr(D, "device_reason", lambda device=None: None)
    monkeypatch.delenv(HOOKS_ENV, raising=False)
    calls = []

    def fake_run(choice, a, q, s):
        assert isinstance(choice, F.W8A16Config), choice  # the untuned default on a CPU
        calls.append(a.shape[0])
        return R.emulate_kernel(a, q, s)

    monkeypatch.setattr(dispatch, "run_choice", fake_run)
    D.calls = calls
    yield D
    D.remove()


def _model(vllm_mods, monkeypatch, weight_dtype=torch.bfloat16):
    """A real DSparkDeepseekV4ForCausalLM object with just what the head path touches."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    monkeypatch.setattr(
        vllm_mods.lp, "get_current_vllm_config", lambda: types.SimpleNamespace(model_config=None)
    )
    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    torch.manual_seed(0)
    lm_head = torch.nn.Module()
    lm_head.weight = torch.nn.Parameter(
        (torch.randn(N, K) * 0.05).to(weight_dtype), requires_grad=False
    )
    lm_head.quant_method = UnquantizedEmbeddingMethod()
    lm_head.tp_size = 1
    model.lm_head = lm_head
    inner = torch.nn.Module()
    inner.norm = torch.nn.Identity()
    model.model = inner
    model.config = types.SimpleNamespace(hidden_size=K)
    model.logits_processor = vllm_mods.lp.LogitsProcessor(N)
    return model


def test_flag_off_leaves_vllm_untouched(vllm_mods, monkeypatch):
    import dsv4_flash_overlays as plugin

    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    before = (
        cls.compute_draft_logits,
        cls.compute_logits,
        vllm_mods.spec.DSparkSpeculator.load_draft_model,
    )
    monkeypatch.delenv("VLLM_DSPARK_FP8_DRAFT_HEAD", raising=False)
    monkeypatch.setattr(plugin, "_APPLIED", {})
    plugin.register()
    assert plugin.applied()["fp8-draft-head"] is False
    assert (
        cls.compute_draft_logits,
        cls.compute_logits,
        vllm_mods.spec.DSparkSpeculator.load_draft_model,
    ) == before


def test_flag_on_cpu_only_process_logs_why_and_changes_nothing(vllm_mods, monkeypatch, caplog):
    import dsv4_flash_overlays as plugin
    from dsv4_flash_overlays import dspark_nvidia as D

    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    before = cls.compute_draft_logits
    monkeypatch.setenv("VLLM_DSPARK_FP8_DRAFT_HEAD", "1")
    monkeypatch.setenv(HOOKS_ENV, load_stack("upstream").hooks_json())
    monkeypatch.setattr(plugin, "_APPLIED", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        plugin.register()
    assert plugin.applied()["fp8-draft-head"] is False
    lines = [r.getMessage() for r in caplog.records if "fp8-draft-head" in r.getMessage()]
    assert len(lines) == 1, lines  # one line: which stack, which vLLM, why
    assert lines[0].startswith(
        "dsv4-flash-overlays: fp8-draft-head not applied (stack upstream, vLLM 0.33."
    )
    assert lines[0].endswith("no CUDA device in this process; vLLM left untouched")
    assert cls.compute_draft_logits is before and not getattr(before, D.PATCH_MARK, False)


def test_old_gpu_is_refused(monkeypatch):
    from dsv4_flash_overlays import dspark_nvidia as D

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert "SM 8.6" in D.device_reason()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 1))
    assert D.device_reason() is None  # GB10 (SM 12.1) qualifies


def test_markers_match_installed_vllm_and_drift_refuses(overlay, vllm_mods):
    assert hooks.resolve("fp8-draft-head").ok  # the built-in (upstream) table holds in 0.33
    table = json.loads(load_stack("upstream").hooks_json())
    head = next(h for h in table["hooks"] if h["qualname"] == "LogitsProcessor._apply_head")
    head["anchors"] = ["no such code"]
    res = hooks.resolve("fp8-draft-head", hooks.parse_table(json.dumps(table)))
    out = overlay.apply(res)
    assert not out and out.reason == (
        "stack upstream: hook vllm.model_executor.layers.logits_processor:"
        "LogitsProcessor._apply_head (check): does not contain 'no such code'"
    )
    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    assert not getattr(cls.compute_draft_logits, overlay.PATCH_MARK, False)


def test_draft_path_swapped_verify_path_not(overlay, vllm_mods, monkeypatch):
    from bench.kernels.fp8_tune import reference as R

    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    verify_before = cls.compute_logits
    assert overlay.apply() and overlay.apply()  # idempotent
    patched = cls.compute_draft_logits
    assert getattr(patched, overlay.PATCH_MARK) and cls.compute_logits is verify_before
    model = _model(vllm_mods, monkeypatch)
    h = torch.randn(10, K).bfloat16()
    bf16 = torch.nn.functional.linear(h, model.lm_head.weight)

    verify = model.compute_logits(h)
    assert torch.equal(verify, bf16)  # target logits: untouched bf16

    draft = model.compute_draft_logits(h)
    head = model.lm_head.__dict__[overlay.HEAD_ATTR]  # kept on the (shared) lm_head
    assert overlay.calls == [10]
    assert torch.equal(draft, R.emulate_kernel(h, head.fp8.q, head.fp8.scale))
    assert not torch.equal(draft, bf16)  # really the fp8 copy ...
    rel = (draft.float() - bf16.float()).norm() / bf16.float().norm()
    assert rel < 0.05  # ... of the same head (e4m3: ~2.5% rms per logit)
    assert head.extra_bytes == N * K + 4 * N

    overlay.remove()
    assert cls.compute_draft_logits is not patched
    assert torch.equal(model.compute_draft_logits(h), bf16)


def test_speculator_loader_builds_the_copy_before_capture(overlay, vllm_mods, monkeypatch):
    spec_cls = vllm_mods.spec.DSparkSpeculator
    model = _model(vllm_mods, monkeypatch)
    monkeypatch.setattr(spec_cls, "load_draft_model", lambda self, t, names: model)
    assert overlay.apply()
    assert spec_cls.load_draft_model(object(), None, set()) is model
    assert isinstance(model.lm_head.__dict__[overlay.HEAD_ATTR], overlay._Fp8LmHead)


def test_non_bf16_head_stays_bf16_and_says_why(overlay, vllm_mods, monkeypatch, caplog):
    assert overlay.apply()
    model = _model(vllm_mods, monkeypatch, weight_dtype=torch.float32)
    h = torch.randn(5, K)
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays"):
        out = model.compute_draft_logits(h)
    assert "not bfloat16" in caplog.text
    assert torch.equal(out, torch.nn.functional.linear(h, model.lm_head.weight))
    assert overlay.calls == []


# ------------------------------------------------------------------- the fork's shape
_FORK = "tests.support.fork_dspark_model"


def _fork_style_table() -> hooks.Table:
    """The fork's roles (fork.yaml) pointed at the model of its call pattern."""
    return hooks.Table(
        "fork-model",
        "env",
        (
            hooks.Hook(
                "fp8-draft-head",
                _FORK,
                "ForkStyleDraftModel.draft",
                "draft-head-arg",
                ("logits_processor(lm_head, normed)",),
            ),
            hooks.Hook(
                "fp8-draft-head",
                _FORK,
                "ForkStyleProposer.load_model",
                "loader",
                ("self._share_lm_head(",),
            ),
        ),
    )


def _fork_head(vllm_mods, monkeypatch):
    model = _model(vllm_mods, monkeypatch)
    model.lm_head.shard_indices = types.SimpleNamespace(org_vocab_start_index=7)
    return model.lm_head, model.logits_processor


def test_fork_shape_draft_runs_on_the_fp8_stand_in(overlay, vllm_mods, monkeypatch):
    from bench.kernels.fp8_tune import reference as R
    from tests.support import fork_dspark_model as F

    original = F.ForkStyleDraftModel.draft
    assert overlay.apply(hooks.resolve("fp8-draft-head", _fork_style_table()))
    lm_head, lp = _fork_head(vllm_mods, monkeypatch)
    draft = F.ForkStyleDraftModel(hidden_size=K)
    h = torch.randn(10, K).bfloat16()
    ids, logits = draft.draft(torch.zeros(10), h, torch.zeros(10), lm_head, lp)
    stand_in = draft.seen_heads[-1]
    assert isinstance(stand_in, overlay._Fp8LmHead) and stand_in.real is lm_head
    assert torch.equal(logits, R.emulate_kernel(h, stand_in.fp8.q, stand_in.fp8.scale))
    assert overlay.calls == [10]
    bf16 = torch.nn.functional.linear(h, lm_head.weight)
    assert torch.equal(lp(lm_head, h), bf16)  # the target's own call: still bf16

    # the local-argmax path: quant_method.apply and shard_indices through the stand-in
    ids, local = draft.draft(torch.zeros(10), h, torch.zeros(10), lm_head, lp, local_argmax=True)
    assert torch.equal(local, logits) and torch.equal(ids, logits.argmax(-1) + 7)

    overlay.remove()
    assert F.ForkStyleDraftModel.draft is original
    draft.draft(torch.zeros(10), h, torch.zeros(10), lm_head, lp)
    assert draft.seen_heads[-1] is lm_head


def test_fork_shape_inherited_loader_builds_on_the_shared_head(overlay, vllm_mods, monkeypatch):
    from tests.support import fork_dspark_model as F

    assert "load_model" not in vars(F.ForkStyleProposer)
    assert overlay.apply(hooks.resolve("fp8-draft-head", _fork_style_table()))
    lm_head, lp = _fork_head(vllm_mods, monkeypatch)
    target = types.SimpleNamespace(lm_head=lm_head)
    outer = types.SimpleNamespace(logits_processor=lp, config=types.SimpleNamespace(hidden_size=K))
    proposer = F.ForkStyleProposer(outer)
    proposer.load_model(target)
    assert outer.lm_head is lm_head
    assert isinstance(lm_head.__dict__[overlay.HEAD_ATTR], overlay._Fp8LmHead)
    overlay.remove()
    assert "load_model" not in vars(F.ForkStyleProposer)  # the base class's, uncovered again
    assert F.ForkStyleProposer.load_model is F.ForkStyleBaseProposer.load_model
