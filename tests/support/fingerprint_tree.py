"""A module tree built from a recorded fingerprint, for resolving a stack's hook points.

A fingerprint (tests/data/overlay_fingerprints/*.json) records, for an engine no test can
run here, each symbol's module, qualname, kind, signature and which anchor substrings its
source has. ``build`` writes a package tree in which every recorded symbol exists with that
signature and a body that contains exactly those anchors (as comments), so the plugin's
resolver (import, walk, signature, anchors) meets the same facts it would meet in the
image. Nothing else of the engine exists in the tree.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

FINGERPRINTS = Path(__file__).resolve().parents[1] / "data" / "overlay_fingerprints"


def load(name: str) -> dict[str, Any]:
    return json.loads((FINGERPRINTS / f"{name}.json").read_text())


def _method(name: str, sym: dict[str, Any], indent: str) -> list[str]:
    lines = []
    if sym["kind"] in ("classmethod", "staticmethod"):
        lines.append(f"{indent}@{sym['kind']}")
    lines.append(f"{indent}def {name}{sym['signature']}:")
    lines += [f"{indent}    # {a}" for a in sym.get("anchors_present", [])]
    lines.append(f"{indent}    raise NotImplementedError('fingerprint stand-in')")
    return lines


def _module_source(module: str, symbols: list[dict[str, Any]]) -> str:
    imports: list[str] = []
    classes: dict[str, dict[str, Any]] = defaultdict(lambda: {"bases": [], "methods": []})
    body: list[str] = []
    for sym in symbols:
        parts = sym["qualname"].split(".")
        if sym["kind"] == "class":
            cls = classes[parts[0]]
            for base in sym.get("bases", []):
                mod, _, qual = base.partition(":")
                imports.append(f"from {mod} import {qual}")
                cls["bases"].append(qual)
        elif len(parts) == 1:
            body += _method(parts[0], sym, "")
        else:
            classes[parts[0]]["methods"].append((parts[1], sym))
    out = [f'"""Fingerprint stand-in for {module}."""', *imports, ""]
    for name, cls in classes.items():
        bases = f"({', '.join(cls['bases'])})" if cls["bases"] else ""
        out.append(f"class {name}{bases}:")
        for meth, sym in cls["methods"]:
            out += _method(meth, sym, "    ")
        if not cls["methods"]:
            out.append("    pass")
        out.append("")
    return "\n".join(out + body) + "\n"


def build(fp: dict[str, Any], root: Path) -> Path:
    """Write the fingerprint's modules under ``root`` (a ``vllm`` package whose
    ``__version__`` is the fingerprint's) and return ``root`` for ``PYTHONPATH``."""
    by_module: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sym in fp["symbols"]:
        by_module[sym["module"]].append(sym)
    for module, symbols in by_module.items():
        path = root.joinpath(*module.split("."))
        for parent in [*path.parents][::-1]:
            if parent == root or root not in parent.parents:
                continue
            init = parent / "__init__.py"
            parent.mkdir(parents=True, exist_ok=True)
            init.touch()
        path.with_suffix(".py").write_text(_module_source(module, symbols))
    (root / "vllm" / "__init__.py").write_text(f"__version__ = {fp['vllm']!r}\n")
    return root
