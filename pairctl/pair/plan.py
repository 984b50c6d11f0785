"""What ``up`` runs on each node: the exact ``docker run`` argv per rank.

Kept pure (config + recipe + what the image says in, argv out) so ``plan`` prints precisely
what ``up`` executes and tests can pin every flag. Containers carry the pair labels from
docs/INTERFACES.md; cleanup selects on them, which is what makes the seed's cross-pair
incident impossible. docs/FIDELITY.md sets every flag of the line beside what the peers
that run this model on real Spark pairs pass.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pairctl.engine.image import ImageFacts
from pairctl.engine.stack import Stack
from pairctl.pair import cabling
from pairctl.pair.config import ConfigError
from pairctl.pair.derive import OVERLAY_MOUNT, container_env, is_secret
from pairctl.pair.recipe import Mount, substitute
from pairctl.pair.resolved import ResolvedPair

# The RDMA devices NCCL opens (uverbs*); without them it falls back to TCP sockets, which
# NCCL_NET=IB in the recipe turns into a loud failure instead.
RDMA_MOUNT = "/dev/infiniband"
# The --entrypoint is the stack's vLLM console script (pair.stack.entrypoint), always set:
# an image built on vllm-openai has ENTRYPOINT ["vllm", "serve"], which would turn our
# `vllm serve MODEL ...` into `vllm serve vllm serve MODEL ...`.
LABEL_PAIR = "dsv4.pair"
LABEL_RANK = "dsv4.rank"
LABEL_ROLE = "dsv4.role"
LABEL_PLAN = "dsv4.plan"
# This boot's id, drawn by `up` (pairctl.lifecycle.updown.boot) for both ranks; not part of
# the plan hash (that labels config drift, and a boot is not a config change).
LABEL_BOOT = "dsv4.boot"
# What `plan` shows where `up` puts the boot id.
BOOT_PLACEHOLDER = "<BOOT_ID: drawn by up>"
FORBIDDEN_ENV = "VLLM_DSV4_B12X_COMPRESSED_MLA"


def container_name(pair_id: str, rank: int) -> str:
    """``dsv4-<PAIR_ID>-rank<R>`` (docs/INTERFACES.md)."""
    return f"dsv4-{pair_id}-rank{rank}"


@dataclass(frozen=True)
class RankPlan:
    """One rank's container: where it runs and the full docker argv (without 'docker')."""

    rank: int
    role: str
    node: str
    name: str
    image: str
    env: dict[str, str]
    mounts: tuple[Mount, ...]
    vllm_argv: tuple[str, ...]
    docker_argv: tuple[str, ...]
    # Secret env values travel in the docker client's environment (``-e NAME`` in argv),
    # never on a command line where ps, ssh logs or shell history could see them.
    secret_env: tuple[tuple[str, str], ...] = ()
    # The image facts the line was built from (None: not inspected, see render_plan).
    image_facts: ImageFacts | None = None


def ipc_args(shm_size: str | None) -> list[str]:
    """The rank's IPC namespace. With ``shm_size`` (the recipe's default): a private one
    whose /dev/shm is a tmpfs of that size, created and freed with the container, so the
    shared-memory segments vLLM's processes leave when they are SIGKILLed (a crash, a
    `docker rm -f`) cannot pile up on the node across restarts. Without it: the host's
    (`--ipc host`), where such leftovers stay until someone deletes them. vLLM documents
    both ("use the ipc=host flag or --shm-size", docs/deployment/docker.md)."""
    if shm_size:
        return ["--ipc", "private", "--shm-size", shm_size]
    return ["--ipc", "host"]


def boot_fingerprint(pair_id: str, boot_id: str) -> str:
    """The ``system_fingerprint`` rank 0 of this boot answers with (pairctl.status.ownership)."""
    return f"dsv4/{pair_id}/{boot_id}"


def identity_args(pair: ResolvedPair, rank: int, boot_id: str) -> list[str]:
    """Rank 0's vLLM flags that make every non-streaming reply name this pair and boot
    (vllm/entrypoints/serve/utils/fingerprint.py, mode "custom"); only for a stack that
    declares ``boot_identity: fingerprint``."""
    if rank != 0 or pair.stack.boot_identity != "fingerprint":
        return []
    value = boot_fingerprint(pair.pair_id, boot_id)
    return ["--fingerprint-mode", "custom", "--fingerprint-value", value]


def build_rank(
    pair: ResolvedPair,
    rank: int,
    overlay: bool = True,
    image_facts: ImageFacts | None = None,
    boot_id: str | None = None,
) -> RankPlan:
    """The docker run argv for one rank; ``overlay`` False drops the overlay mount.

    ``image_facts``: what ``docker image inspect`` says about the image on this rank's node
    (its PYTHONPATH is kept); None when it was not read (``plan``). The vLLM argv, the
    placeholders and the plan hash come from the resolved pair, computed once there.
    ``boot_id``: this boot's id (``up``); None shows ``BOOT_PLACEHOLDER`` (``plan``).
    """
    if rank not in pair.ranks:
        raise ConfigError(f"rank must be 0..{pair.nnodes - 1}, not {rank}")
    recipe = pair.recipe
    role = "head" if rank == 0 else "worker"
    name = container_name(pair.pair_id, rank)
    image = pair.node_image(rank)  # a headless rank: a digest-pinned IMAGE's local tag
    values = pair.placeholders[rank]
    mounts = [Mount(pair.model_path, pair.model_path, ro=True)]
    mounts += [Mount(d, d) for d in pair.caches.values()]
    if overlay:
        mounts.append(Mount(pair.overlay_dir, OVERLAY_MOUNT, ro=True))
    for m in recipe.mounts:
        mounts.append(Mount(substitute(m.src, values, "recipe mount"), m.dst, m.ro))
    env = container_env(recipe, rank, values, overlay, image_facts, pair.stack, pair.cabling_env)
    boot = boot_id or BOOT_PLACEHOLDER
    vargs = (*pair.vllm_argv[rank], *identity_args(pair, rank, boot))
    argv: list[str] = [
        "run",
        "-d",
        "--name",
        name,
        "--label",
        f"{LABEL_PAIR}={pair.pair_id}",
        "--label",
        f"{LABEL_RANK}={rank}",
        "--label",
        f"{LABEL_ROLE}={role}",
        "--label",
        f"{LABEL_PLAN}={pair.plan_hash}",
        "--label",
        f"{LABEL_BOOT}={boot}",
        "--network",
        "host",
        "--gpus",
        "all",
        *ipc_args(recipe.shm_size),
        "--device",
        f"{pair.rdma_device_dir}:{RDMA_MOUNT}",
        "--entrypoint",
        pair.stack.entrypoint,
    ]
    if pair.container_user:
        # The operator's UID:GID: what the ranks write into the mounted caches stays the
        # operator's (container_env sets HOME for a user the image does not know).
        argv += ["--user", pair.container_user]
    for u in recipe.ulimits:
        argv += ["--ulimit", u]
    for m in mounts:
        argv += ["-v", m.arg()]
    secrets: list[tuple[str, str]] = []
    for k, v in env.items():
        if is_secret(k):
            if "\n" in v:
                raise ConfigError(f"{k} must be a single line")
            argv += ["-e", k]
            secrets.append((k, v))
        else:
            argv += ["-e", f"{k}={v}"]
    argv.append(image)
    argv += vargs[1:]  # the entrypoint is the stack's vllm: the command starts at `serve`
    return RankPlan(
        rank=rank,
        role=role,
        node=pair.node_addr(rank),
        name=name,
        image=image,
        env=env,
        mounts=tuple(mounts),
        vllm_argv=tuple(vargs),
        docker_argv=tuple(argv),
        secret_env=tuple(secrets),
        image_facts=image_facts,
    )


def mask_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Copy of argv with secret ``-e K=V`` values replaced by ``***`` (defence in depth:
    build_rank already passes secrets as bare ``-e K``)."""
    out: list[str] = []
    prev = ""
    for a in argv:
        if prev in ("-e", "--env") and "=" in a:
            k, _, _v = a.partition("=")
            if is_secret(k):
                a = f"{k}=***"
        out.append(a)
        prev = a
    return out


def _prepends(stack: Stack, name: str) -> bool:
    return any(v.prepend and v.name == name for v in stack.env)


def render_plan(pair: ResolvedPair, argv_note: str = "") -> str:
    """Human-readable plan: per rank, the docker line, env, mounts and vLLM args (masked).

    ``plan`` contacts no node, so what only a node can tell (the image's own PYTHONPATH
    and entrypoint) is stated as an assumption; ``up`` reads it on each node.
    """
    recipe = pair.recipe
    stack = pair.stack
    prepends = [v.name for v in stack.env if v.prepend]
    group = pair.nnodes > 2
    fabric = ", ".join(f"rank {r} {pair.fabric_addr(r)}" for r in pair.ranks)
    every = "every node" if group else "both nodes"
    starts = ", ".join(f"start rank {r}" for r in (*reversed(pair.headless_ranks), 0))
    lines = [
        f"# pair {pair.pair_id}: recipe {recipe.name} ({recipe.path}), "
        f"env {pair.env_file}, plan {pair.plan_hash}",
        f"# {stack.summary()}",
        f"# endpoint: http://{pair.spark1}:{pair.port}/v1 (clients and the router use SPARK1)",
        f"# fabric ({pair.nccl_socket_ifname}): {fabric} "
        f"(VLLM_HOST_IP); master {pair.master_addr}:{pair.master_port}",
        f"# order: remove this pair's stale containers on {every} (label "
        f"{LABEL_PAIR}={pair.pair_id}), {starts}, wait for health",
        f"# if OVERLAY_DIR ({pair.overlay_dir}) is missing on a node, that node boots "
        "without the overlay mount and PYTHONPATH (warning)",
        "# assumed (plan contacts no node): the image sets no PYTHONPATH"
        + (", and its PATH is docker's default" if _prepends(stack, "PATH") else "")
        + ". up reads the image's Config.Env on each node (docker image inspect) and appends "
        f"{OVERLAY_MOUNT} to its PYTHONPATH"
        + (
            f", and puts the stack's entries in front of its {', '.join(prepends)}"
            if prepends
            else ""
        )
        + f"; --entrypoint {stack.entrypoint} replaces any image ENTRYPOINT",
    ]
    if group:
        lines.insert(
            3,
            f"# group: {pair.nnodes} Sparks as one engine (TP={pair.nnodes}, --nnodes "
            f"{pair.nnodes}; rank 0 the head, ranks 1-{pair.nnodes - 1} --headless), "
            f"cabling {cabling.describe(pair.cabling, pair.nnodes)}",
        )
    lines.append(
        f"# boot identity: up draws a fresh id for each boot and fills {BOOT_PLACEHOLDER} "
        f"(label {LABEL_BOOT} on {'every rank' if group else 'both ranks'}"
        + (
            "; rank 0's --fingerprint-value, which vLLM returns as system_fingerprint"
            if stack.boot_identity == "fingerprint"
            else f"; stack {stack.name} declares no boot identity, so status/watch prove "
            "ownership by labels only"
        )
        + "); the plan hash does not depend on it"
    )
    if pair.stack_notes:
        lines.append(f"# stack {stack.name} changes the recipe's line ({len(pair.stack_notes)}):")
        lines += [f"#   {note}" for note in pair.stack_notes]
    if argv_note:
        lines.append(f"# {argv_note}")
    for rank in (*reversed(pair.headless_ranks), 0):
        rp = build_rank(pair, rank)
        where = "local (SPARK1)" if rank == 0 else f"ssh {pair.ssh_targets[rank]} (SPARK{rank + 1})"
        lines.append("")
        lines.append(f"## rank {rank} ({rp.role}) on {rp.node} via {where}: container {rp.name}")
        if rank != 0:
            lines.append(
                "# over: "
                + shlex.join(pair.nodes[rank].ssh_argv())
                + " -- <the docker line>"
                + (" (secret values on stdin)" if rp.secret_env else "")
            )
        lines.append("docker " + shlex.join(mask_argv(rp.docker_argv)))
        lines.append("# env:")
        for k, v in rp.env.items():
            lines.append(f"#   {k}={'***' if is_secret(k) else v}")
        lines.append("# mounts:")
        for m in rp.mounts:
            lines.append(f"#   {m.arg()}")
        lines.append("# vllm: " + shlex.join(rp.vllm_argv))
    return "\n".join(lines) + "\n"
