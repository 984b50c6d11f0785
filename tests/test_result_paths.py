"""The writers of recorded results name no path of the machine that ran them.

bench/headline_real.py (through chat_ttft_ab.relativize) and sim/rehearsal/leaks.py write
JSON that is committed to bench/results/; tests/test_repo_hygiene.py fails on a /tmp, /root
or /home path there. These check the rewriting itself, without a real run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench import chat_ttft_ab, headline_real
from sim.rehearsal import leaks
from tests.conftest import REPO
from tests.test_repo_hygiene import build_machine_paths


def _passes_hygiene(tmp_path: Path, text: str) -> bool:
    out = tmp_path / "bench/results/t/run.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return build_machine_paths(["bench/results/t/run.json"], root=tmp_path) == []


def test_headline_paths_become_portable_and_the_clone_stays_relative(tmp_path, monkeypatch):
    home, tmp = tmp_path / "home" / "ann", tmp_path / "scratch"
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp))
    venv = REPO / ".venv-engine"
    prefixes = headline_real.path_prefixes(venv)
    doc = {
        "log": f"{tmp}/headline/full/vllm_on.log",
        "model_dir": f"{home}/.cache/dsv4-flash-spark/tiny-dsv4-llama-headline-d003dce104d3",
        "argv": [f"{venv}/bin/vllm", "serve", f"{REPO}/bench/results/t/run.json"],
    }
    got = json.loads(chat_ttft_ab.relativize(json.dumps(doc), prefixes))
    assert got == {
        "log": "$TMPDIR/headline/full/vllm_on.log",
        "model_dir": "~/.cache/dsv4-flash-spark/tiny-dsv4-llama-headline-d003dce104d3",
        "argv": [".venv-engine/bin/vllm", "serve", "bench/results/t/run.json"],
    }


def test_headline_prefixes_on_this_machine_leave_nothing_the_hygiene_test_rejects(tmp_path):
    text = json.dumps(
        {
            "log": f"{tempfile.gettempdir()}/headline/full/vllm_off.log",
            "model": f"{Path.home()}/.cache/dsv4-flash-spark/m",
        }
    )
    assert not _passes_hygiene(tmp_path, text)  # the raw paths would be caught ...
    out = chat_ttft_ab.relativize(text, headline_real.path_prefixes(Path("/opt/venv")))
    assert _passes_hygiene(tmp_path, out), out  # ... the written ones are not


def test_leaks_names_the_pair_directory_and_keeps_the_clone_relative(tmp_path):
    pair_dir = Path("/tmp/dsv4k-v0_7gsq0")
    text = json.dumps(
        [
            f"482: .venv/bin/python -m sim.rehearsal.supervise run {pair_dir}/node/docker/c1",
            f"483: vllm serve {pair_dir}/node/models/tiny-dsv4-llama --port 8000",
            f"{REPO}/sim/rehearsal/leaks.py",
            f"{Path.home()}/.cache/x",
        ]
    )
    assert not _passes_hygiene(tmp_path, text)
    out = leaks.portable(text, pair_dir)
    assert json.loads(out) == [
        "482: .venv/bin/python -m sim.rehearsal.supervise run <pair-dir>/node/docker/c1",
        "483: vllm serve <pair-dir>/node/models/tiny-dsv4-llama --port 8000",
        "sim/rehearsal/leaks.py",
        "~/.cache/x",
    ]
    assert _passes_hygiene(tmp_path, out), out
