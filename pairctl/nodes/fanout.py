"""One job per headless rank, all at once: the bulk copies of a group of four.

``image ship`` and ``model fetch`` send the same bytes from rank 0 to every other node over
the fabric; one after the other, three ~150 GB copies take three times as long. Here each
headless rank gets its own thread (the copies leave rank 0 on the fabric at once, each
with its own progress bar: pairctl.nodes.transfer.bars_together), and each result is that
rank's: a failure is logged naming the rank, and the others still finish. A copy that
fails leaves no half file under its real name (transfer's ``.partial`` + rename), so a
re-run resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pairctl.contracts import EXIT_OK, EXIT_RUNTIME
from pairctl.nodes.transfer import bars_together


def each_rank(
    ranks: Sequence[int], job: Callable[[int], int], log: Callable[[str], None]
) -> dict[int, int]:
    """``job(rank)`` for every rank at once; rank -> exit code (an exception is that rank's
    EXIT_RUNTIME, logged with its rank)."""
    if len(ranks) == 1:
        return {ranks[0]: job(ranks[0])}
    out: dict[int, int] = {}
    with bars_together(), ThreadPoolExecutor(max_workers=len(ranks)) as pool:
        futures = {r: pool.submit(job, r) for r in ranks}
        for r, fut in futures.items():
            try:
                out[r] = fut.result()
            except Exception as exc:  # noqa: BLE001 - one rank's failure must not hide the others'
                log(f"rank {r}: {type(exc).__name__}: {exc}")
                out[r] = EXIT_RUNTIME
    return out


def summary(results: dict[int, int]) -> tuple[int, str]:
    """(EXIT_OK when every rank succeeded else EXIT_RUNTIME, the ranks that failed)."""
    bad = [r for r, rc in sorted(results.items()) if rc != EXIT_OK]
    return (EXIT_RUNTIME if bad else EXIT_OK), ", ".join(f"rank {r}" for r in bad)
