"""Preflight: read-only checks with stable IDs, PASS/WARN/FAIL and a remedy each.

Every *decision* is a pure function of recorded evidence (``pairctl.probe``) plus the
config, so the verdicts are unit-tested without nodes. ``up`` runs this first and stops on
any FAIL before a single container is started or removed (exit 3).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pairctl.config import PairConfig
from pairctl.plan import (
    FORBIDDEN_ENV,
    LABEL_PAIR,
    build_rank,
    resolve_image,
    with_recipe_defaults,
)
from pairctl.recipe import Recipe
from pairctl.roce import decide_gid

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    """One verdict. ``id`` is stable: docs and tests refer to it."""

    id: str
    status: str
    what: str
    detail: str
    remedy: str = ""


# ID → what it checks, its remedy (README's table is generated from the same text).
CATALOGUE: dict[str, tuple[str, str]] = {
    "PF-SSH": (
        "ssh to SPARK2 works with BatchMode and strict host-key checking",
        "fix SPARK2/SSH_* in the env file; add SPARK2's host key to the known_hosts "
        "file after verifying its fingerprint (never disable host-key checking)",
    ),
    "PF-SELF-IS-SPARK1": (
        "the machine running the launcher is SPARK1 and MASTER_ADDR",
        "run the launcher on the rank-0 node, or fix SPARK1/MASTER_ADDR",
    ),
    "PF-DISTINCT-NODES": (
        "SPARK2 is a different machine from SPARK1",
        "set SPARK2 to this pair's rank-1 node (a copied env file still "
        "pointing elsewhere is how the seed's incident started)",
    ),
    "PF-FOREIGN-PAIR": (
        "no container of another pair runs on either node",
        "this env file points at another pair's node: fix SPARK1/SPARK2/"
        "PAIR_ID; never remove the other pair's containers from here",
    ),
    "PF-IMAGE-MATCH": (
        "the same image ID exists on both nodes",
        "docker pull IMAGE on both nodes, or docker save | ssh SPARK2 docker load",
    ),
    "PF-MODEL-MATCH": (
        "MODEL_PATH exists on both nodes with the same config/tokenizer files",
        "copy the model to the same path on both nodes (rsync -a), then re-run",
    ),
    "PF-PORT-FREE": (
        "PORT is free on SPARK1 (or held by this pair's own stale container)",
        "stop the process holding the port (ss -ltnp 'sport = :PORT') or set PORT",
    ),
    "PF-MASTER-PORT-FREE": (
        "MASTER_PORT is free on SPARK1 (or held by this pair's container)",
        "stop the process holding it or set MASTER_PORT",
    ),
    "PF-NCCL-IFACE": (
        "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME exist on each node",
        "set them to the RoCE link's netdev (ip -br link) on both nodes",
    ),
    "PF-TILELANG-CACHE": (
        "TILELANG_CACHE_DIR exists and is writable on both nodes",
        "mkdir -p TILELANG_CACHE_DIR and fix its owner on that node",
    ),
    "PF-HCA-2RAIL": (
        "NCCL_IB_HCA names one port per card (2-rail)",
        "list one port of each card, e.g. NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1; "
        "4-rail fails with ibv_modify_qp ... 110",
    ),
    "PF-ROCE-GID": (
        "each NCCL_IB_HCA port has a RoCEv2 IPv4 GID, and a pinned "
        "NCCL_IB_GID_INDEX points at it on both nodes",
        "unset NCCL_IB_GID_INDEX (NCCL picks RoCEv2) or set it to the index shown; "
        "check the port's netdev has its IPv4 address (ip -br addr)",
    ),
    "PF-NO-COMPRESSED-MLA": (
        f"{FORBIDDEN_ENV} is set nowhere",
        f"remove {FORBIDDEN_ENV} from the recipe, env file and extra args "
        "(it once wedged a host's unified memory)",
    ),
    "PF-NO-RAY": (
        "the executor is PyTorch-distributed (mp), never Ray",
        "use distributed-executor-backend: mp; with Ray TP=2 collapses onto one GPU",
    ),
    "PF-OVERLAYS": (
        "OVERLAY_DIR on both nodes matches mods/dsv4-flash-overlays (WARN only)",
        "run launch/dspark_launch.sh sync-overlays --env-file FILE",
    ),
}


def _mk(cid: str, status: str, detail: str) -> Check:
    what, remedy = CATALOGUE[cid]
    return Check(cid, status, what, detail, remedy if status in (FAIL, WARN) else "")


def resolve(host: str) -> str | None:
    """First IPv4/IPv6 address for a host name or literal; None if it does not resolve."""
    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except (socket.gaierror, OSError, IndexError):
        return None


# ---------------------------------------------------------------- decisions (pure)


def check_ssh(n1: dict[str, Any]) -> Check:
    if n1.get("reachable"):
        return _mk("PF-SSH", PASS, "SPARK2 answered over ssh")
    err = n1.get("stderr", "")
    hint = ""
    if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION" in err:
        hint = " (host key unknown or changed)"
    elif "Permission denied" in err:
        hint = " (authentication: check SSH_USER / SSH_IDENTITY_FILE)"
    elif "timed out" in err.lower() or "No route" in err or "refused" in err:
        hint = " (host unreachable: check SPARK2 / SSH_PORT)"
    return _mk("PF-SSH", FAIL, f"ssh failed rc={n1.get('rc')}{hint}: {err[-200:]}")


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_self(resolved: dict[str, str | None], n0: dict[str, Any]) -> Check:
    addrs = set(n0.get("addrs", []))
    bad = []
    for key in ("SPARK1", "MASTER_ADDR"):
        ip = resolved.get(key)
        if ip is None:
            bad.append(f"{key} does not resolve")
        elif ip not in addrs:
            bad.append(f"{key}={ip} is not an address of this machine")
    master, spark2 = resolved.get("MASTER_ADDR"), resolved.get("SPARK2")
    if master and spark2 and _loopback(master) and not _loopback(spark2):
        bad.append(f"MASTER_ADDR={master} is loopback: rank 1 cannot reach it")
    if bad:
        return _mk(
            "PF-SELF-IS-SPARK1",
            FAIL,
            "; ".join(bad) + f" (local addrs: {', '.join(sorted(addrs)) or 'none'})",
        )
    return _mk("PF-SELF-IS-SPARK1", PASS, f"this machine has {resolved.get('SPARK1')}")


def check_distinct(resolved: dict[str, str | None], n1: dict[str, Any]) -> Check:
    s1, s2 = resolved.get("SPARK1"), resolved.get("SPARK2")
    if s2 is None:
        return _mk("PF-DISTINCT-NODES", FAIL, "SPARK2 does not resolve")
    if s1 == s2:
        return _mk("PF-DISTINCT-NODES", FAIL, f"SPARK1 and SPARK2 are both {s1}")
    if n1.get("reachable") and s1 in set(n1.get("addrs", [])):
        return _mk(
            "PF-DISTINCT-NODES",
            FAIL,
            f"ssh to SPARK2 landed on a machine that has SPARK1's address {s1}",
        )
    return _mk("PF-DISTINCT-NODES", PASS, f"SPARK1 {s1} != SPARK2 {s2}")


def check_foreign(pair_id: str, n0: dict[str, Any], n1: dict[str, Any]) -> Check:
    running: list[str] = []
    stopped: list[str] = []
    errors: list[str] = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.get("reachable"):
            continue
        if ev.get("docker_ps_rc") not in (0, None):
            errors.append(f"rank {rank}: docker ps failed: {ev.get('docker_ps_error', '')}")
            continue
        for c in ev.get("containers", []):
            other = c.get("labels", {}).get(LABEL_PAIR)
            if other is None or other == pair_id:
                continue
            desc = f"rank {rank} runs {c.get('name')} of pair '{other}'"
            (running if str(c.get("state", "")).lower() == "running" else stopped).append(desc)
    if running:
        return _mk("PF-FOREIGN-PAIR", FAIL, "; ".join(running))
    if errors:
        return _mk("PF-FOREIGN-PAIR", FAIL, "; ".join(errors))
    if stopped:
        return _mk("PF-FOREIGN-PAIR", WARN, "stopped: " + "; ".join(stopped))
    return _mk("PF-FOREIGN-PAIR", PASS, "no other pair's containers on either node")


def check_image(image: str, n0: dict[str, Any], n1: dict[str, Any]) -> Check:
    ids = {0: n0.get("image_id"), 1: n1.get("image_id")}
    missing = [f"rank {r}" for r, i in ids.items() if not i]
    if missing:
        return _mk("PF-IMAGE-MATCH", FAIL, f"{image} not found on {', '.join(missing)}")
    if ids[0] != ids[1]:
        return _mk("PF-IMAGE-MATCH", FAIL, f"{image}: rank 0 {ids[0]} != rank 1 {ids[1]}")
    return _mk("PF-IMAGE-MATCH", PASS, f"{image} = {ids[0]} on both")


def model_fingerprint(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}={files[name]}\n".encode())
    return h.hexdigest()[:16]


def check_model(path: str, n0: dict[str, Any], n1: dict[str, Any]) -> Check:
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.get("model_dir"):
            probs.append(f"rank {rank}: {path} missing")
        elif "config.json" not in ev.get("model_files", {}):
            probs.append(f"rank {rank}: {path}/config.json missing")
    if probs:
        return _mk("PF-MODEL-MATCH", FAIL, "; ".join(probs))
    f0, f1 = n0["model_files"], n1["model_files"]
    if f0 != f1:
        diff = sorted(k for k in set(f0) | set(f1) if f0.get(k) != f1.get(k))
        return _mk("PF-MODEL-MATCH", FAIL, f"files differ between nodes: {', '.join(diff)}")
    return _mk(
        "PF-MODEL-MATCH", PASS, f"{len(f0)} files, fingerprint {model_fingerprint(f0)} on both"
    )


def _own_running(pair_id: str, ev: dict[str, Any]) -> list[str]:
    return [
        c["name"]
        for c in ev.get("containers", [])
        if c.get("labels", {}).get(LABEL_PAIR) == pair_id
        and str(c.get("state", "")).lower() == "running"
    ]


def check_port(cid: str, port: int, pair_id: str, n0: dict[str, Any]) -> Check:
    if port not in set(n0.get("listen_ports", [])):
        return _mk(cid, PASS, f"port {port} free on SPARK1")
    own = _own_running(pair_id, n0)
    if own:
        return _mk(
            cid,
            WARN,
            f"port {port} held, and this pair's {', '.join(own)} runs on SPARK1: up replaces it",
        )
    return _mk(
        cid, FAIL, f"port {port} on SPARK1 is held by a process that is not this pair's container"
    )


def iface_present(spec: str, netdevs: list[str]) -> list[str]:
    """Interfaces of an NCCL-style list missing from ``netdevs`` ('^' excludes; '=' exact)."""
    if spec.startswith("^"):
        return []
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]
    missing = []
    for n in names:
        ok = n in netdevs if exact else any(d.startswith(n) for d in netdevs)
        if not ok:
            missing.append(n)
    return missing


def check_ifaces(cfg: PairConfig, n0: dict[str, Any], n1: dict[str, Any]) -> Check:
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            miss = iface_present(cfg.values[var], ev.get("netdevs", []))
            if miss:
                probs.append(f"rank {rank}: {var} {','.join(miss)} not found")
    if probs:
        return _mk("PF-NCCL-IFACE", FAIL, "; ".join(probs))
    return _mk(
        "PF-NCCL-IFACE", PASS, f"{cfg.NCCL_SOCKET_IFNAME}/{cfg.GLOO_SOCKET_IFNAME} present on both"
    )


def check_tilelang(path: str, n0: dict[str, Any], n1: dict[str, Any]) -> Check:
    bad = [f"rank {r}" for r, ev in ((0, n0), (1, n1)) if not ev.get("tilelang_ok")]
    if bad:
        return _mk("PF-TILELANG-CACHE", FAIL, f"{path} not writable on {', '.join(bad)}")
    return _mk("PF-TILELANG-CACHE", PASS, f"{path} ready on both")


def hca_card(name: str, pci: str = "") -> str:
    """Card identity of an HCA: PCI domain:bus:device when known, else the name minus fN."""
    if pci:
        m = re.search(r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\.[0-7]$", pci.rstrip("/"))
        if m:
            return m.group(1)
    return re.sub(r"f\d+$", "", name)


def check_hca(spec: str, evs: list[dict[str, Any]]) -> Check:
    if not spec:
        return _mk(
            "PF-HCA-2RAIL",
            WARN,
            "NCCL_IB_HCA empty: NCCL uses every port it finds (4-rail on a Spark pair)",
        )
    if spec.startswith("^"):
        return _mk("PF-HCA-2RAIL", WARN, "exclusion list: cannot prove one port per card")
    entries = [e for e in spec.lstrip("=").split(",") if e]
    probs = []
    for rank, ev in enumerate(evs):
        ib: dict[str, str] = ev.get("ibdevs", {})
        cards: dict[str, list[str]] = {}
        for e in entries:
            dev = e.split(":")[0]
            cards.setdefault(hca_card(dev, ib.get(dev, "")), []).append(e)
        dup = {c: v for c, v in cards.items() if len(v) > 1}
        if dup:
            probs.append(
                f"rank {rank}: "
                + "; ".join(f"{', '.join(v)} are ports of one card" for v in dup.values())
            )
    if probs:
        return _mk("PF-HCA-2RAIL", FAIL, " | ".join(sorted(set(probs))))
    missing = sorted(
        {
            e.split(":")[0]
            for ev in evs
            for e in entries
            if ev.get("ibdevs") and e.split(":")[0] not in ev["ibdevs"]
        }
    )
    if missing:
        return _mk("PF-HCA-2RAIL", FAIL, f"HCA(s) not present: {', '.join(missing)}")
    if not any(ev.get("ibdevs") for ev in evs):
        return _mk(
            "PF-HCA-2RAIL",
            WARN,
            f"{spec}: one port per card, but no RDMA devices "
            "visible (NCCL would fall back to sockets)",
        )
    return _mk("PF-HCA-2RAIL", PASS, f"{spec}: one port per card")


def check_no_compressed_mla(cfg: PairConfig, recipe: Recipe, passthrough: list[str]) -> Check:
    where = []
    if FORBIDDEN_ENV in recipe.env:
        where.append("recipe env")
    if FORBIDDEN_ENV in cfg.unknown:
        where.append(f"env file {cfg.env_file}")
    if any(FORBIDDEN_ENV in a for a in passthrough):
        where.append("extra vLLM args")
    if where:
        return _mk("PF-NO-COMPRESSED-MLA", FAIL, f"{FORBIDDEN_ENV} set in {', '.join(where)}")
    return _mk("PF-NO-COMPRESSED-MLA", PASS, "not set")


def effective_backend(argv: list[str]) -> str | None:
    """The last --distributed-executor-backend value (argparse: last one wins)."""
    val = None
    for i, a in enumerate(argv):
        if a == "--distributed-executor-backend" and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith("--distributed-executor-backend="):
            val = a.split("=", 1)[1]
    return val


def check_no_ray(argv: list[str], env: dict[str, str]) -> Check:
    backend = effective_backend(argv)
    ray_flags = [
        a
        for a in argv
        if a.startswith("--") and "ray" in a.split("=")[0].lower() and a not in ("--no-ray",)
    ]
    ray_env = [k for k in env if "RAY" in k.upper().split("_")]
    if backend != "mp" or ray_flags or ray_env:
        detail = f"distributed-executor-backend={backend}"
        if ray_flags:
            detail += f"; ray flags {ray_flags}"
        if ray_env:
            detail += f"; ray env {ray_env}"
        return _mk("PF-NO-RAY", FAIL, detail)
    return _mk("PF-NO-RAY", PASS, "distributed-executor-backend=mp")


def overlay_excluded(rel: Path) -> bool:
    """Build litter that sync_overlays.sh does not copy (same rule both sides)."""
    return (
        any(
            part == "__pycache__" or part.endswith(".egg-info") or part == "build"
            for part in rel.parts
        )
        or rel.suffix == ".pyc"
    )


def local_overlay_files(src: Path) -> dict[str, str]:
    """sha256 of every file of the overlay package as sync_overlays.sh copies it."""
    out = {}
    if not src.is_dir():
        return out
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if p.is_file() and not overlay_excluded(rel):
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def check_overlays(
    path: str, want: dict[str, str], n0: dict[str, Any], n1: dict[str, Any]
) -> Check:
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.get("overlay_dir"):
            probs.append(f"rank {rank}: {path} missing (boots without overlays)")
            continue
        have = ev.get("overlay_files", {})
        miss = sorted(set(want) - set(have))
        diff = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        if miss:
            probs.append(f"rank {rank}: missing {', '.join(miss[:5])}")
        if diff:
            probs.append(f"rank {rank}: differs from repo: {', '.join(diff[:5])}")
    if probs:
        return _mk("PF-OVERLAYS", WARN, "; ".join(probs))
    return _mk("PF-OVERLAYS", PASS, f"{len(want)} files match on both")


# ---------------------------------------------------------------- assembling


def decide(
    cfg: PairConfig,
    recipe: Recipe,
    passthrough: list[str],
    evidence: dict[str, Any],
    overlay_src_files: dict[str, str],
) -> list[Check]:
    """All verdicts from evidence. Rank-1 checks are SKIP when ssh failed."""
    cfg = with_recipe_defaults(cfg, recipe)
    n0 = evidence["nodes"]["0"]
    n1 = evidence["nodes"]["1"]
    resolved = evidence["resolved"]
    head = build_rank(cfg, recipe, 0, passthrough)
    checks: list[Check] = [check_ssh(n1), check_self(resolved, n0), check_distinct(resolved, n1)]
    both: list[tuple[str, Callable[[], Check]]] = [
        ("PF-FOREIGN-PAIR", lambda: check_foreign(cfg.PAIR_ID, n0, n1)),
        ("PF-IMAGE-MATCH", lambda: check_image(resolve_image(cfg, recipe), n0, n1)),
        ("PF-MODEL-MATCH", lambda: check_model(cfg.MODEL_PATH, n0, n1)),
    ]
    for cid, fn in both:
        checks.append(fn() if n1.get("reachable") else _mk(cid, SKIP, "rank 1 not reachable"))
    checks.append(check_port("PF-PORT-FREE", int(cfg.PORT), cfg.PAIR_ID, n0))
    checks.append(check_port("PF-MASTER-PORT-FREE", int(cfg.MASTER_PORT), cfg.PAIR_ID, n0))
    for cid, fn in (
        ("PF-NCCL-IFACE", lambda: check_ifaces(cfg, n0, n1)),
        ("PF-TILELANG-CACHE", lambda: check_tilelang(cfg.TILELANG_CACHE_DIR, n0, n1)),
    ):
        checks.append(fn() if n1.get("reachable") else _mk(cid, SKIP, "rank 1 not reachable"))
    evs = [n0, n1] if n1.get("reachable") else [n0]
    checks.append(check_hca(cfg.NCCL_IB_HCA, evs))
    status, detail = decide_gid(
        cfg.NCCL_IB_HCA, cfg.NCCL_IB_GID_INDEX, {r: ev.get("roce_gids") for r, ev in enumerate(evs)}
    )
    checks.append(_mk("PF-ROCE-GID", status, detail))
    checks.append(check_no_compressed_mla(cfg, recipe, passthrough))
    checks.append(check_no_ray(list(head.vllm_argv), head.env))
    if n1.get("reachable"):
        checks.append(check_overlays(cfg.OVERLAY_DIR, overlay_src_files, n0, n1))
    else:
        checks.append(_mk("PF-OVERLAYS", SKIP, "rank 1 not reachable"))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.id:22} {c.detail}")
        if c.remedy:
            lines.append(f"      {'':22} fix: {c.remedy}")
    n = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"preflight: {n[PASS]} pass, {n[WARN]} warn, {n[FAIL]} fail, {n[SKIP]} skip")
    return "\n".join(lines) + "\n"


def as_json(checks: list[Check], evidence: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "ok": not failed(checks),
        "checks": [asdict(c) for c in checks],
        "evidence": evidence,
    }
