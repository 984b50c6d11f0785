"""Repository hygiene: what a reader of any tracked file can follow, and what ships.

* No file points at something a user of this repository cannot open: notes that live
  outside it, our own tracker's issue numbers, the tools used to develop it. Cite public
  sources instead (vLLM file paths, ``vllm#NNNN``, peer repositories such as
  eugr/spark-vllm-docker).
* Nothing edits ``sys.path``: packages are declared in pyproject.toml and run as
  ``python -m PACKAGE``.
* The overlay folder is copied to the Sparks, so it holds no benchmark results.

This file is exempt from the first rule: its own examples must name what it forbids.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO

# (pattern, what to do instead). Matched per line, case-insensitively unless noted.
UNREACHABLE = [
    (r"\b(FACTS|METHOD|STYLE|H200)\.md\b", "a development note outside the repo: cite upstream"),
    (r"\.\./shared\b|\bshared/(seed|FACTS)", "a path outside the repo: cite upstream"),
    (r"\bissues?\s+#?\d", "our tracker is not public: say what, or cite owner/repo#N"),
    (r"\bdevice\s+tool\b", "a development tool: name the machine (GPU, driver, date)"),
    (r"\blent\s+H200\b|\bGPU[- ]lending\b", "a development tool: name the machine"),
    (r"\bthe\s+lead\b", "a person on the development team: say what was decided and why"),
]
# Upper-case words only: "method" and "facts" are ordinary English.
UNREACHABLE_CASED = [
    (r"\b(FACTS|METHOD|STYLE)\b", "a development note outside the repo: cite upstream"),
]
SYS_PATH_EDIT = r"\bsys\.path\.(insert|append|extend)\b|\bsys\.path\s*\+?="

SELF = "tests/test_repo_hygiene.py"
OVERLAY_DIR = "mods/dsv4-flash-overlays/"
# Results belong in bench/results/<topic>/, not in the folder that ships.
SHIPPED_RESULT = [
    (r"\.png$", "an image"),
    (r"(^|/)results?/", "a results folder"),
    (r"(^|/)fp8_head_(run|final)", "an fp8 benchmark result"),
    (r"(^|/)tokenizer_cache_bench", "a tokenizer-cache benchmark result"),
]


def tracked_files() -> list[str]:
    """Every file git tracks (a fresh clone's view; untracked scratch files do not count)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"git ls-files failed in {REPO}: {exc}; run the tests from a git checkout")
    return [p for p in out.decode().split("\0") if p]


def _text(root: Path, path: str) -> str | None:
    """The file's text, or None for binary files (PNGs) and files deleted in the work tree."""
    try:
        data = (root / path).read_bytes()
    except FileNotFoundError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def offences(paths: list[str], root: Path = REPO) -> list[str]:
    """``file:line: text  <- why`` for every reference a reader cannot follow."""
    rules = [(re.compile(p, re.IGNORECASE), why) for p, why in UNREACHABLE]
    rules += [(re.compile(p), why) for p, why in UNREACHABLE_CASED]
    found = []
    for path in paths:
        text = _text(root, path)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            for rx, why in rules:
                if rx.search(line):
                    found.append(f"{path}:{no}: {line.strip()[:120]}  <- {why}")
                    break
    return found


def sys_path_edits(paths: list[str], root: Path = REPO) -> list[str]:
    """``file:line: text`` for every line that edits sys.path (any text file)."""
    rx = re.compile(SYS_PATH_EDIT)
    found = []
    for path in paths:
        text = _text(root, path)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            if rx.search(line):
                found.append(f"{path}:{no}: {line.strip()[:120]}")
    return found


def results_in_overlay(paths: list[str]) -> list[str]:
    """Tracked files under the overlay folder that are benchmark output, not the plugin."""
    found = []
    for path in paths:
        if not path.startswith(OVERLAY_DIR):
            continue
        inside = str(PurePosixPath(path).relative_to(OVERLAY_DIR))
        for pattern, what in SHIPPED_RESULT:
            if re.search(pattern, inside):
                found.append(f"{path}: {what}; move it to bench/results/<topic>/")
                break
    return found


def test_no_reference_to_anything_a_reader_cannot_open():
    bad = offences([p for p in tracked_files() if p != SELF])
    assert not bad, "references a user of this repo cannot follow:\n" + "\n".join(bad)


def test_nothing_edits_sys_path():
    bad = sys_path_edits(tracked_files())
    assert not bad, (
        "sys.path edits (declare the package in pyproject.toml and run it with "
        "python -m instead):\n" + "\n".join(bad)
    )


def test_overlay_folder_ships_no_results():
    paths = tracked_files()
    assert any(p.startswith(OVERLAY_DIR) for p in paths), f"{OVERLAY_DIR} is not tracked"
    bad = results_in_overlay(paths)
    assert not bad, "benchmark results in the folder that ships:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "see FACTS.md for the flags",
        "as in ../shared/seed/DSv4-Flash-spark-README.txt",
        "each fault from issue 3, each ending in",
        "the issues 3/6 follow-up",
        "one NVIDIA H200 (device tool), 2026-11-30",
        "the lead decided",
        "Method (METHOD): random data",
    ],
)
def test_patterns_catch_what_they_are_for(tmp_path, line):
    """The rules must fire on real phrasings, or the repo-wide test proves nothing."""
    (tmp_path / "doc.md").write_text(f"intro\n{line}\n")
    bad = offences(["doc.md"], root=tmp_path)
    assert len(bad) == 1 and bad[0].startswith(f"doc.md:2: {line}  <- "), bad


@pytest.mark.parametrize(
    "line",
    [
        "upstream vllm#47584 (PR) and vllm-project/vllm#47582",
        "the method of least squares; facts about the model",
        "the leading dimension",
        "prompt: the issue with caching is",
    ],
)
def test_patterns_leave_ordinary_text_alone(tmp_path, line):
    (tmp_path / "doc.md").write_text(line + "\n")
    assert offences(["doc.md"], root=tmp_path) == []


def test_sys_path_and_overlay_rules_fire(tmp_path):
    edit = "sys" + ".path.insert(0, str(ROOT))"
    (tmp_path / "a.py").write_text(f"import sys\n{edit}\nprint(sys.path)\n")
    assert sys_path_edits(["a.py"], root=tmp_path) == [f"a.py:2: {edit}"]
    shipped = [
        OVERLAY_DIR + "dsv4_flash_overlays/fp8_configs.json",
        OVERLAY_DIR + "README.md",
    ]
    assert results_in_overlay(shipped) == []
    for bad in ("results/fp8_head_run1_eval.json", "plot.png", "fp8_head_final_bench.json"):
        assert len(results_in_overlay([OVERLAY_DIR + bad])) == 1, bad
    assert results_in_overlay(["bench/results/fp8_head/fp8_head_run1_eval.json"]) == []
