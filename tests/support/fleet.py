"""Helpers for the fleet tests: env files and inventories written into a temp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pairctl.fleet.inventory import Fleet, load_inventory

SECRET = "hf_fleetTestTokenNeverPrinted0000"


def env_file(tmp: Path, pair_id: str, spark1: str, spark2: str, port: int = 8000) -> Path:
    """A valid pair env file (the variables of .env.example) with a secret in it."""
    path = tmp / f"{pair_id}.env"
    path.write_text(
        "\n".join(
            [
                f"PAIR_ID={pair_id}",
                f"SPARK1={spark1}",
                f"SPARK2={spark2}",
                f"PORT={port}",
                "MODEL_PATH=/models/DeepSeek-V4-Flash-DSpark",
                "NCCL_SOCKET_IFNAME=enp1s0f1np1",
                "GLOO_SOCKET_IFNAME=enp1s0f1np1",
                f"HF_TOKEN={SECRET}",
            ]
        )
        + "\n"
    )
    return path


def inventory_data(tmp: Path, **router: Any) -> dict[str, Any]:
    """Two pairs (10.9.0.11/12 and 10.9.0.21/22) and a router on 10.9.0.50."""
    a = env_file(tmp, "pair-a", "10.9.0.11", "10.9.0.12")
    b = env_file(tmp, "pair-b", "10.9.0.21", "10.9.0.22")
    r = {
        "host": "10.9.0.50",
        "port": 8080,
        "metrics_port": 29000,
        "image": "dsv4-vllm-router:0.1.17",
    }
    r.update(router)
    return {
        "fleet_version": 1,
        "fleet_id": "test",
        "repo_dir": "/srv/dsv4",
        "ssh": {"user": "bird", "known_hosts_file": str(tmp / "known_hosts")},
        "pairs": [{"env_file": str(a)}, {"env_file": str(b)}],
        "router": r,
    }


def write_inventory(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fleet(tmp: Path, **router: Any) -> Fleet:
    return load_inventory(write_inventory(tmp, inventory_data(tmp, **router)))
