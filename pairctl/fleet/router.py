"""The fleet's router: vLLM's own router (vllm-project/router, pinned 0.1.17) in a container.

The container runs on the router host with `--network host`, carries the fleet's labels
(`dsv4.fleet=<fleet_id>`, `dsv4.role=router`, `dsv4.plan=<hash>`), and is only ever
selected by them, as a pair's containers are by theirs. Its command line is built here, once,
for `plan`, `up` and bench/bench_router.py alike. The router's own view of its workers comes
from its `/readiness` and `/workers` endpoints (its `/health` turns 503 as soon as one worker
is down, and `/v1/models` asks the first worker only, vllm-project/router#135).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from pairctl.fleet import LABEL_FLEET, ROUTER_ROLE
from pairctl.fleet.inventory import Fleet, Router, Tuning
from pairctl.fleet.remote import Machine
from pairctl.nodes.docker import Container, parse_ps, ps_argv
from pairctl.pair.plan import LABEL_PLAN, LABEL_ROLE

ROUTER_VERSION = "0.1.17"


def container_name(fleet_id: str) -> str:
    return f"dsv4-fleet-{fleet_id}-router"


def router_args(
    worker_urls: list[str],
    *,
    policy: str,
    bind: str,
    port: int,
    metrics_bind: str,
    metrics_port: int,
    tuning: Tuning,
) -> list[str]:
    """`vllm-router` arguments (0.1.17's CLI; `vllm-router --help` lists each)."""
    t = tuning
    return [
        "--host",
        bind,
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        "--prometheus-host",
        metrics_bind,
        "--prometheus-port",
        str(metrics_port),
        "--health-check-endpoint",
        "/health",
        "--health-check-interval-secs",
        str(t.health_check_interval_s),
        "--health-check-timeout-secs",
        str(t.health_check_timeout_s),
        "--health-failure-threshold",
        str(t.health_failure_threshold),
        "--health-success-threshold",
        str(t.health_success_threshold),
        "--worker-startup-timeout-secs",
        str(t.worker_startup_timeout_s),
        "--worker-startup-check-interval",
        str(min(t.health_check_interval_s, 10)),
        "--request-timeout-secs",
        str(t.request_timeout_s),
        "--retry-max-retries",
        str(t.retry_max_retries),
        "--cb-failure-threshold",
        str(t.cb_failure_threshold),
        "--cb-timeout-duration-secs",
        str(t.cb_timeout_s),
        "--log-level",
        "info",
    ]


def fleet_router_args(fleet: Fleet) -> list[str]:
    r: Router = fleet.router
    return router_args(
        [p.endpoint for p in fleet.pairs],
        policy=r.policy,
        bind=r.bind,
        port=r.port,
        metrics_bind=r.bind,
        metrics_port=r.metrics_port,
        tuning=r.tuning,
    )


def plan_hash(fleet: Fleet) -> str:
    """Fingerprint of what would run; a label on the container, to spot drift."""
    h = hashlib.sha256("\0".join([fleet.router.image, *fleet_router_args(fleet)]).encode())
    return h.hexdigest()[:12]


def docker_run_argv(fleet: Fleet) -> list[str]:
    """`docker run` arguments (without `docker`): the image's entrypoint is `vllm-router`."""
    return [
        "run",
        "-d",
        "--name",
        container_name(fleet.fleet_id),
        "--label",
        f"{LABEL_FLEET}={fleet.fleet_id}",
        "--label",
        f"{LABEL_ROLE}={ROUTER_ROLE}",
        "--label",
        f"{LABEL_PLAN}={plan_hash(fleet)}",
        "--network",
        "host",
        fleet.router.image,
        *fleet_router_args(fleet),
    ]


def machine(fleet: Fleet) -> Machine:
    return Machine(fleet.router.host, fleet.ssh, "router host")


def containers(m: Machine, fleet_id: str) -> tuple[list[Container], str | None]:
    """The fleet's router containers on the machine (label-filtered by docker and here)."""
    res = m.run(ps_argv(f"{LABEL_FLEET}={fleet_id}"), timeout=30)
    if res.rc != 0:
        why = (res.err or res.out).strip()[-300:]
        return [], f"{m.label}: docker ps failed (rc={res.rc}): {why}"
    mine = [c for c in parse_ps(res.out) if c.labels.get(LABEL_FLEET) == fleet_id]
    return mine, None


def remove(m: Machine, fleet_id: str) -> tuple[list[str], str | None]:
    """`docker rm -f` the fleet's router containers; nothing without the fleet's label."""
    mine, err = containers(m, fleet_id)
    if err or not mine:
        return [], err
    rm = m.run(["docker", "rm", "-f", *[c.id or c.name for c in mine]], timeout=120)
    if rm.rc != 0:
        return [], f"{m.label}: docker rm failed: {(rm.err or rm.out).strip()[-300:]}"
    return [c.name for c in mine], None


def image_id(m: Machine, image: str) -> tuple[str | None, str]:
    """(image ID, '') when the router image is on the machine, else (None, why)."""
    res = m.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=30)
    if res.rc == 0 and res.out.strip():
        return res.out.strip().splitlines()[0], ""
    if res.rc == 255 and not m.local:
        return None, f"ssh to {m.addr} failed: {res.err.strip()[-300:]}"
    return None, (res.err or res.out).strip()[-300:]


def start(m: Machine, fleet: Fleet) -> str | None:
    """Start the router container; None on success, else the error."""
    res = m.run(["docker", *docker_run_argv(fleet)], timeout=120)
    if res.rc != 0:
        return f"docker run failed (rc={res.rc}): {(res.err or res.out).strip()[-500:]}"
    return None


@dataclass
class RouterView:
    """What the router says: is it serving, and which workers does it count healthy."""

    reachable: bool
    ready: bool
    detail: str
    workers: dict[str, bool] = field(default_factory=dict)

    @property
    def healthy_workers(self) -> list[str]:
        return [u for u, ok in self.workers.items() if ok]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def view(url: str, timeout: float = 3.0) -> RouterView:
    """GET /readiness and /workers (vllm-router 0.1.17's own endpoints)."""
    import requests

    try:
        ready = requests.get(f"{url}/readiness", timeout=timeout)
        workers = requests.get(f"{url}/workers", timeout=timeout)
        rows = workers.json().get("workers", []) if workers.status_code == 200 else []
    except (requests.RequestException, ValueError) as exc:
        return RouterView(False, False, type(exc).__name__)
    health = {str(w.get("url")): bool(w.get("is_healthy")) for w in rows if isinstance(w, dict)}
    detail = "ready" if ready.status_code == 200 else f"/readiness {ready.status_code}"
    return RouterView(True, ready.status_code == 200, detail, health)


def wait_sees(
    url: str, want_healthy: list[str], timeout_s: float, poll_s: float = 0.5
) -> RouterView:
    """Wait until the router is ready and counts every URL in `want_healthy` healthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = view(url)
        if v.ready and all(v.workers.get(u) for u in want_healthy):
            return v
        if time.monotonic() >= deadline:
            return v
        time.sleep(poll_s)
