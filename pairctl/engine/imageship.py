"""``image ship``: the pair's IMAGE on both ranks, the same image ID on each.

Rank 0 builds it (``--build``: the engine stack's Dockerfile, ``image.dockerfile`` in
recipes/stacks/NAME.yaml: launch/image/Dockerfile for ``fork``, the DSpark fork on the
Spark's vLLM base; launch/image/upstream/Dockerfile for ``upstream``), pulls it (``--pull``:
a registry reference, best pinned by digest), or already has it. Rank 1 gets it over the
pair's ssh, never from a registry, so the two cannot drift: ``docker save`` to a tar on
rank 0, a resumable copy (pairctl.nodes.transfer), ``docker load`` on rank 1, then the
image ID (the digest of the image's config) compared on both.
A rank 1 that already has the same ID is left alone. Only the pair's IMAGE reference is
ever saved, loaded or tagged: no other image on either node is touched.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pairctl.contracts import EXIT_OK, EXIT_RUNTIME, IMAGE_STAGE_DIR, REPO
from pairctl.log import logger
from pairctl.nodes.docker import NO_SUCH_IMAGE, daemon_problem, node_user
from pairctl.nodes.ssh import Node
from pairctl.nodes.transfer import PARTIAL, TransferError, send_tree
from pairctl.pair.config import ConfigError
from pairctl.pair.resolved import ResolvedPair

if TYPE_CHECKING:
    from pairctl.engine.stack import Stack

# The default stack's (``fork``) recipe: what --build builds when the pair names no stack.
DEFAULT_DOCKERFILE = REPO / "launch" / "image" / "Dockerfile"
DEFAULT_STAGE = IMAGE_STAGE_DIR


log = logger("image: ")


class DockerUnreachable(TransferError):
    """docker on a node could not be asked at all (daemon down, socket denied, ssh); the
    message names the node and the fix."""


def image_id(node: Node, ref: str) -> str:
    """The image ID of ``ref`` on ``node``, '' when docker says it is not there. Any other
    failure is DockerUnreachable: a daemon that does not answer is not a missing image."""
    res = node.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    if res.rc == 0:
        return res.out.strip()
    text = res.err + res.out
    why = daemon_problem(text, node.label, node_user(node))
    if why is None and NO_SUCH_IMAGE not in text.lower():
        why = f"docker image inspect on {node.label} failed (rc={res.rc}): {text.strip()[-300:]}"
    if why:
        raise DockerUnreachable(why)
    return ""


def _stream(argv: list[str]) -> int:
    """Run a long local command with its own progress output on the terminal."""
    log("running: " + shlex.join(argv))
    sys.stdout.flush()
    return subprocess.run(argv, check=False).returncode


def dockerfile_for(stack: Stack | None) -> Path:
    """The Dockerfile ``--build`` builds: the stack's ``image.dockerfile`` (relative to the
    project), or the default stack's when the pair carries no stack (``None``).

    ConfigError (exit 2) for a stack that is not built (``image.obtain`` pull or
    rehearsal) or whose Dockerfile is missing: building another stack's recipe instead
    would tag the wrong engine as IMAGE.
    """
    if stack is None:
        return DEFAULT_DOCKERFILE
    if stack.obtain != "build" or not stack.dockerfile:
        how = f"pull {stack.pull}" if stack.obtain == "pull" else f"obtain: {stack.obtain}"
        raise ConfigError(
            f"stack {stack.name!r} is not built from a Dockerfile ({how}, {stack.path}): "
            "use image ship --pull, or a stack with image.obtain build"
        )
    path = Path(stack.dockerfile)
    if not path.is_absolute():
        path = REPO / path
    if not path.is_file():
        raise ConfigError(
            f"stack {stack.name!r} builds {stack.dockerfile}, but {path} does not exist"
        )
    return path


def build_argv(image: str, dockerfile: Path = DEFAULT_DOCKERFILE) -> list[str]:
    """``docker build`` of one Dockerfile (its own directory is the context), tagged IMAGE."""
    return ["docker", "build", "-t", image, "-f", str(dockerfile), str(dockerfile.parent)]


def obtain_hint(stack: Stack | None, dockerfile: Path | None = None) -> str:
    """How to get the image onto rank 0, in the stack's own terms."""
    if stack is not None and stack.obtain == "pull":
        return f"pull it (image ship --pull; the stack {stack.name!r} pulls {stack.pull})"
    if dockerfile is None:
        try:
            dockerfile = dockerfile_for(stack)
        except ConfigError:
            dockerfile = None
    where = f", from {_shown(dockerfile)}" if dockerfile is not None else ""
    return f"build it (image ship --build{where}) or pull it (image ship --pull)"


def _shown(path: Path) -> str:
    """``path`` relative to the project when it is inside it (what the docs name)."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def tar_name(image_id_: str) -> str:
    """The tar of one image ID (a resumed copy only ever continues the same bytes)."""
    return image_id_.removeprefix("sha256:")[:32] + ".tar"


def save(rank0: Node, image: str, tar: Path) -> None:
    """``docker save`` into ``tar`` (via a .partial, so an interrupted save is redone)."""
    if tar.is_file():
        log(f"{tar} already saved; reusing it")
        return
    tar.parent.mkdir(parents=True, exist_ok=True)
    part = tar.with_name(tar.name + PARTIAL)
    log(f"saving {image} on {rank0.label} to {tar} (docker save; minutes for a large image)")
    res = rank0.run(["docker", "save", "-o", str(part), image], timeout=7200)
    if res.rc != 0:
        part.unlink(missing_ok=True)
        raise TransferError(f"docker save {image} failed: {(res.err or res.out).strip()[-300:]}")
    part.replace(tar)


def ship(
    pair: ResolvedPair,
    *,
    build: bool = False,
    pull: bool = False,
    stage: str = DEFAULT_STAGE,
    remote_stage: str | None = None,
    dockerfile: Path | None = None,
) -> int:
    """Get IMAGE onto both ranks; 0 when both hold the same ID, 1 otherwise.

    ``dockerfile`` (``--build``) defaults to the pair's stack's: ``pair.stack`` once
    ResolvedPair carries the resolved stack, the default stack's until then.
    """
    rank0, rank1 = pair.nodes
    image = pair.image
    stack = getattr(pair, "stack", None)  # ResolvedPair.stack, where the stack is resolved
    if build:
        dockerfile = dockerfile or dockerfile_for(stack)
        if _stream(build_argv(image, dockerfile)) != 0:
            log(
                f"docker build of {_shown(dockerfile)} failed on {rank0.label}; nothing was shipped"
            )
            return EXIT_RUNTIME
    if pull and _stream(["docker", "pull", image]) != 0:
        log(f"docker pull {image} failed on {rank0.label}; nothing was shipped")
        return EXIT_RUNTIME
    try:
        id0 = image_id(rank0, image)
        id1 = image_id(rank1, image) if id0 else ""
    except DockerUnreachable as exc:
        log(f"{exc}; nothing was shipped")
        return EXIT_RUNTIME
    if not id0:
        log(
            f"{image} is not on {rank0.label}: {obtain_hint(stack, dockerfile)}; "
            "nothing was shipped"
        )
        return EXIT_RUNTIME
    if id1 == id0:
        print(f"{image} = {id0} on both ranks; nothing to ship")
        return EXIT_OK
    if id1:
        log(f"{rank1.label} has {image} = {id1}, rank 0 has {id0}: replacing it with rank 0's")
    name = tar_name(id0)
    tar = Path(stage) / name
    far = (remote_stage or stage).rstrip("/")
    try:
        save(rank0, image, tar)
        sent, nbytes = send_tree(rank1, tar.parent, far, [name], f"{image}")
        log(f"copied {nbytes / 2**30:.1f} GiB to {rank1.label}" if sent else "tar already there")
        far_tar = f"{far}/{name}"
        res = rank1.run(["docker", "load", "-i", far_tar], timeout=7200)
        if res.rc != 0:
            raise TransferError(
                f"docker load on {rank1.label} failed: {(res.err or res.out).strip()[-300:]}"
            )
        id1 = image_id(rank1, image)
    except TransferError as exc:
        log(f"{exc}")
        return EXIT_RUNTIME
    if id1 != id0:
        log(
            f"after docker load, {rank1.label} has {image} = {id1 or 'nothing'}, rank 0 "
            f"{id0}: the copy is not the image; {far_tar} removed, run image ship again"
        )
        rank1.run(["rm", "-f", far_tar])
        return EXIT_RUNTIME
    rank1.run(["rm", "-f", far_tar])
    tar.unlink(missing_ok=True)
    print(f"{image} = {id0} on both ranks (docker load on {rank1.label}, image ID checked)")
    return EXIT_OK
