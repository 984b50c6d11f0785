"""What ``dspark`` runs besides the pair commands: each subcommand is a module with
``add_cli_args(parser)`` and ``main(args)`` (the same module still runs as
``python -m MODULE``). Modules are named, not imported, here: ``dspark --help`` and
``dspark bench --help`` import nothing heavy, and ``dspark bench NAME`` imports NAME only.

A ``Command`` with ``argv=True`` parses its own line (``main(argv)``): a line that is
another program's (``sim twin serve`` takes ``vllm serve``'s; ``bench headline-real``
hands the flags it does not know to ``bench chat-ttft-ab``).
"""

from __future__ import annotations

from dataclasses import dataclass

# The benches' shared flags (--url, --api-key, the guard options; bench/benchlib/cli.py).
BENCH_FLAGS = "bench.benchlib.cli"


@dataclass(frozen=True)
class Command:
    """One subcommand: the module that owns it, one line of help, how its line is read."""

    module: str
    help: str
    shared: tuple[str, ...] = ()  # modules whose add_cli_args come first (shared flags)
    argv: bool = False  # main(argv) parses the rest of the line itself


def _bench(module: str, help_: str) -> Command:
    return Command(module, help_, shared=(BENCH_FLAGS,))


BENCHES: dict[str, Command] = {
    "conc": _bench("bench.bench_conc", "decode throughput and TTFT per concurrency level"),
    "ctx": _bench("bench.bench_ctx", "TTFT and decode speed per context depth"),
    "interfere": _bench("bench.bench_interfere", "decode slowdown under a long prefill"),
    "chat-ttft-ab": _bench("bench.chat_ttft_ab", "multi-turn chat TTFT, two servers A/B"),
    "chat-ttft-probe": _bench("bench.chat_ttft_probe", "multi-turn chat TTFT on one server"),
    "router": Command("bench.bench_router", "the fleet router against its pairs"),
    "headline-real": Command(
        "bench.headline_real", "chat-ttft-ab on two real CPU engines", argv=True
    ),
    "frontend-stages": Command(
        "bench.frontend_stages", "a turn's TTFT stage by stage in real CPU servers", argv=True
    ),
    "spin-budget-pair": Command(
        "bench.spin_budget_pair", "the spin-budget overlay A/B on a real CPU pair"
    ),
    "quality-ref-dspark": Command(
        "bench.quality_ref_dspark", "the quality gate under the benches' name (as dspark gate)"
    ),
    "fp8-head": Command("bench.kernels.bench_fp8_head", "FP8 LM-head kernel timing"),
    "eval-fp8-head": Command("bench.kernels.eval_fp8_head", "FP8 LM-head accuracy on real rows"),
    "fp8-head-mtile-probe": Command(
        "bench.kernels.fp8_head_mtile_probe", "FP8 LM-head M-tile shapes"
    ),
    "fp8-smem-probe": Command(
        "bench.kernels.fp8_smem_probe", "FP8 kernels' shared memory, compiled"
    ),
    "fp8-tune": Command("bench.kernels.fp8_tune.tune", "tune the FP8 LM-head table"),
    "tokenizer-cache": Command(
        "bench.kernels.bench_tokenizer_cache", "chat-template tokenizer cache"
    ),
}

SIM: dict[str, Command] = {
    "twin": Command("sim.twin.__main__", "the spark twin simulator (serve|truth)", argv=True),
    "rehearse": Command("sim.rehearsal.rehearse", "the offline netns rehearsal"),
    "diffcheck": Command("sim.diffcheck.cli", "twin against a real server, metric by metric"),
}

# name -> one Command, or a table of NAME -> Command (``dspark bench NAME``).
GROUPS: dict[str, Command | dict[str, Command]] = {
    "fleet": Command("pairctl.fleet.cli", "several pairs behind one router (plan|up|down|...)"),
    "gate": Command("pairctl.gate.cli", "the quality gate against an endpoint"),
    "sentinel": {
        "record": Command("pairctl.sentinel.record", "record the acceptance probe (a good pair)"),
    },
    "bench": BENCHES,
    "sim": SIM,
    "perfmodel": Command("perfmodel.cli", "the decode performance model"),
}


def summary() -> list[tuple[str, str]]:
    """(name, one line) per group, for the front door's --help."""
    out = []
    for name, entry in GROUPS.items():
        if isinstance(entry, Command):
            out.append((name, entry.help))
        else:
            out.append((f"{name} NAME", f"NAME one of: {', '.join(entry)}"))
    return out
