"""Recipes: validation, CLI > recipe > default, the seed's tuned values, and every serve key
checked against real vLLM 0.33's own ``vllm serve`` argument parser."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from pairctl.pair.config import ConfigError, parse_env
from pairctl.pair.plan import build_rank
from pairctl.pair.recipe import load_recipe, parse_recipe, serve_argv
from pairctl.pair.resolved import resolve
from tests.support import warm

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
MAIN = REPO / "recipes" / "dsv4-flash-dspark.yaml"

ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "MODEL_PATH": "/models/dsv4",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
}


def _raw() -> dict:
    return yaml.safe_load(MAIN.read_text())


def test_seed_tuned_values_present() -> None:
    r = load_recipe(MAIN)
    s, e = r.serve, r.env
    assert s["long-prefill-token-threshold"] == 4096
    assert s["max-num-seqs"] == 24
    assert s["speculative-config"] == {"method": "dspark", "num_speculative_tokens": 5}
    assert s["tensor-parallel-size"] == 2 and s["nnodes"] == 2
    assert s["distributed-executor-backend"] == "mp"
    assert s["kv-cache-dtype"] == "fp8" and s["port"] == 8000
    for k in ("tokenizer-mode", "reasoning-parser", "tool-call-parser"):
        assert s[k] == "deepseek_v4"
    assert e["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "600"
    assert e["VLLM_INCREMENTAL_ENCODE_CACHE"] == "1"
    assert e["VLLM_DSPARK_FP8_DRAFT_HEAD"] == "1"
    assert e["VLLM_DSV4_WEIGHT_GUARD"] == "1"
    assert e["TILELANG_CACHE_DIR"] == "${TILELANG_CACHE_DIR}"
    assert "VLLM_DSV4_B12X_COMPRESSED_MLA" not in e


def test_each_tuned_value_is_commented_with_what_it_bought() -> None:
    text = MAIN.read_text()
    for key, evidence in (
        ("long-prefill-token-threshold", "+53%"),
        ("max-num-seqs", "108 -> 131"),
        ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300 s"),
        ("VLLM_INCREMENTAL_ENCODE_CACHE", "0.92 s -> 0.47 s"),
        ("VLLM_DSPARK_FP8_DRAFT_HEAD", "+3-5%"),
        ("VLLM_DSV4_WEIGHT_GUARD", "60% -> 26%"),
        ("TILELANG_CACHE_DIR", "6-10 s"),
    ):
        idx = text.index(f"  {key}:")
        assert evidence in text[max(0, idx - 400) : idx], key


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda d: d.pop("recipe_version"), "recipe_version is required"),
        (lambda d: d.update(recipe_version=99), "not supported"),
        (lambda d: d.update(bogus=1), "unknown top-level key"),
        (lambda d: d["serve"].update({"max_num_seqs": 3}), "long flag name"),
        (lambda d: d["serve"].update({"--port": 3}), "long flag name"),
        (lambda d: d["serve"].update({"node-rank": 1}), "set by the launcher"),
        (lambda d: d["serve"].update({"master-addr": "x"}), "set by the launcher"),
        (lambda d: d["container"].update(shm="1g"), "unknown container key"),
        (lambda d: d["container"].update(ulimits=["memlock"]), "ulimits"),
        (lambda d: d["env"].update({"BAD-NAME": "1"}), "not a valid variable"),
        (lambda d: d["env"].update({"X": {"a": 1}}), "scalar"),
        (lambda d: d.pop("serve"), "serve must be"),
    ],
)
def test_recipe_validation_rejects(mutate, msg: str) -> None:
    d = _raw()
    mutate(d)
    with pytest.raises(ConfigError, match=msg):
        parse_recipe(d, "r.yaml")


def test_unknown_placeholder_is_config_error() -> None:
    d = _raw()
    d["env"]["X"] = "${NOPE}"
    r = parse_recipe(d)
    with pytest.raises(ConfigError, match="NOPE"):
        build_rank(resolve(parse_env(ENV), r), 0)


def test_serve_argv_rendering() -> None:
    argv = serve_argv({"a": True, "b": False, "c": None, "d": {"x": 1}, "e": [1, 2], "f": 3})
    assert argv == ["--a", "--no-b", "--d", '{"x":1}', "--e", "1", "2", "--f", "3"]


def test_precedence_cli_over_env_over_recipe() -> None:
    cfg = parse_env(dict(ENV, PORT="8123"))
    rp = build_rank(resolve(cfg, load_recipe(MAIN), ["--max-num-seqs", "8"]), 0)
    argv = list(rp.vllm_argv)
    assert argv[argv.index("--port") + 1] == "8123"  # env PORT over recipe port 8000
    assert argv[-2:] == ["--max-num-seqs", "8"]  # passthrough last: argparse keeps the last
    assert rp.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    cfg = parse_env(dict(ENV, NCCL_IB_HCA=""))
    assert "NCCL_IB_HCA" not in build_rank(resolve(cfg, load_recipe(MAIN)), 0).env


def test_recipe_port_is_default_and_wiring_not_overridable() -> None:
    from pairctl.pair.derive import with_recipe_defaults
    from pairctl.pair.recipe import check_passthrough

    d = _raw()
    d["serve"]["port"] = 8100
    cfg = with_recipe_defaults(parse_env(ENV), parse_recipe(d))
    assert cfg["PORT"] == "8100"
    cfg = with_recipe_defaults(parse_env(dict(ENV, PORT="8200")), parse_recipe(d))
    assert cfg["PORT"] == "8200"
    for bad in (["--port", "1"], ["--node-rank=0"], ["--headless"], ["--master-addr", "x"]):
        with pytest.raises(ConfigError, match="set by the launcher"):
            check_passthrough(bad)
    check_passthrough(["--max-num-seqs", "8", "--twin-fault", "rank1-crash"])
    d["serve"]["port"] = "eighty"
    with pytest.raises(ConfigError, match="serve.port"):
        parse_recipe(d)


_PARSE = r"""
import json, os, sys
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # parser needs a platform; CPU is enough
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
options = sorted(parser._option_string_actions)
results = []
for argv in json.load(sys.stdin):
    try:
        ns = parser.parse_args(argv)
        validate_parsed_serve_args(ns)
        results.append({k: v for k, v in vars(ns).items()
                        if isinstance(v, (int, float, str, bool, dict, list, type(None)))})
    except SystemExit as e:
        results.append({"__error__": f"exit {e.code}"})
    except Exception as e:
        results.append({"__error__": f"{type(e).__name__}: {e}"})
print("@@JSON@@" + json.dumps({"options": options, "results": results}))
"""


@pytest.fixture(scope="module")
def vllm_parse():
    """Parse argv lists with real vLLM 0.33's serve parser (in a subprocess: vLLM import
    picks a platform globally, which must not leak into other tests)."""

    def run(argvs: list[list[str]]) -> dict:
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
        p = warm.run(sys.executable, ["-c", _PARSE], input=json.dumps(argvs), env=env, timeout=240)
        assert "@@JSON@@" in p.stdout, p.stderr[-3000:]
        return json.loads(p.stdout.split("@@JSON@@", 1)[1])

    return run


@pytest.mark.needs_vllm
def test_every_serve_key_is_a_real_vllm_flag(vllm_parse) -> None:
    cfg = parse_env(ENV)
    cases: list[list[str]] = []
    for path in RECIPES:
        recipe = load_recipe(path)
        for rank in (0, 1):
            cases.append(list(build_rank(resolve(cfg, recipe), rank).vllm_argv[2:]))
    cases.append(["m", "--max-num-seqz", "3"])  # control: a typo must fail
    out = vllm_parse(cases)
    options = set(out["options"])
    for path in RECIPES:
        for key, val in load_recipe(path).serve.items():
            flag = f"--{key}" if val is not False else f"--no-{key}"
            assert flag in options, f"{path.name}: {flag} is not a vLLM 0.33 serve flag"
    for flag in ("--node-rank", "--master-addr", "--master-port", "--headless", "--nnodes"):
        assert flag in options
    *results, control = out["results"]
    assert "__error__" in control
    for res in results:
        assert "__error__" not in res, res
    head, worker = results[0], results[1]
    for ns in (head, worker):
        assert ns["tensor_parallel_size"] == 2 and ns["nnodes"] == 2
        assert ns["distributed_executor_backend"] == "mp"
        assert ns["speculative_config"] == {"method": "dspark", "num_speculative_tokens": 5}
        # the fork stack (the default) caps it to 1 without the Keys patch (tests/test_stacks.py)
        assert ns["long_prefill_token_threshold"] == 4096 and ns["max_num_seqs"] == 1
        assert ns["trust_remote_code"] is True and ns["block_size"] == 256
        assert ns["kv_cache_dtype"] == "fp8" and ns["tokenizer_mode"] == "deepseek_v4"
        assert ns["reasoning_parser"] == "deepseek_v4" and ns["tool_call_parser"] == "deepseek_v4"
        assert ns["master_addr"] == "10.0.0.1" and ns["model_tag"] == "/models/dsv4"
    assert head["node_rank"] == 0 and head["headless"] is False
    assert worker["node_rank"] == 1 and worker["headless"] is True
