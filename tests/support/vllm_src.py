"""Reading the installed vLLM/uvicorn sources, for tests that check a string is really there."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path


def site_packages() -> Path:
    """The site-packages holding uvicorn (and, with the vllm extra, vLLM and torch)."""
    spec = importlib.util.find_spec("uvicorn")
    assert spec and spec.origin
    return Path(spec.origin).parents[1]


@cache
def string_constants(path: Path) -> tuple[str, ...]:
    """Every str literal of a Python file (implicit concatenation already joined by ast)."""
    tree = ast.parse(path.read_text())
    return tuple(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
