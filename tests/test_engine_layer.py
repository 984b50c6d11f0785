"""The rehearsal layer: exactly the declared changes, and nothing else, between the
launcher's `vllm serve` line and what the real CPU engine runs.

The input is the launcher's own output for both ranks (the recipe on `.env.example`), so
a recipe change that the layer does not expect (a flag renamed, a value it replaces
differently) fails here instead of silently in a rehearsal log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dotenv import dotenv_values

from pairctl.pair.config import parse_env
from pairctl.pair.plan import build_rank
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from sim.engine import layer

REPO = Path(__file__).resolve().parents[1]


def launcher_lines() -> list[tuple[list[str], dict[str, str]]]:
    """(vllm argv after the entrypoint, container env) for rank 0 and rank 1."""
    cfg = parse_env(dict(dotenv_values(REPO / ".env.example")))
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    out = []
    for rank in (0, 1):
        rp = build_rank(resolve(cfg, recipe), rank)
        argv = list(rp.docker_argv)
        cmd = argv[argv.index(rp.image) + 1 :]
        env = dict(
            kv.partition("=")[::2]
            for kv in (argv[i + 1] for i, a in enumerate(argv) if a == "-e" and "=" in argv[i + 1])
        )
        out.append((cmd, env))
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_the_layer_changes_only_what_it_declares(rank):
    cmd, env = launcher_lines()[rank]
    assert cmd[0] == "serve"
    rules = layer.load()
    new_cmd, new_env, changes = layer.apply(rules, cmd, env)
    head, flags = layer._split(cmd)
    new_head, new_flags = layer._split(new_cmd)
    assert new_head == head  # `serve MODEL`: untouched
    declared = {r.name for r in rules if r.kind == "flag"}
    before = {n: v for n, v in flags if n not in declared}
    after = {n: v for n, v in new_flags if n not in declared}
    assert after == before  # every undeclared flag reaches the engine as written, in order
    assert [n for n, _ in new_flags if n not in declared] == [
        n for n, _ in flags if n not in declared
    ]
    got = dict(new_flags)
    assert json.loads(got["speculative-config"][0]) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    assert "kv-cache-dtype" not in got and "gpu-memory-utilization" not in got
    assert got["enforce-eager"] == []
    env_rules = {r.name: r.value for r in rules if r.kind == "env"}
    assert {k: v for k, v in new_env.items() if k not in env_rules} == {
        k: v for k, v in env.items() if k not in env_rules
    }
    assert all(new_env[k] == v for k, v in env_rules.items())
    # one log line per change, naming what and why
    lines = [c.line() for c in changes]
    assert any(
        ln.startswith('rehearsal layer: --speculative-config: {"method":"dspark"') for ln in lines
    ), lines
    assert "rehearsal layer: dropped --kv-cache-dtype fp8 (" in "\n".join(lines)
    assert all("(" in ln and ln.endswith(")") for ln in lines)


def test_the_speculative_tokens_match_the_recipes():
    """ngram drafts as many tokens as the recipe's DSpark gamma, so per-position acceptance
    has the same number of positions as on a Spark."""
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    gamma = recipe.serve["speculative-config"]["num_speculative_tokens"]
    rule = next(r for r in layer.load() if r.name == "speculative-config")
    assert json.loads(rule.value)["num_speculative_tokens"] == gamma


def test_flag_forms_and_absent_flags():
    rules = [
        layer.Rule("flag", "kv-cache-dtype", "drop", None, "w"),
        layer.Rule("flag", "speculative-config", "replace", "X", "w"),
        layer.Rule("flag", "enforce-eager", "add", None, "w"),
    ]
    argv = ["serve", "m", "--kv-cache-dtype=fp8", "--max-num-seqs", "4", "--enforce-eager"]
    out, _, changes = layer.apply(rules, argv, {})
    # drop works on the `=` form; replace of an absent flag adds nothing; add is idempotent
    assert out == ["serve", "m", "--max-num-seqs", "4", "--enforce-eager"]
    assert [c.rule.name for c in changes] == ["kv-cache-dtype"]


@pytest.mark.parametrize(
    "text, msg",
    [
        ("rules: [{kind: flag, name: x, action: set, value: 1, why: w}]", "not allowed"),
        ("rules: [{kind: env, name: X, action: set, why: w}]", "needs a value"),
        ("rules: [{kind: flag, name: x, action: drop}]", "needs a name and a why"),
    ],
)
def test_a_malformed_layer_is_refused(tmp_path, text, msg):
    f = tmp_path / "l.yaml"
    f.write_text(text)
    with pytest.raises(layer.LayerError, match=msg):
        layer.load(f)
