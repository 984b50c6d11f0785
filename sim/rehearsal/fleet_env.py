"""What a fleet rehearsal has besides five machines: two pairs' env files, images, an inventory.

Hosts 1+2 are pair `pair-a`, hosts 3+4 pair `pair-b`, host 5 runs the router and the fleet
command (an operator's box). Each pair host gets what `pairenv` gives a pair host (fake
model dir, TileLang cache, simulator image, overlays); the router host gets the router
"image", whose entrypoint is `sim/rehearsal/bin/vllm-router`: the real vllm-router from
PyPI, run by the process runtime as the container would run it.

With ``engine="cpu"`` each pair host gets what `make rehearse` gives one: the tiny real model
and the real-engine image (real vLLM, CPU build; the pair's env file selects the `cpu`
engine stack), so the fleet is two real TP=2 pairs.

Which pair a simulated rank belongs to reaches the simulator through the host's
`inject.env` (`TWIN_PAIR_ID`, harness-only, like `TWIN_FAULT`): the twin then answers with
an `X-Spark-Pair` header, so tests can see where the router sent a request. The launcher
and its containers are unchanged; a real vLLM gets no such variable (the fleet rehearsal
reads which real pair answered off the pairs' own counters, sim/rehearsal/whichpair.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.rehearsal import pairenv
from sim.rehearsal.hosts import Host, Pair
from sim.rehearsal.store import INJECT_ENV_FILE
from sim.rehearsal.whichpair import Counters

ROUTER_IMAGE = "dsv4-vllm-router:0.1.17"
ROUTER_IMAGE_ID = "sha256:" + hashlib.sha256(b"dsv4-rehearsal vllm-router image").hexdigest()
ROUTER_PORT = 8080
ROUTER_METRICS_PORT = 29000
N_HOSTS = 5
PAIR_IDS = ("pair-a", "pair-b")
FLEET_ID = "rehearsal"

# Fast router settings for a rehearsal whose pairs boot in seconds (real defaults:
# pairctl/fleet/inventory.py Tuning, docs/fleet.md). Same mechanisms, shorter clocks.
REHEARSAL_TUNING = {
    "health_check_interval_s": 1,
    "health_check_timeout_s": 2,
    "health_failure_threshold": 2,
    "health_success_threshold": 1,
    "worker_startup_timeout_s": 120,
    "request_timeout_s": 600,
    "retry_max_retries": 4,
    "cb_failure_threshold": 2,
    "cb_timeout_s": 2,
}


@dataclass(frozen=True)
class FleetHosts:
    """Roles of the five hosts and the files the fleet command reads."""

    pair: Pair
    inventory: Path
    env_files: dict[str, Path]
    engine: str = "sim"

    @property
    def router(self) -> Host:
        return self.pair.hosts[4]

    def nodes(self, pair_id: str) -> tuple[Host, Host]:
        i = PAIR_IDS.index(pair_id)
        return self.pair.hosts[2 * i], self.pair.hosts[2 * i + 1]

    @property
    def router_url(self) -> str:
        return f"http://{self.router.ip}:{ROUTER_PORT}"

    def endpoint(self, pair_id: str) -> str:
        return f"http://{self.nodes(pair_id)[0].ip}:8000"

    def counters(self) -> Counters | None:
        """Real engines name no pair in their replies: attribute by their own counters.
        None for the simulator, whose `X-Spark-Pair` header says it."""
        if self.engine == "sim":
            return None
        return Counters({p: self.endpoint(p) for p in PAIR_IDS})


def inventory(fh: FleetHosts, repo: Path, tuning: dict[str, int]) -> dict:
    """The fleet inventory, as an operator writes pairs/fleet.yaml (example in pairs/)."""
    return {
        "fleet_version": 1,
        "fleet_id": FLEET_ID,
        "repo_dir": str(repo),
        "ssh": {
            "user": fh.pair.ssh_user,
            "port": "22",
            "identity_file": str(fh.pair.identity),
            "known_hosts_file": str(fh.pair.known_hosts),
        },
        "pairs": [{"env_file": str(fh.env_files[p])} for p in PAIR_IDS],
        "router": {
            "host": fh.router.ip,
            "port": ROUTER_PORT,
            "metrics_port": ROUTER_METRICS_PORT,
            "image": ROUTER_IMAGE,
            "policy": "consistent_hash",
            **tuning,
        },
    }


def prepare(
    pair: Pair,
    repo: Path,
    tuning: dict[str, int] | None = None,
    engine: str = "sim",
    model: Path | None = None,
) -> FleetHosts:
    """Model dirs, images, overlays, pair identities, env files and the inventory.
    ``engine`` "cpu" (with the built tiny ``model``): two real pairs; "sim": simulated."""
    if len(pair.hosts) != N_HOSTS:
        raise ValueError(f"a fleet rehearsal needs {N_HOSTS} hosts, got {len(pair.hosts)}")
    lay = pairenv.layout(pair, engine)
    env_files: dict[str, Path] = {}
    for i, pair_id in enumerate(PAIR_IDS):
        head, worker = pair.hosts[2 * i], pair.hosts[2 * i + 1]
        for host in (head, worker):
            pairenv.prepare_node(host, lay, engine, model)
            if engine == "sim":
                (host.disk / "docker" / INJECT_ENV_FILE).write_text(f"TWIN_PAIR_ID={pair_id}\n")
        pairenv.copy_overlays(pair, repo, [head, worker])
        values = pairenv.env_values(pair, lay, pair_id, head=head, worker=worker, engine=engine)
        env_files[pair_id] = pairenv.write_env(pair.base / "client" / f"{pair_id}.env", values)
    router = pair.hosts[4]
    pairenv.load_image(router, ROUTER_IMAGE_ID, ROUTER_IMAGE, entrypoint=("vllm-router",))
    fh = FleetHosts(pair, pair.base / "client" / "fleet.yaml", env_files, engine)
    inv = inventory(fh, repo, tuning or REHEARSAL_TUNING)
    fh.inventory.write_text(
        "# Written by sim/rehearsal/fleet_env.py for the fleet rehearsal.\n"
        + yaml.safe_dump(inv, sort_keys=False)
    )
    return fh
