"""One process per command, the pair resolved once (fake docker/ssh from tests/fakes).

`launch/dspark_launch.sh up` starts exactly one Python (it execs `python -m pairctl`), and
inside it, following the pair config from the command line to both `docker run` lines
reads the env file and recipe once, resolves the pair once and builds each rank's vLLM
argv and the plan hash once: nothing below the top of the command re-derives them.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from pairctl.cli import main as cli
from pairctl.pair import config, derive, recipe, resolved
from tests.fakes.fakepair import Env

# The steps that turn the env file and recipe into argv, and how often one `up` may run
# each: once per command, or once per rank where the value is per rank.
ONCE = {
    config.load_env_file: 1,
    recipe.load_recipe: 1,
    resolved.resolve: 1,
    derive.with_recipe_defaults: 1,
    derive.resolve_image: 1,
    derive.plan_hash: 1,
    derive.placeholders: 2,
    derive.vllm_args: 2,
}


def _counting(fns: dict) -> tuple[Counter, object]:
    codes = {f.__code__: f.__qualname__ for f in fns}
    seen: Counter = Counter()

    def profile(frame, event, _arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and frame.f_code in codes:
            seen[codes[frame.f_code]] += 1

    return seen, profile


def test_up_resolves_the_pair_once(pair: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in pair.environ().items():
        monkeypatch.setenv(k, v)
    seen, profile = _counting(ONCE)
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        rc = cli.main(["up", "--env-file", str(pair.env_file)])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert rc == 0
    assert [r["argv"][r["argv"].index("--name") + 1] for r in pair.runs()] == [
        "dsv4-pair-a-rank1",
        "dsv4-pair-a-rank0",
    ]
    for fn, times in ONCE.items():
        assert seen[fn.__qualname__] == times, (fn.__qualname__, dict(seen))


def test_launcher_starts_one_python_per_command(pair: Env, tmp_path: Path) -> None:
    """The launcher execs one interpreter; nothing it runs starts the launcher or another
    `python -m pairctl` (PAIRCTL_PYTHON is a shim that logs every start)."""
    log = tmp_path / "starts.log"
    shim = tmp_path / "python-shim"
    shim.write_text(f'#!/bin/sh\necho "start $1" >> "{log}"\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    for args in (("up",), ("status",), ("down",), ("plan",), ("--help",)):
        log.write_text("")
        p = pair.run(*args, env={"PAIRCTL_PYTHON": str(shim)})
        assert p.returncode in (0, 7, 8), (args, p.stderr)
        starts = log.read_text().splitlines()
        assert starts == ["start -c"], (args, starts)
    assert "dspark_launch.sh" not in pair.log_path.read_text()
