"""``python -m pairctl``: every command of ``launch/dspark_launch.sh``, one process each.

The command line is parsed once (``pairctl.cli.frontdoor``); the env file, recipe and extra
vLLM args are resolved once into a ``ResolvedPair`` (exit 2 on a bad value, before any
step acts); the command then runs here from start to end: ``up`` holds the pair's lock,
runs preflight, starts rank 1 then rank 0, waits and tears a failed boot down without
starting another Python. ``fleet`` hands the rest of the line to ``pairctl.fleet``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pairctl import contracts
from pairctl import preflight as pf
from pairctl.cli import argtypes, ops
from pairctl.cli.frontdoor import Args, UsageError, parse
from pairctl.cli.usage import LAUNCHER, usage
from pairctl.contracts import EXIT_INTERRUPTED, EXIT_OK, EXIT_PREFLIGHT, EXIT_USAGE
from pairctl.engine.overlays import shipped_files
from pairctl.lifecycle import steps as lc
from pairctl.lifecycle import updown
from pairctl.pair.config import ConfigError
from pairctl.pair.plan import render_plan
from pairctl.pair.resolved import ResolvedPair, load
from pairctl.preflight import argcheck
from pairctl.preflight import group as pfgroup
from pairctl.status import pair as pst

Also = Sequence[tuple[str, str]]


def writable_file(path: str, flag: str) -> None:
    """Fail before the work when ``path`` cannot be written, not after it."""
    why = argtypes.unwritable(path)
    if why:
        raise ConfigError(f"{flag} {why}; give another path")


def preflight(pair: ResolvedPair, json_file: str | None = None) -> int:
    """Every check, each printed as its evidence arrives; exit 3 on any FAIL."""
    want = shipped_files(contracts.OVERLAY_SRC)
    checked = argcheck.require_local(pair)  # else the image's parser, in gather
    checks, evidence = pfgroup.run(
        pair, want, ops.print_check, ops.progress, local_argv=checked, say=ops.log
    )
    sys.stdout.write(pf.summary(checks))
    if json_file:
        Path(json_file).write_text(json.dumps(pf.as_json(checks, evidence), indent=2) + "\n")
        ops.log(f"evidence written to {json_file}")
    if pf.failed(checks):
        ops.log("preflight FAILED: nothing was started or removed")
        return EXIT_PREFLIGHT
    return EXIT_OK


def already_healthy(pair: ResolvedPair) -> bool:
    """True when the pair is up and healthy (``up`` then changes nothing, and says so).

    The endpoint is asked first: when it does not answer, the pair is not healthy, and no
    ssh round trip to rank 1 is spent finding that out.
    """
    if not lc.probe_health(pair.endpoint, api_key=pair.api_key).healthy:
        return False
    st = pst.pair_status(pair, interval_s=0)
    if st.verdict != pst.HEALTHY:
        return False
    print(
        f"pair {pair.pair_id} is already up and healthy at {st.endpoint.url} "
        f"({', '.join(st.endpoint.models)}); nothing changed."
    )
    if st.running_plan and st.running_plan != pair.plan_hash:
        print(
            f"note: it runs plan {st.running_plan}, the current config is {pair.plan_hash}: "
            "run down, then up, to apply the change."
        )
    return True


def poll_s() -> float:
    """PAIRCTL_POLL_S: tests poll fast; operators keep the default."""
    return float(os.environ.get("PAIRCTL_POLL_S", contracts.BOOT_POLL_S))


def cmd_up(a: Args, pair: ResolvedPair) -> int:
    gate = ops.gate if a.gate else None
    return updown.up(
        pair,
        a.timeout,
        preflight=lambda p: preflight(p, a.json_file),
        healthy=already_healthy,
        gate=gate,
        poll_s=poll_s(),
    )


def restart(a: Args) -> int:
    """The watchdog's restart: ``down`` then ``up`` in this process, with the env file and
    recipe read again (an edit since the watchdog started applies, a broken one is exit 2)."""
    try:
        pair = load(a.env_file, a.recipe, a.vllm_args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    rc = updown.down(pair)
    if rc != EXIT_OK:
        ops.log(f"down exited {rc}; trying up anyway (it removes this pair's stale containers)")
    return cmd_up(Args(**{**a.__dict__, "gate": False, "json_file": None}), pair)


def cmd_plan(_a: Args, pair: ResolvedPair) -> int:
    checked = argcheck.require_local(pair)  # vLLM's parser, if importable here
    sys.stdout.write(render_plan(pair, argcheck.plan_note(checked, pair.nnodes)))
    return EXIT_OK


def dispatch(a: Args) -> int:
    if a.cmd == "preflight" and a.catalogue_md:
        sys.stdout.write(pf.catalogue_markdown())
        return EXIT_OK
    pair = load(a.env_file, a.recipe, a.vllm_args)
    if a.json_file:  # checked before the lock and any probe
        writable_file(a.json_file, "--json")
    if a.cmd == "up":
        return cmd_up(a, pair)
    if a.cmd == "down":
        return updown.down(pair)
    if a.cmd == "plan":
        return cmd_plan(a, pair)
    if a.cmd == "preflight":
        return preflight(pair, a.json_file)
    if a.cmd == "status":
        return ops.status(a, pair)
    if a.cmd == "logs":
        return ops.logs(a, pair)
    if a.cmd == "sync-overlays":
        return ops.sync_overlays(a, pair)
    if a.cmd in ("image", "model"):
        return ops.transfer(a, pair)
    if a.cmd == "watch":
        return ops.watchdog(a, pair, restart=lambda: restart(a))
    raise AssertionError(a.cmd)


def main(argv: list[str] | None = None, prog: str = LAUNCHER, also: Also = ()) -> int:
    """The pair commands (``fleet`` and ``contracts`` handed on); ``prog`` and ``also``
    are what --help names (``dspark`` passes its own name and its other command groups)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fleet"]:
        from pairctl.fleet.cli import main as fleet_main

        return fleet_main(argv[1:])
    if argv[:1] == ["contracts"]:
        return contracts.main(argv[1:])
    try:
        a = parse(argv)
        if a.help:
            sys.stdout.write(usage(prog, also))
            return EXIT_OK
        return dispatch(a)
    except UsageError as exc:
        print(f"dspark_launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP during a boot (updown.Interrupted)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
