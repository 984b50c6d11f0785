"""The pair commands' --help: what each command does, every option with the commands it
applies to, and the exit codes (from ``pairctl.contracts``). Users read this text as the
reference, so it is written here by hand, from the same option table the parser is built
from (``pairctl.cli.pairopts``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from pairctl.cli.pairopts import ACTIONS, COMMANDS, OPTIONS
from pairctl.contracts import PAIR_EXITS, exit_text

LAUNCHER = "launch/dspark_launch.sh"

COMMAND_HELP = {
    "up": "(default) preflight; remove this pair's stale containers on both nodes; start "
    "rank 1 over ssh (--node-rank 1 --headless), then rank 0; wait for /health and "
    "/v1/models showing elapsed time and boot phase; if a rank dies, tear both down and "
    "print its log tail. On an already healthy pair: says so, changes nothing.",
    "down": "stop and remove this pair's containers (label dsv4.pair=PAIR_ID) on both nodes.",
    "status": "each rank's container state and uptime, endpoint health and model, and live "
    "serving figures from /metrics: running/waiting, decode tok/s, TTFT p50/p95, KV-cache "
    "use, prefix-cache hit rate, DSpark acceptance per draft position and mean acceptance "
    "length, shown only once rank 0's labelled container runs on SPARK1 (else: whose endpoint it "
    "may be). --json for machines, --watch for a live view. Exit 0 healthy, 7 degraded, 8 "
    "down, 9 the endpoint rejects VLLM_API_KEY (--watch: the last reading's; Ctrl-C 130).",
    "logs": "container log of one rank (--rank 0|1, -f to follow, --tail N).",
    "plan": "print the exact docker run lines per rank (env, mounts, vLLM args; secrets "
    "masked). Changes nothing.",
    "preflight": "read-only checks with stable IDs (PASS/WARN/FAIL + remedy); --json FILE "
    "writes the evidence. up runs it first and stops on any FAIL.",
    "sync-overlays": "copy the files that ship in mods/dsv4-flash-overlays/ to OVERLAY_DIR on "
    "both nodes, check every file's sha256 on arrival, then swap the copy in (a node that "
    "fails keeps its old copy; exit 1). Refuses (exit 3) unless this machine is SPARK1 and "
    "SPARK2 is another one (PF-SELF-IS-SPARK1, PF-DISTINCT-NODES).",
    "image": "IMAGE on both ranks with the same image ID: on rank 0 build it "
    "(--build: the engine stack's Dockerfile, launch/image/Dockerfile for the default fork "
    "stack, launch/image/upstream/Dockerfile for upstream), pull it (--pull) or use the one "
    "there; then docker "
    "save, a resumable copy to rank 1 over ssh (bytes/s shown), docker load there, and the "
    "image ID compared on both. Skips rank 1 when it has the same ID already; touches no "
    "image but IMAGE. Refuses (exit 3) off SPARK1, as sync-overlays does.",
    "model": "fetch: download MODEL_REPO at MODEL_REVISION into MODEL_PATH on rank 0 "
    "(hf download; resumes), copy it to rank 1 over ssh (resumable, bytes/s), then verify. "
    "verify: compare both copies only (file list, sizes, every shard "
    "model.safetensors.index.json names, each as long as its safetensors header says; "
    "--checksum: sha256 too). HF_TOKEN goes to the "
    "downloader's environment only. Refuses (exit 3) off SPARK1.",
    "watch": "watchdog: a 1-token completion every --interval s; after --failures failed "
    "probes in a row, down then up (backoff after a failed up); a 401/403 (wrong key) stops "
    "it with exit 9 and never restarts the pair. Runs until stopped: SIGTERM exit 0 (systemd's "
    "stop), Ctrl-C 130; one "
    "timestamped line per event. After each good probe: the acceptance sentinel (acceptance "
    "per draft position against the recipe's recorded band) and, every --canary-every s, the "
    "output canary; both log events and never restart. launch/dsv4-watch@.service runs it "
    "under systemd.",
}


def usage(prog: str = LAUNCHER, also: Sequence[tuple[str, str]] = ()) -> str:
    """--help: commands, options (with the commands each applies to) and exit codes;
    ``also``: the other command groups (name, one line) the same program runs."""

    def block(head: str, text: str) -> str:
        body = textwrap.fill(text, 88, initial_indent=" " * 20, subsequent_indent=" " * 20)
        return (f"  {head:<17} " + body[20:]) if len(head) < 18 else f"  {head}\n{body}"

    out = [
        f"Usage: {prog} [" + "|".join(c for c in COMMANDS if c not in ACTIONS) + "]",
        " " * len(f"Usage: {prog} ") + "[options] [-- VLLM_ARGS...]",
        f"       {prog} image ship [--build|--pull] [--stage DIR] [options]",
        f"       {prog} model fetch|verify [--checksum] [options]",
        f"       {prog} fleet plan|up|down|status|prometheus|alert-floors [options]  (--help)",
        "",
        "Run on the rank-0 Spark (SPARK1). One OpenAI endpoint at http://SPARK1:PORT/v1.",
        "",
        "Commands:",
    ]
    out += [
        block(" ".join([c, "|".join(ACTIONS.get(c, ()))]).strip(), COMMAND_HELP[c])
        for c in COMMANDS
    ]
    if also:
        out += ["", f"Also ({prog} NAME --help for each):"]
        out += [block(name, text) for name, text in also]
    out += ["", "Options:"]
    for o in OPTIONS:
        if o.hidden:
            continue
        head = ", ".join(o.flags) + (f" {o.metavar}" if o.metavar else "")
        out.append(
            block(head, f"{', '.join(o.commands) if o.commands != COMMANDS else 'all'}: {o.help}")
        )
    out.append(block("-h, --help", "this help"))
    out.append(block("-- ARGS", "extra vllm serve args for both ranks (override the recipe)"))
    out += ["", "Exit codes:", exit_text(PAIR_EXITS)]
    return "\n".join(out)
