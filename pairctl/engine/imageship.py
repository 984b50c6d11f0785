"""``image ship``: the pair's IMAGE on both ranks, the same image ID on each.

Rank 0 builds it (``--build``: the engine stack's Dockerfile, ``image.dockerfile`` in
recipes/stacks/NAME.yaml: launch/image/Dockerfile for ``fork``, the DSpark fork on the
Spark's vLLM base; launch/image/upstream/Dockerfile for ``upstream``), pulls it (``--pull``:
a registry reference, best pinned by digest), or already has it. Rank 1 gets it from rank 0,
never from a registry, so the two cannot drift: ``docker save`` to a tar on rank 0, a
resumable copy over the fabric (ssh to FABRIC2, pairctl.nodes.fabric), ``docker load`` on
rank 1, then the image ID (the digest of the image's config) compared on both. A rank 1
that already has that ID, under any name or none, gets no copy: at most a ``docker tag``.
A digest-pinned IMAGE loads untagged (moby/moby#22011), so rank 1 names it
``repo:pinned-D`` (pairctl.engine.image.node_ref), the name preflight and ``up`` use there.
Only the pair's IMAGE is ever saved, loaded or tagged: no other image on either node is
touched.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pairctl.contracts import EXIT_OK, EXIT_RUNTIME, IMAGE_STAGE_DIR, REPO
from pairctl.engine.image import node_ref
from pairctl.log import logger
from pairctl.nodes import fabric, fanout
from pairctl.nodes.docker import NO_SUCH_IMAGE, daemon_problem, node_user
from pairctl.nodes.ssh import Node
from pairctl.nodes.transfer import PARTIAL, TransferError
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
    """Get IMAGE onto every rank; 0 when all hold the same ID, 1 otherwise.

    A group of four gets it on ranks 1-3 at once (pairctl.nodes.fanout: a thread and a bar
    per node, rank 0 saving the tar once); a rank that fails is named, the others finish.
    ``dockerfile`` (``--build``) defaults to the pair's stack's.
    """
    rank0 = pair.nodes[0]
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
    tar_lock = threading.Lock()
    saved: list[Path] = []

    def save_once(tar: Path) -> None:
        with tar_lock:  # the headless ranks' threads share one docker save
            if tar not in saved:
                save(rank0, image, tar)
                saved.append(tar)

    if getattr(pair, "nnodes", 2) == 2:  # a pair (or a test's stand-in for one)
        return deliver(pair, stage, remote_stage, dockerfile, save_once, keep_tar=False)

    def job(rank: int) -> int:
        return deliver(pair.with_head(rank), stage, remote_stage, dockerfile, save_once, True)

    rc, bad = fanout.summary(fanout.each_rank(list(pair.headless_ranks), job, log))
    if rc != EXIT_OK:
        log(f"image ship failed on {bad} (named above); run it again: it copies only there")
        return rc
    for tar in saved:
        tar.unlink(missing_ok=True)
    print(f"{image} on all {pair.nnodes} ranks")
    return EXIT_OK


def deliver(
    pair: ResolvedPair,
    stage: str,
    remote_stage: str | None,
    dockerfile: Path | None,
    save_tar: Callable[[Path], None],
    keep_tar: bool,
) -> int:
    """IMAGE from rank 0 onto the pair's second node (``pair.nodes[1]``: rank 1, or one
    headless rank of a group, ``ResolvedPair.with_head``), by image ID: already there,
    tagged, or saved (``save_tar``), copied over the fabric and loaded. ``keep_tar``: leave
    rank 0's tar for the caller (the other ranks' copies still read it)."""
    rank0, rank1 = pair.nodes
    image = pair.image
    stack = getattr(pair, "stack", None)
    both = "both ranks" if getattr(pair, "nnodes", 2) == 2 else f"rank 0 and {rank1.label}"
    local = node_ref(image, 1)  # IMAGE, or a digest-pinned IMAGE's name on rank 1
    try:
        id0 = image_id(rank0, image)
        id1 = image_id(rank1, local) if id0 else ""
        # rank 1 may hold rank 0's image under another name or none (an earlier load of a
        # digest-pinned IMAGE, its own pull): then it needs a tag, not a copy
        there = bool(id0) and id1 != id0 and image_id(rank1, id0) == id0
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
        print(f"{image} = {id0} on {both}; nothing to ship")
        return EXIT_OK
    if id1:
        log(f"{rank1.label} has {local} = {id1}, rank 0 has {id0}: replacing it with rank 0's")
    if there:
        return name_on_rank1(rank1, image, local, id0, "already there, nothing copied", both)
    name = tar_name(id0)
    tar = Path(stage) / name
    far = (remote_stage or stage).rstrip("/")
    try:
        save_tar(tar)
        sent, nbytes = fabric.send(rank1, pair.fabric2, tar.parent, far, [name], f"{image}")
        via = fabric.bulk_node(rank1, pair.fabric2).label
        log(f"copied {nbytes / 2**30:.1f} GiB to {via}" if sent else "tar already there")
        far_tar = f"{far}/{name}"
        res = rank1.run(["docker", "load", "-i", far_tar], timeout=7200)
        if res.rc != 0:
            raise TransferError(
                f"docker load on {rank1.label} failed: {(res.err or res.out).strip()[-300:]}"
            )
        loaded = image_id(rank1, id0)  # by ID: a digest-pinned IMAGE loads untagged
    except TransferError as exc:
        log(f"{exc}")
        return EXIT_RUNTIME
    if loaded != id0:
        log(
            f"after docker load, {rank1.label} has no image {id0} (rank 0's {image}): the "
            f"copy is not the image; {far_tar} removed, run image ship again"
        )
        rank1.run(["rm", "-f", far_tar])
        return EXIT_RUNTIME
    rank1.run(["rm", "-f", far_tar])
    if not keep_tar:
        tar.unlink(missing_ok=True)
    return name_on_rank1(rank1, image, local, id0, "docker load, image ID checked", both)


def name_on_rank1(
    rank1: Node, image: str, local: str, id0: str, how: str, both: str = "both ranks"
) -> int:
    """Rank 1 holds image ``id0``: make ``local`` (IMAGE, or a digest-pinned IMAGE's
    ``repo:pinned-D``) name it there, by ID, and check that it does."""
    tagged = ""
    try:
        if image_id(rank1, local) != id0:
            res = rank1.run(["docker", "tag", id0, local])
            if res.rc != 0:
                why = (res.err or res.out).strip()[-300:]
                log(f"docker tag {id0} {local} on {rank1.label} failed: {why}")
                return EXIT_RUNTIME
            tagged = f", tagged {local}"
        named = image_id(rank1, local)
    except DockerUnreachable as exc:
        log(f"{exc}")
        return EXIT_RUNTIME
    if named != id0:
        log(f"{local} on {rank1.label} is not {id0} after docker tag; run image ship again")
        return EXIT_RUNTIME
    if both == "both ranks":  # a pair's line, as the README quotes it
        print(f"{image} = {id0} on both ranks ({how} on {rank1.label}{tagged})")
    else:
        print(f"{image} = {id0} on {both} ({how} on {rank1.label}{tagged})")
    return EXIT_OK
