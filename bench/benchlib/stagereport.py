"""bench.frontend_stages' summary: median ms per stage per depth per arm, the table, the plot."""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.benchlib import report
from bench.benchlib.stages import KIND, STAGE_NAMES
from bench.benchlib.stats import median

# Stages grouped for the short table and the plot (each group in the order a request meets it).
GROUPS: dict[str, tuple[str, ...]] = {
    "parse": ("to_server", "receive", "parse"),
    "render": ("messages", "template"),
    "tokenize": ("tokenize",),
    "hand-off": (
        "engine_input",
        "serving",
        "validate",
        "process_inputs",
        "output_state",
        "delta_plan",
        "serialise",
        "add_request",
        "to_core",
        "deserialise",
        "rebuild",
        "request_init",
    ),
    "hash": ("hash",),
    "schedule": ("core_wakeup", "queue", "wait", "prefix_lookup", "allocate", "schedule"),
    "worker": ("to_worker", "runner_update"),
    "prefill": ("forward", "to_sample", "sample", "to_update", "update"),
    "output": ("to_api", "outputs", "to_sse", "to_client"),
}
GOAL_RATIO = 1.2  # the goal: cached-turn TTFT at the deepest depth within 1.2x of the shallowest


def fmt_ms(v: float | None) -> str:
    return report.fmt(v, 1)


def _reply(r: Any) -> dict[str, Any]:
    return dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r)


def raw_json(raw: dict[str, Any]) -> dict[str, Any]:
    """The run's turns as plain dicts (replies' text cut to 80 characters)."""
    depths = []
    for d in raw["depths"]:
        turns = []
        for got in d["turns"]:
            row = {}
            for arm, r in got.items():
                rr = _reply(r)
                rr["content"] = rr.get("content", "")[:80]
                row[arm] = rr
            turns.append(row)
        depths.append({"depth": d["depth"], "turns": turns})
    return {**raw, "depths": depths}


def clean(r: dict[str, Any]) -> bool:
    return bool(r.get("ok")) and r.get("stages") is not None and not r.get("foreign")


def summarize(raw: dict[str, Any], arms: list[str]) -> dict[str, Any]:
    """Per depth and arm: medians of every stage and group over the clean measured turns."""
    rows = []
    problems: dict[str, list[str]] = {"failed": [], "contaminated": [], "different": []}
    for d in raw_json(raw)["depths"]:
        per_arm: dict[str, Any] = {}
        for arm in arms:
            replies = [t[arm] for t in d["turns"] if arm in t]
            ok = [r for r in replies if clean(r)]
            for r in replies:
                if not r.get("ok") or r.get("stages") is None:
                    problems["failed"].append(f"{r['tag']}: {r.get('error')}")
                elif r.get("foreign"):
                    problems["contaminated"].append(r["tag"])
            # .get: a run recorded before a stage existed has no value for it
            vals = {s: [r["stages"][s] for r in ok if s in r["stages"]] for s in STAGE_NAMES}
            st = {s: median(v) for s, v in vals.items()}
            st_min = {s: min(v, default=None) for s, v in vals.items()}
            per_arm[arm] = {
                "turns": len(replies),
                "clean_turns": len(ok),
                "ttft_ms": median([r["ttft_ms"] for r in ok]),
                "ttft_min_ms": min((r["ttft_ms"] for r in ok), default=None),
                "ttft_ms_all": [r["ttft_ms"] for r in ok],
                "prompt_tokens": [r["prompt_tokens"] for r in ok],
                "stages_ms": st,
                "stages_min_ms": st_min,
                "groups_ms": {
                    g: median([sum(r["stages"].get(s, 0.0) for s in ss) for r in ok])
                    for g, ss in GROUPS.items()
                },
                "facts": {
                    k: median([r["facts"][k] for r in ok if r["facts"].get(k) is not None])
                    for k in ("hashed_blocks", "reused_blocks", "prefix_hit_tokens", "ids_sent")
                },
            }
        for t in d["turns"]:
            vals = list(t.values())
            if len(vals) > 1 and any(
                (v["prompt_tokens"], v["content"]) != (vals[0]["prompt_tokens"], vals[0]["content"])
                for v in vals[1:]
            ):
                problems["different"].append(vals[0]["tag"])
        rows.append({"depth": d["depth"], "arms": per_arm})
    goal = {}
    if rows:
        lo, hi = rows[0], rows[-1]
        for arm in arms:
            a, b = lo["arms"][arm]["ttft_ms"], hi["arms"][arm]["ttft_ms"]
            mins = [lo["arms"][arm]["ttft_min_ms"], hi["arms"][arm]["ttft_min_ms"]]
            ratio = b / a if a and b else None
            goal[arm] = {
                "from_depth": lo["depth"],
                "to_depth": hi["depth"],
                "ttft_ms": [a, b],
                "ttft_min_ms": mins,
                "ratio": ratio,
                "goal_ratio": GOAL_RATIO,
                "goal_met": None if ratio is None else ratio <= GOAL_RATIO,
            }
    return {
        "arms": arms,
        "rows": rows,
        "goal": goal,
        "problems": problems,
        "skipped_depths": raw.get("skipped_depths", []),
        "fills": raw.get("fills", []),
    }


def print_report(summary: dict[str, Any]) -> None:
    depths = [r["depth"] for r in summary["rows"]]
    for arm in summary["arms"]:
        print(f"\narm {arm}: median ms per stage over the clean turns at each depth")
        rows = []
        for s in STAGE_NAMES:
            rows.append([s, KIND[s], *(r["arms"][arm]["stages_ms"][s] for r in summary["rows"])])
        rows.append(["TTFT", "client", *(r["arms"][arm]["ttft_ms"] for r in summary["rows"])])
        rows.append(
            ["TTFT min", "client", *(r["arms"][arm]["ttft_min_ms"] for r in summary["rows"])]
        )
        rows.append(
            [
                "prompt tokens",
                "",
                *(max(r["arms"][arm]["prompt_tokens"] or [0]) for r in summary["rows"]),
            ]
        )
        print(report.table(rows, ["stage", "kind", *(f"{d // 1000}k" for d in depths)]))
    print("\nby group (median ms), arms side by side")
    head = ["group", *(f"{d // 1000}k {a}" for d in depths for a in summary["arms"])]
    rows = []
    for g in [*GROUPS, "TTFT"]:
        cells = []
        for r in summary["rows"]:
            for a in summary["arms"]:
                x = r["arms"][a]
                cells.append(x["ttft_ms"] if g == "TTFT" else x["groups_ms"][g])
        rows.append([g, *cells])
    print(report.table(rows, head))
    for arm, g in summary["goal"].items():
        ratio = g["ratio"]
        mins = g["ttft_min_ms"]
        print(
            f"goal ({arm}): TTFT at {g['to_depth']} / at {g['from_depth']} tokens of history = "
            f"{'—' if ratio is None else f'{ratio:.2f}'}x (goal <= {g['goal_ratio']}x: "
            f"{'met' if g['goal_met'] else 'NOT met'}); fastest turns {fmt_ms(mins[0])} and "
            f"{fmt_ms(mins[1])} ms"
        )
    for s in summary["skipped_depths"]:
        print(f"skipped depth {s['depth']}: {s['why']}")
    for what, tags in summary["problems"].items():
        if tags:
            print(f"{what}: {', '.join(tags[:8])}{' ...' if len(tags) > 8 else ''}")


def plot(path: str, summary: dict[str, Any]) -> None:
    """Per arm, one stacked bar per depth: each group's median ms, the median TTFT as a dot.

    Medians of parts need not add up to the median of the whole, hence the dot. Each panel
    has its own y scale (the arms differ by 20x at depth), from zero.
    """
    plt = report._pyplot()
    rows = summary["rows"]
    arms = summary["arms"]
    labels = [f"{r['depth'] // 1000}k" for r in rows]
    fig, axes = plt.subplots(1, len(arms), figsize=(5.2 * len(arms), 4.2), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, arm in zip(axes[0], arms, strict=True):
        bottom = [0.0] * len(rows)
        for k, g in enumerate(GROUPS):
            vals = [r["arms"][arm]["groups_ms"][g] or 0.0 for r in rows]
            ax.bar(labels, vals, bottom=bottom, label=g, color=colors[k % len(colors)])
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ttft = [r["arms"][arm]["ttft_ms"] for r in rows]
        ax.plot(labels, [float("nan") if t is None else t for t in ttft], "ko", label="TTFT")
        for x, t in zip(labels, ttft, strict=True):
            if t is not None:
                ax.annotate(
                    f"{t:.0f}",
                    (x, t),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=8,
                )
        ax.set_ylim(bottom=0)
        ax.set_title(f"arm {arm}")
        ax.set_xlabel("tokens of history")
        ax.set_ylabel("ms (median over the turns)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left")
    fig.suptitle("A ~300-token turn's TTFT by stage, real vLLM CPU engine (sliding-window model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def exit_code(summary: dict[str, Any]) -> int:
    p = summary["problems"]
    if p["failed"]:
        return 1
    if p["contaminated"]:
        return 3
    return 0
