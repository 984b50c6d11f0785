"""A recipe's recorded acceptance baseline: the file, and the band made from observations.

One JSON file per recipe, ``recipes/baselines/<recipe name>.acceptance.json`` beside the
recipe (``path_for``), written by ``python -m pairctl.sentinel record`` and read by
``status`` and ``watch``. It keeps every observation it was made from and how they were
taken (endpoint, simulator or not, gate rounds, live seconds), so a band can be checked
and re-made; the floors in ``band`` are what the sentinel judges by, and an operator may
edit them by hand (the file says so in ``comment``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pairctl.sentinel.acceptance import (
    DEFAULT_MIN_DRAFTS,
    DEFAULT_MIN_TRIALS,
    Band,
    Shape,
)

SCHEMA_VERSION = 1
DEFAULT_MARGIN = 0.15  # R may fall this fraction below the lowest recorded R
FIRST_FACTOR = 0.5  # a0 may fall to half the lowest recorded a0 (harder traffic does)
COMMENT = (
    "Acceptance baseline of one recipe (pairctl/sentinel). `band` holds the floors the "
    "sentinel judges by: depth_ratio_floor = (1 - margin) x the lowest depth ratio observed; "
    "first_floor = 0.5 x the lowest first-position acceptance; conditional_floor per position "
    "= (1 - margin) x the lowest observed. Re-record with `python -m pairctl.sentinel record` "
    "after a change of recipe, image, draft or model; edit the floors by hand only with a reason."
)


class BaselineError(ValueError):
    """A baseline file that cannot be read or does not have the expected shape."""


def path_for(recipe_path: str | Path, recipe_name: str) -> Path:
    """Where a recipe's baseline lives: ``<recipe dir>/baselines/<name>.acceptance.json``."""
    return Path(recipe_path).resolve().parent / "baselines" / f"{recipe_name}.acceptance.json"


def observation(source: str, s: Shape, seconds: float) -> dict[str, Any]:
    """One recorded window, as the file keeps it."""
    return {
        "source": source,
        "seconds": round(seconds, 1),
        "drafts": s.drafts,
        "per_pos": [round(x, 4) for x in s.per_pos],
        "conditional": [None if x is None else round(x, 4) for x in s.conditional],
        "mean_length": None if s.mean_length is None else round(s.mean_length, 4),
        "first": None if s.first is None else round(s.first, 4),
        "depth_ratio": None if s.depth_ratio is None else round(s.depth_ratio, 4),
    }


def band_from(
    observations: list[dict[str, Any]],
    positions: int,
    margin: float = DEFAULT_MARGIN,
    min_drafts: int = DEFAULT_MIN_DRAFTS,
    min_trials: int = DEFAULT_MIN_TRIALS,
) -> Band:
    """The band of a set of observations (the lowest of each figure, less the margin).

    Raises BaselineError when no observation has a depth ratio (too few drafts recorded).
    """
    usable = [o for o in observations if o.get("depth_ratio") is not None]
    if not usable:
        raise BaselineError(
            "no recorded window had drafts at the later positions: record longer "
            "(--live-s) or with traffic running"
        )
    cond_floor = []
    for k in range(positions):
        vals = [o["conditional"][k] for o in usable if o["conditional"][k] is not None]
        cond_floor.append(round((1 - margin) * min(vals), 4) if vals else 0.0)
    mals = [o["mean_length"] for o in usable]
    return Band(
        positions=positions,
        depth_ratio_floor=round((1 - margin) * min(o["depth_ratio"] for o in usable), 4),
        first_floor=round(FIRST_FACTOR * min(o["first"] for o in usable), 4),
        conditional_floor=cond_floor,
        mean_length_range=(min(mals), max(mals)),
        min_drafts=min_drafts,
        min_trials=min_trials,
    )


def document(recipe: str, band: Band, margin: float, recorded: dict[str, Any]) -> dict[str, Any]:
    """The file's JSON document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "comment": COMMENT,
        "recipe": recipe,
        "margin": margin,
        "band": asdict(band),
        "recorded": recorded,
    }


def save(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def load(path: Path) -> Band | None:
    """The band of a baseline file; None when there is no file. BaselineError when it is
    there but unusable (the message names the file and what to do)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BaselineError(f"baseline {path} unreadable ({exc}): record it again") from None
    try:
        b = doc["band"]
        band = Band(
            positions=int(b["positions"]),
            depth_ratio_floor=float(b["depth_ratio_floor"]),
            first_floor=float(b["first_floor"]),
            conditional_floor=[float(x) for x in b["conditional_floor"]],
            mean_length_range=(float(b["mean_length_range"][0]), float(b["mean_length_range"][1])),
            min_drafts=int(b.get("min_drafts", DEFAULT_MIN_DRAFTS)),
            min_trials=int(b.get("min_trials", DEFAULT_MIN_TRIALS)),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BaselineError(
            f"baseline {path}: bad or missing field ({exc}): record it again"
        ) from None
    if len(band.conditional_floor) != band.positions or band.positions < 1:
        raise BaselineError(f"baseline {path}: conditional_floor must have one entry a position")
    return band
