"""A pair's ``plan`` stays byte-identical: recorded outputs in tests/data/plan_golden.

Recorded before groups of four Sparks were added (branch ``groups``), so the pair, still the
default, must come out exactly as it did: the plan text of three env files (fork, upstream
with a pinned image and secrets, cpu), and the ``docker run`` line ``up`` builds when it
has inspected the image on each node. A change that means to alter a pair's plan
re-records them with ``python -m tests.test_plan_golden`` and says why in its commit.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from pairctl.engine.image import ImageFacts
from pairctl.pair.config import load_env_file
from pairctl.pair.plan import build_rank, mask_argv, render_plan
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "plan_golden"
RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
ENVS = ("pair-a", "pair-upstream", "pair-cpu")
NOTE = "argv check: fixed note of the golden test"
# What a node's `docker image inspect` said (an image with its own PYTHONPATH and PATH).
FACTS = ImageFacts(
    id="sha256:" + "cd" * 32,
    env=["PATH=/opt/venv/bin:/usr/bin", "PYTHONPATH=/opt/site"],
    entrypoint=["vllm", "serve"],
)


def _pair(name: str):
    return resolve(load_env_file(DATA / f"{name}.env"), load_recipe(RECIPE))


def _portable(text: str) -> str:
    return text.replace(str(REPO), "<repo>")


def render(name: str, inspected: bool) -> str:
    """``plan``'s text, or (inspected) each rank's docker line as ``up`` builds it."""
    pair = _pair(name)
    if not inspected:
        return _portable(render_plan(pair, NOTE))
    lines = []
    for rank in (1, 0):
        rp = build_rank(pair, rank, image_facts=FACTS, boot_id="golden-boot")
        lines.append(f"## rank {rank} on {rp.node}: {rp.name}")
        lines.append("docker " + shlex.join(mask_argv(rp.docker_argv)))
    return _portable("\n".join(lines) + "\n")


def _golden(name: str, inspected: bool) -> Path:
    return DATA / f"{name}{'.inspected' if inspected else ''}.plan.txt"


@pytest.mark.parametrize("inspected", [False, True], ids=["plan", "inspected"])
@pytest.mark.parametrize("name", ENVS)
def test_pair_plan_is_byte_identical(name: str, inspected: bool) -> None:
    want = _golden(name, inspected).read_text(encoding="utf-8")
    assert render(name, inspected) == want


def test_golden_plans_hold_no_secret() -> None:
    for path in DATA.glob("*.plan.txt"):
        text = path.read_text(encoding="utf-8")
        assert "NeverPrinted" not in text and "never-printed" not in text, path


if __name__ == "__main__":  # re-record (only for an intended change of a pair's plan)
    for env in ENVS:
        for insp in (False, True):
            _golden(env, insp).write_text(render(env, insp), encoding="utf-8")
    sys.exit(0)
