"""pytest support for the netns tests: a session-scoped rehearsal pair, the launcher run
on host 1, and a GET from inside a host.

Each test module makes its own fixture with its own prefix (`pair_fixture("dsv4t")`),
so modules never share names and a manual `make rehearse` (prefix `dsv4r`) can run at
the same time; if someone else's test run holds the prefix, the next free `prefixN` is
used. Building a pair takes ~1.5 s; the simulator boot is the slow part.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.engine import local
from sim.rehearsal import hosts, pairenv, provision


def pair_fixture(
    prefix: str, with_env: bool = True, engine: str = "sim", nodes: int = 2
) -> Callable[..., Any]:
    """A session-scoped fixture yielding a built `hosts.Pair` (with `.env_file` if asked);
    ``engine`` "cpu" gives every host the real-engine image and the tiny real model;
    ``nodes`` 4 builds four hosts, one group (SPARK1..4 in the env file)."""

    @pytest.fixture(scope="session")
    def _pair() -> Iterator[hosts.Pair]:
        model = local.built_model() if engine == "cpu" else None
        pair = provision.build_free_pair(prefix, n_hosts=nodes)
        try:
            if with_env:
                pair.env_file = pairenv.prepare(pair, engine=engine, model=model)
            yield pair
        finally:
            provision.teardown(pair)

    return _pair


def run_launcher(
    pair: hosts.Pair,
    repo: Path,
    *args: str,
    env_file: Path | None = None,
    timeout: float = 240,
    extra_env: dict[str, str] | None = None,
    vllm_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run launch/dspark_launch.sh on host 1, as an operator does on the rank-0 Spark;
    ``vllm_args`` go after `--` (passed through to `vllm serve`)."""
    env_path = env_file or pair.env_file
    argv = [str(repo / "launch" / "dspark_launch.sh"), *args, "--env-file", str(env_path)]
    if vllm_args:
        argv += ["--", *vllm_args]
    env = dict(extra_env or {})
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The launcher's documented test knob: poll health every 0.5 s instead of 2 s.
    env.setdefault("PAIRCTL_POLL_S", "0.5")
    return pair.h1.run(argv, env=env, timeout=timeout, cwd=str(repo / "launch"))


_GET = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
)


def http_get_on(host: hosts.Host, url: str) -> subprocess.CompletedProcess:
    """GET `url` from inside `host` (its network); rc 0 and the body on success."""
    return host.run(["python3", "-c", _GET, url], timeout=30)
