"""Multi-turn TTFT on two servers at once: the same conversation, turns interleaved (A, B, B, A...).

The tokenizer-cache headline measured end to end: arm A (`--url`) and arm B (`--url-b`) are two
servers that differ in one thing (e.g. VLLM_INCREMENTAL_ENCODE_CACHE=0 vs 1). Turn 0 is a long
document (`--first-tokens`), then short user turns as people write them (`--turn-tokens`, each
0.5-1.5x that), every turn re-sending the whole history. Each turn goes to both servers back to
back, the order alternating per turn, so load drift on a shared machine hits both arms alike;
each request is a guarded wave on its own server (chat_ttft_probe's `ask`). Both arms get the
same messages (one nonce per run); the history carries arm A's reply, and a reply or prompt
length that differs between arms is counted (greedy decoding must give the same tokens).

The headline is the median TTFT over the turns after turn 0 whose prompt has at least
`--headline-from` tokens, per arm, and their ratio. Per turn, (A - B) per 10k prompt tokens is
the tokenization share when A is uncached; the summary sets it beside the offline encode
benchmark's (uncached - cached) per 10k tokens over the same depths (`--offline-json`).

Example: python -m bench.chat_ttft_ab --url 127.0.0.1:18201 --url-b 127.0.0.1:18202 \\
    --labels off,on --first-tokens 100k --turns 12 --turn-tokens 300 --max-tokens 4
(python -m bench.headline_real boots both real servers and runs this.)
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.benchlib import EXIT_ERROR, EXIT_INTERRUPTED, cli, prompts, report
from bench.benchlib.endpoint import endpoint_arg
from bench.benchlib.runner import Bench, git_sha
from bench.benchlib.stats import median, request_metrics
from bench.chat_ttft_probe import ask
from bench.kernels.bench_tokenizer_cache import TraceText
from pairctl.cli import argtypes, options
from pairctl.home import project_root

REPO = project_root()
OFFLINE_JSON = REPO / "bench/results/tokenizer_cache/tokenizer_cache_bench_idle_200k.json"
HEADERS = ["turn", "prompt_tok", "A ttft_ms", "B ttft_ms", "A/B", "(A-B) ms/10k", "same", "status"]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    pos = argtypes.int_at_least(1)
    p.add_argument(
        "--url-b", type=endpoint_arg(), required=True, help="arm B's base URL (--url is arm A)"
    )
    p.add_argument("--labels", default="A,B", help="names of arm A and arm B, comma-separated")
    p.add_argument("--turns", type=pos, default=12, help="conversation turns, the document first")
    p.add_argument(
        "--first-tokens", type=argtypes.size, default="100k", help="size of the document (turn 0)"
    )
    p.add_argument(
        "--turn-tokens",
        type=argtypes.size,
        default="300",
        help="mean size of each later user message (each is 0.5-1.5x this)",
    )
    p.add_argument("--max-tokens", type=pos, default=4, help="reply length per turn")
    p.add_argument(
        "--text",
        choices=("trace", "prose"),
        default="trace",
        help="trace: the offline encode benchmark's mixed text (prose, lists, code, numbers, "
        "CJK), so the two compare; prose: bench.benchlib.prompts' sentences (~100 distinct "
        "words, cheap for a BPE word cache)",
    )
    p.add_argument(
        "--headline-from",
        type=argtypes.size,
        default="100k",
        help="turns with at least this many prompt tokens make the headline medians",
    )
    p.add_argument(
        "--offline-json",
        type=Path,
        default=OFFLINE_JSON,
        help="bench_tokenizer_cache result to compare the per-10k tokenization share with",
    )


def parse_args(argv: argparse.Namespace | list[str] | None) -> argparse.Namespace:
    args, p = cli.parse(argv, __doc__, __spec__.name, add_cli_args)
    labels = [s.strip() for s in args.labels.split(",")]
    if len(labels) != 2 or not all(labels) or labels[0] == labels[1]:
        options.usage_error(p, "--labels needs two different names, e.g. off,on")
    args.labels = labels
    return args


def arm_args(args: argparse.Namespace, url: Any, label: str) -> argparse.Namespace:
    """The shared flags for one arm: its URL, its own JSON kept out of the way."""
    a = copy.copy(args)
    a.url, a.json_path, a.plot = url, None, None
    a.arm = label
    return a


@dataclass
class Turn:
    """One turn measured on both arms."""

    turn: int
    metrics: dict[str, dict[str, Any] | None]  # label -> request_metrics (None: no clean wave)
    status: dict[str, str]
    retries: dict[str, int]
    same_output: bool | None  # reply text and prompt length equal between arms
    user_tokens_target: int

    def ttft(self, label: str) -> float | None:
        m = self.metrics.get(label)
        if m is None:
            return None
        # The role chunk comes with the first engine output in vLLM's chat streaming
        # (vllm/entrypoints/openai/chat_completion/serving.py): the fallback when a 1-4 token
        # reply of a random-weight model decodes to no text.
        return m["ttft_ms"] if m["ttft_ms"] is not None else m["first_chunk_ms"]

    def prompt_tokens(self, label: str) -> int | None:
        m = self.metrics.get(label)
        return None if m is None else m.get("prompt_tokens")


@dataclass
class AB:
    labels: list[str]
    turns: list[Turn] = field(default_factory=list)


def body_text(kind: str, n_tokens: int, seed: int, chars_per_token: float) -> str:
    """About n_tokens of text of the chosen kind."""
    if kind == "prose":
        return prompts.prose(max(1, int(n_tokens / 1.3)), seed=seed)
    return TraceText(seed).block(max(1, int(n_tokens * chars_per_token)))


def chars_per_token(b: Bench, kind: str) -> float:
    """The trace text's characters per token, measured once on arm A's /tokenize (4.0 if not)."""
    if kind != "trace":
        return 4.0
    sample = TraceText(-1).block(40_000)
    n = prompts.count_tokens(b.session, b.endpoint, b.model, [{"role": "user", "content": sample}])
    return len(sample) / n if n else 4.0


def user_message(turn: int, n_tokens: int, args: argparse.Namespace, tag: str, cpt: float) -> str:
    """Turn 0: a document to read; later: a short note and a question, as a person writes."""
    body = body_text(args.text, n_tokens, args.seed * 1000 + turn, cpt)
    if turn == 0:
        return f"{tag}Here is the document we will work on.\n\n{body}\n\nRead it; I have questions."
    return f"{body}\n\nGiven the document, what changes with this?"


def run(benches: dict[str, Bench], args: argparse.Namespace) -> AB:
    """One conversation; each turn to both arms, alternating which goes first."""
    labels = args.labels
    rng = random.Random(args.seed)
    tag = prompts.nonce(rng)
    ab = AB(labels)
    history: list[dict[str, str]] = []
    cpt = chars_per_token(benches[labels[0]], args.text)
    bar = benches[labels[0]].progress(args.turns, "chat_ttft_ab")
    for turn in range(args.turns):
        target = args.first_tokens if turn == 0 else int(args.turn_tokens * rng.uniform(0.5, 1.5))
        question = user_message(turn, target, args, tag, cpt)
        order = labels if turn % 2 == 0 else labels[::-1]
        got: dict[str, Any] = {}
        for label in order:
            b = benches[label]
            gp = ask(b, history, question, f"{label} turn{turn}")
            m = None
            if gp.result is not None:
                res, _ = gp.result
                m = request_metrics(res)
                m["content"] = res.content
            pt = b.results.add(f"turn{turn}", gp, m, turn=turn)
            got[label] = (gp, m, pt)
        a_m, b_m = got[labels[0]][1], got[labels[1]][1]
        same = None
        if a_m is not None and b_m is not None:
            same = a_m["content"] == b_m["content"] and a_m["prompt_tokens"] == b_m["prompt_tokens"]
        t = Turn(
            turn,
            {lb: got[lb][1] for lb in labels},
            {lb: got[lb][2]["status"] for lb in labels},
            {lb: got[lb][2]["retries"] for lb in labels},
            same,
            target,
        )
        ab.turns.append(t)
        a, bb = t.ttft(labels[0]), t.ttft(labels[1])
        cli.log(
            f"turn {turn}: {t.prompt_tokens(labels[0])} prompt tokens, "
            f"{labels[0]} {report.fmt(a)} ms, {labels[1]} {report.fmt(bb)} ms"
        )
        bar.update()
        if a_m is None or b_m is None:
            cli.log(f"conversation stopped at turn {turn} (no clean wave on an arm)")
            break
        # The reply the client got goes into the history, as a chat client does.
        reply = a_m["content"] or "OK."
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    bar.close()
    return ab


def offline_share(path: Path, lo: int, hi: int) -> dict[str, Any] | None:
    """(uncached - cached) ms per 10k prompt tokens in the offline encode benchmark, lo..hi."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    per10k = [
        (r["uncached_ms"] - r["cached_ms"]) * 10_000 / r["prompt_tokens"]
        for r in doc.get("rows", [])
        if lo <= r.get("prompt_tokens", -1) <= hi and r.get("uncached_ms") and r.get("cached_ms")
    ]
    if not per10k:
        return None
    return {
        "file": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "prompt_tokens_range": [lo, hi],
        "rows": len(per10k),
        "median_ms_per_10k": median(per10k),
        "env": doc.get("env"),
    }


def summarize(ab: AB, args: argparse.Namespace) -> dict[str, Any]:
    la, lb = ab.labels
    rows = [t for t in ab.turns[1:] if t.ttft(la) is not None and t.ttft(lb) is not None]
    head = [t for t in rows if (t.prompt_tokens(la) or 0) >= args.headline_from]
    med = {lab: median([t.ttft(lab) for t in head]) for lab in (la, lb)}
    share = [
        (t.ttft(la) - t.ttft(lb)) * 10_000 / t.prompt_tokens(la)
        for t in head
        if t.prompt_tokens(la)
    ]
    toks = [t.prompt_tokens(la) for t in head if t.prompt_tokens(la)]
    ratio = med[la] / med[lb] if med[la] and med[lb] else None
    return {
        "labels": {"A": la, "B": lb},
        "headline_from_tokens": args.headline_from,
        "headline_turns": len(head),
        "headline_prompt_tokens": [min(toks), max(toks)] if toks else None,
        "median_ttft_ms": med,
        "ratio_A_over_B": ratio,
        "goal_ratio": 1.9,
        "goal_met": None if ratio is None else ratio >= 1.9,
        "median_share_ms_per_10k": median(share),
        "offline_share": offline_share(args.offline_json, min(toks), max(toks)) if toks else None,
        "same_output_turns": sum(t.same_output is True for t in ab.turns),
        "different_output_turns": [t.turn for t in ab.turns if t.same_output is False],
        "turns": [turn_json(t, la, lb) for t in ab.turns],
    }


def turn_json(t: Turn, la: str, lb: str) -> dict[str, Any]:
    keep = ("ttft_ms", "ttft_content_ms", "first_chunk_ms", "prompt_tokens", "completion_tokens")
    return {
        "turn": t.turn,
        "user_tokens_target": t.user_tokens_target,
        "ttft_ms": {la: t.ttft(la), lb: t.ttft(lb)},
        "status": t.status,
        "retries": t.retries,
        "same_output": t.same_output,
        "arms": {
            lab: None if m is None else {k: m.get(k) for k in keep} for lab, m in t.metrics.items()
        },
    }


def print_report(summary: dict[str, Any]) -> None:
    la, lb = summary["labels"]["A"], summary["labels"]["B"]
    rows = []
    for t in summary["turns"]:
        a, b = t["ttft_ms"][la], t["ttft_ms"][lb]
        ptok = (t["arms"][la] or {}).get("prompt_tokens")
        rows.append(
            [
                t["turn"],
                ptok,
                a,
                b,
                None if not (a and b) else f"{a / b:.2f}",
                None if not (a and b and ptok) else (a - b) * 10_000 / ptok,
                {True: "yes", False: "NO", None: "—"}[t["same_output"]],
                "/".join(t["status"].values()),
            ]
        )
    headers = [h.replace("A ", f"{la} ").replace("B ", f"{lb} ") for h in HEADERS]
    print(report.table(rows, headers))
    med = summary["median_ttft_ms"]
    rng = summary["headline_prompt_tokens"] or ["—", "—"]
    ratio = summary["ratio_A_over_B"]
    print(
        f"headline: median TTFT over {summary['headline_turns']} turns at "
        f"{rng[0]}-{rng[1]} prompt tokens: {la} {report.fmt(med[la])} ms, "
        f"{lb} {report.fmt(med[lb])} ms, ratio {'—' if ratio is None else f'{ratio:.2f}'}x "
        f"(goal >= {summary['goal_ratio']}x: {'met' if summary['goal_met'] else 'NOT met'})"
    )
    off = summary["offline_share"]
    print(
        f"tokenization share ({la} - {lb}): {report.fmt(summary['median_share_ms_per_10k'])} ms "
        "per 10k tokens of history; offline encode benchmark (uncached - cached): "
        + (
            f"{report.fmt(off['median_ms_per_10k'])} ms per 10k ({off['file']}, "
            f"{off['rows']} rows in range)"
            if off
            else "no rows in range"
        )
    )
    print(
        f"same reply and prompt length on both arms: {summary['same_output_turns']} of "
        f"{len(summary['turns'])} turns"
    )


def machine() -> dict[str, Any]:
    """Where the run happened, for the JSON."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = round(mem_kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "mem_gib": mem,
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def command() -> str:
    """How this run was started, as a user types it (`python -m bench.NAME ...`)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec and spec.name else ["python", sys.argv[0]]
    return " ".join([*head, *sys.argv[1:]])


def document(
    benches: dict[str, Bench], args: argparse.Namespace, summary: dict[str, Any], started: str
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "script": "chat_ttft_ab",
        "date_utc": started,
        "ended_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command(),
        "command_line": [sys.executable, *sys.argv],
        "git_sha": git_sha(),
        "machine": machine(),
        "params": {
            k: (str(v) if k in ("url", "url_b", "offline_json") else v)
            for k, v in vars(args).items()
            if k != "api_key"
        },
        "summary": summary,
        "arms": {
            lab: b.results.document(b.facts(), {}) | {"url": b.endpoint.base}
            for lab, b in benches.items()
        },
    }


def relativize(text: str, prefixes: dict[str, str] | None = None) -> str:
    """Paths of this machine out of a result: the clone's become repo-relative, the
    interpreter is `python`, and each of `prefixes` (e.g. the engine venv) its short name."""
    subs = {sys.executable: "python", str(REPO) + "/": "", **(prefixes or {})}
    for old, new in sorted(subs.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return text


def write_json(path: str | None, doc: dict[str, Any]) -> None:
    if path:
        prefixes = doc.pop("_path_prefixes", None)
        text = json.dumps(doc, indent=1, default=str) + "\n"
        Path(path).write_text(relativize(text, prefixes))


def main(
    argv: argparse.Namespace | list[str] | None = None,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """extra: more top-level JSON keys, asked for after the run (the driver adds its servers)."""
    args = parse_args(argv)
    try:
        return measure(args, extra)
    except KeyboardInterrupt:
        print("chat_ttft_ab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def measure(args: argparse.Namespace, extra: Callable[[], dict[str, Any]] | None) -> int:
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    la, lb = args.labels
    benches = {
        la: Bench("chat_ttft_ab", arm_args(args, args.url, la)),
        lb: Bench("chat_ttft_ab", arm_args(args, args.url_b, lb)),
    }
    for b in benches.values():
        b.prepare()
    ab = run(benches, args)
    summary = summarize(ab, args)
    print_report(summary)
    doc = document(benches, args, summary, started) | (extra() if extra else {})
    write_json(args.json_path, doc)
    codes = [b.finish({}) for b in benches.values()]
    if len(ab.turns) < args.turns:
        return EXIT_ERROR
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
