"""The acceptance probe's record: one JSON file per engine stack, recipe and checkpoint
revision, written when the pair is known good and read by ``watch``, ``status`` and
``up --gate``.

Where: ``probes/<recipe>.<stack>.<revision>.probe.json`` beside the pair's env file (so the
env files of a fleet in ``pairs/`` share ``pairs/probes/``; ``revision`` is the first 12
characters of MODEL_REVISION, ``unpinned`` without one). A pair whose stack, recipe or
checkpoint changed has no record until one is made: its old record says nothing about a
different draft.

The document keeps each prompt's record (``classes``: per position the mean, spread and
floor of ``A_k / drafts``, every repeat's figures, the drafts each took) and how it was made
(endpoint, model, simulator or not, repeats, the probe prompts file, the plan hash, method).
``source`` and ``classes`` with ``name``/``per_pos``/``spread`` are also the shape
``fleet alert-floors --classes FILE`` takes (monitoring/README.md), so a recorded probe gives
the alert rules their floors. ``floor`` may be edited by hand, with a reason in ``comment``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pairctl.sentinel.judgement import PromptRecord

SCHEMA_VERSION = 1
COMMENT = (
    "Acceptance probe record (pairctl/sentinel/probefile.py): per probe prompt, per draft "
    "position, the mean and spread (max - min) of A_k / drafts over the repeats on a pair "
    "known to be good, and the floor watch judges each new reading by: mean - spread - "
    "max(margins.absolute, margins.relative x mean). Record again (dspark sentinel record "
    "--env-file FILE) after an intended change of the draft; edit a floor only with a reason."
)


class ProbeFileError(ValueError):
    """A record file that cannot be read or has not the expected shape."""


@dataclass(frozen=True)
class ProbeKey:
    """What a record is valid for: the engine stack, the recipe and the checkpoint."""

    recipe: str
    stack: str
    revision: str  # MODEL_REVISION, "" when none is pinned

    def file_name(self) -> str:
        rev = self.revision[:12] if self.revision else "unpinned"
        parts = [re.sub(r"[^A-Za-z0-9_-]", "_", x) for x in (self.recipe, self.stack, rev)]
        return ".".join(parts) + ".probe.json"

    def label(self) -> str:
        return f"stack {self.stack}, recipe {self.recipe}, revision {self.revision or 'unpinned'}"

    def to_dict(self) -> dict[str, str]:
        return {"recipe": self.recipe, "stack": self.stack, "revision": self.revision}


@dataclass(frozen=True)
class ProbeRecord:
    key: ProbeKey
    prompts: dict[str, PromptRecord]
    recorded: dict[str, Any]
    path: Path | None = None


def path_in(directory: Path, key: ProbeKey) -> Path:
    return directory / key.file_name()


def document(key: ProbeKey, prompts: list[PromptRecord], margins: dict[str, float],
             recorded: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The file's JSON document."""
    sim = " on the SIMULATOR" if recorded.get("simulator") else ""
    return {
        "schema_version": SCHEMA_VERSION,
        "comment": COMMENT,
        "key": key.to_dict(),
        "source": f"acceptance probe recorded {recorded.get('at')}{sim} ({key.label()})",
        "margins": margins,
        "recorded": recorded,
        "classes": [p.to_dict() for p in prompts],
    }


def save(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def _floats(xs: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in xs)


def _prompt(c: dict[str, Any]) -> PromptRecord:
    rec = PromptRecord(
        name=str(c["name"]),
        kind=str(c.get("kind", "")),
        per_pos=_floats(c["per_pos"]),
        spread=_floats(c["spread"]),
        floor=_floats(c["floor"]),
        mean_length=float(c.get("mean_length", 0.0)),
        repeats=tuple(_floats(r) for r in c.get("repeats", ())),
        drafts=tuple(int(d) for d in c.get("drafts", ())),
        method=str(c.get("method", "")),
    )
    if not (len(rec.per_pos) == len(rec.spread) == len(rec.floor)) or not rec.per_pos:
        raise ValueError("per_pos, spread and floor need one entry per position")
    return rec


def load(path: Path) -> ProbeRecord | None:
    """The record in ``path``; None when there is no file. ProbeFileError when it is there
    but unusable (the message names the file and what to do)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ProbeFileError(f"probe record {path} unreadable ({exc}): record it again") from None
    try:
        k = doc["key"]
        key = ProbeKey(str(k["recipe"]), str(k["stack"]), str(k["revision"]))
        prompts = [_prompt(c) for c in doc["classes"]]
        recorded = dict(doc.get("recorded") or {})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProbeFileError(
            f"probe record {path}: bad or missing field ({exc}): record it again"
        ) from None
    if not prompts:
        raise ProbeFileError(f"probe record {path}: no prompt recorded: record it again")
    return ProbeRecord(key, {p.name: p for p in prompts}, recorded, path)
