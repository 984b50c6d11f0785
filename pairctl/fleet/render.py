"""Text for the operator: the fleet plan, the up/down summary, the status table."""

from __future__ import annotations

import shlex

from pairctl.contracts import BOOT_TIMEOUT_S
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import Fleet
from pairctl.fleet.ops import DownResult, FleetStatus, UpResult
from pairctl.fleet.pairs import head, pair_argv
from pairctl.fleet.remote import ssh_argv
from pairctl.pair.resolved import ResolvedPair


def table(rows: list[list[str]], headers: list[str]) -> str:
    cells = [headers, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def plan(fleet: Fleet) -> str:
    """What `up` would run, where; changes nothing and contacts no machine."""
    r = fleet.router
    out = [
        f"# fleet {fleet.fleet_id}: {len(fleet.pairs)} pair(s) behind one router "
        f"({r.policy}); inventory {fleet.path}",
        f"# clients: {r.url}/v1, one X-Session-ID per conversation (docs/fleet.md)",
        "# order: check the router image on the router host; bring up every pair that is not "
        "healthy, in parallel, each with its own `pairctl up` (own lock, preflight, teardown); "
        "then start the router unless it runs; wait until it counts every healthy pair",
    ]
    for p in fleet.pairs:
        m = head(fleet, p)
        argv = pair_argv(fleet, p, "up", "--timeout", str(BOOT_TIMEOUT_S))
        out += [
            "",
            f"## pair {p.pair_id}: head {p.head}, {_workers(p.pair)}, {p.endpoint}/v1",
        ]
        if m.local:
            out.append(f"# on this machine: {shlex.join(argv)}")
        else:
            out.append(f"# checks {p.remote_env_file} on the head matches {p.env_file}")
            out.append(shlex.join(ssh_argv(p.head, fleet.ssh)) + " -- " + shlex.join(argv))
    m = rt.machine(fleet)
    out += ["", f"## router on {m.label}: container {rt.container_name(fleet.fleet_id)}"]
    if not m.local:
        out.append("# over: " + shlex.join(ssh_argv(r.host, fleet.ssh)) + " -- <the docker line>")
    out.append("docker " + shlex.join(rt.docker_run_argv(fleet)))
    out.append(f"# metrics (Prometheus): {r.metrics_url}; scrape config: fleet prometheus")
    return "\n".join(out) + "\n"


def up_summary(fleet: Fleet, res: UpResult) -> str:
    rows = [
        [
            o.pair_id,
            "healthy" if o.before and o.before.healthy else "not healthy",
            o.action or "-",
            o.result(),
        ]
        for o in res.pairs
    ]
    ro = res.router
    if not rows and not ro.error and ro.view is None:
        return ""  # refused before anything ran: its lines above say why, nothing to sum up
    out = ["", f"fleet {fleet.fleet_id} summary:"]
    if rows:
        out.append(table(rows, ["pair", "before", "action", "result"]))
    if ro.error:
        out.append(f"router: {ro.action + ': ' if ro.action else ''}{ro.error}")
    elif ro.view is not None:
        n = len(ro.view.healthy_workers)
        out.append(
            f"router: {ro.action}, ready, {n}/{len(ro.view.workers)} pair(s) healthy in its view"
        )
        out.append(f"endpoint: {fleet.router.url}/v1 (send X-Session-ID per conversation)")
    if ro.note:
        out.append(f"note: {ro.note}")
    failed = [o.pair_id for o in res.pairs if not o.ok]
    if failed:
        out.append(
            f"not serving: {', '.join(failed)}: see its lines above; fix it and run fleet up "
            "again (healthy pairs and the router are left as they are)"
        )
    return "\n".join(out) + "\n"


def down_summary(fleet: Fleet, res: DownResult) -> str:
    out = ["", f"fleet {fleet.fleet_id} down:"]
    out.append(
        f"router: {res.router_error or 'removed ' + (', '.join(res.router_removed) or 'nothing')}"
    )
    for o in res.pairs:
        out.append(f"pair {o.pair_id}: " + ("down" if o.rc == 0 else f"FAILED (exit {o.rc})"))
    if res.code:
        out.append("down incomplete: re-run once the machines named above answer")
    return "\n".join(out) + "\n"


def status_text(fleet: Fleet, st: FleetStatus) -> str:
    v = st.router
    if st.router_error:
        where = f"cannot query the router host: {st.router_error}"
    elif not st.router_containers:
        where = "no router container"
    else:
        where = ", ".join(f"{c['name']} {c['state']}" for c in st.router_containers)
    state = (
        f"ready, {len(v.healthy_workers)}/{len(v.workers)} worker(s) healthy"
        if v.ready
        else f"not ready ({v.detail})"
    )
    out = [
        f"fleet {fleet.fleet_id}: {st.verdict.upper()}, endpoint {fleet.router.url}/v1 "
        f"({fleet.router.policy})",
        f"router on {fleet.router.host}: {where}; {state}",
    ]
    rows = []
    for p in fleet.pairs:
        pv = st.pairs[p.pair_id]
        seen = v.workers.get(p.endpoint)
        rview = "healthy" if seen else "DOWN" if seen is False else "absent"
        if not v.reachable:
            rview = "-"
        sim = " [SIMULATOR]" if pv.simulator else ""
        rows.append(
            [
                p.pair_id,
                f"{p.pair.nnodes} (TP={p.pair.nnodes})",
                f"{p.endpoint}/v1",
                ("healthy" + sim) if pv.healthy else f"not healthy ({pv.detail})",
                rview,
                _num(pv.running),
                _num(pv.waiting),
            ]
        )
    heads = ["pair", "sparks", "endpoint", "pair health", "router's view", "running", "waiting"]
    out.append(table(rows, heads))
    extra = [u for u in v.workers if u not in fleet.by_endpoint()]
    if extra:
        out.append(f"note: the router also routes to {', '.join(extra)} (not in the inventory)")
    return "\n".join(out) + "\n"


def _workers(pair: ResolvedPair) -> str:
    """A pair's "worker SPARK2"; a group of four's "3 workers (TP=4): S2, S3, S4"."""
    if pair.nnodes == 2:
        return f"worker {pair.spark2}"
    rest = ", ".join(pair.node_addr(r) for r in pair.headless_ranks)
    return f"{pair.nnodes - 1} workers (TP={pair.nnodes}): {rest}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"
