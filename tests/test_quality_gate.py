"""quality_ref_dspark.py: passes a correct endpoint, fails (naming the prompt) on anything else."""

from __future__ import annotations

import json

import pytest

from bench import quality_ref_dspark as q
from tests.fakes.mock_openai import MockConfig, MockServer

REF = json.loads(q.DEFAULT_PROMPTS.read_text())
RIGHT = {p["prompt"]: p["answer"] for p in REF["prompts"]}


def run(cfg: MockConfig, capsys, *extra: str) -> tuple[int, str]:
    with MockServer(cfg) as m:
        rc = q.main(["--url", m.url, *extra])
    return rc, capsys.readouterr().out


def test_reference_file_is_well_formed():
    names = [p["name"] for p in REF["prompts"]]
    assert names == ["arithmetic", "fact", "code_output", "counting", "strict_json"]
    # The expected answers are true (checked here, not trusted).
    assert REF["prompts"][0]["answer"] == str(347 * 29)
    assert REF["prompts"][2]["answer"] == str(sum(i * i for i in range(5)))
    items = "apple, pear, fig, plum, kiwi, lime, date"
    assert items in REF["prompts"][3]["prompt"]
    assert REF["prompts"][3]["answer"] == str(len(items.split(",")))
    assert json.loads(REF["prompts"][4]["answer"]) == {"city": "Paris", "n": 3}


def test_correct_endpoint_passes(capsys, tmp_path):
    out_json = tmp_path / "q.json"
    rc, out = run(MockConfig(answers=RIGHT), capsys, "--json", str(out_json))
    assert rc == 0, out
    assert out.count("PASS") == 5 and "5/5 passed" in out
    assert json.loads(out_json.read_text())["passed"] is True


def test_wrong_answer_fails_naming_the_prompt(capsys):
    wrong = dict(RIGHT)
    counting = next(p for p in REF["prompts"] if p["name"] == "counting")
    wrong[counting["prompt"]] = "8"
    rc, out = run(MockConfig(answers=wrong), capsys)
    assert rc == 1
    assert "FAIL counting" in out and "failed: counting" in out and out.count("PASS") == 4


def test_fenced_json_is_not_strict_json(capsys):
    fenced = dict(RIGHT)
    js = next(p for p in REF["prompts"] if p["name"] == "strict_json")
    fenced[js["prompt"]] = "```json\n" + js["answer"] + "\n```"
    rc, out = run(MockConfig(answers=fenced), capsys)
    assert rc == 1 and "FAIL strict_json" in out


@pytest.mark.parametrize(
    ("mode", "needle"),
    [("http500", "HTTP 500"), ("badjson", "malformed response JSON"), ("slow", "timeout")],
)
def test_transport_failures_fail_every_prompt(capsys, mode, needle):
    rc, out = run(MockConfig(answers=RIGHT, mode=mode, slow_s=2.0), capsys, "--timeout-s", "0.3")
    assert rc == 1
    assert out.count("FAIL") == 5 and needle in out
    assert "failed: arithmetic, fact, code_output, counting, strict_json" in out


def test_unreachable_endpoint_fails_in_one_line_naming_url_and_cause(capsys):
    assert q.main(["--url", "http://127.0.0.1:9", "--ready-timeout-s", "1"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "FAIL endpoint: http://127.0.0.1:9/v1/models not ready after 1 s: "
        "connection refused (nothing listens there)"
    ]


def test_normalisation_is_narrow():
    spec = {"check": "exact", "answer": "Au"}
    assert q.check(spec, " Au.\n") is None and q.check(spec, "`Au`") is None
    assert q.check(spec, "au") is not None and q.check(spec, "The symbol is Au") is not None


def test_a_prompt_may_declare_tolerant_matching():
    spec = {
        "check": "exact",
        "answer": "Paris",
        "forgive": ["emphasis", "punctuation", "case"],
        "accept": ["Paris, France"],
    }
    for right in ("**Paris**", "Paris.", "_paris_", "PARIS!", "«Paris»", "paris, france."):
        assert q.check(spec, right) is None, right
    for wrong in ("Lyon", "**Lyon**", "Paris is the capital", "Pa ris"):
        assert "expected 'Paris' or 'Paris, France'" in q.check(spec, wrong), wrong
    only_emphasis = {"check": "exact", "answer": "Au", "forgive": ["emphasis"]}
    assert q.check(only_emphasis, "**Au**") is None
    assert q.check(only_emphasis, "Au.") is not None and q.check(only_emphasis, "au") is not None
    number = {"check": "exact", "answer": "391", "regex": r"391(\.0+)?"}
    assert q.check(number, "391.00") is None and q.check(number, "3910") is not None


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"forgive": ["bold"]}, "forgive must be a list of"),
        ({"accept": "Paris"}, "accept must be a list"),
        ({"regex": "(unclosed"}, "does not compile"),
    ],
)
def test_a_bad_matching_declaration_is_refused_before_any_request(tmp_path, extra, needle):
    import argparse

    from pairctl.gate.check import load_reference

    doc = {"max_tokens": 8, "prompts": [{**REF["prompts"][1], **extra}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(argparse.ArgumentTypeError, match=needle) as exc:
        load_reference(str(path))
    assert "prompt fact" in str(exc.value)


def test_the_answer_is_read_from_content_and_reasoning_is_set_apart():
    """vLLM 0.33's shapes with --reasoning-parser deepseek_v4 (sim/twin/thinking.py)."""
    from pairctl.gate.reply import from_body

    cut = {
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "reasoning": "Let me see, 29"},
                "finish_reason": "length",
            }
        ],
        "usage": {"completion_tokens": 64, "completion_tokens_details": {"reasoning_tokens": 64}},
    }
    r = from_body(cut)
    assert r.all_reasoning and r.finish_reason == "length"
    assert r.no_answer() == (
        "the reply was all reasoning (64 tokens); raise max_tokens or ask without thinking"
    )
    done = {"choices": [{"message": {"content": "7", "reasoning": "count: 7"}}]}
    assert from_body(done).content == "7" and from_body(done).no_answer() is None
    older = {"choices": [{"message": {"content": "", "reasoning_content": "hmm"}}]}
    assert from_body(older).all_reasoning  # the field's older name
    empty = {"choices": [{"message": {"content": None}}]}
    assert from_body(empty).no_answer() == "empty reply (no content)"
    with pytest.raises(TypeError):
        from_body({"choices": [{"message": {"content": 7}}]})
