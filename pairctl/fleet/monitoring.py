"""Prometheus scrape config for a fleet, generated from its inventory.

Two jobs: the router's metrics exporter (`--prometheus-host/--prometheus-port`, metric names
`vllm_router_*`) and every pair's rank 0 (vLLM's `/metrics` on the pair endpoint, names
`vllm:*` as vLLM 0.33 defines them in vllm/v1/metrics/loggers.py). Each target carries
`fleet` and, for pairs, `pair` labels; the Grafana dashboard in monitoring/grafana/ groups
by them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import yaml

from pairctl.fleet.inventory import Fleet

ROUTER_JOB = "dsv4-router"
PAIRS_JOB = "dsv4-pairs"


def _hostport(url: str) -> str:
    u = urlsplit(url)
    return u.netloc


def scrape_config(fleet: Fleet, interval_s: int = 15) -> dict[str, Any]:
    r = fleet.router
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "scrape_configs": [
            {
                "job_name": ROUTER_JOB,
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [_hostport(r.metrics_url)],
                        "labels": {"fleet": fleet.fleet_id},
                    }
                ],
            },
            {
                "job_name": PAIRS_JOB,
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [_hostport(p.endpoint)],
                        "labels": {"fleet": fleet.fleet_id, "pair": p.pair_id},
                    }
                    for p in fleet.pairs
                ],
            },
        ],
    }


def render(fleet: Fleet) -> str:
    head = (
        f"# Prometheus scrape config for fleet {fleet.fleet_id}, generated from {fleet.path}\n"
        "# by `launch/dspark_launch.sh fleet prometheus`; regenerate after editing the "
        "inventory.\n"
    )
    return head + yaml.safe_dump(scrape_config(fleet), sort_keys=False)
