"""The tokenizer-cache headline in real vLLM: boot two CPU-engine servers (cache off, cache on), run
bench.chat_ttft_ab against both, stop them.

Both servers serve the same tiny random-weight model with the real DSV4 tokenizer
(sim/engine/tiny_model.py, `--spec headline` by default: 1 layer, hidden 64) from the engine
venv (`make engine`), with our plugin on PYTHONPATH and prefix caching on; they differ only in
VLLM_INCREMENTAL_ENCODE_CACHE (0 for arm `off`, 1 for arm `on`). Before measuring, the `on`
server's log must say "dsv4-flash-overlays: incremental-encode-cache active" and the `off`
server's must not. The JSON gets the servers (argv, boot time, log files) and the `on` API
server's cache counters after the run. The servers are stopped, and their /dev/shm segments
removed, on any exit, Ctrl-C included.

Flags not listed here go to bench.chat_ttft_ab (e.g. --turns, --first-tokens, --turn-tokens,
--max-tokens, --headline-from, --json, --seed); `python -m bench.chat_ttft_ab --help` lists them.

Example: python -m bench.headline_real --ports 18201,18202 --turns 12 --first-tokens 100k \\
    --turn-tokens 300 --json bench/results/tokenizer_cache/headline_real.json
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import chat_ttft_ab
from bench.benchlib import EXIT_ERROR, EXIT_INTERRUPTED
from bench.benchlib.cli import log
from bench.realserver import (
    Server,
    ServerError,
    build_model,
    default_engine_venv,
    engine_env,
    serve_argv,
    wait_all,
)
from pairctl.cli import argtypes


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m bench.headline_real",
        description=__doc__.split("\n\n")[0],
        epilog="Other flags go to bench.chat_ttft_ab. Exit codes: those of chat_ttft_ab; "
        "1 also when a server does not boot or the overlay check fails; 130 on Ctrl-C.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--engine-venv",
        type=Path,
        default=default_engine_venv(),
        help="the CPU engine venv (make engine)",
    )
    p.add_argument(
        "--model-spec", default="headline", help="sim.engine.tiny_model --spec of the model"
    )
    p.add_argument("--model-dir", type=Path, default=None, help="serve this model dir instead")
    p.add_argument(
        "--ports",
        type=argtypes.port_list(2),
        default="8101,8102",
        help="loopback ports of the off and the on server",
    )
    p.add_argument("--boot-timeout-s", type=argtypes.seconds(0), default=600, help="wait for both")
    p.add_argument(
        "--log-dir", type=Path, default=None, help="server logs here (default: a new temp dir)"
    )
    args, rest = p.parse_known_args(argv)
    if not (args.engine_venv / "bin/vllm").exists():
        p.error(f"--engine-venv {args.engine_venv} has no bin/vllm; run make engine")
    return args, rest


def path_prefixes(engine_venv: Path) -> dict[str, str]:
    """This machine's paths in a recorded result, each with the portable name it is written as:
    the engine venv as `make engine` names it, temporary files (the logs) under `$TMPDIR/`, the
    model cache under `~/`. The clone's own paths become repo-relative in chat_ttft_ab, and a
    longer prefix is replaced first, so a clone under the home or temp directory stays
    relative."""
    out = {str(engine_venv): ".venv-engine"}
    for path, short in ((tempfile.gettempdir(), "$TMPDIR"), (str(Path.home()), "~")):
        if path.rstrip("/"):
            out[path.rstrip("/") + "/"] = short + "/"
    return out


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, rest: list[str], servers: list[Server]) -> int:
    model = args.model_dir or build_model(args.engine_venv, args.model_spec)
    log(f"model: {model}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="headline_real."))
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, port, on in (("off", args.ports[0], False), ("on", args.ports[1], True)):
        servers.append(
            Server(
                name,
                port,
                log_dir / f"vllm_{name}.log",
                serve_argv(args.engine_venv, model, port, "tiny-dsv4"),
                engine_env(on),
            )
        )
    for s in servers:
        log(f"booting the {s.name} server on {s.url} (log {s.log_path})")
        s.start()
    wait_all(servers, args.boot_timeout_s, log)
    off, on = servers
    log(f"ready: off in {off.ready_s} s, on in {on.ready_s} s")
    if not on.overlay_active() or off.overlay_active():
        log(
            "overlay check failed: the on server must log 'incremental-encode-cache active' "
            f"(it does: {on.overlay_active()}) and the off server must not (it does: "
            f"{off.overlay_active()}); see {log_dir}"
        )
        return EXIT_ERROR

    def extra() -> dict[str, Any]:
        return {
            "_path_prefixes": path_prefixes(args.engine_venv),
            "model_dir": str(model),
            "model_spec": None if args.model_dir else args.model_spec,
            "servers": {
                s.name: {
                    "url": s.url,
                    "argv": s.argv,
                    "env": {k: v for k, v in s.env.items() if k.startswith(("VLLM_", "TORCH_"))},
                    "boot_s": s.ready_s,
                    "log": str(s.log_path),
                    "overlay_active_line": s.overlay_active(),
                    "encoder_stats": s.encoder_stats(),
                }
                for s in servers
            },
        }

    argv = ["--url", off.url, "--url-b", on.url, "--labels", "off,on", *rest]
    code = chat_ttft_ab.main(argv, extra=extra)
    stats = on.encoder_stats()
    log(f"on server's tokenizer cache (API server): {stats}")
    if off.encoder_stats() is not None:
        log("the off server logged cache counters: it ran the cache; not a valid A/B")
        return max(code, EXIT_ERROR)
    return code


def main(argv: list[str] | None = None) -> int:
    args, rest = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    servers: list[Server] = []
    try:
        return run(args, rest, servers)
    except KeyboardInterrupt:
        print("headline_real: interrupted; stopping the servers", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerError as e:
        log(f"headline_real: {e}")
        return EXIT_ERROR
    finally:
        for s in servers:
            try:
                s.stop()
            except KeyboardInterrupt:
                s.stop(grace_s=0)


if __name__ == "__main__":
    sys.exit(main())
