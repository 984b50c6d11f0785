"""The host checks peers learned the hard way, decided on recorded evidence: unified memory,
the kernel's CMA trap, earlyoom, RDMA devices, link MTU, JIT caches, image digest, model
revision, an open endpoint; and the probe's shell fragment that gathers them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pairctl.engine.image import ImageFacts, parse_inspect, pythonpath
from pairctl.pair.config import parse_env
from pairctl.pair.derive import OVERLAY_MOUNT
from pairctl.pair.plan import build_rank
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight import FAIL, PASS, SKIP, WARN
from pairctl.preflight.checks_host import check_jit_caches
from pairctl.preflight.checks_launch import check_api_key
from pairctl.preflight.checks_match import check_image, check_model_revision
from pairctl.preflight.checks_rdma import check_hca, check_rdma_devices, check_roce_mtu
from pairctl.preflight.checks_system import (
    check_earlyoom,
    check_kernel_cma,
    check_memory,
    last_value,
)
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.probe import parse_probe
from pairctl.preflight.probe_host import PROBE_SECTION, parse_model_rev

REPO = Path(__file__).resolve().parents[1]
ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "MODEL_PATH": "/models/dsv4",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
}
GB10 = "NVIDIA GB10"
GIB_KB = 1 << 20  # kB in a GiB
REV = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"


def node(**kw) -> NodeEvidence:
    return NodeEvidence.from_dict({"reachable": True, **kw})


def mem(total_gib: float, avail_gib: float, **extra: int) -> dict[str, int]:
    return {"MemTotal": int(total_gib * GIB_KB), "MemAvailable": int(avail_gib * GIB_KB), **extra}


# -- PF-MEMORY: vLLM's request_memory on unified memory ------------------------------------


def test_memory_applies_vllms_rule_per_node() -> None:
    ok = node(gpu=GB10, meminfo=mem(119.7, 110))
    assert check_memory("0.80", "pair-a", [ok, ok]).status == PASS
    # 0.80 x 119.7 = 95.8 GiB: 95 GiB available is below vLLM's line on rank 1
    c = check_memory("0.80", "pair-a", [ok, node(gpu=GB10, meminfo=mem(119.7, 95))])
    assert c.status == FAIL and "rank 1" in c.detail and "refuse to start" in c.detail
    # vLLM's own default 0.92 when the argv sets none
    assert check_memory(None, "pair-a", [ok, ok]).status == FAIL
    assert "0.92 x" in check_memory(None, "pair-a", [ok, ok]).detail


def test_memory_headroom_on_rank0_and_this_pairs_own_container() -> None:
    tight = node(gpu=GB10, meminfo=mem(119.7, 97.5))  # 1.7 GiB above the line
    ok = node(gpu=GB10, meminfo=mem(119.7, 110))
    c = check_memory("0.80", "pair-a", [tight, ok])
    assert c.status == WARN and "API server" in c.detail
    assert check_memory("0.80", "pair-a", [ok, tight]).status == PASS  # rank 1 has no API server
    mine = [{"name": "dsv4-pair-a-rank1", "state": "running", "labels": {"dsv4.pair": "pair-a"}}]
    held = node(gpu=GB10, meminfo=mem(119.7, 30), containers=mine)
    c = check_memory("0.80", "pair-a", [ok, held])
    assert c.status == WARN and "up replaces it" in c.detail
    assert check_memory("0.80", "pair-b", [ok, held]).status == FAIL


def test_memory_skips_without_unified_memory_and_rejects_a_bad_share() -> None:
    assert check_memory("0.8", "p", [node(meminfo=mem(8, 1))]).status == SKIP
    discrete = node(gpu="NVIDIA H200", meminfo=mem(8, 1))
    assert check_memory("0.8", "p", [discrete]).status == SKIP
    assert check_memory("1.5", "p", [node(gpu=GB10, meminfo=mem(119, 110))]).status == FAIL
    assert check_memory("lots", "p", [node(gpu=GB10, meminfo=mem(119, 110))]).status == FAIL


def test_memory_reads_the_share_vllm_would_use() -> None:
    argv = ["--gpu-memory-utilization", "0.8", "--x", "1", "--gpu-memory-utilization=0.7"]
    assert last_value(argv, "--gpu-memory-utilization") == "0.7"
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    head = list(build_rank(resolve(parse_env(ENV), recipe), 0).vllm_argv)
    assert last_value(head, "--gpu-memory-utilization") == "0.8"
    assert last_value(head, "--max-model-len") == "262144"


# -- PF-KERNEL-CMA, PF-EARLYOOM ---------------------------------------------------------------


def test_kernel_cma_trap() -> None:
    """CmaTotal 0 with CmaFree > 0 is the KHO scratch that breaks ibv_reg_mr (MiaAI-Lab
    #259: `CmaTotal: 0 kB`, `CmaFree: 940604 kB` on 7.0.0-1019-nvidia)."""
    bad = node(kernel="7.0.0-1019-nvidia", meminfo={"CmaTotal": 0, "CmaFree": 940604})
    fixed = node(kernel="7.0.0-1019-nvidia", meminfo={"CmaTotal": 0, "CmaFree": 0})
    old = node(kernel="6.17.0-1032-nvidia", meminfo={"CmaTotal": 32768, "CmaFree": 30000})
    c = check_kernel_cma([old, bad])
    assert c.status == FAIL and "rank 1 (7.0.0-1019-nvidia)" in c.detail
    assert "kho=off" in c.remedy and "6.17" in c.remedy
    assert check_kernel_cma([fixed, old]).status == PASS
    unknown = node(kernel="7.0.0-31-generic", meminfo={})
    assert check_kernel_cma([unknown]).status == WARN
    assert check_kernel_cma([node(kernel="6.8.0-1", meminfo={})]).status == PASS


def test_earlyoom_warns() -> None:
    assert check_earlyoom([node(), node()]).status == PASS
    c = check_earlyoom([node(), node(earlyoom=True)])
    assert c.status == WARN and "rank 1" in c.detail and "systemctl disable" in c.remedy


# -- PF-RDMA-DEVICES, PF-ROCE-MTU, PF-HCA-2RAIL's suggestion -------------------------------


def test_rdma_devices() -> None:
    good = node(rdma_dir=True, uverbs=["uverbs0", "uverbs1"])
    assert check_rdma_devices("/dev/infiniband", good, good).status == PASS
    c = check_rdma_devices("/dev/infiniband", good, node(rdma_dir=True))
    assert c.status == FAIL and "rank 1: no uverbs" in c.detail and "ib_uverbs" in c.remedy
    c = check_rdma_devices("/dev/infiniband", node(), good)
    assert c.status == FAIL and "rank 0: /dev/infiniband missing" in c.detail


def _linked(mtu0: int, mtu1: int = 9000, state: str = "up", port: str = "ACTIVE"):
    ports = [
        {"dev": "rocep1s0f1", "port": 1, "netdev": "enp1s0f1np1", "state": port},
        {"dev": "roceP2p1s0f1", "port": 1, "netdev": "enP2p1s0f1np1", "state": "ACTIVE"},
    ]
    links = [
        {"name": "enp1s0f1np1", "mtu": mtu0, "state": state},
        {"name": "enP2p1s0f1np1", "mtu": mtu1, "state": "up"},
        {"name": "enp1s0f0np0", "mtu": 1500, "state": "down"},  # the other, unused port
    ]
    return node(links=links, ibports=ports)


def test_roce_mtu_and_link_state() -> None:
    ifs, hca = "enp1s0f1np1", "rocep1s0f1,roceP2p1s0f1"
    c = check_roce_mtu(ifs, hca, [_linked(9000), _linked(9000)])
    assert c.status == PASS and "MTU 9000" in c.detail  # the unused port's 1500 is not ours
    c = check_roce_mtu(ifs, hca, [_linked(9000), _linked(1500)])
    assert c.status == FAIL and "MTU differs" in c.detail and "rank 1 enp1s0f1np1 1500" in c.detail
    c = check_roce_mtu(ifs, hca, [_linked(9000, mtu1=1500), _linked(9000)])
    assert c.status == FAIL and "rank 0 enP2p1s0f1np1 1500" in c.detail  # halves differ
    c = check_roce_mtu(ifs, hca, [_linked(9000), _linked(9000, state="down")])
    assert c.status == FAIL and "rank 1: enp1s0f1np1 is down" in c.detail
    c = check_roce_mtu(ifs, hca, [_linked(9000), _linked(9000, port="DOWN")])
    assert c.status == FAIL and "RDMA port rocep1s0f1:1 is DOWN" in c.detail
    assert check_roce_mtu("nosuch", "", [node(), node()]).status == SKIP


def test_hca_suggests_the_active_devices_only_when_they_differ_from_the_setting() -> None:
    ib = {
        "rocep1s0f1": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1",
        "roceP2p1s0f1": "/sys/devices/pci0002:00/0002:00:01.0/0002:01:00.1",
        "rocep1s0f0": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
    }
    ports = [
        {"dev": "rocep1s0f1", "port": 1, "netdev": "enp1s0f1np1", "state": "ACTIVE"},
        {"dev": "roceP2p1s0f1", "port": 1, "netdev": "enP2p1s0f1np1", "state": "ACTIVE"},
        {"dev": "rocep1s0f0", "port": 1, "netdev": "enp1s0f0np0", "state": "DOWN"},
    ]
    evs = [node(ibdevs=ib, ibports=ports)] * 2
    four = check_hca("rocep1s0f0,rocep1s0f1,roceP2p1s0f1", evs)
    assert four.status == FAIL and "NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1" in four.detail
    empty = check_hca("", evs)
    assert empty.status == WARN and "NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1" in empty.detail
    # the value already set is never suggested back, and the remedy names no value at all
    missing = check_hca("roceP2p1s0f1,rocep1s0f1", [node(ibdevs={"x": ""}, ibports=ports)] * 2)
    assert missing.status == FAIL and "ACTIVE RDMA devices" not in missing.detail
    assert "NCCL_IB_HCA=" not in missing.remedy


# -- PF-JIT-CACHES, PF-IMAGE-MATCH, PF-MODEL-REVISION, PF-API-KEY ----------------------------


def test_jit_caches() -> None:
    cfg = parse_env(ENV)
    ok = {
        "VLLM_CACHE_ROOT": True,
        "TRITON_CACHE_DIR": True,
        "FLASHINFER_WORKSPACE_BASE": True,
        "DG_JIT_CACHE_DIR": True,
    }
    assert check_jit_caches(cfg.values, node(cache_dirs=ok), node(cache_dirs=ok)).status == PASS
    bad = dict(ok, TRITON_CACHE_DIR=False)
    c = check_jit_caches(cfg.values, node(cache_dirs=ok), node(cache_dirs=bad))
    assert c.status == FAIL and "rank 1: TRITON_CACHE_DIR=/home/bird/.triton/cache" in c.detail


def _img(id_: str = "sha256:1", digests: tuple[str, ...] = ()) -> NodeEvidence:
    facts = {"id": id_, "repo_digests": list(digests), "env": [], "entrypoint": None}
    return node(image_id=id_, image_facts=facts)


def test_image_digest() -> None:
    ref = "ghcr.io/x/vllm-dspark@sha256:aaa"
    assert check_image("local:1", _img(), _img()).status == PASS  # built here: the ID is all
    c = check_image("ghcr.io/x/vllm-dspark:t", _img(digests=(ref,)), _img(digests=(ref,)))
    assert c.status == WARN and f"pin IMAGE={ref}" in c.detail
    assert check_image(ref, _img(digests=(ref,)), _img(digests=(ref,))).status == PASS
    other = "ghcr.io/x/vllm-dspark@sha256:bbb"
    c = check_image("i", _img(digests=(ref,)), _img(digests=(other,)))
    assert c.status == FAIL and "registry digests differ" in c.detail
    assert check_image("i", _img(), _img("sha256:2")).status == FAIL


def test_model_revision() -> None:
    a, b = node(model_revision=REV), node(model_revision="1" * 40)
    assert check_model_revision(REV, a, a).status == PASS
    assert check_model_revision("", a, a).status == WARN  # known, the same, but not pinned
    assert f"MODEL_REVISION={REV}" in check_model_revision("", a, a).detail
    assert check_model_revision("", a, b).status == FAIL
    c = check_model_revision(REV, a, node())
    assert c.status == FAIL and "rank 1 unknown" in c.detail
    assert check_model_revision("", node(), node()).status == WARN


def test_model_revision_sources() -> None:
    snap = f"path=/root/.cache/huggingface/hub/models--x--y/snapshots/{REV}"
    assert parse_model_rev([snap]) == REV
    assert parse_model_rev(["path=/models/dsv4", f"meta={REV}"]) == REV
    assert parse_model_rev(["path=/models/dsv4", "meta=main"]) == ""
    assert parse_model_rev(["path=/models/dsv4"]) == ""


def test_api_key() -> None:
    assert check_api_key("0.0.0.0", False).status == WARN
    assert check_api_key("0.0.0.0", True).status == PASS
    assert check_api_key("10.0.0.1", False).status == PASS


# -- the image's PYTHONPATH and entrypoint in the generated line ------------------------------


def test_overlay_path_is_appended_to_the_images_pythonpath() -> None:
    facts = parse_inspect(
        '[{"Id": "sha256:1", "RepoDigests": [], '
        '"Config": {"Env": ["PYTHONPATH=/opt/a:/opt/b"], "Entrypoint": ["vllm", "serve"]}}]'
    )
    assert facts == ImageFacts("sha256:1", [], ["PYTHONPATH=/opt/a:/opt/b"], ["vllm", "serve"])
    assert pythonpath(facts, OVERLAY_MOUNT) == f"/opt/a:/opt/b:{OVERLAY_MOUNT}"
    assert pythonpath(None, OVERLAY_MOUNT) == OVERLAY_MOUNT
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    rp = build_rank(resolve(parse_env(ENV), recipe), 0, image_facts=facts)
    argv = list(rp.docker_argv)
    assert f"PYTHONPATH=/opt/a:/opt/b:{OVERLAY_MOUNT}" in argv
    assert argv[argv.index("--entrypoint") + 1] == "/opt/env/bin/vllm"  # the fork stack's
    image_at = argv.index(rp.image)
    assert argv[image_at + 1 : image_at + 3] == ["serve", "/models/dsv4"]
    assert argv[argv.index("--device") + 1] == "/dev/infiniband:/dev/infiniband"


def test_api_key_goes_to_rank0_by_name_only() -> None:
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    cfg = parse_env(dict(ENV, VLLM_API_KEY="sk-pair-secret"))
    head, worker = (build_rank(resolve(cfg, recipe), r) for r in (0, 1))
    assert ("VLLM_API_KEY", "sk-pair-secret") in head.secret_env
    assert "VLLM_API_KEY" in head.docker_argv
    assert "sk-pair-secret" not in " ".join(head.docker_argv + worker.docker_argv)
    assert "VLLM_API_KEY" not in worker.env


# -- the probe's fragment -------------------------------------------------------------------


def test_probe_fragment_runs_under_sh(tmp_path: Path) -> None:
    """The host fragment is POSIX sh and parses on this machine; caches are created."""
    rdma = tmp_path / "ib"
    rdma.mkdir()
    (rdma / "uverbs0").symlink_to("/dev/null")
    (rdma / "uverbs9").write_text("not a device")
    model = tmp_path / "model"
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text(f"{REV}\netag\n1700000000.0\n")
    cache = tmp_path / "new" / "cache"
    script = (
        "sec() { printf '\\n==== %s ====\\n' \"$1\"; }\n"
        f"RDMA={rdma}\nMODEL={model}\nCACHES='VLLM_CACHE_ROOT={cache} X=/proc/nope'\n"
        + PROBE_SECTION
        + "sec end\n"
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    ev = parse_probe(out)
    assert ev.complete and ev.kernel and ev.meminfo["MemTotal"] > 0
    assert ev.rdma_dir and ev.uverbs == ["uverbs0"]  # a regular file is no device
    assert any(link.name == "lo" for link in ev.links)
    assert ev.cache_dirs == {"VLLM_CACHE_ROOT": True, "X": False} and cache.is_dir()
    assert ev.model_revision == REV


@pytest.mark.parametrize("line", ["rocep1s0f1 1 enp1s0f1np1 ACTIVE", "mlx5_0 1 - DOWN"])
def test_ibports_lines_parse(line: str) -> None:
    out = "\n==== ibports ====\n" + line + "\n==== end ====\n"
    (port,) = parse_probe(out).ibports
    assert port.state in ("ACTIVE", "DOWN") and port.netdev in ("enp1s0f1np1", "")
