"""up/down building blocks: cleanup, start one rank, wait for health, endpoint health.

``wait_healthy`` watches both ranks while it polls the endpoint: a dead rank ends the wait
at once (exit 4) with that rank's log tail, instead of letting the survivor sit on ~77 GB
until the timeout. The phase shown in the progress line is read from the logs.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pairctl import EXIT_BOOT, EXIT_OK, EXIT_TIMEOUT
from pairctl.config import PairConfig
from pairctl.docker import State, inspect, logs_tail, remove_pair
from pairctl.nodes import Node, nodes
from pairctl.plan import build_rank, container_name, mask_argv, plan_hash
from pairctl.recipe import Recipe

# Log line substring → phase shown while waiting (docs/INTERFACES.md; real vLLM logs match).
PHASES: tuple[tuple[str, str], ...] = (
    ("Loading weights", "loading weights"),
    ("Compiling", "compiling"),
    ("torch.compile", "compiling"),
    ("Capturing CUDA graphs", "capturing CUDA graphs"),
    ("Waiting for rank 1 to join", "waiting for rank 1"),
    ("Starting vLLM API server", "starting API server"),
    ("Application startup complete.", "API server up"),
    ("Worker ready", "worker ready"),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def phase_of(text: str) -> str:
    """The phase of the last log line that names one; 'starting' if none yet."""
    phase = "starting"
    for line in text.splitlines():
        for needle, name in PHASES:
            if needle in line:
                phase = name
    return phase


JOIN_HINT_AFTER_S = 90.0


def join_hint(head_phase: str, waited_s: float, cfg: PairConfig) -> str | None:
    """A hint once the head has waited long for rank 1 (the DistStoreError family)."""
    if head_phase != "waiting for rank 1" or waited_s < JOIN_HINT_AFTER_S:
        return None
    return (
        f"hint: rank 1 has not joined after {waited_s:.0f}s: it must reach "
        f"{cfg.master_addr}:{cfg.MASTER_PORT} and the head's ZeroMQ ports over "
        f"{cfg.NCCL_SOCKET_IFNAME}; check firewall, MASTER_ADDR and PF-NCCL-IFACE, and "
        "`launch/dspark_launch.sh logs --rank 1`"
    )


def fmt_elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s"


def endpoint(cfg: PairConfig) -> str:
    """Base URL of the pair's endpoint (rank 0); IPv6 literals get brackets."""
    host = f"[{cfg.SPARK1}]" if ":" in cfg.SPARK1 else cfg.SPARK1
    return f"http://{host}:{cfg.PORT}"


@dataclass(frozen=True)
class Health:
    """Endpoint state: /health and /v1/models."""

    healthy: bool
    models: list[str]
    simulator: bool
    detail: str


def probe_health(base: str, timeout: float = 3.0) -> Health:
    """GET /health then /v1/models; healthy only when both answer 200 with a model."""
    import requests  # lazy: only steps that talk HTTP pay for the import

    try:
        r = requests.get(f"{base}/health", timeout=timeout)
        if r.status_code != 200:
            return Health(False, [], False, f"/health {r.status_code}")
        r = requests.get(f"{base}/v1/models", timeout=timeout)
        if r.status_code != 200:
            return Health(False, [], False, f"/v1/models {r.status_code}")
        data = r.json().get("data", [])
    except requests.Timeout:
        return Health(False, [], False, f"no answer within {timeout:g} s")
    except requests.ConnectionError:
        return Health(False, [], False, "connection failed (nothing listening, or host down)")
    except (requests.RequestException, ValueError) as exc:
        return Health(False, [], False, f"{type(exc).__name__}: {str(exc)[:200]}")
    models = [str(m.get("id")) for m in data if isinstance(m, dict)]
    sim = any(m.get("owned_by") == "spark-twin-simulator" for m in data if isinstance(m, dict))
    return Health(bool(models), models, sim, "ok" if models else "no models listed")


def cleanup(cfg: PairConfig) -> int:
    """Remove this pair's containers (label-selected) on both nodes; 0 if both went fine."""
    rc = EXIT_OK
    for node in reversed(nodes(cfg)):
        removed, err = remove_pair(node, cfg.PAIR_ID)
        if err:
            log(f"cleanup: {err}")
            rc = 1
        elif removed:
            log(f"cleanup: removed {', '.join(removed)} on {node.label}")
    return rc


def start_rank(cfg: PairConfig, recipe: Recipe, rank: int, passthrough: list[str]) -> int:
    """docker run one rank on its node (overlay mount only if OVERLAY_DIR exists there)."""
    node = nodes(cfg)[rank]
    has_ov = node.run(["test", "-d", cfg.OVERLAY_DIR], timeout=30)
    if has_ov.rc == 255 and node.remote:
        log(f"start: ssh to {node.label} failed: {has_ov.err.strip()[-300:]}")
        return 1
    overlay = has_ov.rc == 0
    if not overlay:
        log(
            f"WARN start: {cfg.OVERLAY_DIR} missing on {node.label}: booting without overlays "
            "(run launch/dspark_launch.sh sync-overlays)"
        )
    mk = node.run(["mkdir", "-p", cfg.TILELANG_CACHE_DIR], timeout=30)
    if mk.rc != 0:
        log(f"WARN start: mkdir {cfg.TILELANG_CACHE_DIR} on {node.label}: {mk.err.strip()}")
    rp = build_rank(cfg, recipe, rank, passthrough, overlay=overlay)
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


def first_dead(dead: list[tuple[Node, str, State]]) -> list[tuple[Node, str, State]]:
    """Dead ranks, the one that died first leading (FinishedAt; unknown sorts last).

    When one rank crashes the other usually exits too ("TP peer lost"); the first one to
    die is the cause, so its log tail is printed first.
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
        log(f"FAIL: both ranks exited; rank {ordered[0][0].rank} went first")
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
    cfg: PairConfig,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Poll until healthy (0), a rank dies (4) or the timeout passes (5). No teardown here."""
    start = clock()
    base = endpoint(cfg)
    tty = sys.stderr.isatty()
    last_line, last_print = "", 0.0
    pair = nodes(cfg)
    misses = {0: 0, 1: 0}
    waiting_since: float | None = None
    hinted = False
    while True:
        now = clock()
        dead: list[tuple[Node, str, State]] = []
        for node in pair:
            name = container_name(cfg.PAIR_ID, node.rank)
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
            report_dead(dead)
            return EXIT_BOOT
        h = probe_health(base)
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
                f"TIMEOUT: not healthy after {elapsed} (limit {timeout_s:.0f}s); last: "
                f"{h.detail}. A first boot takes ~10 min (graph capture); raise --timeout "
                "if this was one."
            )
            for node in pair:
                _print_dead(node, container_name(cfg.PAIR_ID, node.rank), "timed out")
            return EXIT_TIMEOUT
        phases = []
        for node in pair:
            text = logs_tail(node, container_name(cfg.PAIR_ID, node.rank), 60)
            phase = phase_of(text)
            phases.append(f"rank{node.rank}: {phase}")
            if node.rank == 0:
                if phase != "waiting for rank 1":
                    waiting_since = None
                elif waiting_since is None:
                    waiting_since = now
        hint = join_hint(
            "waiting for rank 1" if waiting_since is not None else "",
            now - (waiting_since or now),
            cfg,
        )
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


def current_plan(cfg: PairConfig, recipe: Recipe, passthrough: list[str]) -> str:
    return plan_hash(cfg, recipe, passthrough)
