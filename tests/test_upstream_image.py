"""The `upstream` stack's image recipe (launch/image/upstream): the patch layer and the check
step, run for real here, and the Dockerfile read as text (no daemon here to build it).

Every patch script runs against a fixture: a few lines that reproduce its anchor as the
upstream file has it, inside a stand-in class so the patched code can run. Each must rewrite
its anchor as intended, change nothing (byte for byte) on a second run, and exit non-zero
naming the file and the anchor when the anchor is gone. The check step runs against stand-in
packages (hermetic) and once against the real vLLM in .venv.
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = REPO / "launch" / "image" / "upstream"
DOCKERFILE = UPSTREAM / "Dockerfile"
PATCHES = UPSTREAM / "patches"
CHECK = UPSTREAM / "check_image.py"
PATCH_SCRIPTS = sorted(p for p in PATCHES.glob("*.py") if not p.name.startswith("_"))

# dspark_index_width.py: the statement vLLM 0.27.1 has in
# DeepseekSparseSWAMetadataBuilder.__init__ (vllm/v1/attention/backends/mla/sparse_swa.py),
# as ecohash-co/deepseek-v4-flash-dgx-spark-vllm027 docs/01-blockers.md quotes it, in a
# stand-in class with vLLM's ceiling division (vllm/utils/math_utils.py cdiv).
INDEX_WIDTH_FIXTURE = """\
def cdiv(a: int, b: int) -> int:
    return -(a // -b)


class Builder:
    def __init__(self, window_size, num_speculative_tokens, is_dspark):
        self.window_size = window_size
        self.num_speculative_tokens = num_speculative_tokens
        self.is_dspark = is_dspark
        self.noncausal_index_width = (
            cdiv(self.window_size + self.num_speculative_tokens, 128) * 128
            if self.is_dspark
            else 0
        )
"""


def _index_width_before(mod: ModuleType) -> None:
    """The bug: 128 + 5 drafts rounds to 256, a width FlashInfer's SM12x kernels lack."""
    assert mod.Builder(128, 5, True).noncausal_index_width == 256


def _index_width_after(mod: ModuleType) -> None:
    """512 for 128 + 5; no drafts stays 128; non-DSpark 0; too wide is a clear error."""
    assert mod.Builder(128, 5, True).noncausal_index_width == 512
    assert mod.Builder(128, 0, True).noncausal_index_width == 128
    assert mod.Builder(128, 5, False).noncausal_index_width == 0
    assert mod.Builder(600, 5, True).noncausal_index_width == 1024
    with pytest.raises(ValueError, match="exceeds the widest"):
        mod.Builder(1020, 5, True)


# Per patch script: (fixture, what the unpatched code does, what the patched code does).
FIXTURES: dict[str, tuple[str, Any, Any]] = {
    "dspark_index_width.py": (INDEX_WIDTH_FIXTURE, _index_width_before, _index_width_after),
}


def run_patch(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60
    )


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fixture_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def patch_of(script: Path) -> Any:
    """The script's PATCH, loaded as the Dockerfile runs it: its own folder on the import
    path (where _patchlib lives), for this load only."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(script.parent))
        return runpy.run_path(str(script))["PATCH"]


def fixture_file(tmp_path: Path, script: Path) -> Path:
    target = tmp_path / Path(patch_of(script).target).name
    target.write_text(FIXTURES[script.name][0])
    return target


# --- the patch scripts -------------------------------------------------------------------


def test_every_patch_script_has_a_fixture() -> None:
    assert PATCH_SCRIPTS, "no patch scripts found"
    assert sorted(FIXTURES) == [p.name for p in PATCH_SCRIPTS]


@pytest.mark.parametrize("script", PATCH_SCRIPTS, ids=lambda p: p.stem)
def test_patch_rewrites_its_anchor_as_intended(script: Path, tmp_path: Path) -> None:
    target = fixture_file(tmp_path, script)
    patch = patch_of(script)
    FIXTURES[script.name][1](load_module(target))
    p = run_patch(script, str(target))
    assert p.returncode == 0, p.stderr
    assert f"[applied] {patch.name}: {target}" in p.stdout
    text = target.read_text()
    assert all(edit.anchor not in text for edit in patch.edits)
    assert patch.marker in text
    FIXTURES[script.name][2](load_module(target))


@pytest.mark.parametrize("script", PATCH_SCRIPTS, ids=lambda p: p.stem)
def test_patch_twice_is_a_byte_identical_noop(script: Path, tmp_path: Path) -> None:
    target = fixture_file(tmp_path, script)
    assert run_patch(script, "--check", str(target)).returncode == 3  # not patched yet
    assert run_patch(script, str(target)).returncode == 0
    first = target.read_bytes()
    p = run_patch(script, str(target))
    assert p.returncode == 0, p.stderr
    assert "[already applied]" in p.stdout
    assert target.read_bytes() == first
    assert run_patch(script, "--check", str(target)).returncode == 0


@pytest.mark.parametrize("script", PATCH_SCRIPTS, ids=lambda p: p.stem)
def test_patch_fails_naming_file_and_anchor_when_the_base_changed(
    script: Path, tmp_path: Path
) -> None:
    patch = patch_of(script)
    target = fixture_file(tmp_path, script)
    anchor = patch.edits[0].anchor
    changed = target.read_text().replace(anchor, "        self.noncausal_index_width = 0\n")
    target.write_text(changed)
    p = run_patch(script, str(target))
    assert p.returncode == 1
    assert f"PATCH FAILED {patch.name}" in p.stderr and str(target) in p.stderr
    missing = next(ln.strip() for ln in anchor.splitlines() if ln.strip() not in changed)
    assert f"anchor {missing!r} not found" in p.stderr
    assert "the base image changed" in p.stderr
    assert target.read_text() == changed  # untouched


def test_an_anchor_found_twice_is_refused(tmp_path: Path) -> None:
    script = PATCHES / "dspark_index_width.py"
    target = fixture_file(tmp_path, script)
    body = target.read_text()
    again = body.split("\n\n\n", 1)[1].replace("class Builder:", "class Again:")
    target.write_text(body + "\n\n" + again)
    p = run_patch(script, str(target))
    assert p.returncode == 1 and "found 2 times (expected once)" in p.stderr


def test_a_half_patched_file_is_refused(tmp_path: Path) -> None:
    script = PATCHES / "dspark_index_width.py"
    target = fixture_file(tmp_path, script)
    assert run_patch(script, str(target)).returncode == 0
    text = target.read_text()
    target.write_text(text[: text.index("\n_DSV4_DSPARK_INDEX_WIDTHS")] + "\n")  # helper lost
    p = run_patch(script, str(target))
    assert p.returncode == 1 and "partly patched" in p.stderr


def test_patch_finds_its_file_under_site_packages_and_keeps_its_mode(tmp_path: Path) -> None:
    script = PATCHES / "dspark_index_width.py"
    patch = patch_of(script)
    target = tmp_path / "site" / patch.target
    target.parent.mkdir(parents=True)
    target.write_text(INDEX_WIDTH_FIXTURE)
    target.chmod(0o644)
    p = run_patch(script, "--site", str(tmp_path / "site"))
    assert p.returncode == 0, p.stderr
    assert patch.marker in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [x.name for x in target.parent.iterdir()] == [target.name]  # no temp file left


def test_patch_reports_a_missing_file_and_bad_usage(tmp_path: Path) -> None:
    script = PATCHES / "dspark_index_width.py"
    p = run_patch(script, str(tmp_path / "nope.py"))
    assert p.returncode == 1 and "cannot read" in p.stderr and "nope.py" in p.stderr
    assert run_patch(script).returncode == 2
    assert run_patch(script, "--help").returncode == 0


@pytest.mark.needs_vllm
def test_the_patch_refuses_a_real_changed_base(tmp_path: Path) -> None:
    """vLLM 0.33 rewrote the statement (get_dspark_swa_index_width): a real moved anchor."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    script = PATCHES / "dspark_index_width.py"
    real = Path(spec.origin).parent.parent / patch_of(script).target
    target = tmp_path / "sparse_swa.py"
    shutil.copyfile(real, target)
    p = run_patch(script, str(target))
    assert p.returncode == 1
    assert "'cdiv(self.window_size + self.num_speculative_tokens, 128) * 128' not found" in (
        p.stderr
    )
    assert target.read_bytes() == real.read_bytes()


# --- the check step ----------------------------------------------------------------------


def fake_site(tmp_path: Path, *, vllm: str = "0.27.1", arch: bytes = b"sm120") -> Path:
    """Stand-in packages with the versions and classes the upstream image has."""
    site = tmp_path / "site"
    files = {
        "vllm/__init__.py": f"__version__ = {vllm!r}\n",
        "vllm/models/__init__.py": "",
        "vllm/models/deepseek_v4/__init__.py": "",
        "vllm/models/deepseek_v4/nvidia/__init__.py": "",
        "vllm/models/deepseek_v4/nvidia/dspark.py": "class DSparkDeepseekV4ForCausalLM:\n"
        "    def compute_draft_logits(self): ...\n",
        "torch/__init__.py": "__version__ = '2.13.0+cu130'\n",
        "flashinfer/__init__.py": "__version__ = '0.6.16.post3'\n",
        "deep_gemm/__init__.py": "",
    }
    for rel, body in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(body)
    (site / "deep_gemm" / "_C.cpython-312-aarch64-linux-gnu.so").write_bytes(
        b"\x7fELF" + b"\0" * 64 + b"impls/" + arch + b"_fp8_gemm_1d1d.hpp"
    )
    vllm_bin = tmp_path / "bin" / "vllm"
    vllm_bin.parent.mkdir()
    vllm_bin.write_text("#!/bin/sh\n")
    vllm_bin.chmod(0o755)
    return site


def run_check(site: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, str(CHECK), *args], capture_output=True, text=True, env=env, timeout=300
    )


def check_args(site: Path, vllm: str = "0.27.1") -> list[str]:
    dspark = "vllm.models.deepseek_v4.nvidia.dspark:DSparkDeepseekV4ForCausalLM"
    return [
        f"--vllm={vllm}",
        "--torch=2.13.0",
        "--flashinfer=0.6.16.post3",
        f"--interpreter={sys.executable}",
        f"--entrypoint={site.parent / 'bin' / 'vllm'}",
        f"--import={dspark}.compute_draft_logits",
        "--deep-gemm-arch=sm120",
    ]


def test_check_passes_on_the_declared_image(tmp_path: Path) -> None:
    site = fake_site(tmp_path)
    p = run_check(site, *check_args(site))
    assert p.returncode == 0, p.stderr
    assert "image check passed: vllm 0.27.1, torch 2.13.0+cu130, flashinfer 0.6.16.post3" in (
        p.stdout
    )


def test_check_fails_on_every_drift_and_names_each(tmp_path: Path) -> None:
    site = fake_site(tmp_path, vllm="0.27.2", arch=b"sm100")
    (site / "vllm/models/deepseek_v4/nvidia/dspark.py").write_text("class Other: ...\n")
    (site.parent / "bin" / "vllm").chmod(0o644)
    p = run_check(site, *check_args(site))
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("IMAGE CHECK FAILED: ")]
    assert len(lines) == 4, p.stderr
    assert "vllm is 0.27.2, the stack declares 0.27.1" in p.stderr
    assert "DSparkDeepseekV4ForCausalLM.compute_draft_logits not importable" in p.stderr
    assert f"entrypoint {site.parent / 'bin' / 'vllm'} is not an executable" in p.stderr
    assert "no 'sm120'" in p.stderr and "wrong architecture" in p.stderr


def test_check_fails_when_vllm_does_not_import(tmp_path: Path) -> None:
    site = fake_site(tmp_path)
    (site / "vllm/__init__.py").write_text("raise ImportError('libcudart.so.13: missing')\n")
    p = run_check(site, "--vllm", "0.27.1")
    assert p.returncode == 1
    assert "import vllm failed: ImportError: libcudart.so.13: missing" in p.stderr


def test_check_accepts_only_the_version_or_a_local_build_of_it() -> None:
    mod = runpy.run_path(str(CHECK))
    ok = mod["version_matches"]
    assert ok("2.13.0+cu130", "2.13.0") and ok("0.27.1", "0.27.1")
    assert not ok("2.13.01", "2.13.0") and not ok("2.13.0", "2.13")
    assert not ok("0.27.1rc1", "0.27.1")


@pytest.mark.needs_vllm
def test_the_dockerfiles_imports_resolve_in_a_real_vllm(capsys: pytest.CaptureFixture) -> None:
    """The classes the check step imports exist in a real vLLM (0.33 here; 0.27.1 has the
    same classes, checked against its wheel, launch/image/upstream/README.md). In this
    process, so the suite pays vLLM's import once."""
    import vllm

    imports = re.findall(r"--import (\S+)", DOCKERFILE.read_text())
    assert len(imports) >= 4
    main = runpy.run_path(str(CHECK))["main"]
    assert main(["--vllm", vllm.__version__, *(f"--import={spec}" for spec in imports)]) == 0
    out = capsys.readouterr().out
    assert f"vllm {vllm.__version__}" in out and f"{len(imports)} import(s)" in out
    assert main(["--vllm", "0.27.1"]) == 1  # the real version read, not assumed
    assert f"vllm is {vllm.__version__}, the stack declares 0.27.1" in capsys.readouterr().err


# --- the Dockerfile, read as text ----------------------------------------------------------


def dockerfile() -> str:
    return DOCKERFILE.read_text()


def run_lines() -> list[str]:
    """Each RUN instruction as one line (continuations joined, comments dropped)."""
    out, cur = [], ""
    for raw in dockerfile().splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        cur += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if cur.startswith("RUN "):
                out.append(cur.strip())
            cur = ""
    return out


def arg(name: str) -> str:
    m = re.search(rf"^ARG {name}=(\S+)$", dockerfile(), re.M)
    assert m, f"ARG {name}= not found"
    return m.group(1).strip('"')


def test_base_is_the_official_v0_27_1_image_pinned_by_digest() -> None:
    base = arg("BASE_IMAGE")
    assert re.fullmatch(r"vllm/vllm-openai:v0\.27\.1@sha256:[0-9a-f]{64}", base), base
    froms = re.findall(r"^FROM (\S+)", dockerfile(), re.M)
    assert froms == ["${BASE_IMAGE}"]


def test_every_patch_is_applied_and_checked_and_every_reference_exists() -> None:
    text = dockerfile()
    assert re.search(r"^COPY patches/ /opt/dsv4-upstream/patches/$", text, re.M)
    referenced = set(re.findall(r"/opt/dsv4-upstream/patches/([\w.]+\.py)", text))
    assert referenced == {p.name for p in PATCH_SCRIPTS}
    for name in referenced:
        assert (PATCHES / name).is_file()
        applied = [r for r in run_lines() if f"patches/{name}" in r and "--check" not in r]
        checked = [r for r in run_lines() if f"patches/{name} --check" in r]
        assert applied and checked, name
    assert (UPSTREAM / "check_image.py").is_file()


def test_the_check_step_runs_last_with_the_declared_versions() -> None:
    runs = run_lines()
    last = runs[-1]
    assert "/opt/dsv4-upstream/check_image.py" in last
    assert '--vllm "${VLLM_VERSION}"' in last and arg("VLLM_VERSION") == "0.27.1"
    assert '--torch "${TORCH_VERSION}"' in last and arg("TORCH_VERSION") == "2.13.0"
    assert '--flashinfer "${FLASHINFER_VERSION}"' in last
    for cls in ("dspark:DSparkDeepseekV4ForCausalLM", "speculator:DSparkSpeculator"):
        assert cls in last
    assert "--deep-gemm-arch sm120" in last
    assert '--interpreter "${PYTHON}"' in last and arg("PYTHON") == "/usr/bin/python3"


def test_deepgemm_and_flashinfer_are_pinned_and_never_move_torch() -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", arg("DEEPGEMM_REF"))
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", arg("FLASHINFER_VERSION"))
    runs = run_lines()
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 2
    assert all("--no-deps" in r for r in installs)  # no install may re-resolve torch
    assert any('"flashinfer-python==${FLASHINFER_VERSION}"' in r for r in installs)
    for r in installs:
        assert "torch_before" in r and "torch_after" in r
    deepgemm = next(r for r in runs if "DEEPGEMM_REF" in r)
    assert 'checkout --detach "${DEEPGEMM_REF}"' in deepgemm
