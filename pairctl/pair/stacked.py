"""A stack's changes to the recipe, each one said: serve flags, container env, concurrency.

The recipe says what to serve; the stack (pairctl.engine.stack) says what the image's vLLM
needs on top. Precedence for ``vllm serve`` flags: extra args after ``--`` > the stack's
flags > the recipe (the stack's are applied to the recipe's serve keys here, the extra
args are appended last and vLLM's argparse keeps the last occurrence). For the container
env a stack variable replaces the recipe's. Every change comes back as one line for
``plan``, with the stack's source for it, so the plan shows what the stack did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pairctl.engine.image import ImageFacts
from pairctl.engine.stack import EnvVar, Stack

# What dockerd gives a container whose image sets no PATH (moby oci/defaults.go
# DefaultPathEnv): the base a prepended PATH falls back to when the image was not read.
DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MAX_NUM_SEQS = "max-num-seqs"


def prepended(var: EnvVar, image: ImageFacts | None) -> str:
    """``var.value`` in front of the image's own value (``docker image inspect`` on the
    node); unread or unset, PATH falls back to docker's default and anything else to
    nothing."""
    base = image.env_value(var.name) if image else None
    if base is None and var.name == "PATH":
        base = DOCKER_DEFAULT_PATH
    return f"{var.value}:{base}" if base else var.value


def _shown(value: Any) -> str:
    if value is True:
        return "on"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def serve_keys(
    serve: Mapping[str, Any], stack: Stack, image_patched: bool | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The recipe's serve keys with the stack's flags and concurrency policy applied, and
    one note per change.

    ``image_patched``: whether the image carries ``stack.concurrency.requires_patch``;
    None = not known (``plan`` reads no image; the image probe may tell), taken as absent.
    """
    out = dict(serve)
    notes: list[str] = []
    for change in stack.flags:
        flag = f"--{change.name}"
        had = change.name in out and out[change.name] is not None
        if change.action == "drop":
            if had:
                notes.append(f"{flag} {_shown(out.pop(change.name))} dropped ({change.source})")
            continue
        value = True if change.action == "add" else change.value
        if had and out[change.name] == value:
            continue
        before = f"{_shown(out[change.name])} -> " if had else "added "
        out[change.name] = value
        notes.append(f"{flag}: {before}{_shown(value)} ({change.source})")
    notes += _concurrency(out, stack, image_patched)
    return out, notes


def _concurrency(serve: dict[str, Any], stack: Stack, image_patched: bool | None) -> list[str]:
    """Cap max-num-seqs to what the stack can batch (in place); a note when it did."""
    conc = stack.concurrency
    patched = conc.requires_patch is None or bool(image_patched)
    limit = conc.max_num_seqs if patched else conc.without_patch
    asked = serve.get(_MAX_NUM_SEQS)
    if limit is None or (asked is not None and not isinstance(asked, int)):
        return []  # a value vLLM's parser will name (plan/preflight check the argv)
    if isinstance(asked, int) and asked <= limit:
        return []
    serve[_MAX_NUM_SEQS] = limit
    before = asked if asked is not None else "vLLM's default"
    if patched:
        return [f"--max-num-seqs: {before} -> {limit}: stack {stack.name}'s limit ({conc.source})"]
    assumed = (
        "assumed absent: plan reads no image (the image probe can tell)"
        if image_patched is None
        else "the image does not carry it"
    )
    return [
        f"--max-num-seqs: {before} -> {limit}: stack {stack.name} batches more than "
        f"{limit} only with the {conc.requires_patch} patch, {assumed}; an image that "
        f"carries it: pass `-- --max-num-seqs {asked}` ({conc.source})"
    ]


def env_notes(recipe_env: Mapping[str, str], stack: Stack) -> list[str]:
    """One note per container variable the stack sets (``prepend``: in front of the image's
    own value), saying when it replaces the recipe's."""
    notes = []
    for var in stack.env:
        shown = f"{var.value}:<image's {var.name}>" if var.prepend else var.value
        if var.name in recipe_env and recipe_env[var.name] != var.value:
            notes.append(
                f"env {var.name}: recipe's {recipe_env[var.name]} -> {shown} ({var.source})"
            )
        elif var.name not in recipe_env:
            notes.append(f"env {var.name}={shown} ({var.source})")
    if stack.engine_ready_s is not None:
        notes.append(
            f"env VLLM_ENGINE_READY_TIMEOUT_S={stack.engine_ready_s}: timeouts.engine_ready_s, "
            f">= this stack's first boot ({stack.first_boot_s} s)"
        )
    return notes
