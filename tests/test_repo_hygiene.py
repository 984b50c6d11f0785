"""Repository hygiene: what a reader of any tracked file can follow, and what ships.

* No file points at something a user of this repository cannot open. Every Markdown file
  it names is one of its own or an upstream document listed in ``UPSTREAM_DOCS``; every
  ``../`` path stays inside the repository; no issue numbers of our own tracker, no words
  about the machines or people that built it. Cite public sources instead (vLLM file
  paths, ``vllm#NNNN``, peer repositories such as eugr/spark-vllm-docker).
* Nothing edits ``sys.path``: packages are declared in pyproject.toml and run as
  ``python -m PACKAGE``.
* The overlay folder is copied to the Sparks, so it holds no benchmark results.
* No absolute path of a machine that built, tuned or tested this repository (see
  ``BUILD_MACHINE_PATHS``): a recorded command or result names paths in the clone
  relative to it, and scratch files by name.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO

# (pattern, what to do instead). Matched per line, case-insensitively.
UNREACHABLE = [
    (r"\bissues?\s+#?\d", "our tracker is not public: say what, or cite owner/repo#N"),
    (r"\blent\b|\blending\b", "how the development machine was obtained: name the machine"),
    (r"\bthe\s+lead\b", "a person on the development team: say what was decided and why"),
]
# Markdown files of other projects that we cite by name, with the project that holds them.
UPSTREAM_DOCS = {
    "NETWORKING.md": "eugr/spark-vllm-docker",
    "BUILD-dspark-runtime.md": "rafaelcaricio/vllm",
    "SETUP.md": "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark",
    "docker.md": "vllm-project/vllm (docs/deployment/docker.md)",
    "PATCHES.md": "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark",
    "RESULTS-2026-08-14.md": "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark (results/)",
    "01-blockers.md": "ecohash-co/deepseek-v4-flash-dgx-spark-vllm027",
    "02-before-after.md": "ecohash-co/deepseek-v4-flash-dgx-spark-vllm027",
    "03-what-i-wish-id-had.md": "ecohash-co/deepseek-v4-flash-dgx-spark-vllm027",
    "05-dead-ends.md": "ecohash-co/deepseek-v4-flash-dgx-spark-vllm027",
    "PERFORMANCE.md": "NVIDIA/nccl-tests (doc/PERFORMANCE.md)",
    "analysis-tp2-tp4-communication-2026-08-09.md": (
        "luxingcom/LuZ0.3.1-DeepSeek-v4-Flash-DSpark-DGXspark-TP4-Ring (docs/01-research-reports/)"
    ),
    "DEEPSEEK_V4_FLASH_QUICKSTART.md": "FujitsuPolycom/sparkring (docs/)",
    "ar-optimization-2026-08-22.md": (
        "luxingcom/LuZ0.3.1-DeepSeek-v4-Flash-DSpark-DGXspark-TP4-Ring (docs/01-research-reports/)"
    ),
}
MARKDOWN_NAME = r"(?<![\w.-])([\w-]+\.md)\b"
PARENT_PATH = r"(?<![\w.])\.\./[\w./-]*"
SYS_PATH_EDIT = r"\bsys\.path\.(insert|append|extend)\b|\bsys\.path\s*\+?="

# Absolute paths of the machines this repository was built, tuned and tested on: never in a
# tracked file. A reader's machine has none of them; results record repo-relative paths and
# scratch files by name (bench/kernels/fp8_tune/table.py). Deliberately not matched, because
# they are paths of the deployment, the same on every user's machine: the seed's Spark user's
# home (/home/bird/..., the seed's layout; the systemd unit's example install path; the env
# defaults and examples use /srv/dsv4, tests/test_pairctl.py checks), container paths
# (/root/.cache, /root/.triton, /opt/...) and fixed /tmp files a tool itself creates
# (/tmp/P.lock, /tmp/router.txt). What is matched, by prefix:
#   /work/...          development checkouts and worktrees (/work/<checkout>);
#   /root/<not dot>    a root user's scratch directories (/root/<dir>); dot-dirs are caches;
#   /home/<not bird>, /Users/...   someone else's home directory;
#   /tmp/ci-check, /tmp/pytest-of-, /tmp/tmpXXXXXXXX   CI scratch, pytest's and
#                      tempfile's temporary directories.
# A path must not continue a word or a variable (not 'x/work/', 'example.org/work/',
# '~/work', '${HOME}/work'): relative paths and web URLs pass; file:/// URLs do not.
_START = r"(?<![\w.~$}-])"
BUILD_MACHINE_PATHS = [
    (_START + r"/work/\w", "a development checkout"),
    (_START + r"/root/(?!\.)\w", "root's scratch directory (not a dot-dir cache)"),
    (_START + r"/home/(?!bird/)\w", "someone's home directory (the Spark user is bird)"),
    (_START + r"/Users/\w", "someone's home directory"),
    (r"/tmp/(ci-check|pytest-of-|tmp[a-z0-9_]{8}\b)", "a CI or test run's temporary directory"),
]
# A recorded result ran on one machine, not in a container or on the Spark user's account:
# every /tmp, /root and /home path in it is that machine's (a run's log directory, its model
# cache). Its writer names them portably ($TMPDIR/..., ~/..., <pair-dir>: see
# bench/headline_real.py path_prefixes, sim/rehearsal/leaks.py portable).
RESULTS_DIRS = ("bench/results/",)
RESULT_MACHINE_PATHS = [
    (_START + r"/tmp/\w", "a temporary directory of the machine that ran it: $TMPDIR/..."),
    (_START + r"/root/", "root's home on the machine that ran it: ~/..."),
    (_START + r"/home/\w", "a home directory on the machine that ran it: ~/..."),
]

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


def offences(paths: list[str], root: Path = REPO, known: set[str] | None = None) -> list[str]:
    """``file:line: text  <- why`` for every reference a reader cannot follow.

    ``known``: the Markdown file names this repository has (default: those among ``paths``).
    """
    rules = [(re.compile(p, re.IGNORECASE), why) for p, why in UNREACHABLE]
    if known is None:
        known = {PurePosixPath(p).name for p in paths}
    docs = known | set(UPSTREAM_DOCS)
    found = []
    for path in paths:
        text = _text(root, path)
        if text is None:
            continue
        here = (root / path).parent
        for no, line in enumerate(text.splitlines(), 1):
            why = next((why for rx, why in rules if rx.search(line)), None)
            if why is None and any(m not in docs for m in re.findall(MARKDOWN_NAME, line)):
                why = "a Markdown file that is neither here nor upstream: cite upstream"
            if why is None and any(
                os.path.commonpath([os.path.normpath(here / rel), root]) != str(root)
                for rel in re.findall(PARENT_PATH, line)
            ):
                why = "a path outside the repository: cite upstream"
            if why:
                found.append(f"{path}:{no}: {line.strip()[:120]}  <- {why}")
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


def build_machine_paths(paths: list[str], root: Path = REPO) -> list[str]:
    """``file:line: text  <- why`` for every absolute path of a build machine (in a recorded
    result, under ``RESULTS_DIRS``, also any /tmp, /root or /home path)."""
    rules = [(re.compile(p), why) for p, why in BUILD_MACHINE_PATHS]
    strict = rules + [(re.compile(p), why) for p, why in RESULT_MACHINE_PATHS]
    found = []
    for path in paths:
        text = _text(root, path)
        if text is None:
            continue
        these = strict if path.startswith(RESULTS_DIRS) else rules
        for no, line in enumerate(text.splitlines(), 1):
            why = next((why for rx, why in these if rx.search(line)), None)
            if why:
                found.append(f"{path}:{no}: {line.strip()[:120]}  <- {why}")
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
    paths = tracked_files()
    known = {PurePosixPath(p).name for p in paths}
    bad = offences([p for p in paths if p != SELF], known=known)
    assert not bad, "references a user of this repo cannot follow:\n" + "\n".join(bad)


def test_nothing_edits_sys_path():
    bad = sys_path_edits(tracked_files())
    assert not bad, (
        "sys.path edits (declare the package in pyproject.toml and run it with "
        "python -m instead):\n" + "\n".join(bad)
    )


def test_no_build_machine_path_in_any_tracked_file():
    """No tracked text file names a path that exists only on a machine that built, tuned or
    tested the repository: development checkouts (/work/...), root's scratch (/root/<dir>),
    other people's homes, CI and pytest temporary directories. Paths of the deployment that
    are the same for every user (the seed's /home/bird layout,
    container caches under /root/.cache, /opt mounts, fixed /tmp files of our own tools) are
    allowed; ``BUILD_MACHINE_PATHS`` says why each rule is what it is."""
    bad = build_machine_paths([p for p in tracked_files() if p != SELF])
    assert not bad, (
        "absolute paths of a build machine (record paths relative to the clone, scratch "
        "files by name: bench/kernels/fp8_tune/table.py portable_command):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "line",
    [
        '"command": "/work/clone-a/bench/kernels/bench_fp8_head.py --tune"',
        "cd /work/tree-b/h1 && make test",
        "--configs-out /root/scratch/fp8_configs.json",
        "  /tmp/ci-check/repo/tests/test_x.py:12: AssertionError",
        "/tmp/pytest-of-root/pytest-3/test_a0/doc.md",
        '"router_logs": "/tmp/tmpab3_x9z0"',
        "see /home/alice/notes.txt",
        "file:///Users/alice/src/x",
    ],
)
def test_build_machine_paths_are_caught(tmp_path, line):
    (tmp_path / "a.json").write_text(f"{{\n{line}\n")
    bad = build_machine_paths(["a.json"], root=tmp_path)
    assert len(bad) == 1 and bad[0].startswith("a.json:2: "), bad


@pytest.mark.parametrize(
    "line",
    [
        '"--log-dir", "/tmp/headline/full",',
        '"root": "/root/.cache/dsv4-flash-spark/tiny-dsv4-llama-headline-d003dce104d3",',
        '"482: python -m sim.rehearsal.supervise run /tmp/dsv4k-v0_7gsq0/node/docker",',
        '"model": "/home/bird/models/x",',
    ],
)
def test_machine_paths_in_recorded_results_are_caught(tmp_path, line):
    """In bench/results/ even the paths allowed elsewhere (/root/.cache, /home/bird, /tmp
    files) are the running machine's; the same line in a document passes."""
    for rel in ("bench/results/topic/run.json", "docs/x.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"{{\n{line}\n")
    bad = build_machine_paths(["bench/results/topic/run.json", "docs/x.md"], root=tmp_path)
    assert len(bad) == 1 and bad[0].startswith("bench/results/topic/run.json:2: "), bad


def test_portable_names_in_recorded_results_pass(tmp_path):
    (tmp_path / "bench/results/t").mkdir(parents=True)
    (tmp_path / "bench/results/t/run.json").write_text(
        '"$TMPDIR/headline/full", "~/.cache/dsv4-flash-spark/m", "<pair-dir>/node/models/m",\n'
        '"bench/results/t/run.json", ".venv-engine/bin/vllm", "http://127.0.0.1:8000/v1"\n'
    )
    assert build_machine_paths(["bench/results/t/run.json"], root=tmp_path) == []


@pytest.mark.parametrize(
    "line",
    [
        "OVERLAY_DIR=/home/bird/vllm-overlays",
        "-v $HOME/.cache/vllm:/root/.cache/vllm and /root/.triton, /root/.ssh",
        "-v ${HOME}/work/x:/x and ~/work/repo",
        "the lock /tmp/P.lock, > /tmp/router.txt, file:///tmp/vllm_dist_1f",
        "https://example.org/work/x and bench/work/y and /opt/dsv4-flash-overlays",
        '"command": "python -m bench.kernels.bench_fp8_head --json run30_bench.json"',
    ],
)
def test_deployment_paths_are_not_build_machine_paths(tmp_path, line):
    (tmp_path / "a.md").write_text(line + "\n")
    assert build_machine_paths(["a.md"], root=tmp_path) == []


def test_overlay_folder_ships_no_results():
    paths = tracked_files()
    assert any(p.startswith(OVERLAY_DIR) for p in paths), f"{OVERLAY_DIR} is not tracked"
    bad = results_in_overlay(paths)
    assert not bad, "benchmark results in the folder that ships:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "line",
    [
        "see NOTES.md for the flags",
        "as in ../private/seed/README.txt",
        "each fault from issue 3, each ending in",
        "the issues 3/6 follow-up",
        "one NVIDIA H200 (a lent GPU), 2026-11-30",
        "the GPU-lending service",
        "the lead decided",
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
        "see doc.md and eugr/spark-vllm-docker docs/NETWORKING.md",
        "the link [lab notes](../other/doc.md) of a nested file",
    ],
)
def test_patterns_leave_ordinary_text_alone(tmp_path, line):
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    (tmp_path / "sub" / "dir" / "doc.md").write_text(line + "\n")
    assert offences(["sub/dir/doc.md"], root=tmp_path) == []


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
