"""A pair's status as data: the stable interface of ``status --json`` and of ``pair_status``.

``pair_status(pair)`` returns a ``PairStatus``: each rank's container (state, uptime), the
endpoint's health and model, and live serving figures from ``/metrics``
(``pairctl.status.metrics``), plus one verdict with its exit code: ``healthy`` (0) when both
ranks run and the endpoint answers with a model, ``down`` (8) when no endpoint of this pair
answers and no rank's container is known to run, ``unauthorized`` (9) when the endpoint
answers 401/403 to the env file's VLLM_API_KEY (a key problem, not an outage), ``foreign``
(10) when the server answering is proven not this pair's (pairctl.status.ownership), ``degraded``
(7) for anything in between (a rank gone while the endpoint still answers, containers
running but the endpoint not healthy yet, a node that cannot be asked, a node in the
critical memory band: ``pairctl.status.memory``).

An endpoint's model and figures are shown only once it is proven this pair's
(pairctl.status.ownership: the 1-token probe's system_fingerprint names the boot of this
pair's running rank 0; a stack without boot identity falls back to the weaker label proof).
Something else answering at SPARK1:PORT (another pair's head, because SPARK1 in this env file
points at it) is named and makes the verdict ``foreign``. Fields are documented in
docs/INTERFACES.md; ``SCHEMA_VERSION`` changes when one changes meaning or goes away.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pairctl.contracts import (
    DEFAULT_RECIPE,
    EXIT_DEGRADED,
    EXIT_DOWN,
    EXIT_FOREIGN,
    EXIT_KEY,
    EXIT_OK,
    STATUS_TOKEN_PROBE_S,
)
from pairctl.lifecycle.steps import Health, probe_health
from pairctl.nodes.docker import inspect, labelled_containers, pair_containers
from pairctl.nodes.pressure import NodeMemory
from pairctl.nodes.ssh import Node
from pairctl.pair.plan import LABEL_BOOT, LABEL_PLAN, container_name
from pairctl.pair.resolved import ResolvedPair, load
from pairctl.sentinel.pair import status_extras
from pairctl.status import memory, ownership
from pairctl.status.metrics import (
    GENERATION,
    MetricsSample,
    ServingFigures,
    figures,
    increase,
    scrape,
)
from pairctl.status.watch import Answer, KeyRejected, probe_answer

SCHEMA_VERSION = 3  # 3: foreign verdict; endpoint.proof/proof_detail, ranks[].boot
HEALTHY, DEGRADED, DOWN, UNAUTHORIZED = "healthy", "degraded", "down", "unauthorized"
FOREIGN = "foreign"
EXIT_CODES = {
    HEALTHY: EXIT_OK,
    DEGRADED: EXIT_DEGRADED,
    DOWN: EXIT_DOWN,
    UNAUTHORIZED: EXIT_KEY,
    FOREIGN: EXIT_FOREIGN,
}
# Is the server answering at SPARK1:PORT this pair's? (rank 0's labelled container runs)
OURS, NOT_OURS, UNPROVEN, NO_ANSWER = "yes", "no", "unproven", "-"
MISSING, UNKNOWN = "missing", "unknown"  # no container of this rank / node did not answer


@dataclass(frozen=True)
class RankStatus:
    """One rank's container on its node."""

    rank: int
    role: str  # "head" (rank 0) or "worker" (every headless rank)
    addr: str  # SPARK<rank+1>
    reachable: bool  # docker answered on the node (over ssh for a headless rank)
    error: str  # why the node could not be asked ("" when reachable)
    container: str  # this rank's container name, dsv4-<PAIR_ID>-rank<R>
    state: str  # docker's state ("running", "exited", ...), "missing" or "unknown"
    started_at: str | None  # RFC 3339, when the container last started; None if not running
    uptime_s: float | None  # seconds since started_at (this machine's clock)
    others: list[str]  # other containers of this pair on the node, "name (state)"
    plan: str | None  # the container's dsv4.plan label (hash of what it runs)
    boot: str | None = None  # the container's dsv4.boot label (which boot of the pair)

    @property
    def running(self) -> bool:
        return self.state.lower() == "running"


@dataclass(frozen=True)
class EndpointStatus:
    """The OpenAI endpoint on rank 0: GET /health, then /v1/models."""

    url: str  # base URL clients use, ending in /v1
    healthy: bool  # /health 200 and /v1/models lists a model, and the server is ours
    detail: str  # "ok" or what failed (or whose server answers instead)
    models: list[str]  # empty unless the server is proven ours
    simulator: bool  # the spark twin answered, not vLLM
    answered: bool = False  # some HTTP server answers at the URL
    key_rejected: bool = False  # /v1 answered 401/403 to VLLM_API_KEY
    ours: str = NO_ANSWER  # "yes" | "no" | "unproven" | "-" (nothing answered)
    proof: str = ""  # "proven" | "disproven" | "unavailable" | "" (nothing answered)
    proof_detail: str = ""  # the ownership proof's sentence


@dataclass(frozen=True)
class PairStatus:
    """Everything ``status`` shows; ``to_dict()`` is the ``status --json`` document."""

    schema_version: int
    pair_id: str
    verdict: str  # "healthy" | "degraded" | "down" | "unauthorized" | "foreign"
    exit_code: int  # 0, 7, 8, 9 or 10: what `status` exits with
    reasons: list[str]  # why not healthy (empty when healthy)
    ranks: list[RankStatus]  # rank 0, rank 1 (.. rank 3 in a group of four)
    endpoint: EndpointStatus
    serving: ServingFigures | None  # None when /metrics was not read (endpoint not healthy)
    metrics_error: str  # why /metrics gave nothing ("" when it did or was not asked)
    running_plan: str | None  # rank 0's plan label (what runs), to compare with current_plan
    current_plan: str | None  # plan hash of the current config (None if not computed)
    checked_at: str  # UTC, RFC 3339
    memory: list[NodeMemory] = field(default_factory=list)  # each node's pressure band
    # Why the engine did not generate a token though /health answers ("" = it generates, or
    # the endpoint was not healthy enough to ask): see ``engine_generates``.
    engine_error: str = ""
    # The acceptance probe's last round and the output canary's last run, as `watch`
    # recorded them, and their events, one line each (pairctl.sentinel; docs/INTERFACES.md).
    # Live acceptance is `serving`'s display only. Events do not change the verdict or the
    # exit code.
    acceptance: dict[str, Any] | None = None
    watch_record: dict[str, Any] | None = None
    events: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_docker_time(text: str) -> datetime | None:
    """Docker's RFC 3339 time (nanoseconds allowed); None for its zero time or junk."""
    if not text or text.startswith("0001-"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text.strip())
    if not m:
        return None
    frac = (m.group(2) or "")[:7]  # Python takes at most microseconds
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        return datetime.fromisoformat(m.group(1) + frac + tz)
    except ValueError:
        return None


def rank_status(node: Node, pair_id: str, now: datetime) -> RankStatus:
    """Ask the node's docker for this pair's containers (label-selected) and uptime."""
    role = "head" if node.rank == 0 else "worker"
    name = container_name(pair_id, node.rank)
    found, res = pair_containers(node, pair_id)
    if res.rc != 0:
        error = (res.err or res.out).strip()[-300:] or f"rc={res.rc}"
        return RankStatus(
            node.rank, role, node.addr, False, error, name, UNKNOWN, None, None, [], None
        )
    mine = next((c for c in found if c.name == name), None)
    others = [f"{c.name} ({c.state})" for c in found if c.name != name]
    if mine is None:
        return RankStatus(
            node.rank, role, node.addr, True, "", name, MISSING, None, None, others, None
        )
    started, uptime = None, None
    if mine.running:
        st = inspect(node, name)
        when = parse_docker_time(st.started_at) if st else None
        if when is not None:
            started = st.started_at
            uptime = max(0.0, (now - when).total_seconds())
    plan, boot = mine.labels.get(LABEL_PLAN), mine.labels.get(LABEL_BOOT)
    return RankStatus(
        node.rank, role, node.addr, True, "", name, mine.state, started, uptime, others, plan, boot
    )


def verdict(ranks: list[RankStatus], ep: EndpointStatus) -> tuple[str, list[str]]:
    """healthy / degraded / down / unauthorized / foreign, and why (module docstring)."""
    reasons = []
    for r in ranks:
        if not r.reachable:
            reasons.append(f"rank {r.rank} ({r.addr}): cannot ask docker: {r.error}")
        elif not r.running:
            reasons.append(f"rank {r.rank} ({r.addr}): container {r.container} {r.state}")
    reasons += mixed_boots(ranks)
    if not ep.healthy:
        reasons.append(f"endpoint {ep.url}: {ep.detail}")
    if ep.ours == NOT_OURS:
        return FOREIGN, reasons
    if not reasons:
        return HEALTHY, []
    if ep.key_rejected and ep.ours != NOT_OURS:
        return UNAUTHORIZED, reasons
    if not (ep.healthy or ep.ours == UNPROVEN) and not any(r.running for r in ranks):
        return DOWN, reasons
    return DEGRADED, reasons


def mixed_boots(ranks: list[RankStatus]) -> list[str]:
    """Running ranks of another boot than the head's: one engine is one boot (``up`` labels
    every rank with it), so a rank of another is a leftover that is not part of the engine
    the endpoint serves, though it holds its node's memory."""
    head = ranks[0] if ranks and ranks[0].rank == 0 else None
    if head is None or not head.running or head.boot is None:
        return []
    return [
        f"rank {r.rank} ({r.addr}): runs boot {r.boot}, the head boot {head.boot}: not part "
        "of the engine that serves; run down, then up"
        for r in ranks[1:]
        if r.running and r.boot is not None and r.boot != head.boot
    ]


def whose(node: Node, pair_id: str, h: Health) -> str:
    """Who may own the server answering on this pair's SPARK1:PORT (not this pair)."""
    found, res = labelled_containers(node)
    others = sorted({c.pair or "" for c in found if c.running and c.pair != pair_id})
    names = [c.name for c in found if c.running and c.pair != pair_id]
    if h.pair_header and h.pair_header != pair_id and h.pair_header not in others:
        others.insert(0, h.pair_header)
    if others:
        running = f" ({', '.join(names)} running there)" if names else ""
        return f"it may be pair {' or '.join(others)}'s{running}"
    if res.rc != 0:
        return "whose it is is unknown (docker ps of all pairs failed there)"
    return "no pair's container runs there: some other server holds the port"


def head_facts(rank0: RankStatus) -> ownership.Head:
    """Rank 0's container as the ownership proof reads it."""
    return ownership.Head(rank0.reachable, rank0.running, rank0.boot, rank0.error)


def endpoint_status(
    base: str, h: Health, rank0: RankStatus, node0: Node, pair_id: str, proof: ownership.Proof
) -> EndpointStatus:
    """The endpoint as this pair's: its model and health count only once the ownership
    proof holds (``proof``); another server answering there is named, not shown as ours."""
    url = f"{base}/v1"
    if not h.answered:
        return EndpointStatus(url, False, h.detail, [], False)
    said = (proof.outcome, proof.detail)
    if proof.ours:
        detail = h.detail if proof.outcome == ownership.PROVEN else f"{h.detail} ({proof.detail})"
        return EndpointStatus(
            url, h.healthy, detail, h.models, h.simulator, True, h.key_rejected, OURS, *said
        )
    if proof.outcome == ownership.UNAVAILABLE:
        why = (
            f"answers ({h.detail}), but it cannot be proven this pair's: {proof.detail}; "
            "its figures are not shown"
        )
        return EndpointStatus(url, False, why, [], False, True, h.key_rejected, UNPROVEN, *said)
    why = (
        f"a server answers there, but it is not this pair's endpoint: {proof.detail}; "
        f"{whose(node0, pair_id, h)}. Its figures are not shown; check SPARK1 and PORT in "
        "the env file"
    )
    return EndpointStatus(url, False, why, [], False, True, h.key_rejected, NOT_OURS, *said)


def prove(pair: ResolvedPair, h: Health, rank0: RankStatus) -> tuple[ownership.Proof, Answer]:
    """The 1-token probe and the ownership proof on its answer (once anything answers)."""
    if not h.answered:
        return ownership.Proof(ownership.UNAVAILABLE, "nothing answered"), Answer(h.detail)
    refused = False
    if not (h.healthy or h.key_rejected):  # booting or broken: no completion to read yet
        ans = Answer(h.detail)
    else:
        try:
            ans = probe_answer(pair.endpoint, STATUS_TOKEN_PROBE_S, pair.api_key)
        except KeyRejected as exc:
            ans, refused = Answer(str(exc)), True
    identity = pair.stack.boot_identity == "fingerprint"
    url = f"{pair.endpoint}/v1"
    proof = ownership.judge_answer(
        pair.pair_id, identity, url, ans, refused or h.key_rejected, head_facts(rank0)
    )
    return proof, ans


def engine_generates(probed: Answer, prev: MetricsSample | None, last: MetricsSample | None) -> str:
    """Empty when the engine generates tokens, else why not.

    vLLM's /health answers from the API server: with rank 1 killed while idle, or the two
    ranks partitioned, it stays 200 while no request can be served (the real engine in the
    rehearsal). Generated tokens in the window prove the engine alive without adding a
    request; otherwise the answer of the 1-token probe (``watch``'s probe, at most
    STATUS_TOKEN_PROBE_S seconds) that the ownership proof reads, ``probed``, says.
    """
    if prev is not None and last is not None:
        made = increase(prev.scrape.total(GENERATION), last.scrape.total(GENERATION))
        if made:
            return ""
    return probed.why or ""


def collect(
    pair: ResolvedPair,
    previous: MetricsSample | None = None,
    interval_s: float = 0.0,
    on_window: Callable[[float], None] | None = None,
) -> tuple[PairStatus, MetricsSample | None]:
    """One status reading; serving rates cover the time since ``previous`` (if given), or
    ``interval_s`` seconds between two scrapes taken now (0: lifetime figures only).
    ``on_window(interval_s)`` is called once the first of those two scrapes is taken, before
    the wait (the window's start: ``status`` says so on stderr for a long one).

    Returns the status and the newest /metrics sample (pass it back as ``previous``).
    """
    base = pair.endpoint
    key = pair.api_key
    h = probe_health(base, api_key=key)
    now = datetime.now(UTC)
    node_list = pair.nodes
    # every headless rank's ssh runs alongside rank 0, and the memory read beside them
    with ThreadPoolExecutor(max_workers=len(node_list) + 1) as pool:
        mem = pool.submit(memory.sample, node_list)
        ranks = list(pool.map(lambda n: rank_status(n, pair.pair_id, now), node_list))
        readings = mem.result()
    proof, probed = prove(pair, h, ranks[0])
    ep = endpoint_status(base, h, ranks[0], node_list[0], pair.pair_id, proof)
    serving, last, prev, err = None, None, None, ""
    if ep.healthy:  # proven ours: only now are its figures this pair's figures
        prev = previous
        if prev is None and interval_s > 0:
            prev, err = scrape(base, api_key=key)
            if prev is not None:
                if on_window is not None:
                    on_window(interval_s)
                time.sleep(interval_s)
        last, err = scrape(base, api_key=key)
        if last is not None:
            dt = last.t - prev.t if prev is not None else None
            serving = figures(last.scrape, prev.scrape if prev else None, dt)
    name, reasons = verdict(ranks, ep)
    engine = ""
    if name == HEALTHY:
        engine = engine_generates(probed, prev, last)
        if engine:
            name = DEGRADED
            reasons.append(
                f"the engine generated no token ({engine}) although /health answers: a lost "
                "rank, a partition between the ranks or a NCCL wedge; `watch` restarts such a "
                "pair, or run down, then up"
            )
    if memory.reasons(readings):  # a node about to wedge is not a healthy pair
        reasons += memory.reasons(readings)
        name = DEGRADED if name == HEALTHY else name
    extras = status_extras(pair)
    status = PairStatus(
        schema_version=SCHEMA_VERSION,
        pair_id=pair.pair_id,
        verdict=name,
        exit_code=EXIT_CODES[name],
        reasons=reasons,
        ranks=ranks,
        endpoint=ep,
        serving=serving,
        metrics_error=err,
        running_plan=ranks[0].plan,
        current_plan=pair.plan_hash,
        checked_at=now.isoformat(timespec="seconds").replace("+00:00", "Z"),
        memory=readings,
        engine_error=engine,
        **extras,
    )
    return status, last


def pair_status(
    pair: ResolvedPair,
    interval_s: float = 1.0,
    on_window: Callable[[float], None] | None = None,
) -> PairStatus:
    """The pair's status now; rates over ``interval_s`` seconds (0 = lifetime figures).

    ``pair`` is the resolved pair (``pairctl.pair.resolved.load``); ``pair_status_of`` builds it
    from the files. ``on_window``: see ``collect``.
    """
    return collect(pair, None, interval_s, on_window)[0]


def pair_status_of(
    env_file: str | Path, recipe_file: str | Path = DEFAULT_RECIPE, interval_s: float = 1.0
) -> PairStatus:
    """``pair_status`` from a pair's env file and recipe, validated as the launcher does
    (raises ``pairctl.pair.config.ConfigError`` naming what is wrong)."""
    return pair_status(load(env_file, recipe_file), interval_s)
