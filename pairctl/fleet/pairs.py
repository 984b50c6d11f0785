"""The fleet's view of one pair, and running that pair's own launcher on its head.

A pair in a fleet is still brought up and down by `launch/dspark_launch.sh` on its head
(SPARK1), with its own lock, preflight, labels and teardown; the fleet only decides which
pairs need it and runs those launchers side by side.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from typing import Any

from pairctl.fleet.inventory import Fleet, PairEntry
from pairctl.fleet.remote import Machine
from pairctl.lifecycle import steps as lc
from pairctl.status.metrics import scrape


@dataclass(frozen=True)
class PairView:
    """How a pair looks from the fleet: endpoint health and load."""

    pair_id: str
    endpoint: str
    healthy: bool
    detail: str
    models: tuple[str, ...] = ()
    simulator: bool = False
    running: float | None = None
    waiting: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, models=list(self.models))


def pair_status(pair: PairEntry) -> PairView:
    """The one place the fleet asks how a pair is (an adapter: keep callers off the details).

    The pair's endpoint as its own `up` sees it: ``lifecycle.probe_health`` (/health +
    /v1/models, the check `up` uses) and the running/waiting gauges from one /metrics scrape
    parsed like `status` does (``pairctl.status.pair.scrape``), with the pair's API key and no
    proxy. Per-rank container state is not asked from here: the fleet host is not the
    pair's rank 0, and `launch/dspark_launch.sh status` on the head has that view.
    """
    key = pair.pair.api_key
    h = lc.probe_health(pair.endpoint, api_key=key)
    sample = scrape(pair.endpoint, api_key=key)[0] if h.healthy else None
    load = sample.scrape if sample is not None else None
    return PairView(
        pair_id=pair.pair_id,
        endpoint=pair.endpoint,
        healthy=h.healthy,
        detail=h.detail,
        models=tuple(h.models),
        simulator=h.simulator,
        running=load.total("vllm:num_requests_running") if load else None,
        waiting=load.total("vllm:num_requests_waiting") if load else None,
    )


def head(fleet: Fleet, pair: PairEntry) -> Machine:
    return Machine(pair.head, fleet.ssh, f"{pair.pair_id} head")


def pair_argv(fleet: Fleet, pair: PairEntry, command: str, *extra: str) -> list[str]:
    """The pair's own command (``python -m pairctl COMMAND``, what its launcher execs) on its
    head, with the pair's env file and recipe as the head has them: this machine's Python
    when the head is this machine, else the head checkout's venv (``make venv`` there)."""
    if head(fleet, pair).local:
        python, env_file, recipe = sys.executable, str(pair.env_file), str(pair.recipe)
    else:
        python = f"{fleet.repo_dir}/.venv/bin/python"
        env_file, recipe = pair.remote_env_file, pair.remote_recipe
    return [python, "-m", "pairctl", command, "--env-file", env_file, "--recipe", recipe, *extra]


def env_file_matches(fleet: Fleet, pair: PairEntry) -> str | None:
    """None when the head has the same env file as this machine, else what to do.

    The router sends this pair's traffic to the endpoint in *our* copy; the head boots from
    *its* copy. If they differ (a stale or hand-edited file), the fleet would route to an
    endpoint the head does not serve, so `up` refuses that pair until the files agree.
    """
    machine = head(fleet, pair)
    if machine.local:
        return None
    want = hashlib.sha256(pair.env_file.read_bytes()).hexdigest()
    res = machine.run(["sha256sum", "--", pair.remote_env_file], timeout=30)
    if res.rc == 255:
        return f"ssh to {pair.head} failed: {res.err.strip()[-300:]}"
    if res.rc != 0:
        return (
            f"{pair.remote_env_file} is missing on {pair.head}: copy {pair.env_file} there "
            "(the head's launcher reads it)"
        )
    got = res.out.split()[0] if res.out.split() else ""
    if got != want:
        return (
            f"{pair.remote_env_file} on {pair.head} differs from {pair.env_file} here: copy "
            "this machine's file to the head (or fix the inventory), then run fleet up again"
        )
    return None
