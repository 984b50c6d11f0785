"""Typed preflight evidence: what the probe saw on each node, and how it reached it.

``pairctl.preflight.probe`` builds these from the nodes and ``pairctl.preflight`` decides on them
only, so every verdict replays on recorded evidence. ``dataclasses.asdict(Evidence)`` is the
``evidence`` object of ``preflight --json`` (schema_version 1); ``Evidence.from_dict``
reads one back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pairctl.engine.image import ImageFacts
from pairctl.nodes.docker import Container
from pairctl.preflight.imageprobe import ImageProbe
from pairctl.preflight.probe_host import IbPort, Link
from pairctl.preflight.reach import Reach
from pairctl.preflight.roce import Gid


@dataclass(frozen=True)
class NodeEvidence:
    """One node's probe output, then the transport result (ssh for rank 1).

    Defaults describe a node that was never reached, so a recorded file or a test states
    only what it saw.
    """

    complete: bool = False  # the probe ran to its end marker
    hostname: str = ""
    addrs: list[str] = field(default_factory=list)
    ifaddrs: dict[str, list[str]] = field(default_factory=dict)  # interface -> its addresses
    netdevs: list[str] = field(default_factory=list)
    ibdevs: dict[str, str] = field(default_factory=dict)  # RDMA device -> sysfs device path
    listen_ports: list[int] = field(default_factory=list)
    docker_ps_rc: int | None = None
    containers: list[Container] = field(default_factory=list)  # every dsv4.pair-labelled one
    docker_ps_error: str = ""
    image_id: str | None = None
    image_error: str = ""
    model_dir: bool = False
    model_files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    tilelang_ok: bool = False
    overlay_dir: bool = False
    overlay_files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    roce_gids: list[Gid] = field(default_factory=list)
    image_facts: ImageFacts | None = None  # docker image inspect IMAGE (None: not found)
    kernel: str = ""  # uname -r
    gpu: str = ""  # nvidia-smi's GPU name ("" none visible)
    meminfo: dict[str, int] = field(default_factory=dict)  # /proc/meminfo, kB
    rdma_dir: bool = False  # RDMA_DEVICE_DIR exists
    uverbs: list[str] = field(default_factory=list)  # uverbs* character devices in it
    links: list[Link] = field(default_factory=list)  # netdev MTU and operstate
    ibports: list[IbPort] = field(default_factory=list)  # RDMA port state and netdev
    cache_dirs: dict[str, bool] = field(default_factory=dict)  # cache var -> writable
    model_revision: str = ""  # HF commit of MODEL_PATH ("" unknown)
    earlyoom: bool = False  # an earlyoom process runs
    rc: int | None = None
    stderr: str = ""
    reachable: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeEvidence:
        """Recorded evidence (the ``--json`` shape) back into the dataclass; unknown keys fail."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown node evidence field(s): {', '.join(unknown)}")
        kw = dict(data)
        kw["containers"] = [
            c
            if isinstance(c, Container)
            else Container(
                id=str(c.get("id", "")),
                name=str(c.get("name", "")),
                state=str(c.get("state", "")),
                labels=dict(c.get("labels", {})),
            )
            for c in kw.get("containers", [])
        ]
        kw["roce_gids"] = [g if isinstance(g, Gid) else Gid(**g) for g in kw.get("roce_gids", [])]
        kw["links"] = [x if isinstance(x, Link) else Link(**x) for x in kw.get("links", [])]
        kw["ibports"] = [x if isinstance(x, IbPort) else IbPort(**x) for x in kw.get("ibports", [])]
        facts = kw.get("image_facts")
        if isinstance(facts, Mapping):
            kw["image_facts"] = ImageFacts(**facts)
        return cls(**kw)


@dataclass(frozen=True)
class ArgvCheck:
    """Both ranks' vLLM argv, read by vLLM's own parser (pairctl.preflight.argcheck)."""

    where: str = ""  # which parser: "this machine's vLLM 0.33.0" or "image sha256:... on ..."
    ran: bool = False
    detail: str = ""  # why it did not run, or that it passed before (cached)
    errors: list[str] = field(default_factory=list)  # one explained rejection per bad flag

    @property
    def ok(self) -> bool:
        return self.ran and not self.errors


@dataclass(frozen=True)
class Evidence:
    """Everything preflight looked at: both nodes plus name resolution on this machine."""

    config: dict[str, str] = field(default_factory=dict)  # env values, secrets masked
    # SPARK1/SPARK2/FABRIC1/FABRIC2/MASTER_ADDR
    resolved: dict[str, str | None] = field(default_factory=dict)
    image: str = ""
    nodes: dict[str, NodeEvidence] = field(  # keys "0", "1" (JSON object keys)
        default_factory=lambda: {"0": NodeEvidence(), "1": NodeEvidence()}
    )
    argv_check: ArgvCheck = field(default_factory=ArgvCheck)
    reach: Reach = field(default_factory=Reach)  # rank 1 -> MASTER_ADDR:MASTER_PORT
    # the image's own interpreter, per probed node ("0", "1"): pairctl.preflight.imageprobe
    image_probes: dict[str, ImageProbe] = field(default_factory=dict)

    @property
    def rank0(self) -> NodeEvidence:
        return self.nodes["0"]

    @property
    def rank1(self) -> NodeEvidence:
        return self.nodes["1"]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        """The ``evidence`` object of a ``preflight --json`` file back into the dataclass."""
        return cls(
            config=dict(data.get("config", {})),
            resolved=dict(data.get("resolved", {})),
            image=str(data.get("image", "")),
            nodes={r: NodeEvidence.from_dict(n) for r, n in data["nodes"].items()},
            argv_check=ArgvCheck(**data.get("argv_check", {})),
            reach=Reach(**data.get("reach", {})),
            image_probes={
                r: ImageProbe.from_dict(p) for r, p in (data.get("image_probes") or {}).items()
            },
        )
