"""docs/FIDELITY.md stays true: its flag table is exactly the items of the lines `plan`
generates (with the generated values), its stack table is exactly recipes/stacks/*.yaml
(every item, value and source), and its needle table is pairctl.engine.bootlog's list, each
needle in the installed file it names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dotenv import dotenv_values

from pairctl.engine.bootlog import NEEDLES
from pairctl.engine.stack import Stack, load_stack, names
from pairctl.pair.config import CACHE_VARS, parse_env
from pairctl.pair.derive import is_secret
from pairctl.pair.plan import build_rank
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from tests.support.vllm_src import site_packages, string_constants

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "FIDELITY.md").read_text()


def _table(header: str) -> list[list[str]]:
    """Rows (cells) of the markdown table whose header line starts with ``header``."""
    start = DOC.index(header)
    rows = []
    for line in DOC[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _generated() -> dict[str, str]:
    """item -> value for both ranks' lines on .env.example, every optional item switched on."""
    values = dict(dotenv_values(REPO / ".env.example"))
    values.update(
        HF_TOKEN="hf_doc", VLLM_API_KEY="sk_doc", NCCL_IB_GID_INDEX="3", CONTAINER_USER="1000:1000"
    )
    cfg = parse_env(values)
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    by_path = {cfg.values[v]: v for v in ("MODEL_PATH", "OVERLAY_DIR", *CACHE_VARS)}
    items: dict[str, str] = {}
    for rank in (0, 1):
        rp = build_rank(resolve(cfg, recipe), rank)
        argv = list(rp.docker_argv)
        image_at = argv.index(rp.image)
        items["docker run -d"] = "-d"
        i = 2
        while i < image_at:
            flag, val = argv[i], argv[i + 1]
            if flag == "-v":
                items[f"-v {by_path[val.split(':')[0]]}"] = val
            elif flag == "-e":
                key, _, v = val.partition("=")
                items[f"-e {key}"] = "***" if is_secret(key) else v
            elif flag == "--ulimit":
                items[f"--ulimit {val.split('=')[0]}"] = val
            else:
                items.setdefault(flag, val)
            i += 2
        cmd = argv[image_at + 1 :]
        items["vllm serve MODEL"] = f"{cmd[0]} {cmd[1]}"
        j = 2
        while j < len(cmd):
            flag = cmd[j]
            has_value = j + 1 < len(cmd) and not cmd[j + 1].startswith("--")
            if flag not in items or rank == 0:
                items[flag] = cmd[j + 1] if has_value else "on"
            j += 2 if has_value else 1
    return items


# Items whose "ours" cell must show the generated value (others depend on the pair).
VALUE_CHECKED = ("--", "-e ")
NOT_VALUE_CHECKED = {
    "--name",
    "--label",
    "--master-addr",
    "--node-rank",
    "--headless",  # rank 1 only
    "-e VLLM_HOST_IP",
    "-e NCCL_IB_GID_INDEX",  # only when the env file pins it
    "-e HOME",  # only with CONTAINER_USER
    "-e DSV4_OVERLAY_HOOKS",  # the stack's overlays: section, as JSON
}


def test_flag_table_is_the_generated_lines() -> None:
    rows = _table("| item | ours |")
    doc = {re.sub(r"^`(.*)`$", r"\1", r[0]): r for r in rows}
    items = _generated()
    assert sorted(doc) == sorted(items), "FIDELITY.md's rows differ from plan's items"
    for item, value in items.items():
        row = doc[item]
        assert len(row) == 6 and all(row), f"{item}: ours, 3 peers and a verdict, none empty"
        if item.startswith(VALUE_CHECKED) and item not in NOT_VALUE_CHECKED:
            if item.startswith("-e ") and "/" in value:
                continue  # a path: the cell says which dir
            assert f"`{value}`" in row[1] or value == "on" and row[1] == "on", (item, value, row[1])


def test_needle_table_is_bootlog() -> None:
    rows = _table("| needle | phase | source file |")
    want = [[f"`{n.text}`", n.phase, f"`{n.source}`"] for n in NEEDLES]
    assert rows == want


@pytest.mark.needs_vllm
def test_needle_table_rows_are_in_the_installed_files() -> None:
    for text, _, source in _table("| needle | phase | source file |"):
        path = site_packages() / source.strip("`")
        assert any(text.strip("`") in s for s in string_constants(path)), (text, source)


def _stack_value(v: object) -> str:
    if isinstance(v, dict):
        return f"`{json.dumps(v, separators=(',', ':'))}`"
    return f"`{v}`"


def _stack_items(stack: Stack) -> list[tuple[str, str, str]]:
    """(item, value, source) for every item of one stack, in declaration order."""
    rows = [
        ("vllm", f"`{stack.vllm}`", stack.image_source),
        (
            "image",
            f"`{stack.image_default}` ({stack.obtain}"
            + (f" `{stack.dockerfile}`" if stack.dockerfile else "")
            + ")",
            stack.image_source,
        ),
        ("interpreter", f"`{stack.interpreter}`", stack.paths_source),
        ("entrypoint", f"`{stack.entrypoint}`", stack.paths_source),
    ]
    for v in stack.env:
        shown = f"`{v.value}` in front of the image's" if v.prepend else _stack_value(v.value)
        rows.append((f"`-e {v.name}`", shown, v.source))
    for f in stack.flags:
        shown = {"add": "on", "drop": "dropped"}.get(f.action) or _stack_value(f.value)
        rows.append((f"`--{f.name}`", shown, f.source))
    t = ", ".join(
        f"{k} {v} s"
        for k, v in (("engine_ready_s", stack.engine_ready_s), ("first_boot_s", stack.first_boot_s))
        if v is not None
    )
    rows.append(("timeouts", t or "-", stack.timeouts_source or "-"))
    c = stack.concurrency
    if c.requires_patch:
        conc = f"max-num-seqs {c.max_num_seqs} with `{c.requires_patch}`, else {c.without_patch}"
    else:
        conc = "no cap, no patch needed"
    rows.append(("concurrency", conc, c.source or "-"))
    for k in stack.known_bad:
        versions = ", ".join(f"`{v}`" for v in k.versions)
        rows.append((f"known bad `{k.component}`", versions, k.source))
    return rows


def stack_rows() -> list[list[str]]:
    """The stack table's rows, as docs/FIDELITY.md must have them."""
    return [[name, *item] for name in names() for item in _stack_items(load_stack(name))]


def test_stack_table_is_the_declared_stacks() -> None:
    rows = _table("| stack | item | value | source |")
    assert rows == stack_rows(), "regenerate the stack table from recipes/stacks/ (rows differ)"
