"""`make rehearse`: the real launcher brings up a real vLLM pair on two netns test hosts
(or, with `--nodes 4`, one TP=4 group on four).

Steps (each prints a progress line):
  0. (`--engine cpu`, the default) check the CPU engine's venv and build the tiny model
     once (sim/engine/);
  1. build two test hosts (network namespaces on a bridge, each with its own sshd, host
     key, hostname and local disk; see sim/rehearsal/hosts.py and provision.py);
  2. give both the same image, a model dir (the tiny real model; with `--engine sim` a
     fake one), the JIT cache dirs and an RDMA device dir (links to a character device,
     see pairenv.py); write the pair's env file (the variables of .env.example);
  3. copy the overlays to both hosts with launch/dspark_launch.sh sync-overlays (over ssh);
     (`--engine cpu`) `preflight` on a deliberately mismatched image (the simulator's, real
     vLLM 0.33, for the cpu stack) must be refused on PF-IMAGE-STACK (sim/rehearsal/mismatch.py);
  4. run `launch/dspark_launch.sh up` unchanged, on host 1, with the process runtime as
     `docker`; the image's `vllm` is real vLLM (CPU build, TP=2 across the two hosts; the
     env file selects the `cpu` engine stack, recipes/stacks/cpu.yaml), or with
     `--engine sim` the simulator (GB10 timing, 10-minute boots, fault injection; the
     `upstream` stack's line, as the simulator imitates upstream vLLM);
  5. send one streamed chat request to http://SPARK1:8000 and print the reply;
  6. `status`, then `down`, then check nothing of the pair is left on either host;
  7. remove everything the rehearsal created (also on failure and Ctrl-C).

`--nodes 4` builds four hosts and one group (SPARK1..4, FABRIC1..4, rank 0 the head, ranks
1..3 headless, TP=4): step 6 also checks `status --json` has live figures from every rank,
then SIGKILLs one rank other than rank 1 (`--kill-rank`, default 2) and checks `status`
names it and is not healthy, before `down` (sim/rehearsal/groupsteps.py).

Needs root (ip netns, mounts, sshd). `--keep` leaves the pair up for poking and prints
how to reach it; `--on N -- CMD` runs a command on host N of a kept pair; `--clean`
removes a kept pair. Exit status: 0 when every step passed,
otherwise the failing launcher command's status (or 1).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from pairctl.cli import argtypes, options
from pairctl.contracts import REHEARSE_EXITS, REHEARSE_PASSES_ON, codes, exit_line
from pairctl.home import project_root
from sim.engine import local
from sim.rehearsal import chat, groupsteps, hosts, mismatch, pairenv, provision

_EXIT = codes(REHEARSE_EXITS)
EXIT_OK, EXIT_FAILED = _EXIT["EXIT_OK"], _EXIT["EXIT_FAILED"]
EXIT_USAGE, EXIT_INTERRUPTED = _EXIT["EXIT_USAGE"], _EXIT["EXIT_INTERRUPTED"]

REPO = project_root()
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[rehearse {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class StepFailed(RuntimeError):
    """A rehearsal step failed; `code` becomes the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


EPILOG = exit_line(REHEARSE_EXITS) + " " + REHEARSE_PASSES_ON


def run_steps(pair: hosts.Pair, steps: Callable[[], bool]) -> int:
    """Run a rehearsal's steps on its hosts; its exit status. Whatever happens (a failed
    step, Ctrl-C, SIGTERM/SIGHUP, a bug), the hosts are removed afterwards, unless the steps
    returned True (--keep: left up on purpose)."""
    keep = False
    try:
        keep = steps()
        return EXIT_OK
    except StepFailed as exc:
        say(f"FAILED: {exc}")
        return exc.code
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - report, then always clean up
        say(f"FAILED: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    finally:
        if not keep:
            provision.teardown(pair, say)


def stream_on_host(
    host: hosts.Host, label: str, argv: list[str], cwd: Path, timeout: float, what: str
) -> int:
    """Run argv on a test host with output streaming to our terminal; returns its status.
    Past ``timeout`` it is killed and the step fails, naming ``what``."""
    say(f"{label} $ " + shlex.join(argv))
    proc = host.popen(argv, env={"PYTHONUNBUFFERED": "1"}, cwd=str(cwd))
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise StepFailed(f"{what} did not finish within {timeout:.0f} s") from None


def on_host1(pair: hosts.Pair, argv: list[str], timeout: float) -> int:
    """Run argv on host 1 (from launch/); returns its status."""
    return stream_on_host(pair.h1, "host 1", argv, REPO / "launch", timeout, argv[0])


def launcher(pair: hosts.Pair, *args: str, timeout: float = 900) -> None:
    assert pair.env_file is not None
    rc = on_host1(pair, [str(LAUNCHER), *args, "--env-file", str(pair.env_file)], timeout)
    if rc != 0:
        raise StepFailed(f"`dspark_launch.sh {' '.join(args)}` exited {rc}", rc)


def sync_overlays(pair: hosts.Pair) -> None:
    """Quickstart step 2 as the operator runs it: the launcher's sync-overlays, over ssh."""
    launcher(pair, "sync-overlays", timeout=120)


def refuse_mismatched_image(pair: hosts.Pair) -> None:
    """The image probe's refusal, rehearsed: preflight on the wrong image exits 3."""
    try:
        mismatch.refuse(pair, say)
    except mismatch.Refusal as exc:
        raise StepFailed(str(exc)) from None


def send_chat(pair: hosts.Pair) -> None:
    url = f"http://{pair.h1.ip}:8000"
    prompt = "In one sentence: why does a DGX Spark pair use TP=2 over RoCE?"
    say(f"chat request to {url}/v1/chat/completions (streamed): {prompt!r}")
    print("  reply: ", end="", flush=True)
    res = chat.stream_chat(url, prompt, on_text=lambda t: print(t, end="", flush=True))
    print(flush=True)
    label = " (served by the SPARK-TWIN SIMULATOR)" if res.simulator else ""
    say(f"reply done: {res.chunks} chunks, usage {res.usage}{label}")
    if not res.content and not res.reasoning:
        raise StepFailed("the endpoint streamed no text")


def nothing_left_on(test_hosts: list[hosts.Host], step: str, where: str) -> None:
    """After ``step``, no container and no process of ours may remain on any test host."""
    for host in test_hosts:
        ps = host.docker("ps", "-a", "-q")
        procs = host.process_cmdlines()
        if ps.stdout.strip() or procs:
            raise StepFailed(
                f"after {step}, {host.name} still has containers "
                f"{ps.stdout.split()} / processes {procs}"
            )
    say(f"after {step}: no containers and no processes left on {where}")


def check_nothing_left(pair: hosts.Pair) -> None:
    where = "either host" if len(pair.hosts) == 2 else f"any of the {len(pair.hosts)} hosts"
    nothing_left_on(pair.hosts, "down", where)


def status_from_every_rank(pair: hosts.Pair) -> None:
    """A group: `status --json` reads every rank live (groupsteps.every_rank_live)."""
    doc = groupsteps.status_json(pair, LAUNCHER)
    wrong = groupsteps.every_rank_live(doc, len(pair.hosts))
    print(groupsteps.summary(doc), flush=True)
    if wrong:
        raise StepFailed("status of the group: " + "; ".join(wrong))
    say(f"status: {doc['verdict']}, live figures from all {len(pair.hosts)} ranks")


def kill_one_rank(pair: hosts.Pair, pair_id: str, rank: int) -> None:
    """A group: rank ``rank`` SIGKILLed; `status` must name it and not call the group
    healthy, as it does for a pair's dead rank 1."""
    name = groupsteps.kill_rank(pair, pair_id, rank)
    say(f"SIGKILLed {name} on {pair.hosts[rank].name}; status must name rank {rank}")
    doc = groupsteps.status_json(pair, LAUNCHER)
    wrong = groupsteps.dead_rank_named(doc, rank)
    for reason in doc.get("reasons", []):
        print(f"  {reason}", flush=True)
    if wrong:
        raise StepFailed(f"status after rank {rank} died: " + "; ".join(wrong))
    say(f"status: {doc['verdict']} ({doc['exit_code']}), rank {rank} named")


def print_poke_help(pair: hosts.Pair) -> None:
    me = f"{sys.executable} -m sim.rehearsal --prefix {pair.prefix}"
    print(
        f"""
The pair is left up (--keep). Poke at it:
  curl http://{pair.h1.ip}:8000/v1/models
  {me} --on 1 -- launch/dspark_launch.sh status --env-file {pair.env_file}
  {me} --on 2 -- docker ps -a
  {me} --on 1 -- {shlex.join(pair.ssh_argv(pair.h2, ["hostname"]))}
  {me} --on 1 -- bash          # a shell on host 1 (its network, hostname and disk)
Remove it with: {me} --clean
""",
        flush=True,
    )


def run_on(prefix: str, rank: int, argv: list[str]) -> int:
    """`--on N -- CMD`: run CMD on host N of a kept pair, in the repo dir, attached."""
    pair = provision.find_kept_pair(prefix)
    host = pair.hosts[rank - 1]
    return subprocess.call(host.argv(argv or ["bash"]), env=host.env(), cwd=str(REPO))


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def prepare_engine(engine: str) -> Path | None:
    """`--engine cpu`: the engine venv checked and the tiny model built (cached); its dir."""
    if engine != "cpu":
        return None
    say("checking the CPU engine and the tiny rehearsal model (built once, cached)")
    try:
        return local.built_model()
    except local.EngineMissing as exc:
        raise hosts.HarnessError(f"{exc} (or rehearse the simulator: --engine sim)") from None


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument(
        "--prefix",
        default="dsv4r",
        help="name prefix for netns/links/temp dirs (default dsv4r); use another "
        "to run next to a kept pair or the tests",
    )
    p.add_argument("--pair-id", default="rehearsal", help="PAIR_ID in the env file")
    p.add_argument(
        "--nodes",
        type=int,
        choices=(2, 4),
        default=2,
        help="test hosts, one per rank: 2 = a TP=2 pair (default), 4 = one TP=4 group",
    )
    p.add_argument(
        "--kill-rank",
        type=int,
        choices=(0, 2, 3),
        default=None,
        help="with --nodes 4: the rank SIGKILLed after status (default 2; 0 = the head)",
    )
    p.add_argument(
        "--engine",
        choices=pairenv.ENGINES,
        default="cpu",
        help="what the image's vllm is: cpu = real vLLM, CPU build, on a tiny model "
        "(default); sim = the spark twin simulator (GB10 timing, fault injection)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.seconds(0),
        default=None,
        help="seconds for `up` to become healthy (default 300; 900 with --nodes 4, whose "
        "nine torch imports took 2-5 min on 2 shared cores)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the pair up after the chat request (skip down and cleanup)",
    )
    p.add_argument(
        "--clean",
        action="store_true",
        help="only remove what an earlier (kept or crashed) run left, then exit",
    )
    p.add_argument(
        "--on",
        type=int,
        choices=(1, 2, 3, 4),
        metavar="N",
        help="run the command after `--` on host N of a kept pair, then exit",
    )
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    return options.namespace(
        argv,
        add_cli_args,
        prog="python -m sim.rehearsal",
        description="Offline rehearsal: the real launcher brings up a pair on two netns "
        "test hosts over real ssh (real vLLM, CPU build, TP=2 across them; or the "
        "simulator), one chat request, status, down, cleanup. Needs root.",
        epilog="See docs/rehearsal.md for what this proves and what it cannot.\n" + EPILOG,
    )[0]


def main(argv: argparse.Namespace | list[str]) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    try:
        provision.check_prefix(args.prefix)
        if args.on:
            return run_on(args.prefix, args.on, args.command)
        if args.command:
            print("rehearse: a command after `--` needs --on N (see --help)", file=sys.stderr)
            return EXIT_USAGE
        if args.clean:
            removed = provision.clean_prefix(args.prefix, say)
            say(f"removed {len(removed)} leftover item(s) with prefix {args.prefix}")
            return EXIT_OK
        model = prepare_engine(args.engine)
        if args.kill_rank is not None and args.nodes != 4:
            print("rehearse: --kill-rank needs --nodes 4", file=sys.stderr)
            return EXIT_USAGE
        what = "two test hosts" if args.nodes == 2 else f"{args.nodes} test hosts (one group)"
        say(f"building {what} (netns + veth + bridge, an sshd each)")
        pair = provision.build_pair(args.prefix, say, n_hosts=args.nodes)
    except hosts.HarnessError as exc:
        print(f"rehearse: {exc}", file=sys.stderr)
        return EXIT_FAILED

    def steps() -> bool:
        pair.env_file = pairenv.prepare(pair, args.pair_id, args.engine, model)
        image = pairenv.ENGINE_IMAGE if args.engine == "cpu" else pairenv.IMAGE
        what = "tiny real model" if args.engine == "cpu" else "fake model dir"
        every = "both hosts" if args.nodes == 2 else f"all {args.nodes} hosts"
        say(
            f"image {image} loaded on {every}; {what}, JIT caches and RDMA device dir "
            f"on each; env file {pair.env_file}"
        )
        sync_overlays(pair)
        if args.engine == "cpu":
            refuse_mismatched_image(pair)
        limit = args.timeout or (300 if args.nodes == 2 else 900)
        launcher(pair, "up", "--timeout", str(int(limit)), timeout=limit + 120)
        send_chat(pair)
        launcher(pair, "status", timeout=120)
        if args.nodes > 2:
            status_from_every_rank(pair)
        if args.keep:
            print_poke_help(pair)
            return True
        if args.nodes > 2:
            kill_one_rank(pair, args.pair_id, 2 if args.kill_rank is None else args.kill_rank)
        launcher(pair, "down", timeout=180)
        check_nothing_left(pair)
        say("rehearsal passed")
        return False

    return run_steps(pair, steps)
