"""pairctl's modules import each other without a circle.

A circle (``a`` imports ``b`` imports ``a``) works only while the lazy import that hides it
stays lazy, and it means neither module can be read, tested or moved alone. The graph is
read from the source with ``ast``: every ``import`` and ``from ... import``, at module
level, inside functions and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "pairctl"


def modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` as the
    package itself)."""
    out = {}
    for path in (root / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(tree: ast.AST, known: set[str], here: str, is_pkg: bool = False) -> set[str]:
    """The package's modules this tree imports (``from pkg import sub`` is the submodule
    when ``sub`` is one, else ``pkg`` itself)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: against this module's package (an __init__ is its own)
                pkg = here.split(".")
                base = ".".join([*pkg[: len(pkg) - node.level + is_pkg], *filter(None, [base])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return (out & known) - {here}


def graph(root: Path = REPO) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {
        m: imported(ast.parse(p.read_text()), known, m, p.name == "__init__.py")
        for m, p in mods.items()
    }


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as the path that closes it (``a -> b -> a``), found by DFS."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                loop = path[path.index(n) :] + [n]
                key = frozenset(loop)
                if key not in seen:
                    seen.add(key)
                    found.append(loop)
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


def test_pairctl_has_no_import_cycle() -> None:
    loops = cycles(graph())
    assert not loops, "import cycles in pairctl:\n" + "\n".join(" -> ".join(c) for c in loops)


def test_the_graph_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pairctl.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pairctl import c\n"
    )
    (pkg / "c.py").write_text("def f():\n    import pairctl.a\n")
    (pkg / "sub" / "__init__.py").write_text("from . import b\nfrom .. import c\n")
    g = graph(tmp_path)
    assert g["pairctl.a"] == {"pairctl.sub.b"}
    assert g["pairctl.sub.b"] == {"pairctl.c"}
    assert g["pairctl.c"] == {"pairctl.a"}
    assert g["pairctl.sub"] == {"pairctl.sub.b", "pairctl.c"}
    assert cycles(g) == [["pairctl.a", "pairctl.sub.b", "pairctl.c", "pairctl.a"]]


def test_no_cycle_in_a_tree_without_one(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pairctl.b import X\n")
    (pkg / "a.py").write_text("from pairctl import b\n")
    (pkg / "b.py").write_text("X = 1\n")
    assert cycles(graph(tmp_path)) == []
