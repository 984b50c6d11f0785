"""``model fetch`` / ``model verify``: the checkpoint at MODEL_PATH on both ranks, the same
files from the same Hugging Face commit.

``fetch`` downloads MODEL_REPO at MODEL_REVISION into MODEL_PATH on rank 0 with the
Hugging Face CLI (``hf download REPO --revision COMMIT --local-dir MODEL_PATH``: its own
progress bars, and it resumes an interrupted download), then copies the directory to the
same path on rank 1 over the fabric (ssh to FABRIC2, pairctl.nodes.fabric; the transfer
itself is pairctl.nodes.transfer: resumable, bytes/s), then verifies over SPARK2.
``HF_TOKEN`` reaches the downloader in its environment only, never on a command line or in
a message. The commit is required: a moving ``main`` would give two pairs (or
a re-fetch) different weights. The download metadata ``hf download --local-dir`` writes
(``.cache/huggingface/download/*.metadata``, which names the commit) travels too, so
preflight's PF-MODEL-REVISION reads the same commit on both nodes.

``verify`` (also the end of ``fetch``): the same file list and sizes on both nodes, and
``model.safetensors.index.json`` present with every shard its ``weight_map`` names on
both, each as long as its safetensors header says (pairctl.nodes.shardcheck: an empty or
cut-short shard fails, named); ``--checksum`` adds a sha256 of every file on both sides
(minutes per 100 GB).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from pairctl.contracts import EXIT_OK, EXIT_RUNTIME
from pairctl.log import logger
from pairctl.nodes import fabric, fanout
from pairctl.nodes.shardcheck import shard_problem
from pairctl.nodes.ssh import Node
from pairctl.nodes.transfer import PARTIAL, TransferError, remote_sizes, sha256_remote
from pairctl.pair.config import ConfigError
from pairctl.pair.resolved import ResolvedPair

INDEX = "model.safetensors.index.json"
# What `hf download --local-dir` keeps beside the files while it works: not the model.
SKIP_SUFFIXES = (".incomplete", ".lock", PARTIAL)


log = logger("model: ")


def model_files(root: Path) -> list[str]:
    """Every file of the model dir (relative), the download metadata included, without
    the downloader's in-progress files."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.endswith(SKIP_SUFFIXES):
            out.append(p.relative_to(root).as_posix())
    return out


def downloader(given: str | None) -> list[str]:
    """The Hugging Face CLI: ``--downloader CMD``, else ``hf`` beside this Python, else on
    PATH; ConfigError naming the install command when there is none."""
    if given:
        return shlex.split(given)
    beside = Path(sys.executable).parent / "hf"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("hf")
    if found:
        return [found]
    raise ConfigError(
        "no Hugging Face CLI (hf) found: install it into the launcher's venv "
        "(.venv/bin/pip install 'huggingface_hub>=1.0'), or pass "
        "--downloader CMD"
    )


def repo_and_revision(pair: ResolvedPair) -> tuple[str, str]:
    """MODEL_REPO / MODEL_REVISION (env file, else the recipe's model:); ConfigError when
    the commit is not pinned."""
    repo = pair.model_repo
    rev = pair.model_revision
    if not repo:
        raise ConfigError("MODEL_REPO is empty and the recipe names no model.hf_repo; set one")
    if not rev:
        raise ConfigError(
            f"MODEL_REVISION is not set: pin the commit of {repo} to download (40 hex, from "
            f"https://huggingface.co/{repo}/commits/main) in {pair.env_file}, so both "
            "nodes, and every later fetch, get the same weights"
        )
    return repo, rev


def download(
    repo: str, rev: str, dest: str, cmd: list[str], token: str, env: Mapping[str, str] | None = None
) -> int:
    """Run the downloader on rank 0 (this machine); its progress goes to the terminal."""
    argv = [*cmd, "download", repo, "--revision", rev, "--local-dir", dest]
    log("running: " + shlex.join(argv) + ("  (HF_TOKEN from the env file)" if token else ""))
    run_env = dict(env if env is not None else os.environ)
    run_env.pop("HF_HUB_OFFLINE", None)  # the container's setting, not the download's
    if token:
        run_env["HF_TOKEN"] = token
    Path(dest).mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    try:
        return subprocess.run(argv, env=run_env, check=False).returncode
    except FileNotFoundError:
        log(f"{cmd[0]} not found; install the Hugging Face CLI or pass --downloader")
        return 127


def shards(index_path: Path) -> set[str]:
    """The shard files ``model.safetensors.index.json``'s weight_map names."""
    data = json.loads(index_path.read_text())
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise ValueError(f"{index_path}: no weight_map")
    return {str(v) for v in wmap.values()}


def _names(items: list[str], at_most: int = 5) -> str:
    more = len(items) - at_most
    return ", ".join(items[:at_most]) + (f" and {more} more" if more > 0 else "")


def gaps(
    root: Path, local: Mapping[str, int], far: Mapping[str, int], index: set[str] | None
) -> tuple[list[str], list[str]]:
    """What the copies lack against the index: (the same on both, rank 0's alone).

    A shard is whole when its size is the one its safetensors header promises
    (pairctl.nodes.shardcheck); rank 1's copy of a broken shard is broken the same way when
    its size is rank 0's (a size that differs is a difference, reported as one)."""
    both: list[str] = []
    only0: list[str] = []
    wanted = index if index is not None else set()
    if index is None:
        lacks = f"missing {INDEX} (not a complete safetensors checkpoint)"
        (both if INDEX not in far else only0).append(lacks)
    for k in sorted(wanted - set(local)):
        (both if k not in far else only0).append(f"missing {k}")
    for k in sorted(k for k in local if k in wanted or k.endswith(".safetensors")):
        why = shard_problem(root / k)
        if why:
            (both if far.get(k) == local[k] else only0).append(f"{k} {why}")
    return both, only0


def differences(local: Mapping[str, int], far: Mapping[str, int], rank: int = 1) -> list[str]:
    """What differs between rank 0's files (``local``) and ``rank``'s (``far``)."""
    out = [f"rank {rank} lacks {k}" for k in sorted(set(local) - set(far))]
    out += [f"rank {rank} has {k}, rank 0 does not" for k in sorted(set(far) - set(local))]
    out += [
        f"{k}: {local[k]} bytes on rank 0, {far[k]} on rank {rank}"
        for k in sorted(set(local) & set(far))
        if local[k] != far[k]
    ]
    return out


def verify(pair: ResolvedPair, checksum: bool = False, far_root: str | None = None) -> int:
    """Compare rank 0's copy with every other rank's (a group of four: each in turn, every
    rank named); 0 when all match."""
    if pair.nnodes == 2:
        return verify_one(pair, checksum, far_root)
    rcs = {r: verify_one(pair.with_head(r), checksum, far_root) for r in pair.headless_ranks}
    rc, bad = fanout.summary(rcs)
    if rc != EXIT_OK:
        log(f"model verify: {bad} differ from rank 0 (named above)")
    return rc


def verify_one(pair: ResolvedPair, checksum: bool = False, far_root: str | None = None) -> int:
    """Compare the two copies (file list, sizes, the index's shards whole; ``checksum``:
    sha256). Two copies that are the same but incomplete are said to be so, not to differ."""
    rank0, rank1 = pair.nodes
    both_ranks = "both ranks" if pair.nnodes == 2 else f"rank 0 and rank {rank1.rank}"
    root = Path(pair.model_path)
    far = far_root or pair.model_path
    if not root.is_dir():
        log(f"{root} does not exist on {rank0.label}: run model fetch")
        return EXIT_RUNTIME
    files = model_files(root)
    local = {rel: (root / rel).stat().st_size for rel in files}
    try:
        there = remote_sizes(rank1, far)
    except TransferError as exc:
        log(str(exc))
        return EXIT_RUNTIME
    there = {k: v for k, v in there.items() if not k.endswith(SKIP_SUFFIXES)}
    try:
        index = shards(root / INDEX) if (root / INDEX).is_file() else None
    except (ValueError, json.JSONDecodeError) as exc:
        log(f"{root}/{INDEX} unreadable: {exc}")
        return EXIT_RUNTIME
    both, only0 = gaps(root, local, there, index)
    differ = differences(local, there, rank1.rank)
    if not (both or only0 or differ) and checksum:
        differ = _checksums(rank0, rank1, pair.model_path, far, files)
    if both:
        log(f"both copies are incomplete: {_names(both)}")
    if only0:
        log(f"rank 0's copy is incomplete: {_names(only0)}")
    for p in differ[:10]:
        log(f"MISMATCH: {p}")
    if differ:
        log("the copies differ: run model fetch again (it resumes and re-copies what differs)")
    elif both or only0:
        broken = any(not g.startswith("missing ") for g in both + only0)
        where = f"from {pair.model_path} on {rank0.label}"
        first = f"delete the broken shard(s) {where}, then " if broken else ""
        log(
            f"{first}run model fetch again: it resumes the download on {rank0.label}, then "
            f"copies to {rank1.label}"
        )
    if both or only0 or differ:
        return EXIT_RUNTIME
    size = sum(local.values())
    how = "sha256 of every file" if checksum else "names and sizes"
    shard_note = f", all {len(index)} shards of {INDEX}" if index else ""
    print(
        f"{pair.model_path}: {len(files)} files, {size / 2**30:.1f} GiB identical on {both_ranks} "
        f"({how}{shard_note})"
    )
    return EXIT_OK


def _checksums(rank0: Node, rank1: Node, near: str, far: str, files: list[str]) -> list[str]:
    log(f"sha256 of {len(files)} files on both ranks (minutes per 100 GB)...")
    try:
        s0 = sha256_remote(rank0, near, files)
        s1 = sha256_remote(rank1, far, files)
    except TransferError as exc:
        return [str(exc)]
    return [f"{k}: sha256 differs" for k in files if s0.get(k) != s1.get(k)]


def fetch(
    pair: ResolvedPair,
    *,
    checksum: bool = False,
    skip_download: bool = False,
    downloader_cmd: str | None = None,
    far_root: str | None = None,
) -> int:
    """Download on rank 0, copy to every other rank (a group of four: all at once,
    pairctl.nodes.fanout), verify; 0 when every copy matches."""
    repo, rev = repo_and_revision(pair)
    if not skip_download:
        cmd = downloader(downloader_cmd)
        rc = download(repo, rev, pair.model_path, cmd, pair.hf_token)
        if rc != 0:
            log(f"download of {repo}@{rev[:12]} failed (rc={rc}); run model fetch again to resume")
            return EXIT_RUNTIME
    root = Path(pair.model_path)
    files = model_files(root)
    if not files:
        log(f"{root} is empty on rank 0; nothing to copy")
        return EXIT_RUNTIME
    far = far_root or pair.model_path

    def copy(rank: int) -> int:
        node, addr = pair.nodes[rank], pair.fabric_addr(rank)
        try:
            sent, nbytes = fabric.send(node, addr, root, far, files, Path(pair.model_path).name)
        except TransferError as exc:
            log(f"copy to {node.label} failed: {exc}" if pair.nnodes > 2 else str(exc))
            return EXIT_RUNTIME
        log(
            f"copied {sent} file(s), {nbytes / 2**30:.1f} GiB to "
            f"{fabric.bulk_node(node, addr).label}"
            if sent
            else f"{node.label} already has every file at its size"
        )
        return EXIT_OK

    rc, bad = fanout.summary(fanout.each_rank(list(pair.headless_ranks), copy, log))
    if rc != EXIT_OK:
        log(f"model fetch: the copy to {bad} failed; run model fetch again to resume it")
        return rc
    return verify(pair, checksum=checksum, far_root=far_root)
