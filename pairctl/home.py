"""Where the project's own files are: ``recipes/``, ``.env``, ``mods/dsv4-flash-overlays``,
``pairs/``, ``launch/`` (worked out here once, for every package).

Those files are not package data: an operator edits ``.env`` and the recipes in a clone of
the repository. So the code must find that clone whether it runs from the checkout itself
(``python -m pairctl``, the launcher) or from a package installed elsewhere (``pip install .``
then ``dspark``). In order: ``$DSPARK_HOME``; else the checkout this package was imported
from; else the current directory or the nearest parent of it that holds ``recipes/``. Files
that ship inside the packages (gate prompts, sim profiles) are read from the packages.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DSPARK_HOME"
# A directory is the project's when it holds this (every command reads a recipe).
MARKER = "recipes"


def _is_project(p: Path) -> bool:
    return (p / MARKER).is_dir()


def project_root() -> Path:
    """The project directory (see the module docstring); the current directory when none
    is found, so that a missing file's message names where it was looked for."""
    given = os.environ.get(ENV_VAR, "").strip()
    if given:
        return Path(given).expanduser().resolve()
    checkout = Path(__file__).resolve().parent.parent
    if _is_project(checkout):
        return checkout
    cwd = Path.cwd().resolve()
    for p in (cwd, *cwd.parents):
        if _is_project(p):
            return p
    return cwd


def found() -> bool:
    """True when project_root() really is the project (it holds ``recipes/``)."""
    return _is_project(project_root())


def hint() -> str:
    """What to do when the project's files are not where they were looked for."""
    root = project_root()
    how = f"${ENV_VAR}" if os.environ.get(ENV_VAR, "").strip() else "the current directory"
    return (
        f"the project's files (recipes/, .env) were looked for in {root} ({how}) and are not "
        f"there: run from your clone of the repository, or set {ENV_VAR}=/path/to/the/clone"
    )
