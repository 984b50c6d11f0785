"""The fp8 draft-head overlay against real vLLM 0.33 classes, on the CPU.

The GEMM itself is replaced by its CPU emulation (``fp8_tune.reference.emulate_kernel``); what is
tested here is the patch: where it hooks, what it leaves alone, and how it falls back.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch

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
    monkeypatch.setattr(plugin, "_APPLIED", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays.dspark_nvidia"):
        plugin.register()
    assert plugin.applied()["fp8-draft-head"] is False
    assert "no CUDA device" in caplog.text
    assert cls.compute_draft_logits is before and not hasattr(cls, D.PATCH_MARK)


def test_old_gpu_is_refused(monkeypatch):
    from dsv4_flash_overlays import dspark_nvidia as D

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert "SM 8.6" in D.device_reason()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 1))
    assert D.device_reason() is None  # GB10 (SM 12.1) qualifies


def test_markers_match_installed_vllm_and_drift_refuses(overlay, vllm_mods, monkeypatch, caplog):
    assert overlay.source_drift() is None
    monkeypatch.setitem(overlay.MARKERS, "LogitsProcessor._apply_head", ("no such code",))
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays.dspark_nvidia"):
        assert overlay.apply() is False
    assert "drifted" in caplog.text
    assert not hasattr(vllm_mods.dspark.DSparkDeepseekV4ForCausalLM, overlay.PATCH_MARK)


def test_draft_path_swapped_verify_path_not(overlay, vllm_mods, monkeypatch):
    from bench.kernels.fp8_tune import reference as R

    cls = vllm_mods.dspark.DSparkDeepseekV4ForCausalLM
    verify_before = cls.compute_logits
    assert overlay.apply() is True and overlay.apply() is True  # idempotent
    assert cls.compute_logits is verify_before
    model = _model(vllm_mods, monkeypatch)
    h = torch.randn(10, K).bfloat16()
    bf16 = torch.nn.functional.linear(h, model.lm_head.weight)

    verify = model.compute_logits(h)
    assert torch.equal(verify, bf16)  # target logits: untouched bf16

    draft = model.compute_draft_logits(h)
    head = model.__dict__[overlay.HEAD_ATTR]
    assert overlay.calls == [10]
    assert torch.equal(draft, R.emulate_kernel(h, head.q, head.scale))
    assert not torch.equal(draft, bf16)  # really the fp8 copy ...
    rel = (draft.float() - bf16.float()).norm() / bf16.float().norm()
    assert rel < 0.05  # ... of the same head (e4m3: ~2.5% rms per logit)
    assert head.extra_bytes == N * K + 4 * N

    overlay.remove()
    assert cls.compute_draft_logits is not overlay._compute_draft_logits
    assert torch.equal(model.compute_draft_logits(h), bf16)


def test_speculator_loader_builds_the_copy_before_capture(overlay, vllm_mods, monkeypatch):
    spec_cls = vllm_mods.spec.DSparkSpeculator
    model = _model(vllm_mods, monkeypatch)
    monkeypatch.setattr(spec_cls, "load_draft_model", lambda self, t, names: model)
    assert overlay.apply() is True
    assert spec_cls.load_draft_model(object(), None, set()) is model
    assert model.__dict__[overlay.HEAD_ATTR] is not False


def test_non_bf16_head_stays_bf16_and_says_why(overlay, vllm_mods, monkeypatch, caplog):
    assert overlay.apply() is True
    model = _model(vllm_mods, monkeypatch, weight_dtype=torch.float32)
    h = torch.randn(5, K)
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays.dspark_nvidia"):
        out = model.compute_draft_logits(h)
    assert "not bfloat16" in caplog.text
    assert torch.equal(out, torch.nn.functional.linear(h, model.lm_head.weight))
    assert overlay.calls == []
