"""Overlays that know where they are: each stack's hook points (recipes/stacks/*.yaml
``overlays:``), the plugin's resolver (dsv4_flash_overlays/hooks.py) and its check
(``python -m dsv4_flash_overlays.check``).

The seed's engine (the rafaelcaricio/vllm fork over vLLM 0.21) cannot run here: its hook
points are resolved against a module tree built from the fingerprint recorded from its
source (tests/data/overlay_fingerprints/fork-0bf8e4c.json). Upstream resolves in real
vLLM 0.33 (needs_vllm), the rehearsal's stack in the real CPU engine (needs_engine).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dsv4_flash_overlays import flags, hooks

from pairctl.engine import stack
from tests.conftest import ENGINE_PY, REPO, require
from tests.support import fingerprint_tree, warm

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py

PKG_DIR = REPO / "mods" / "dsv4-flash-overlays"
FORK_FP = "fork-0bf8e4c"
OVERLAY_NAMES = [o.name for o in flags.OVERLAYS]


def _table(name: str) -> hooks.Table:
    """A stack's table exactly as the plugin reads it from the container variable."""
    return hooks.parse_table(stack.load_stack(name).hooks_json())


def run_check(
    env_extra: dict[str, str], path_front: list[Path] | None = None, python: str | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m dsv4_flash_overlays.check`` in a fresh process; its one stdout line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV4_", "VLLM_"))}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*(path_front or []), PKG_DIR])
    env.update(env_extra)
    proc = warm.run(
        python or sys.executable, ["-m", "dsv4_flash_overlays.check"], env=env, cwd="/", timeout=300
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    return proc, json.loads(lines[0])


def _need_transformers() -> None:
    require(importlib.util.find_spec("transformers") is not None, "transformers not importable")


# ----------------------------------------------------------------- the tables themselves
def test_builtin_table_is_the_upstream_stack() -> None:
    """Without DSV4_OVERLAY_HOOKS the plugin uses upstream's table: the same hook points."""
    assert hooks.builtin_table().hooks == _table("upstream").hooks
    assert hooks.BUILTIN_STACK == "upstream"


@pytest.mark.parametrize("name", stack.names())
def test_every_stack_declares_each_overlay_in_a_shape_the_plugin_accepts(name: str) -> None:
    st = stack.load_stack(name)
    declared = {h.overlay for h in st.overlays} | {g.overlay for g in st.overlay_gaps}
    assert declared == set(OVERLAY_NAMES), f"{name}: every overlay, hooks or a gap"
    table = _table(name)
    assert not table.error and table.stack == name and table.origin == "env"
    for overlay in OVERLAY_NAMES:
        if overlay in table.unavailable:
            assert not table.for_overlay(overlay)
            continue
        assert hooks._shape_reason(overlay, table.for_overlay(overlay)) == ""
    assert all(h.role in hooks.ROLES for h in table.hooks)
    assert all(h.source for h in st.overlays)


def test_the_fork_table_is_what_the_fingerprint_records() -> None:
    """Every vLLM hook point of fork.yaml names a recorded symbol, and asks only for anchors
    its source was seen to contain."""
    fp = fingerprint_tree.load(FORK_FP)
    assert stack.load_stack("fork").vllm == fp["vllm"]
    recorded = {(s["module"], s["qualname"]): s for s in fp["symbols"]}
    inherited = {
        (s["module"], f"{s['qualname']}.{m}"): s
        for s in fp["symbols"]
        for m in s.get("inherits", [])
    }
    vllm_hooks = [h for h in _table("fork").hooks if h.module.startswith("vllm")]
    assert len(vllm_hooks) >= 6
    for h in vllm_hooks:
        key = (h.module, h.qualname)
        if key in inherited:
            base_mod, _, base_cls = inherited[key]["bases"][0].partition(":")
            key = (base_mod, f"{base_cls}.{h.qualname.rsplit('.', 1)[1]}")
        sym = recorded[key]
        assert set(h.anchors) <= set(sym["anchors_present"]), h
        assert not set(h.anchors) & set(sym.get("anchors_absent", [])), h


def test_fidelity_doc_lists_exactly_the_stacks_hook_points() -> None:
    """docs/FIDELITY.md's hook-point table is every stack's overlays: section, row for row."""
    doc = (REPO / "docs" / "FIDELITY.md").read_text()
    section = doc.split("## Overlay hook points, stack by stack", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in stack.names():
            rows.add((cells[0], cells[1], cells[2].strip("`"), cells[3]))
    want = set()
    for name in stack.names():
        st = stack.load_stack(name)
        want |= {
            (name, h.overlay, f"{h.module}:{h.qualname}", h.role or "check") for h in st.overlays
        }
        want |= {(name, g.overlay, f"unavailable: {g.why}", "-") for g in st.overlay_gaps}
    assert rows == want


# -------------------------------------------------------- the fork, on its fingerprint tree
@pytest.fixture
def fork_tree(tmp_path: Path) -> Path:
    return fingerprint_tree.build(fingerprint_tree.load(FORK_FP), tmp_path / "tree")


def test_fork_hook_points_resolve_on_the_fork(fork_tree: Path) -> None:
    _need_transformers()
    proc, out = run_check(
        {hooks.HOOKS_ENV: stack.load_stack("fork").hooks_json(), "VLLM_DSPARK_FP8_DRAFT_HEAD": "1"},
        [fork_tree],
    )
    assert proc.returncode == 0
    assert (out["stack"], out["table"], out["vllm"]) == (
        "fork",
        "env",
        fingerprint_tree.load(FORK_FP)["vllm"],
    )
    assert out["overlays"]["fp8-draft-head"] == {
        "flag": "VLLM_DSPARK_FP8_DRAFT_HEAD",
        "enabled": True,
        "resolvable": True,
        "reason": None,
    }
    assert out["overlays"]["incremental-encode-cache"]["resolvable"] is True
    assert out["overlays"]["incremental-encode-cache"]["enabled"] is False
    assert out["overlays"]["weight-guard"] == {  # on by default
        "flag": "VLLM_DSV4_WEIGHT_GUARD",
        "enabled": True,
        "resolvable": True,
        "reason": None,
    }
    # The base's SpinCondition is upstream's, but its idle readers never recheck: the fork
    # declares the spin budget unavailable, and says why.
    spin = out["overlays"]["spin-budget"]
    assert spin["resolvable"] is False
    assert spin["reason"].startswith("stack fork: the base's vLLM 0.21 lets an idle queue")
    assert "vllm-project/vllm#45224" in spin["reason"]


def test_upstream_hook_points_never_resolve_on_the_fork(fork_tree: Path) -> None:
    """The 0.33 hook points the overlays used to hard-code (now the built-in table) find
    nothing to attach to in the seed's engine; each overlay says so in one line."""
    _need_transformers()
    for env in ({}, {hooks.HOOKS_ENV: stack.load_stack("upstream").hooks_json()}):
        _, out = run_check(env, [fork_tree])
        fp8 = out["overlays"]["fp8-draft-head"]
        tok = out["overlays"]["incremental-encode-cache"]
        assert fp8["resolvable"] is False and tok["resolvable"] is False
        assert "DSparkDeepseekV4ForCausalLM" in fp8["reason"]
        assert "TokenizersBackend" in tok["reason"]
        label = "stack upstream" if env else "built-in upstream table"
        assert all(o["reason"].startswith(label) for o in (fp8, tok)), out
        assert all("\n" not in o["reason"] for o in (fp8, tok))


def test_upstreams_spin_budget_refuses_the_forks_base(fork_tree: Path) -> None:
    """Were the fork to carry upstream's table, the recheck check would stop the budget:
    the base's MessageQueue has SpinCondition's hook points but no capped idle wait."""
    _need_transformers()
    _, out = run_check(
        {
            hooks.HOOKS_ENV: stack.load_stack("upstream").hooks_json(),
            "VLLM_DSV4_SPIN_BUDGET_MS": "2",
        },
        [fork_tree],
    )
    spin = out["overlays"]["spin-budget"]
    assert spin["enabled"] is True and spin["resolvable"] is False
    assert "MessageQueue.ReadTimeoutWithWarnings.timeout_ms (check)" in spin["reason"], spin


def _mutated_tree(tmp_path: Path, qualname: str, **changes: object) -> Path:
    fp = fingerprint_tree.load(FORK_FP)
    sym = next(s for s in fp["symbols"] if s["qualname"] == qualname)
    sym.update(changes)
    return fingerprint_tree.build(fp, tmp_path / "mutated")


def test_a_moved_anchor_in_the_fork_is_one_line_naming_stack_hook_and_anchor(
    tmp_path: Path,
) -> None:
    _need_transformers()
    tree = _mutated_tree(tmp_path, "DeepSeekV4DSparkModel.draft", anchors_present=[])
    _, out = run_check({hooks.HOOKS_ENV: stack.load_stack("fork").hooks_json()}, [tree])
    reason = out["overlays"]["fp8-draft-head"]["reason"]
    assert reason == (
        "stack fork: hook vllm.models.deepseek_v4.nvidia.dspark:DeepSeekV4DSparkModel.draft "
        "(draft-head-arg): does not contain 'logits_processor(lm_head, normed)'"
    )
    assert out["overlays"]["incremental-encode-cache"]["resolvable"] is True


def test_a_draft_that_no_longer_takes_the_head_is_refused(tmp_path: Path) -> None:
    _need_transformers()
    tree = _mutated_tree(
        tmp_path, "DeepSeekV4DSparkModel.draft", signature="(self, input_ids, logits_processor)"
    )
    _, out = run_check({hooks.HOOKS_ENV: stack.load_stack("fork").hooks_json()}, [tree])
    assert out["overlays"]["fp8-draft-head"]["reason"].endswith("takes no parameter lm_head")


def test_an_inherited_loader_is_checked_in_the_base_class(tmp_path: Path) -> None:
    """DSparkProposer.load_model is SpecDecodeBaseProposer's: its anchor is read there."""
    _need_transformers()
    tree = _mutated_tree(tmp_path, "SpecDecodeBaseProposer.load_model", anchors_present=[])
    _, out = run_check({hooks.HOOKS_ENV: stack.load_stack("fork").hooks_json()}, [tree])
    reason = out["overlays"]["fp8-draft-head"]["reason"]
    assert "DSparkProposer.load_model (loader)" in reason and "_maybe_share_lm_head" in reason


def test_a_loader_that_no_longer_hands_over_what_it_loaded_disables_the_guard(
    tmp_path: Path,
) -> None:
    """The guard reads what model.load_weights returns inside the checkpoint loader: a
    loader that stopped calling it that way must not be guarded on a wrong premise."""
    _need_transformers()
    tree = _mutated_tree(tmp_path, "DefaultModelLoader.load_weights", anchors_present=[])
    _, out = run_check({hooks.HOOKS_ENV: stack.load_stack("fork").hooks_json()}, [tree])
    assert out["overlays"]["weight-guard"]["reason"] == (
        "stack fork: hook vllm.model_executor.model_loader.default_loader:"
        "DefaultModelLoader.load_weights (weights): does not contain "
        "'model.load_weights(self.get_all_weights('"
    )
    assert out["overlays"]["fp8-draft-head"]["resolvable"] is True


# ------------------------------------------------------------------ the table and the check
def test_a_table_that_is_not_json_is_reported_for_every_overlay() -> None:
    table = hooks.load_table({hooks.HOOKS_ENV: "{not json"})
    for name in OVERLAY_NAMES:
        res = hooks.resolve(name, table)
        assert not res.ok and res.reason.startswith(
            "stack ?: DSV4_OVERLAY_HOOKS is not a hook table"
        )


def test_the_variable_unset_means_the_builtin_table() -> None:
    table = hooks.load_table({})
    assert (table.origin, table.stack, table.hooks) == ("built-in", "upstream", hooks.BUILTIN)
    assert table.label == "built-in upstream table (DSV4_OVERLAY_HOOKS unset)"


def test_a_stack_that_cannot_carry_an_overlay_says_why() -> None:
    res = hooks.resolve("fp8-draft-head", _table("cpu"))
    assert res.reason.startswith("stack cpu: the CPU engine has no DSpark draft head")


def test_a_table_without_the_required_role_is_refused() -> None:
    only_checks = hooks.Table(
        "x",
        "env",
        tuple(h for h in hooks.BUILTIN if h.role == "check" and h.overlay == "fp8-draft-head"),
    )
    res = hooks.resolve("fp8-draft-head", only_checks)
    assert res.reason == (
        "stack x: declares 0 draft-head-arg or draft-logits hook points, needs exactly one"
    )


def test_check_prints_an_error_line_and_exits_1_when_the_plugin_is_broken(tmp_path: Path) -> None:
    """A broken plugin (here: its flag registry fails to import) is the one nonzero exit."""
    shadow = tmp_path / "shadow" / "dsv4_flash_overlays"
    shadow.mkdir(parents=True)
    for f in (PKG_DIR / "dsv4_flash_overlays").glob("*.py"):
        (shadow / f.name).write_text(f.read_text())
    (shadow / "flags.py").write_text(
        (PKG_DIR / "dsv4_flash_overlays" / "flags.py").read_text() + "\nOVERLAYS = None\n"
    )
    proc, out = run_check({}, [shadow.parent])
    assert proc.returncode == 1 and out["error"].startswith("TypeError")


# ----------------------------------------------------------------- real engines
@pytest.mark.needs_vllm
def test_upstream_hook_points_resolve_in_real_vllm() -> None:
    for name in OVERLAY_NAMES:
        res = hooks.resolve(name, _table("upstream"))
        assert res.ok, res.reason
    _, out = run_check({hooks.HOOKS_ENV: stack.load_stack("upstream").hooks_json()})
    assert out["vllm"].startswith("0.33.")
    assert all(o["resolvable"] for o in out["overlays"].values()), out


@pytest.mark.needs_vllm
def test_the_fork_table_does_not_resolve_in_vllm_033_and_says_where() -> None:
    res = hooks.resolve("incremental-encode-cache", _table("fork"))
    assert res.reason == (
        "stack fork: hook vllm.tokenizers.deepseek_v4:DeepseekV4Tokenizer.from_pretrained "
        "(factory): does not contain 'PreTrainedTokenizerFast.from_pretrained('"
    )


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # one interpreter, no server
def test_the_cpu_stack_in_the_real_cpu_engine() -> None:
    """The rehearsal's engine: the tokenizer cache, the weight guard, the front-end
    overlays and the spin budget resolve, the fp8 head says why not."""
    front_end = {
        "incremental-block-hashes": "VLLM_INCREMENTAL_BLOCK_HASHES",
        "incremental-detokenizer": "VLLM_INCREMENTAL_DETOKENIZER",
        "incremental-prompt-handoff": "VLLM_INCREMENTAL_PROMPT_HANDOFF",
    }
    proc, out = run_check(
        {
            hooks.HOOKS_ENV: stack.load_stack("cpu").hooks_json(),
            "VLLM_INCREMENTAL_ENCODE_CACHE": "1",
            **dict.fromkeys(front_end.values(), "1"),
            "VLLM_DSV4_SPIN_BUDGET_MS": "2",
        },
        python=str(ENGINE_PY),
    )
    assert proc.returncode == 0
    assert out["vllm"] == stack.load_stack("cpu").vllm
    assert out["overlays"]["incremental-encode-cache"] == {
        "flag": "VLLM_INCREMENTAL_ENCODE_CACHE",
        "enabled": True,
        "resolvable": True,
        "reason": None,
    }
    fp8 = out["overlays"]["fp8-draft-head"]
    assert fp8["resolvable"] is False and fp8["reason"].startswith("stack cpu: the CPU engine")
    assert out["overlays"]["weight-guard"] == {
        "flag": "VLLM_DSV4_WEIGHT_GUARD",
        "enabled": True,
        "resolvable": True,
        "reason": None,
    }
    for name, flag in front_end.items():  # the front-end overlays bench.frontend_stages runs
        assert out["overlays"][name] == {
            "flag": flag,
            "enabled": True,
            "resolvable": True,
            "reason": None,
        }
    spin = out["overlays"]["spin-budget"]
    assert spin["enabled"] is True and spin["resolvable"] is True, spin
