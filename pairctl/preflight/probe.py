"""Evidence collection for preflight: one POSIX sh script per node, parsed into dataclasses.

The script only reads (plus ``mkdir -p`` of the JIT cache dirs, which preflight creates
when missing). Its output is plain sections, parsed into ``pairctl.preflight.evidence`` records, so
recorded evidence replays in unit tests of the decisions in ``pairctl.preflight``. The
host sections (kernel, memory, RDMA devices, links, caches, model revision, earlyoom) are
``probe_host``'s; the RoCE GID table is ``roce``'s (both in ``pairctl.preflight``). After the
probes, ``gather`` has vLLM's own parser read the argv (``pairctl.preflight.argcheck``):
locally when vLLM is importable here, else the image's parser in a throwaway container on
SPARK1. And as each node's probe shows the image, the image's own interpreter reads what
the image runs (``pairctl.preflight.imageprobe``).
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace

from pairctl.engine.image import parse_inspect
from pairctl.engine.stack import HOOKS_ENV
from pairctl.nodes.docker import parse_ps
from pairctl.nodes.ssh import SSH_CONNECT_TIMEOUT_S, Node
from pairctl.pair.config import CACHE_VARS
from pairctl.pair.derive import OVERLAY_MOUNT, container_env, is_secret
from pairctl.pair.plan import LABEL_PAIR
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight import argcheck, fabric_ssh, imageprobe, probe_host, reach
from pairctl.preflight.evidence import ArgvCheck, Evidence, NodeEvidence
from pairctl.preflight.imageprobe import ImageProbe
from pairctl.preflight.roce import PROBE_SECTION as _ROCE_SECTION
from pairctl.preflight.roce import parse_gids

MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")

_SCRIPT = r"""
sec() { printf '\n==== %s ====\n' "$1"; }
sec hostname; hostname 2>/dev/null || cat /proc/sys/kernel/hostname
# every address with its interface (PF-FABRIC-ADDR: `ip -o addr show dev IFACE` for every
# IFACE at once); the node's address list is read from it too
sec ifaddrs; ip -o addr show 2>/dev/null | awk '{print $2, $4}'
sec netdevs; ls /sys/class/net 2>/dev/null
sec ibdevs
for d in /sys/class/infiniband/*; do
  [ -e "$d" ] && printf '%s %s\n' "${d##*/}" "$(readlink -f "$d/device" 2>/dev/null)"
done
sec listen; ss -Htln 2>/dev/null | awk '{print $4}'; echo "rc=$?"
sec docker_ps
docker ps -a --no-trunc --filter "label=$LABEL" --format '{{json .}}' 2>&1; echo "rc=$?"
sec image; docker image inspect "$IMAGE" 2>&1; echo "rc=$?"
sec model
if [ -d "$MODEL" ]; then echo "dir=yes"; else echo "dir=no"; fi
for f in $MODEL_FILES; do
  if [ -f "$MODEL/$f" ]; then echo "$(sha256sum < "$MODEL/$f" | cut -d' ' -f1) $f"; fi
done
sec tilelang
if mkdir -p "$TL" 2>/dev/null && [ -w "$TL" ]; then echo ok; else echo fail; fi
sec overlays
# every file: PF-OVERLAYS then compares only what the plugin ships (pairctl/engine/overlays.py)
if [ -d "$OV" ]; then
  echo "dir=yes"
  (cd "$OV" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
     ! -path '*.egg-info/*' ! -path './build/*' -exec sha256sum {} + 2>/dev/null | sort -k2)
else echo "dir=no"; fi
"""  # the RoCE GID table, the host facts and the end marker follow

_SCRIPT += _ROCE_SECTION + probe_host.PROBE_SECTION + "sec end\n"


def probe_script(pair: ResolvedPair, rank: int = 0) -> str:
    """The probe for one rank's node with this pair's values bound as shell variables
    (safely quoted); IMAGE as that node names it (``ResolvedPair.node_image``)."""
    binds = {
        "LABEL": LABEL_PAIR,
        "IMAGE": pair.node_image(rank),
        "MODEL": pair.model_path,
        "MODEL_FILES": " ".join(MODEL_FILES),
        "TL": pair.tilelang_cache_dir,
        "OV": pair.overlay_dir,
        "RDMA": pair.rdma_device_dir,
        # the TileLang cache has its own section (PF-TILELANG-CACHE)
        "CACHES": " ".join(f"{v}={pair.caches[v]}" for v in CACHE_VARS[1:]),
    }
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in binds.items())
    return head + _SCRIPT


def split_sections(text: str) -> dict[str, list[str]]:
    """``==== name ====`` blocks → {name: lines}."""
    out: dict[str, list[str]] = {}
    cur: str | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("==== ") and s.endswith(" ===="):
            cur = s[5:-5].strip()
            out[cur] = []
        elif cur is not None and s:
            out[cur].append(s)
    return out


def _rc(lines: list[str]) -> tuple[int | None, list[str]]:
    if lines and lines[-1].startswith("rc="):
        try:
            return int(lines[-1][3:]), lines[:-1]
        except ValueError:
            pass
    return None, lines


def _digests(lines: list[str]) -> dict[str, str]:
    """``sha256 name`` lines of a section (``dir=`` markers skipped) → {name: digest}."""
    out = {}
    for line in lines:
        if line.startswith("dir="):
            continue
        digest, _, name = line.partition(" ")
        out[name.strip().removeprefix("./")] = digest
    return out


def parse_ifaddrs(lines: list[str]) -> dict[str, list[str]]:
    """``ip -o addr show`` name and address columns (``enp1s0f1np1 10.0.0.1/24``; a veth
    may show as ``veth0@if5``) → {interface: [addresses without prefix length]}."""
    out: dict[str, set[str]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            name = parts[0].rstrip(":").split("@")[0]
            out.setdefault(name, set()).add(parts[1].split("/")[0])
    return {k: sorted(v) for k, v in sorted(out.items())}


def _all(ifaddrs: dict[str, list[str]]) -> list[str]:
    return [a for addrs in ifaddrs.values() for a in addrs]


def _ports(addrs: list[str]) -> list[int]:
    """``ss`` local addresses (``0.0.0.0:22``, ``[::]:8000``) → sorted listening ports."""
    ports = set()
    for addr in addrs:
        tail = addr.rsplit(":", 1)[-1]
        if tail.isdigit():
            ports.add(int(tail))
    return sorted(ports)


def parse_probe(text: str) -> NodeEvidence:
    """Parse the probe's stdout into one node's evidence (transport fields left default)."""
    sec = split_sections(text)
    ifaddrs = parse_ifaddrs(sec.get("ifaddrs", []))  # (older recordings: an "addrs" section)
    ib = {}
    for line in sec.get("ibdevs", []):
        name, _, dev = line.partition(" ")
        ib[name] = dev
    _, listen = _rc(sec.get("listen", []))
    ps_rc, ps_lines = _rc(sec.get("docker_ps", []))
    img_rc, img = _rc(sec.get("image", []))
    facts = parse_inspect("\n".join(img)) if img_rc == 0 else None
    rdma = sec.get("rdma", [])
    model = sec.get("model", [])
    ov = sec.get("overlays", [])
    return NodeEvidence(
        complete="end" in sec,
        hostname=(sec.get("hostname") or [""])[0],
        addrs=sorted({a.split("/")[0] for a in sec.get("addrs", [])} | set(_all(ifaddrs))),
        ifaddrs=ifaddrs,
        netdevs=sorted(sec.get("netdevs", [])),
        ibdevs=ib,
        listen_ports=_ports(listen),
        docker_ps_rc=ps_rc,
        containers=parse_ps("\n".join(ps_lines)),
        docker_ps_error="" if ps_rc == 0 else " ".join(ps_lines)[:300],
        image_id=facts.id if facts else None,
        image_error="" if img_rc == 0 else " ".join(img)[:300],
        image_facts=facts,
        model_dir="dir=yes" in model,
        model_files=_digests(model),
        tilelang_ok=(sec.get("tilelang") or [""])[0] == "ok",
        overlay_dir="dir=yes" in ov,
        overlay_files=_digests(ov),
        roce_gids=parse_gids(sec.get("roce_gids", [])),
        kernel=(sec.get("kernel") or [""])[0],
        gpu=(sec.get("gpu") or [""])[0],
        meminfo=probe_host.parse_meminfo(sec.get("meminfo", [])),
        rdma_dir="dir=yes" in rdma,
        uverbs=sorted(x for x in rdma if not x.startswith("dir=")),
        links=probe_host.parse_links(sec.get("links", [])),
        ibports=probe_host.parse_ibports(sec.get("ibports", [])),
        cache_dirs=probe_host.parse_caches(sec.get("caches", [])),
        model_revision=probe_host.parse_model_rev(sec.get("model_rev", [])),
        earlyoom=bool(sec.get("earlyoom")),
    )


def collect(node: Node, pair: ResolvedPair) -> NodeEvidence:
    """Run the probe on a node; evidence plus how the transport went."""
    res = node.run_script(probe_script(pair, node.rank), timeout=60)
    ev = parse_probe(res.out)
    return replace(
        ev,
        rc=res.rc,
        stderr=res.err.strip()[-600:],
        reachable=ev.complete or (res.rc not in (255, 124, 127) and bool(res.out)),
    )


def resolve(host: str) -> str | None:
    """First IPv4/IPv6 address for a host name or literal; None if it does not resolve."""
    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except (socket.gaierror, OSError, IndexError):
        return None


# Stages of gather(), in the order their evidence can arrive ("rank0"/"rank1" either way;
# "argv" right after "rank0", whose image facts the image's parser needs; "reach" once both
# probes are in: rank 0's port listing must not see the test's own listener; "image" once
# every probed node's image probe is in, each started when its node's probe showed the image;
# "fabric", the ssh to FABRIC2, alongside the probes).
NAMES, RANK0, RANK1, ARGV, REACH = "names", "rank0", "rank1", "argv", "reach"
IMAGE = "image"
FABRIC = "fabric"
_IMAGE_JOB = {RANK0: "image0", RANK1: "image1"}
HEARTBEAT_S = 5.0


def check_argv(
    node: Node, pair: ResolvedPair, ev0: NodeEvidence, local: ArgvCheck | None
) -> ArgvCheck:
    """The argv check's evidence: the local result if there was one, else the image's."""
    if local is not None:
        return local
    if ev0.image_facts is None:
        return ArgvCheck("image", False, f"{pair.image} is not on rank 0, so its parser cannot run")
    return argcheck.run_in_image(node, pair, ev0.image_facts.id)


def probe_env(pair: ResolvedPair, rank: int, ev: NodeEvidence) -> dict[str, str]:
    """The image probe's env: the rank's container env as ``up`` builds it (the stack's env,
    PATH-like values in front of the image's own, PYTHONPATH with the overlays, the stack's
    hook points), less the recipe's ``${...}`` values (addresses and host paths: they change
    no answer and would defeat the cache) and every secret."""
    full = container_env(
        pair.recipe, rank, pair.placeholders[rank], ev.overlay_dir, ev.image_facts, pair.stack
    )
    keep = {k for k, v in pair.recipe.env.items() if "${" not in str(v)}
    keep |= {v.name for v in pair.stack.env} | {"PYTHONPATH", HOOKS_ENV}
    return {k: v for k, v in full.items() if k in keep and not is_secret(k)}


def probe_image(node: Node, pair: ResolvedPair, ev: NodeEvidence) -> ImageProbe:
    """The image probe on ``node``, the overlay folder mounted when the node has one."""
    if ev.image_facts is None:
        return ImageProbe(
            where=node.label, interpreter=pair.stack.interpreter, detail=imageprobe.NOT_ON_NODE
        )
    return imageprobe.run(
        node,
        pair_id=pair.pair_id,
        image=pair.node_image(node.rank),  # rank 1: a digest-pinned IMAGE's local name
        image_id=ev.image_facts.id,
        interpreter=pair.stack.interpreter,
        env=probe_env(pair, node.rank, ev),
        overlay_dir=pair.overlay_dir if ev.overlay_dir else None,
        overlay_mount=OVERLAY_MOUNT,
        overlay_files=ev.overlay_files if ev.overlay_dir else {},
    )


def gather(
    pair: ResolvedPair,
    on_stage: Callable[[str, Evidence], None] | None = None,
    progress: Callable[[str], None] | None = None,
    probe_rank1: bool = True,
    check_args: bool = False,
    local_argv: ArgvCheck | None = None,
    check_reach: bool = False,
    check_fabric_ssh: bool = False,
    check_image: bool = False,
) -> Evidence:
    """Evidence from both nodes plus local name resolution (secrets masked in ``config``).

    The two probes run at the same time. ``on_stage(stage, evidence so far)`` is called
    once names resolved and as each probe finishes, so checks can be reported as soon as
    their evidence is in; ``progress`` hears what is being waited on, with a heartbeat
    every ``HEARTBEAT_S`` seconds. ``probe_rank1=False`` leaves rank 1 unreached (for steps
    that only need to know who this machine is).

    ``check_args`` asks for the argv check: ``local_argv`` when a local vLLM
    already read both ranks' argv, else the image's own parser on SPARK1 once rank 0's
    probe has shown the image (stage ``ARGV``).

    ``check_reach`` asks for the reach test (``pairctl.preflight.reach``, stage ``REACH``)
    once both probes are in and rank 1 answered.

    ``check_image`` asks for the image probe on each node that answered and has the image,
    started as soon as that node's probe is in (stage ``IMAGE`` once all are done).

    ``check_fabric_ssh`` asks for the bulk copies' ssh to FABRIC2
    (``pairctl.preflight.fabric_ssh``, stage ``FABRIC``), alongside the probes; with
    FABRIC2 = SPARK2 there is nothing more to ask and the stage is reached at once.
    """
    say = progress or (lambda _msg: None)
    image = pair.image
    n0, n1 = pair.nodes[:2]  # the head and rank 1 (a group's other ranks: preflight.group)
    say(
        f"resolving SPARK1 ({pair.spark1}), SPARK2 ({pair.spark2}), the fabric addresses and "
        "MASTER_ADDR on this machine"
    )
    ev = Evidence(
        config=dict(pair.evidence_config),
        resolved={
            "SPARK1": resolve(pair.spark1),
            "SPARK2": resolve(pair.spark2),
            "FABRIC1": resolve(pair.fabric1),
            "FABRIC2": resolve(pair.fabric2),
            "MASTER_ADDR": resolve(pair.master_addr),
        },
        image=image,
    )
    if on_stage:
        on_stage(NAMES, ev)
    want_argv = check_args
    if want_argv and local_argv is not None:
        ev = replace(ev, argv_check=local_argv)
        want_argv = False
        if on_stage:
            on_stage(ARGV, ev)
    waits = {RANK0: f"rank 0 (this machine, {n0.addr})"}
    if probe_rank1:
        waits[RANK1] = (
            f"rank 1 over ssh ({n1.addr}; ssh gives up after {SSH_CONNECT_TIMEOUT_S} s "
            "without an answer)"
        )
    ask_fabric = check_fabric_ssh and probe_rank1 and pair.fabric2 != pair.spark2
    if check_fabric_ssh and not ask_fabric and on_stage:
        on_stage(FABRIC, ev)
    if ask_fabric:
        waits[FABRIC] = f"ssh to FABRIC2 ({pair.fabric2}) for the bulk copies"
    say("probing " + " and ".join(waits.values()))
    started = time.monotonic()
    seen: set[str] = set()  # stages whose result is in ev
    image_left: set[str] = set()  # image probes still running
    image_fired = False
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = {pool.submit(collect, n0, pair): RANK0}
        if probe_rank1:
            futures[pool.submit(collect, n1, pair)] = RANK1
        if ask_fabric:
            futures[pool.submit(fabric_ssh.probe, n1, pair.fabric2)] = FABRIC
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futures[f]):
                stage = futures[fut]
                if stage == ARGV:
                    ev = replace(ev, argv_check=fut.result())
                elif stage == REACH:
                    ev = replace(ev, reach=fut.result())
                elif stage == FABRIC:
                    ev = replace(ev, fabric_ssh=fut.result())
                elif stage in _IMAGE_JOB.values():
                    key = stage[-1]
                    ev = replace(ev, image_probes={**ev.image_probes, key: fut.result()})
                    image_left.discard(stage)
                else:
                    key = "0" if stage == RANK0 else "1"
                    ev = replace(ev, nodes={**ev.nodes, key: fut.result()})
                if stage in (RANK0, RANK1) and check_image:
                    node_ev = ev.rank0 if stage == RANK0 else ev.rank1
                    if node_ev.reachable:
                        n = n0 if stage == RANK0 else n1
                        job = pool.submit(probe_image, n, pair, node_ev)
                        futures[job] = _IMAGE_JOB[stage]
                        waits[_IMAGE_JOB[stage]] = f"the image's interpreter on {n.label}"
                        image_left.add(_IMAGE_JOB[stage])
                        pending.add(job)
                if stage == RANK0 and want_argv:
                    waits[ARGV] = f"the image's vLLM parser on rank 0 ({image})"
                    job = pool.submit(check_argv, n0, pair, ev.rank0, None)
                    futures[job] = ARGV
                    pending.add(job)
                probes_in = {RANK0, RANK1} <= {futures[f] for f in futures if f.done()}
                ask = check_reach and REACH not in waits and ev.rank1.reachable
                if stage in (RANK0, RANK1) and ask and probes_in:
                    master = ev.resolved.get("MASTER_ADDR")
                    if master:
                        waits[REACH] = (
                            f"rank 1 connecting to {pair.master_addr}:{pair.master_port} here"
                        )
                        job = pool.submit(
                            reach.reach_master, n1, master, pair.master_port, pair.master_addr
                        )
                        futures[job] = REACH
                        pending.add(job)
                if on_stage and stage not in _IMAGE_JOB.values():
                    on_stage(stage, ev)
                seen.add(stage)
                ranks_in = {RANK0, RANK1} if probe_rank1 else {RANK0}
                if check_image and not image_fired and ranks_in <= seen and not image_left:
                    image_fired = True
                    if on_stage:
                        on_stage(IMAGE, ev)
            if pending and not done:
                names = ", ".join(waits[futures[f]].split(" (")[0] for f in pending)
                say(f"still waiting for {names}: {time.monotonic() - started:.0f} s")
    return ev
