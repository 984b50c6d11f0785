"""The pair, resolved once: env file + recipe + extra vLLM args in, one typed, frozen object out.

Every command builds it at its top (``load``) and passes it down; nothing below re-reads the
env file or recipe, re-applies the recipe's defaults, re-picks the image or rebuilds the
other ranks' argv. A pair is a group of two Sparks; a group of four (SPARK3/SPARK4) has the
same head (rank 0, the endpoint, local) and three headless ranks over ssh, and every
per-rank field is a tuple of ``nnodes``. Ports are ints, addresses and the image are
settled (the two kinds of address: SPARK<R> are where ssh, the router and clients reach a
node, FABRIC<R> where the engine's ranks reach each other, defaulting to SPARK<R>;
MASTER_ADDR defaults to FABRIC1, IMAGE to the recipe's), each rank's placeholders and vLLM
argv are computed here, and so is the plan hash every rank's container is labelled with.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from pairctl.endpoint import Endpoint
from pairctl.engine.image import node_ref
from pairctl.engine.stack import Stack, load_stack
from pairctl.nodes.ssh import Node, nodes
from pairctl.pair import cabling as cab
from pairctl.pair import derive, stacked
from pairctl.pair.config import CACHE_VARS, PairConfig, check_port_clash, load_env_file
from pairctl.pair.recipe import Recipe, check_passthrough, load_recipe


@dataclass(frozen=True)
class ResolvedPair:
    """One pair as every step sees it: each setting a step reads is a field here, settled
    (the env file's validated values, the recipe's PORT default applied)."""

    recipe: Recipe
    stack: Stack  # the engine stack (recipes/stacks/NAME.yaml) the image runs
    passthrough: tuple[str, ...]
    env_file: str
    unknown: tuple[str, ...]  # env file variables pairctl does not know (named in warnings)
    pair_id: str
    spark1: str
    spark2: str
    ssh_target: str  # ``[user@]SPARK2`` (rank 1's; ssh_targets for every rank)
    fabric1: str
    fabric2: str
    master_addr: str
    master_port: int
    port: int
    image: str
    model_path: str
    overlay_dir: str
    model_repo: str
    model_revision: str
    nccl_socket_ifname: str
    gloo_socket_ifname: str
    nccl_ib_hca: str
    nccl_ib_gid_index: str
    rdma_device_dir: str
    container_user: str
    caches: Mapping[str, str]  # CACHE_VARS -> the host dir, mounted at the same path
    # Per rank, ``nnodes`` each: rank 0 local, ranks 1.. over ssh.
    nodes: tuple[Node, ...] = field(repr=False, compare=False)
    # What preflight's evidence records of the env file: every variable, secrets as ***.
    evidence_config: Mapping[str, str] = field(repr=False)
    api_key: str = field(repr=False)
    hf_token: str = field(repr=False)
    placeholders: tuple[Mapping[str, str], ...] = field(repr=False)
    vllm_argv: tuple[tuple[str, ...], ...] = field(repr=False)
    plan_hash: str = ""
    # What the stack changed relative to the recipe, one line each, with its source (plan).
    stack_notes: tuple[str, ...] = ()
    nnodes: int = 2  # the group's size: 2 (a pair) or 4; TP = nnodes
    sparks: tuple[str, ...] = ()  # SPARK1..SPARK<nnodes>
    fabrics: tuple[str, ...] = ()  # each rank's fabric address (FABRIC<R+1> or SPARK<R+1>)
    ssh_targets: tuple[str, ...] = ()  # ``[user@]SPARK<R+1>``; rank 0's is unused (local)
    cabling: str = cab.SWITCHED  # CABLING (a pair's is one cable whatever it says)
    # The container variables the cabling adds (pairctl.pair.cabling; none for a pair).
    cabling_env: tuple[cab.Setting, ...] = ()

    @property
    def ranks(self) -> range:
        """Every rank of the group, 0 (the head) first."""
        return range(self.nnodes)

    @property
    def headless_ranks(self) -> range:
        """The ranks over ssh (1..nnodes-1), started before the head."""
        return range(1, self.nnodes)

    @property
    def tilelang_cache_dir(self) -> str:
        return self.caches["TILELANG_CACHE_DIR"]

    @property
    def endpoint(self) -> str:
        """Base URL of the pair's endpoint on rank 0 (``pairctl.endpoint``'s rules: an IPv6
        literal gets brackets)."""
        return Endpoint.for_host(self.spark1, self.port).base

    def node_addr(self, rank: int) -> str:
        """The address a rank's node is reached at (SPARK<rank+1>)."""
        return self.sparks[rank]

    def node_image(self, rank: int) -> str:
        """IMAGE as a rank's node names it: a headless rank holds a digest-pinned IMAGE
        under the tag `image ship` gives it after the load (pairctl.engine.image.node_ref)."""
        return node_ref(self.image, rank)

    def fabric_addr(self, rank: int) -> str:
        """The address a rank's engine uses on the fabric (its VLLM_HOST_IP):
        FABRIC<rank+1>."""
        return self.fabrics[rank]

    def with_head(self, rank: int) -> ResolvedPair:
        """The head and one headless rank as the two nodes a pair-shaped check (preflight's)
        judges: ``nodes`` is (rank 0, ``rank``), and spark2/fabric2/ssh_target are that
        rank's; the per-rank tuples stay whole, indexed by rank number (the second node
        keeps its own). A pair's own rank 1 gives the pair itself."""
        if self.nnodes == 2 and rank == 1:
            return self
        if rank not in self.headless_ranks:
            raise ValueError(f"rank {rank} is not a headless rank of this group")
        return replace(
            self,
            spark2=self.sparks[rank],
            fabric2=self.fabrics[rank],
            ssh_target=self.ssh_targets[rank],
            nodes=(self.nodes[0], self.nodes[rank]),
        )


def resolve(
    cfg: PairConfig,
    recipe: Recipe,
    passthrough: Sequence[str] = (),
    image_patched: bool | None = None,
) -> ResolvedPair:
    """Settle everything the env file, recipe and engine stack leave open; raises
    ConfigError. ``image_patched``: whether the image carries the stack's concurrency
    patch (None: not known, as in ``plan``; pairctl.pair.stacked.serve_keys)."""
    extra = tuple(passthrough)
    full = derive.with_recipe_defaults(cfg, recipe)
    check_port_clash(cfg, full["PORT"])
    check_passthrough(list(extra))
    stack = load_stack(derive.stack_name(full, recipe), recipe.path)
    image = derive.resolve_image(full, recipe, stack)
    n = full.nnodes
    ranks = range(n)
    group, group_notes = derive.group_serve(recipe.serve, n) if n > 2 else (recipe.serve, [])
    serve, notes = stacked.serve_keys(group, stack, image_patched)
    notes = group_notes + notes
    wired = cab.cabling_env(full["CABLING"], n)
    notes += [f"env {s.name}={s.value}: cabling {full['CABLING']} ({s.source})" for s in wired]
    notes += stacked.env_notes(recipe.env, stack)
    if image != (full["IMAGE"] or recipe.image):
        notes.insert(0, f"image {image}: stack {stack.name}'s image.default ({stack.image_source})")
    values = tuple(MappingProxyType(derive.placeholders(full, r)) for r in ranks)
    argvs = tuple(
        tuple(derive.vllm_args(full, serve, r, values[r], extra, stack.entrypoint)) for r in ranks
    )
    envs = [
        derive.container_env(recipe, r, values[r], overlay=True, stack=stack, cabling=wired)
        for r in ranks
    ]
    return ResolvedPair(
        recipe=recipe,
        stack=stack,
        passthrough=extra,
        env_file=full.env_file,
        unknown=full.unknown,
        pair_id=full["PAIR_ID"],
        spark1=full["SPARK1"],
        spark2=full["SPARK2"],
        ssh_target=full.ssh_target(),
        fabric1=full.fabric_addr(0),
        fabric2=full.fabric_addr(1),
        master_addr=full.master_addr,
        master_port=int(full["MASTER_PORT"]),
        port=int(full["PORT"]),
        image=image,
        model_path=full["MODEL_PATH"],
        overlay_dir=full["OVERLAY_DIR"],
        model_repo=full["MODEL_REPO"] or recipe.model_repo or "",
        model_revision=full["MODEL_REVISION"] or recipe.model_revision or "",
        nccl_socket_ifname=full["NCCL_SOCKET_IFNAME"],
        gloo_socket_ifname=full["GLOO_SOCKET_IFNAME"],
        nccl_ib_hca=full["NCCL_IB_HCA"],
        nccl_ib_gid_index=full["NCCL_IB_GID_INDEX"],
        rdma_device_dir=full["RDMA_DEVICE_DIR"],
        container_user=full["CONTAINER_USER"],
        caches=MappingProxyType({v: full[v] for v in CACHE_VARS}),
        nodes=nodes(full),
        evidence_config=MappingProxyType(
            {k: ("***" if derive.is_secret(k) and v else v) for k, v in full.values.items()}
        ),
        api_key=full["VLLM_API_KEY"],
        hf_token=full["HF_TOKEN"],
        placeholders=values,
        vllm_argv=argvs,
        plan_hash=derive.plan_hash(argvs, envs, image),
        stack_notes=tuple(notes),
        nnodes=n,
        sparks=tuple(full.spark(r) for r in ranks),
        fabrics=tuple(full.fabric_addr(r) for r in ranks),
        ssh_targets=tuple(full.ssh_target(r) for r in ranks),
        cabling=full["CABLING"],
        cabling_env=wired,
    )


def warn_unknown(cfg: PairConfig, say: Callable[[str], None]) -> None:
    """Unknown variables in the env file: named, unless the name looks like a secret."""
    for k in cfg.unknown:
        shown = "" if derive.is_secret(k) else f" ({k})"
        say(f"WARN: {cfg.env_file}: unknown variable{shown} ignored; see .env.example")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def load(
    env_file: str | Path,
    recipe_file: str | Path,
    passthrough: Sequence[str] = (),
    say: Callable[[str], None] = _stderr,
) -> ResolvedPair:
    """Read and validate the env file and recipe, then resolve (the top of every command)."""
    cfg = load_env_file(env_file)
    warn_unknown(cfg, say)
    return resolve(cfg, load_recipe(recipe_file), passthrough)
