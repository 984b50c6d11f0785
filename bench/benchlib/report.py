"""What a bench prints and draws: the table on stdout and the optional PNG."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(v: Any, nd: int = 1) -> str:
    """Table cell: '—' for missing (never 0), fixed decimals for floats."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(
    path: str,
    x: Sequence[Any],
    panels: Sequence[tuple[str, dict[str, Sequence[float | None]]]],
    xlabel: str,
    title: str,
    logx: bool = False,
) -> None:
    """One line chart per (ylabel, {series: ys}) panel, stacked; None points are gaps.

    Every y-axis starts at zero: a 54 -> 51 tok/s dip must look like the 6% it is. matplotlib's
    Agg backend, so no display is needed.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), sharex=True)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for name, ys in series.items():
            ax.plot(x, [float("nan") if y is None else y for y in ys], marker="o", label=name)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend()
    axes[-1].set_xlabel(xlabel)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(
    path: str, categories: Sequence[str], values: Sequence[float | None], ylabel: str, title: str
) -> None:
    """One bar per category (no line: categories are not a continuum); y from zero."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    heights = [0.0 if v is None else v for v in values]
    drawn = ax.bar(list(categories), heights, color="tab:blue")
    for rect, v in zip(drawn, values, strict=True):
        label = "—" if v is None else f"{v:.1f}"
        ax.annotate(
            label,
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
        )
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
