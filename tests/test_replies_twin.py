"""The gate, the canary and the acceptance probe against the simulator as a real DSV4 answers
with the recipe's ``--reasoning-parser deepseek_v4``: in thinking mode the reply's thinking
comes in ``reasoning`` and the answer in ``content``, or no answer at all when max_tokens
runs out first (sim/twin/thinking.py). Both modes are asked; the canary is also judged on
replies written here (decorated right answers, wrong ones), not the prompts file's answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pairctl.endpoint import Endpoint
from pairctl.gate import GateOptions, run_gate
from pairctl.gate.check import load_reference
from pairctl.sentinel import canary as cn
from pairctl.sentinel import record
from tests.support.bench_twin import REPO, Twin

GATE = REPO / "pairctl" / "gate"
CANARY = load_reference(str(GATE / "canary_dspark.json"))
ALL_REASONING = "the reply was all reasoning (512 tokens); raise max_tokens or ask without thinking"


def profile(answers: list[Path], reasoning: tuple[int, int]) -> str:
    files = ", ".join(str(a) for a in answers)
    return f"""profile_version: 1
name: replies
base: {REPO}/sim/profiles/spark-pair.yaml
decode:
  step_ms_by_batch: {{1: 1.0, 16: 3.0}}
  fp8_draft_head_saving_ms: 0.0
prefill:
  tok_s: 1000000
  step_base_ms: 1.0
boot:
  cold: {{loading_weights_s: 0.0, compiling_s: 0.0, capturing_graphs_s: 0.0}}
  warm: {{loading_weights_s: 0.0, compiling_s: 0.0, capturing_graphs_s: 0.0}}
  api_server_s: 0.0
  jit_stall_s: 0.0
output:
  reasoning_min_tokens: {reasoning[0]}
  reasoning_max_tokens: {reasoning[1]}
answers:
  file: [{files}]
"""


PARSER = ("--reasoning-parser", "deepseek_v4", "--tokenizer-mode", "deepseek_v4")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):
    """A twin whose thinking always outlasts 512 tokens (600-700), with the gate's and the
    canary's answers."""
    tmp = tmp_path_factory.mktemp("thinker")
    answers = [GATE / "quality_ref_dspark.json", GATE / "canary_dspark.json"]
    t = Twin(tmp, *PARSER, profile=profile(answers, (600, 700)))
    yield t
    t.stop()


def gate(twin: Twin, **opts) -> int:
    return run_gate(Endpoint.parse(twin.url), GateOptions(ready_timeout_s=10, **opts))


def test_the_gate_asks_without_thinking_and_judges_the_content(thinker, capsys) -> None:
    assert gate(thinker) == 0, capsys.readouterr().out
    assert "5/5 passed" in capsys.readouterr().out


def test_the_gate_in_thinking_mode_says_when_the_reply_was_all_reasoning(thinker, capsys) -> None:
    assert gate(thinker, thinking=True, max_tokens=512) == 1
    out = capsys.readouterr().out
    assert out.count(f"FAIL arithmetic: {ALL_REASONING}") == 1 and "0/5 passed" in out
    # room for the thinking (4096 by default in thinking mode): the answer after it passes
    assert gate(thinker, thinking=True) == 0, capsys.readouterr().out


def test_the_probe_asks_in_chat_mode_and_records_on_a_model_that_thinks(thinker, tmp_path):
    """On a model whose thinking outlasts any probe reply, ``sentinel record`` (which once
    failed on an empty ``content``) records every prompt: the probe reads only the reply's
    token count and spec-decode metrics, and asks in chat mode (tests/test_probe.py)."""
    out = tmp_path / "probe.json"
    assert record.main(["--url", thinker.url, "--out", str(out), "--repeats", "2"]) == 0
    doc = json.loads(out.read_text())
    assert [c["name"] for c in doc["classes"]] == ["prose", "code", "agent_json"]
    assert all(min(c["drafts"]) >= 16 for c in doc["classes"])


def test_the_canary_passes_on_the_thinking_twin(thinker) -> None:
    res = cn.run_against(Endpoint.parse(thinker.url), timeout_s=10)
    assert [v.kind for v in res.verdicts] == [cn.OK] * 5, res.summary()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory):
    """A twin that answers the canary's prompts with replies written here."""
    tmp = tmp_path_factory.mktemp("rendered")
    prompts = {p["name"]: p["prompt"] for p in CANARY["prompts"]}
    replies = {
        "arithmetic": "**391**",
        "capital_en": "Paris.",
        "capital_zh": "**巴黎**。",
        "capital_ru": "Лион",
        "code_output": "16",
    }
    doc = {"prompts": [{"prompt": prompts[n], "answer": a} for n, a in replies.items()]}
    path = tmp / "replies.json"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    t = Twin(tmp, *PARSER, profile=profile([path], (20, 40)))
    yield t
    t.stop()


def test_the_canary_forgives_renderings_and_catches_wrong_answers(rendered) -> None:
    res = cn.run_against(Endpoint.parse(rendered.url), timeout_s=10)
    kinds = {v.name: v.kind for v in res.verdicts}
    assert kinds == {
        "arithmetic": cn.OK,
        "capital_en": cn.OK,
        "capital_zh": cn.OK,
        "capital_ru": cn.WRONG,
        "code_output": cn.WRONG,
    }, res.summary()
    assert [v.name for v in res.events] == ["capital_ru", "code_output"]
