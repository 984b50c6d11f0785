"""bench/results/ holds only runs the documents cite, each listed in its README's index.

* Every tracked file under ``bench/results/`` is a row of ``bench/results/README.md`` and is
  cited, by file name, by at least one Markdown document outside that README (and outside
  ``tests/``). A run nothing cites is removed (git history keeps it); recorded data that only
  a test reads lives in ``tests/data/``.
* Every row of the index names a file that exists, and the documents its "Cited by" column
  names really cite it.

An index row is a Markdown table row whose first cell is the path relative to
``bench/results/`` in backticks; its last cell lists the citing documents in backticks.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from tests.conftest import REPO
from tests.test_repo_hygiene import tracked_files

RESULTS_DIR = "bench/results/"
INDEX = RESULTS_DIR + "README.md"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")
TICKED = re.compile(r"`([^`]+)`")


def cites(text: str, name: str) -> bool:
    """Whether ``text`` names the file ``name`` (not merely a longer name that contains it)."""
    return re.search(r"(?<![\w.-])" + re.escape(name) + r"(?!\.?[\w-])", text) is not None


def index_rows(text: str) -> list[tuple[str, list[str]]]:
    """(path relative to bench/results/, documents in the last cell) for each index row."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            last = line.rstrip().rstrip("|").rsplit("|", 1)[-1]
            rows.append((m.group(1), TICKED.findall(last)))
    return rows


def index_problems(paths: list[str], root: Path = REPO) -> list[str]:
    """What is wrong between bench/results/, its index and the documents (empty: nothing)."""
    results = sorted(p for p in paths if p.startswith(RESULTS_DIR) and p != INDEX)
    docs = sorted(
        p for p in paths if p.endswith(".md") and p != INDEX and not p.startswith("tests/")
    )
    texts = {d: (root / d).read_text(encoding="utf-8") for d in docs if (root / d).is_file()}
    if INDEX not in paths or not (root / INDEX).is_file():
        return [f"{INDEX} is missing: it indexes every file in {RESULTS_DIR}"]
    rows = index_rows((root / INDEX).read_text(encoding="utf-8"))
    listed = [rel for rel, _ in rows]
    problems = [
        f"{INDEX}: lists {rel} more than once"
        for rel in sorted(set(listed))
        if listed.count(rel) > 1
    ]
    names = [PurePosixPath(p).name for p in results]
    problems += [
        f"{RESULTS_DIR}: two files named {n}; a citation by name would be ambiguous"
        for n in sorted(set(names))
        if names.count(n) > 1
    ]
    for path in results:
        rel, name = path[len(RESULTS_DIR) :], PurePosixPath(path).name
        if rel not in listed:
            problems.append(f"{path}: not listed in {INDEX}")
        if not any(cites(t, name) for t in texts.values()):
            problems.append(
                f"{path}: no document outside {INDEX} cites it; cite it, move it to tests/data/ "
                "if only a test reads it, or remove it (git history keeps it)"
            )
    for rel, cited_by in rows:
        path, name = RESULTS_DIR + rel, PurePosixPath(rel).name
        if path not in results or not (root / path).is_file():
            problems.append(f"{INDEX}: lists {rel}, which is not a tracked file in {RESULTS_DIR}")
        if not cited_by:
            problems.append(f"{INDEX}: the row of {rel} names no citing document")
        for doc in cited_by:
            if doc not in texts or not cites(texts[doc], name):
                problems.append(f"{INDEX}: says {doc} cites {rel}; it does not")
    return problems


def test_every_recorded_run_is_indexed_and_cited_and_every_row_exists():
    bad = index_problems(tracked_files())
    assert not bad, "bench/results/ and its index disagree:\n" + "\n".join(bad)


def _repo(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return sorted(files)


_OK = {
    "bench/results/topic/run1.json": "{}\n",
    "bench/results/README.md": "| File | Cited by |\n|---|---|\n"
    "| `topic/run1.json` | `docs/fleet.md` |\n",
    "docs/fleet.md": "Raw: `bench/results/topic/run1.json`.\n",
}


def test_a_consistent_tree_passes(tmp_path):
    assert index_problems(_repo(tmp_path, _OK), root=tmp_path) == []


def test_an_uncited_file_fails_even_when_indexed(tmp_path):
    files = dict(_OK, **{"bench/results/topic/run2.json": "{}\n"})
    files["bench/results/README.md"] += "| `topic/run2.json` | `docs/fleet.md` |\n"
    bad = index_problems(_repo(tmp_path, files), root=tmp_path)
    assert len(bad) == 2, bad
    assert bad[0].startswith("bench/results/topic/run2.json: no document outside")
    assert (
        bad[1] == "bench/results/README.md: says docs/fleet.md cites topic/run2.json; it does not"
    )


def test_an_unindexed_file_and_a_row_without_a_file_fail(tmp_path):
    files = dict(_OK, **{"bench/results/topic/run2.json": "{}\n"})
    files["docs/fleet.md"] += "Also `run2.json`.\n"
    files["bench/results/README.md"] += "| `topic/gone.json` | `docs/fleet.md` |\n"
    bad = index_problems(_repo(tmp_path, files), root=tmp_path)
    assert bad == [
        "bench/results/topic/run2.json: not listed in bench/results/README.md",
        "bench/results/README.md: lists topic/gone.json, which is not a tracked file in "
        "bench/results/",
        "bench/results/README.md: says docs/fleet.md cites topic/gone.json; it does not",
    ]


def test_citations_in_the_index_tests_or_longer_names_do_not_count(tmp_path):
    files = dict(_OK)
    files["docs/fleet.md"] = "See `run1.json.bak`, `old_run1.json` and `topic/run1.jsonl`.\n"
    files["tests/test_x.py"] = 'RUN = "bench/results/topic/run1.json"\n'
    files["tests/data/README.md"] = "`run1.json`\n"
    bad = index_problems(_repo(tmp_path, files), root=tmp_path)
    assert bad[0].startswith("bench/results/topic/run1.json: no document outside"), bad
    assert cites("the file run1.json.", "run1.json") and cites("(`a/run1.json`)", "run1.json")
