"""Engine stacks as data: which stack a pair runs, what it changes, and how plan says so.

recipes/stacks/{fork,upstream,cpu}.yaml are loaded by pairctl/engine/stack.py and applied by
pairctl/pair/stacked.py. Precedence for `vllm serve` flags: extra args after `--` > the
stack's flags > the recipe; for the container env the stack's variable replaces the
recipe's, with a plan note. The day-one fixes that live in the same place are here too:
no HF_TOKEN in the ranks' containers, USER/LOGNAME with CONTAINER_USER, the engine-ready
timeout, the overlay hook points, and max-num-seqs capped without the fork's Keys patch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pairctl.engine.bootlog import NEEDLES, needles_for, phase_of
from pairctl.engine.image import ImageFacts
from pairctl.engine.stack import DEFAULT_STACK, HOOKS_ENV, load_stack, names, parse_stack
from pairctl.pair.config import ConfigError, parse_env
from pairctl.pair.plan import build_rank, render_plan
from pairctl.pair.recipe import load_recipe, parse_recipe
from pairctl.pair.resolved import ResolvedPair, resolve

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "MODEL_PATH": "/models/dsv4",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
}


def _pair(extra: tuple[str, ...] = (), image_patched: bool | None = None, **env) -> ResolvedPair:
    return resolve(parse_env(dict(ENV, **env)), load_recipe(RECIPE), extra, image_patched)


def _flag(argv: tuple[str, ...] | list[str], name: str) -> list[str]:
    """Every value ``--name`` is given in argv (argparse keeps the last)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name and i + 1 < len(argv)]


# -- the declarations ---------------------------------------------------------------------


def test_the_three_stacks_load_and_every_item_has_a_source() -> None:
    assert names() == ["cpu", "fork", "upstream"] and DEFAULT_STACK == "fork"
    for name in names():
        stack = load_stack(name)
        assert stack.name == name and stack.vllm and stack.interpreter and stack.entrypoint
        assert all(v.source for v in stack.env) and all(f.source for f in stack.flags)
        assert all(m.source for m in stack.boot_markers) and stack.tradeoffs
        if stack.engine_ready_s is not None and stack.first_boot_s is not None:
            assert stack.engine_ready_s >= stack.first_boot_s
    fork = load_stack("fork")
    assert fork.vllm == "0.21.1rc1.dev339+g1967a5627bc3"
    assert (fork.interpreter, fork.entrypoint) == ("/opt/env/bin/python", "/opt/env/bin/vllm")
    assert fork.dockerfile == "launch/image/Dockerfile" and fork.engine_ready_s == 3600
    assert fork.concurrency.requires_patch == "keys-concurrency"
    upstream = load_stack("upstream")
    assert upstream.vllm == "0.27.1" and upstream.kv_cache_dtype == "fp8_ds_mla"
    assert upstream.dockerfile == "launch/image/upstream/Dockerfile"
    assert upstream.moe_backend == "DEEPGEMM_MXFP4"


def test_the_fork_stacks_version_is_the_dockerfiles_base() -> None:
    """The fork stack describes the image launch/image/Dockerfile builds: its base and fork."""
    dockerfile = (REPO / load_stack("fork").dockerfile).read_text()
    assert "ARG BASE_IMAGE=ghcr.io/bjk110/vllm-spark:unholy-fusion-prod-ready" in dockerfile
    assert "ARG SITE=/opt/env/lib/python3.12/site-packages" in dockerfile
    assert "ARG PYTHON=/opt/env/bin/python" in dockerfile
    assert load_stack("fork").interpreter == "/opt/env/bin/python"


@pytest.mark.parametrize(
    "edit, msg",
    [
        ({"env": [{"name": "A", "value": "1"}]}, "every entry needs a source"),
        ({"env": [{"name": "A", "value": "1", "source": "s", "prepend": "yes"}]}, "prepend"),
        ({"env": [{"name": "A", "value": "1", "source": "s", "extra": 1}]}, "keys are"),
        ({"boot_markers_replace": "no"}, "boot_markers_replace"),
        ({"timeouts": {"engine_ready_s": 600, "first_boot_s": 780}}, "shorter than the first"),
    ],
)
def test_a_malformed_stack_is_refused(edit: dict, msg: str) -> None:
    data = yaml.safe_load((REPO / "recipes" / "stacks" / "fork.yaml").read_text())
    data.update(edit)
    with pytest.raises(ConfigError, match=msg):
        parse_stack(data, "x.yaml")


# -- which stack a pair runs --------------------------------------------------------------


def test_the_recipe_names_its_stack_and_the_env_file_overrides_it(tmp_path: Path) -> None:
    assert load_recipe(RECIPE).stack == "fork"
    assert _pair().stack.name == "fork"
    assert _pair(ENGINE_STACK="upstream").stack.name == "upstream"
    data = yaml.safe_load(RECIPE.read_text())
    data["stack"] = "upstream"
    assert resolve(parse_env(ENV), parse_recipe(data, "r.yaml")).stack.name == "upstream"
    del data["stack"]  # no key: the default
    assert resolve(parse_env(ENV), parse_recipe(data, "r.yaml")).stack.name == DEFAULT_STACK
    with pytest.raises(ConfigError, match="must be a stack name"):
        parse_recipe(dict(data, stack="Fork!"), "r.yaml")
    with pytest.raises(ConfigError, match="ENGINE_STACK='Up' must be a stack name"):
        parse_env(dict(ENV, ENGINE_STACK="Up"))
    with pytest.raises(ConfigError, match="stack 'nope' is not declared .*declared: cpu, fork"):
        _pair(ENGINE_STACK="nope")


def test_the_image_follows_the_stack() -> None:
    """The recipe's container.image belongs to the recipe's stack: another stack boots its own
    image.default unless IMAGE says otherwise."""
    assert _pair().image == load_recipe(RECIPE).image == load_stack("fork").image_default
    up = _pair(ENGINE_STACK="upstream")
    assert up.image == load_stack("upstream").image_default != load_recipe(RECIPE).image
    assert any(n.startswith(f"image {up.image}: stack upstream's") for n in up.stack_notes)
    assert _pair(ENGINE_STACK="upstream", IMAGE="mine:1").image == "mine:1"


# -- what the stack changes, and the precedence ---------------------------------------------


def test_flags_passthrough_beats_the_stack_which_beats_the_recipe() -> None:
    argv = _pair(("--block-size", "128")).vllm_argv[0]
    assert argv[0] == "/opt/env/bin/vllm" and argv[1] == "serve"
    assert _flag(argv, "--block-size") == ["256", "128"]  # stack, then passthrough: 128 wins
    up = _pair(ENGINE_STACK="upstream").vllm_argv[0]
    assert _flag(up, "--kv-cache-dtype") == ["fp8_ds_mla"]  # replaced the recipe's fp8
    assert up.count("--trust-remote-code") == 1


def test_max_num_seqs_is_capped_without_the_keys_patch() -> None:
    unknown = _pair()
    assert _flag(unknown.vllm_argv[0], "--max-num-seqs") == ["1"]
    note = next(n for n in unknown.stack_notes if n.startswith("--max-num-seqs"))
    assert "24 -> 1" in note and "keys-concurrency" in note and "assumed absent" in note
    assert "pass `-- --max-num-seqs 24`" in note
    known_absent = _pair(image_patched=False)
    assert "the image does not carry it" in " ".join(known_absent.stack_notes)
    patched = _pair(image_patched=True)  # what the image probe may report
    assert _flag(patched.vllm_argv[0], "--max-num-seqs") == ["24"]
    assert not any(n.startswith("--max-num-seqs") for n in patched.stack_notes)
    # the operator who knows the image carries it: the passthrough wins
    assert _flag(_pair(("--max-num-seqs", "24")).vllm_argv[0], "--max-num-seqs") == ["1", "24"]
    # the upstream stack needs no patch: the recipe's 24
    assert _flag(_pair(ENGINE_STACK="upstream").vllm_argv[0], "--max-num-seqs") == ["24"]


def test_stack_env_overrides_the_recipes_with_a_note() -> None:
    cpu = _pair(ENGINE_STACK="cpu")
    head = build_rank(cpu, 0).env
    assert head["VLLM_DSPARK_FP8_DRAFT_HEAD"] == "0"  # the recipe says 1
    assert "env VLLM_DSPARK_FP8_DRAFT_HEAD: recipe's 1 -> 0 (" in " ".join(cpu.stack_notes)
    fork = build_rank(_pair(), 0).env
    assert fork["VLLM_USE_B12X_MOE"] == "1" and fork["CUDA_HOME"] == "/opt/env/targets/sbsa-linux"


def test_prepended_variables_go_in_front_of_the_images_own() -> None:
    facts = ImageFacts("sha256:1", [], ["PATH=/opt/env/bin:/usr/bin", "LD_LIBRARY_PATH=/usr/lib"])
    env = build_rank(_pair(), 1, image_facts=facts).env
    fork_path = "/opt/env/bin:/opt/env/nvvm/bin:/opt/env/targets/sbsa-linux/nvvm/bin"
    assert env["PATH"] == f"{fork_path}:/opt/env/bin:/usr/bin"
    assert env["LD_LIBRARY_PATH"] == "/opt/env/lib:/opt/env/targets/sbsa-linux/lib:/usr/lib"
    plain = build_rank(_pair(), 1).env  # plan: not read; docker's default PATH
    assert plain["PATH"].endswith(":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert plain["LD_LIBRARY_PATH"] == "/opt/env/lib:/opt/env/targets/sbsa-linux/lib"


def test_engine_ready_timeout_and_overlay_hooks_reach_the_container() -> None:
    pair = _pair()
    on, off = build_rank(pair, 0).env, build_rank(pair, 0, overlay=False).env
    assert on["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600" == off["VLLM_ENGINE_READY_TIMEOUT_S"]
    assert json.loads(on[HOOKS_ENV]) == json.loads(pair.stack.hooks_json())
    assert json.loads(on[HOOKS_ENV])["stack"] == "fork"
    assert HOOKS_ENV not in off and "PYTHONPATH" not in off  # no overlays, no hook points
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in build_rank(_pair(ENGINE_STACK="cpu"), 0).env


# -- the day-one findings ------------------------------------------------------------------


def test_hf_token_is_in_neither_rank_container() -> None:
    """The ranks run with HF_HUB_OFFLINE=1 from a local MODEL_PATH: only `model fetch` needs
    the token; in a container env anyone who may `docker inspect` could read it."""
    pair = _pair(HF_TOKEN="hf_never_in_a_container", VLLM_API_KEY="sk-x")
    assert pair.hf_token == "hf_never_in_a_container"  # still there for model fetch
    for rank in (0, 1):
        rp = build_rank(pair, rank)
        assert "HF_TOKEN" not in rp.env and "HF_TOKEN" not in dict(rp.secret_env)
        assert "HF_TOKEN" not in " ".join(rp.docker_argv)
        assert rp.env["HF_HUB_OFFLINE"] == "1"
    assert dict(build_rank(pair, 0).secret_env) == {"VLLM_API_KEY": "sk-x"}


def test_container_user_gets_user_and_logname() -> None:
    """torch's cache set-up calls getpass.getuser(), which reads LOGNAME/USER before the
    passwd file: a UID the image does not know died without them (vllm-project/vllm#44548)."""
    for rank in (0, 1):
        env = build_rank(_pair(CONTAINER_USER="1234:1000"), rank).env
        assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/tmp", "uid1234", "uid1234")
    root = build_rank(_pair(), 0).env
    assert not {"HOME", "USER", "LOGNAME"} & set(root)


# -- what plan says ------------------------------------------------------------------------


def test_plan_names_the_stack_and_each_change() -> None:
    text = render_plan(_pair())
    fork = load_stack("fork")
    assert f"# {fork.summary()}" in text
    assert "vLLM 0.21.1rc1.dev339+g1967a5627bc3, entrypoint /opt/env/bin/vllm, interpreter " in (
        text
    )
    assert "# stack fork changes the recipe's line (" in text
    assert "#   --trust-remote-code: added on (MiaAI@d0d20cb" in text
    assert "#   env VLLM_USE_B12X_MOE=1 (" in text
    assert "--entrypoint /opt/env/bin/vllm replaces any image ENTRYPOINT" in text
    assert "and its PATH is docker's default" in text
    up = render_plan(_pair(ENGINE_STACK="upstream"))
    assert "# stack upstream (" in up and "--kv-cache-dtype: fp8 -> fp8_ds_mla (" in up


def test_plan_hash_differs_between_stacks() -> None:
    hashes = {name: _pair(ENGINE_STACK=name).plan_hash for name in names()}
    assert len(set(hashes.values())) == 3


# -- boot markers per stack ----------------------------------------------------------------


def test_a_stack_adds_or_replaces_boot_markers() -> None:
    fork, cpu = load_stack("fork"), load_stack("cpu")
    assert needles_for(fork) == NEEDLES  # the 0.33 ones, unchanged
    moved = next(n for n in needles_for(cpu) if n.text == "non-default args:")
    assert moved.source.startswith("vllm/entrypoints/serve/utils/api_utils.py")
    assert len(needles_for(cpu)) == len(NEEDLES)  # replaced, not doubled
    data = yaml.safe_load((REPO / "recipes" / "stacks" / "fork.yaml").read_text())
    data["boot_markers"] = [{"text": "Engine booted", "phase": "engine ready", "source": "s"}]
    only = parse_stack(dict(data, boot_markers_replace=True), "x.yaml")
    assert [n.text for n in needles_for(only)] == ["Engine booted"]
    assert phase_of("x\nEngine booted\n", needles_for(only)) == "engine ready"
    assert phase_of("Engine booted\n") == "starting"  # not a 0.33 needle
    added = parse_stack(data, "x.yaml")
    assert len(needles_for(added)) == len(NEEDLES) + 1


@pytest.mark.needs_vllm
def test_every_stacks_line_parses_with_vllm_033() -> None:
    """The fork's and upstream's flags are vLLM serve flags (upstream 0.33's parser; each
    image's own parser checks again in preflight, PF-VLLM-ARGS)."""
    from pairctl.preflight import argcheck

    argvs = [
        a for name in ("fork", "upstream") for a in argcheck.rank_argvs(_pair(ENGINE_STACK=name))
    ]
    out, err = argcheck.run_script_locally(argvs)
    data = json.loads(out.split(argcheck.MARK, 1)[1])
    assert [r["ok"] for r in data["results"]] == [True] * 4, (data, err[-500:])
