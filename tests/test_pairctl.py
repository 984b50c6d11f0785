"""pairctl's decisions on recorded evidence: env parsing and every preflight check."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pairctl.nodes.ssh import ssh_argv
from pairctl.pair.config import CACHE_VARS, VAR_NAMES, ConfigError, load_env_file, parse_env
from pairctl.pair.plan import mask_argv
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight import (
    CHECKS,
    FAIL,
    PASS,
    SKIP,
    WARN,
    as_json,
    catalogue_markdown,
    decide,
)
from pairctl.preflight.check import Inputs, Need, UndeclaredEvidence
from pairctl.preflight.checks_host import (
    PF_MASTER_PORT_FREE,
    PF_PORT_FREE,
    check_ifaces,
    check_port,
)
from pairctl.preflight.checks_identity import (
    PF_SSH,
    check_distinct,
    check_foreign,
    check_self,
    check_ssh,
)
from pairctl.preflight.checks_launch import check_no_compressed_mla, check_no_ray
from pairctl.preflight.checks_match import check_image, check_model, check_overlays
from pairctl.preflight.checks_rdma import check_hca
from pairctl.preflight.evidence import Evidence, NodeEvidence
from pairctl.preflight.imageprobe import ImageProbe, parse_output
from pairctl.preflight.probe import parse_probe
from pairctl.preflight.reach import Reach
from tests.fakes.fakepair import image_probe_reply

REPO = Path(__file__).resolve().parents[1]
ENV = {
    "PAIR_ID": "pair-a",
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "MODEL_PATH": "/models/dsv4",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    "HF_TOKEN": "hf_secret",
}

# Recorded probe output of a healthy rank-1 node (format of pairctl.preflight.probe's script).
PROBE = """
==== hostname ====
spark-2
==== addrs ====
127.0.0.1/8
10.0.0.2/24
==== netdevs ====
lo
enp1s0f0np0
enp1s0f1np1
==== ibdevs ====
rocep1s0f0 /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0
rocep1s0f1 /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1
roceP2p1s0f1 /sys/devices/pci0002:00/0002:00:01.0/0002:01:00.1
==== listen ====
0.0.0.0:22
[::]:8000
rc=0
==== docker_ps ====
{"ID":"abc","Names":"dsv4-pair-b-rank1","State":"running","Labels":"dsv4.pair=pair-b,dsv4.rank=1"}
rc=0
==== image ====
[
    {
        "Id": "sha256:1111",
        "RepoTags": ["vllm-dspark:t"],
        "RepoDigests": ["ghcr.io/x/vllm-dspark@sha256:aaaa"],
        "Config": {
            "Env": ["PATH=/usr/bin", "PYTHONPATH=/opt/extra"],
            "Entrypoint": ["vllm", "serve"]
        }
    }
]
rc=0
==== model ====
dir=yes
aaaa config.json
bbbb tokenizer.json
==== tilelang ====
ok
==== overlays ====
dir=yes
cccc  ./dsv4_flash_overlays/__init__.py
==== end ====
"""


def ev(**kw) -> NodeEvidence:
    """A healthy node's evidence (as recorded in --json), with ``kw`` changed."""
    base = {
        "reachable": True,
        "addrs": ["10.0.0.1"],
        "netdevs": ["lo", "enp1s0f1np1"],
        "ibdevs": {
            "rocep1s0f1": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1",
            "roceP2p1s0f1": "/sys/devices/pci0002:00/0002:00:01.0/0002:01:00.1",
        },
        "listen_ports": [],
        "docker_ps_rc": 0,
        "containers": [],
        "image_id": "sha256:1",
        "model_dir": True,
        "model_files": {"config.json": "aa", "tokenizer.json": "bb"},
        "tilelang_ok": True,
        "overlay_dir": True,
        "overlay_files": {"a.py": "x"},
        # a GB10 node at rest on a fixed kernel (kho=off: no CMA pageblocks)
        "kernel": "6.17.0-1032-nvidia",
        "gpu": "NVIDIA GB10",
        "meminfo": {"MemTotal": 125_000_000, "MemAvailable": 118_000_000, "CmaTotal": 0},
        "rdma_dir": True,
        "uverbs": ["uverbs0", "uverbs1"],
        "links": [{"name": "enp1s0f1np1", "mtu": 9000, "state": "up"}],
        "cache_dirs": {v: True for v in CACHE_VARS[1:]},
    }
    base.update(kw)
    # its addresses on the RoCE netdev (PF-FABRIC-ADDR), unless the test says otherwise
    base.setdefault("ifaddrs", {"enp1s0f1np1": list(base["addrs"])})
    return NodeEvidence.from_dict(base)


UNREACHED = NodeEvidence.from_dict({"reachable": False, "rc": 255, "stderr": "x"})
RESOLVED = {
    "SPARK1": "10.0.0.1",
    "SPARK2": "10.0.0.2",
    "FABRIC1": "10.0.0.1",
    "FABRIC2": "10.0.0.2",
    "MASTER_ADDR": "10.0.0.1",
}
# rank 1 connected to the master port from its fabric address
REACHED = Reach(ran=True, ok=True, peer="10.0.0.2")


def test_parse_probe_recorded() -> None:
    e = parse_probe(PROBE)
    assert e.complete and e.addrs == ["10.0.0.2", "127.0.0.1"]
    assert e.listen_ports == [22, 8000]
    assert e.containers[0].labels["dsv4.pair"] == "pair-b" and e.containers[0].running
    assert e.image_id == "sha256:1111" and e.image_facts is not None
    assert e.image_facts.env_value("PYTHONPATH") == "/opt/extra"
    assert e.image_facts.entrypoint == ["vllm", "serve"] and e.image_facts.digests() == {
        "sha256:aaaa"
    }
    assert e.model_files == {"config.json": "aaaa", "tokenizer.json": "bbbb"}
    assert e.overlay_files == {"dsv4_flash_overlays/__init__.py": "cccc"}
    assert e.ibdevs["rocep1s0f1"].endswith("0000:01:00.1")
    assert not e.reachable and e.rc is None  # transport fields are collect()'s to fill


def test_evidence_json_round_trip_keeps_the_recorded_shape() -> None:
    """--json's evidence is asdict(Evidence); reading it back gives the same dataclasses."""
    n1 = parse_probe(PROBE)
    evidence = Evidence(
        config={"PAIR_ID": "pair-a"}, resolved=RESOLVED, image="i", nodes={"0": ev(), "1": n1}
    )
    data = json.loads(json.dumps(as_json([], evidence)))
    assert data["schema_version"] == 1 and data["ok"] is True and data["checks"] == []
    assert set(data["evidence"]) == {
        "config",
        "resolved",
        "image",
        "nodes",
        "argv_check",
        "reach",
        "image_probes",
    }
    node = data["evidence"]["nodes"]["1"]
    assert node["containers"][0] == {
        "id": "abc",
        "name": "dsv4-pair-b-rank1",
        "state": "running",
        "labels": {"dsv4.pair": "pair-b", "dsv4.rank": "1"},
    }
    assert Evidence.from_dict(data["evidence"]) == evidence
    with pytest.raises(ValueError, match="image_idd"):
        NodeEvidence.from_dict({"image_idd": "sha256:1"})


def test_env_example_documents_every_variable() -> None:
    text = (REPO / ".env.example").read_text()
    keys = re.findall(r"^([A-Z_][A-Z0-9_]*)=", text, re.M)
    assert sorted(keys) == sorted(VAR_NAMES)
    load_env_file(REPO / ".env.example")  # the example itself is valid
    for example in sorted((REPO / "pairs").glob("*.env.example")):
        cfg = load_env_file(example)
        assert cfg.unknown == (), example


def test_pair_examples_are_distinct_pairs() -> None:
    cfgs = [load_env_file(p) for p in sorted((REPO / "pairs").glob("*.env.example"))]
    assert len(cfgs) >= 2
    assert len({c["PAIR_ID"] for c in cfgs}) == len(cfgs)
    nodes = [n for c in cfgs for n in (c["SPARK1"], c["SPARK2"])]
    assert len(set(nodes)) == len(nodes), "pairs share nothing: no node in two pairs"


@pytest.mark.parametrize(
    "key,val,msg",
    [
        ("PAIR_ID", "Pair A", "PAIR_ID"),
        ("SPARK1", "10.0.0.1;rm", "SPARK1"),
        ("MASTER_PORT", "0", "MASTER_PORT"),
        ("PORT", "8000x", "PORT"),
        ("MODEL_PATH", "models", "MODEL_PATH"),
        ("NCCL_SOCKET_IFNAME", "a b", "NCCL_SOCKET_IFNAME"),
        ("NCCL_IB_HCA", "mlx5_0:x", "NCCL_IB_HCA"),
        ("SSH_USER", "bob smith", "SSH_USER"),
    ],
)
def test_malformed_values_named(key: str, val: str, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        parse_env(dict(ENV, **{key: val}))


def test_secret_never_in_error(tmp_path: Path) -> None:
    f = tmp_path / "e.env"
    f.write_text(
        "".join(f"{k}={v}\n" for k, v in ENV.items() if k != "HF_TOKEN") + "HF_TOKEN hf_zz9tok\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_env_file(f)
    assert "hf_zz9tok" not in str(exc.value) and ":8:" in str(exc.value)


@pytest.mark.parametrize(
    "line", ["SPARK3 10.0.0.3", "this line is not KEY=VALUE", 'IMAGE="unterminated']
)
def test_unparsable_line_is_an_error_not_a_warning(tmp_path: Path, line: str) -> None:
    f = tmp_path / "e.env"
    f.write_text("".join(f"{k}={v}\n" for k, v in ENV.items()) + line + "\n")
    with pytest.raises(ConfigError, match=r":9: malformed line"):
        load_env_file(f)


def test_defaults_and_dotenv_semantics(tmp_path: Path) -> None:
    f = tmp_path / "e.env"
    f.write_text(
        "# c\nexport PAIR_ID=pair-a\nSPARK1='10.0.0.1'\nSPARK2=\"10.0.0.2\"\n"
        "MODEL_PATH=/m # comment\nNCCL_SOCKET_IFNAME=eth0\nGLOO_SOCKET_IFNAME=eth0\n"
        "TYPO_VAR=1\n"
    )
    cfg = load_env_file(f)
    assert cfg["SPARK1"] == "10.0.0.1" and cfg["MODEL_PATH"] == "/m"
    assert cfg.master_addr == "10.0.0.1" and cfg["PORT"] == ""  # empty = recipe's port
    assert cfg["OVERLAY_DIR"] == "/home/bird/vllm-overlays"
    assert cfg.unknown == ("TYPO_VAR",)


def test_ssh_files_relative_to_env_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "e.env"
    f.parent.mkdir()
    f.write_text(
        "".join(f"{k}={v}\n" for k, v in ENV.items())
        + "SSH_IDENTITY_FILE=keys/id\nSSH_KNOWN_HOSTS_FILE=/abs/kh\n"
    )
    cfg = load_env_file(f)
    assert cfg["SSH_IDENTITY_FILE"] == str(tmp_path / "sub" / "keys" / "id")
    assert cfg["SSH_KNOWN_HOSTS_FILE"] == "/abs/kh"


def test_ssh_always_checks_host_keys() -> None:
    argv = ssh_argv(
        parse_env(
            dict(
                ENV,
                SSH_USER="bird",
                SSH_PORT="2222",
                SSH_IDENTITY_FILE="/k",
                SSH_KNOWN_HOSTS_FILE="/kh",
            )
        ),
        "true",
    )
    s = " ".join(argv)
    assert "BatchMode=yes" in s and "StrictHostKeyChecking=yes" in s
    assert "StrictHostKeyChecking=no" not in s and "UserKnownHostsFile=/dev/null" not in s
    assert "-i /k" in s and "-p 2222" in s and "-l bird" in s and "UserKnownHostsFile=/kh" in s
    assert argv[-3:] == ["10.0.0.2", "--", "true"]
    plain = ssh_argv(parse_env(ENV))
    assert "-i" not in plain and "-p" not in plain and plain[-1] == "10.0.0.2"


def test_mask_argv() -> None:
    out = mask_argv(["-e", "HF_TOKEN=abc", "-e", "MY_API_KEY=k", "-e", "A=1", "HF_TOKEN=x"])
    assert out == ["-e", "HF_TOKEN=***", "-e", "MY_API_KEY=***", "-e", "A=1", "HF_TOKEN=x"]


def test_readme_documents_every_exit_code() -> None:
    text = (REPO / "launch" / "README.md").read_text()
    for code in range(2, 7):
        assert f"| {code} |" in text


def _readme_table(text: str) -> str:
    """The preflight table in launch/README.md: the block of rows starting at its header."""
    start = text.index("| ID | checks |")
    end = text.find("\n\n", start)
    return text[start : end + 1]


def test_readme_table_is_the_registry() -> None:
    """launch/README.md shows exactly what `preflight --catalogue-md` prints from CHECKS."""
    readme = _readme_table((REPO / "launch" / "README.md").read_text())
    table = catalogue_markdown()
    assert readme == table, "regenerate: python -m pairctl preflight --catalogue-md"
    rows = [r for r in table.splitlines() if r.startswith("| PF-")]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [c.id for c in CHECKS]
    for row, spec in zip(rows, CHECKS, strict=True):
        assert spec.remedy.replace("|", "\\|").replace("*", "\\*") in row
    out = subprocess.run(
        [sys.executable, "-m", "pairctl", "preflight", "--catalogue-md"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == table


def test_registry_specs_are_complete() -> None:
    """One object per check: id, what it checks, its remedy, its evidence, its decision."""
    for spec in CHECKS:
        assert re.fullmatch(r"PF-[A-Z0-9-]+", spec.id) and spec.title and spec.remedy
        assert spec.needs and callable(spec.decide)
    assert PF_PORT_FREE in CHECKS and PF_MASTER_PORT_FREE in CHECKS


def test_check_ssh_remedies() -> None:
    assert check_ssh(ev()).status == PASS
    c = check_ssh(NodeEvidence(rc=255, stderr="Host key verification failed."))
    assert c.status == FAIL and "host key" in c.detail and "known_hosts" in c.remedy
    assert "never disable" in c.remedy


def test_check_self_and_distinct() -> None:
    r = RESOLVED
    assert check_self(r, ev()).status == PASS
    assert check_self(r, ev(addrs=["10.0.9.9"])).status == FAIL
    assert check_self(dict(r, MASTER_ADDR="10.0.0.7"), ev()).status == FAIL
    lo = {"SPARK1": "127.0.0.1", "SPARK2": "10.0.0.2", "MASTER_ADDR": "127.0.0.1"}
    c = check_self(lo, ev(addrs=["127.0.0.1", "10.0.0.1"]))
    assert c.status == FAIL and "loopback" in c.detail
    assert check_distinct(r, ev(addrs=["10.0.0.2"])).status == PASS
    assert check_distinct(dict(r, SPARK2="10.0.0.1"), ev()).status == FAIL
    # ssh "to SPARK2" landed on a machine that owns SPARK1's address: same host
    assert check_distinct(r, ev(addrs=["10.0.0.1", "10.0.0.2"])).status == FAIL
    assert check_distinct(r, None).status == PASS  # rank 1 unreached: addresses alone


def test_check_foreign_pair_names_it() -> None:
    other = {"name": "dsv4-pair-b-rank1", "state": "running", "labels": {"dsv4.pair": "pair-b"}}
    mine = {"name": "dsv4-pair-a-rank1", "state": "running", "labels": {"dsv4.pair": "pair-a"}}
    c = check_foreign("pair-a", ev(), ev(containers=[other, mine]))
    assert c.status == FAIL and "pair-b" in c.detail and "rank 1" in c.detail
    assert check_foreign("pair-a", ev(containers=[mine]), ev()).status == PASS
    stopped = dict(other, state="exited")
    assert check_foreign("pair-a", ev(), ev(containers=[stopped])).status == WARN
    c = check_foreign("pair-a", ev(docker_ps_rc=1, docker_ps_error="daemon down"), ev())
    assert c.status == FAIL and "rank 0: docker ps failed: daemon down" in c.detail


def test_check_image_and_model() -> None:
    assert check_image("i", ev(), ev()).status == PASS
    assert check_image("i", ev(), ev(image_id=None)).status == FAIL
    assert check_image("i", ev(), ev(image_id="sha256:2")).status == FAIL
    assert check_model("/m", ev(), ev()).status == PASS
    assert check_model("/m", ev(), ev(model_dir=False)).status == FAIL
    c = check_model("/m", ev(), ev(model_files={"config.json": "zz", "tokenizer.json": "bb"}))
    assert c.status == FAIL and "config.json" in c.detail


def test_check_ports() -> None:
    assert check_port(PF_PORT_FREE, 8000, "pair-a", ev()).status == PASS
    c = check_port(PF_PORT_FREE, 8000, "pair-a", ev(listen_ports=[8000]))
    assert c.status == FAIL and c.id == "PF-PORT-FREE"
    own = ev(
        listen_ports=[8000],
        containers=[
            {"name": "dsv4-pair-a-rank0", "state": "running", "labels": {"dsv4.pair": "pair-a"}}
        ],
    )
    assert check_port(PF_PORT_FREE, 8000, "pair-a", own).status == WARN
    assert check_port(PF_PORT_FREE, 8000, "pair-b", own).status == FAIL
    c = check_port(PF_MASTER_PORT_FREE, 8000, "pair-b", own)
    assert c.id == "PF-MASTER-PORT-FREE" and "MASTER_PORT" in c.remedy


def test_check_ifaces() -> None:
    cfg = parse_env(ENV)
    ifaces = cfg["NCCL_SOCKET_IFNAME"], cfg["GLOO_SOCKET_IFNAME"]
    assert check_ifaces(*ifaces, ev(), ev()).status == PASS
    assert check_ifaces(*ifaces, ev(), ev(netdevs=["lo", "eth0"])).status == FAIL
    assert check_ifaces("enp1", "=enp1s0f1np1", ev(), ev()).status == PASS  # prefix; '=' exact


def test_check_hca_two_rail() -> None:
    ib = parse_probe(PROBE).ibdevs
    assert check_hca("rocep1s0f1,roceP2p1s0f1", [ev(ibdevs=ib)]).status == PASS
    four = check_hca("rocep1s0f0,rocep1s0f1,roceP2p1s0f1", [ev(ibdevs=ib)])
    assert four.status == FAIL and "both physical ports" in four.detail and "110" in four.remedy
    assert check_hca("mlx5_0:1,mlx5_0:2", [ev()]).status == FAIL  # two ports, one device
    assert check_hca("", [ev()]).status == WARN
    assert check_hca("rocep1s0f1,roceP9p1s0f1", [ev(ibdevs=ib)]).status == FAIL  # absent
    c = check_hca("rocep1s0f1,roceP2p1s0f1", [ev(ibdevs={})])  # no RDMA at all: NCCL_NET=IB fails
    assert c.status == FAIL and "NCCL_NET=IB" in c.detail


def test_check_no_compressed_mla_and_no_ray() -> None:
    cfg = parse_env(ENV)
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    assert check_no_compressed_mla(cfg, recipe, []).status == PASS
    recipe.env["VLLM_DSV4_B12X_COMPRESSED_MLA"] = "1"
    assert check_no_compressed_mla(cfg, recipe, []).status == FAIL
    cfg2 = parse_env(dict(ENV, VLLM_DSV4_B12X_COMPRESSED_MLA="0"))
    recipe.env.pop("VLLM_DSV4_B12X_COMPRESSED_MLA")
    assert check_no_compressed_mla(cfg2, recipe, []).status == FAIL
    base = ["--distributed-executor-backend", "mp"]
    assert check_no_ray(base, {}).status == PASS
    assert check_no_ray([*base, "--distributed-executor-backend", "ray"], {}).status == FAIL
    assert check_no_ray([*base, "--ray-workers-use-nsight"], {}).status == FAIL
    assert check_no_ray(base, {"VLLM_USE_RAY_SPMD_WORKER": "1"}).status == FAIL
    assert check_no_ray([], {}).status == FAIL


def test_check_overlays_compares_only_what_ships() -> None:
    want = {"a.py": "x", "b.json": "j"}
    have = {"a.py": "x", "b.json": "j"}
    assert check_overlays("/o", want, ev(overlay_files=have), ev(overlay_files=have)).status == PASS
    # a file the node has beyond the ship list (an old result, a stray egg-info) is no reason
    stray = dict(have, **{"results/run1.json": "r", "x.egg-info/PKG-INFO": "e"})
    assert (
        check_overlays("/o", want, ev(overlay_files=stray), ev(overlay_files=have)).status == PASS
    )
    c = check_overlays("/o", want, ev(overlay_files=have), ev(overlay_dir=False))
    assert c.status == WARN and "rank 1: /o missing" in c.detail
    c = check_overlays(
        "/o", want, ev(overlay_files={"a.py": "y", "b.json": "j"}), ev(overlay_files=have)
    )
    assert c.status == WARN and "rank 0: differs from repo: a.py" in c.detail
    c = check_overlays("/o", want, ev(overlay_files=have), ev(overlay_files={"a.py": "x"}))
    assert c.status == WARN and "rank 1: missing b.json" in c.detail and "sync-overlays" in c.remedy


def _decide(n1: NodeEvidence, n0: NodeEvidence | None = None, **env: str) -> dict[str, str]:
    cfg = parse_env(dict(ENV, **env))
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    # the image probe found a clean image of the pair's stack on each reached node
    pair = resolve(cfg, recipe)
    found = parse_output(image_probe_reply(pair.stack.name)["out"])
    probed = {"0": ImageProbe("rank 0 (10.0.0.1)", "sha256:1", "py", True, "", False, found)}
    if n1.reachable:
        probed["1"] = replace(probed["0"], where="rank 1 (10.0.0.2)")
    evidence = Evidence(
        resolved=RESOLVED, nodes={"0": n0 or ev(), "1": n1}, reach=REACHED, image_probes=probed
    )
    checks = decide(pair, evidence, {"a.py": "x"})
    assert [c.id for c in checks] == [s.id for s in CHECKS]  # report order = registry order
    return {c.id: c.status for c in checks}


def test_decide_skips_exactly_the_checks_that_need_rank1() -> None:
    v4 = "0000:0000:0000:0000:0000:ffff:0a00:0001"
    rdma = ev(
        ibdevs={"rocep1s0f1": "", "roceP2p1s0f1": ""},
        roce_gids=[
            {"dev": d, "port": 1, "index": 3, "gid": v4, "type": "RoCE v2"}
            for d in ("rocep1s0f1", "roceP2p1s0f1")
        ],
    )
    by = _decide(UNREACHED, n0=rdma)
    needs_rank1 = {s.id for s in CHECKS if Need.RANK1 in s.needs}
    assert {cid for cid, st in by.items() if st == SKIP} == needs_rank1
    assert {"PF-IMAGE-MATCH", "PF-OVERLAYS", "PF-FOREIGN-PAIR"} <= needs_rank1
    assert by["PF-SSH"] == FAIL and by["PF-SELF-IS-SPARK1"] == PASS
    # rank 0's own RDMA setup is still judged while rank 1 is away
    assert by["PF-HCA-2RAIL"] == PASS and by["PF-ROCE-GID"] == PASS
    assert by["PF-DISTINCT-NODES"] == PASS
    by = _decide(ev(addrs=["10.0.0.2"]))
    assert FAIL not in by.values(), by
    # the only SKIP left: no RDMA devices on either recorded node
    assert [cid for cid, st in by.items() if st == SKIP] == ["PF-ROCE-GID"]


@pytest.mark.parametrize("n1", [UNREACHED, ev(addrs=["10.0.0.2"])], ids=["unreached", "reached"])
def test_every_decision_reads_only_declared_evidence(n1: NodeEvidence) -> None:
    """decide() runs each check through a View: reading undeclared evidence raises."""
    _decide(n1)  # no UndeclaredEvidence from any check, reachable or not
    _decide(n1, NCCL_IB_GID_INDEX="3")


def test_undeclared_evidence_raises() -> None:
    cfg = parse_env(ENV)
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    greedy = replace(PF_SSH, decide=lambda v: check_ssh(v.rank1))
    evidence = Evidence(resolved=RESOLVED, nodes={"0": ev(), "1": ev()})
    inputs = Inputs(resolve(cfg, recipe), evidence, {})
    with pytest.raises(UndeclaredEvidence, match="PF-SSH reads RANK1"):
        greedy.run(inputs)


def test_first_dead_rank_leads_the_report() -> None:
    from pairctl.lifecycle.steps import first_dead
    from pairctl.nodes.docker import State
    from pairctl.nodes.ssh import nodes

    n0, n1 = nodes(parse_env(ENV))
    head = (n0, "h", State(True, False, "exited", 1, "2026-11-30T10:02:20.500000000Z"))
    worker = (n1, "w", State(True, False, "exited", 1, "2026-11-30T10:02:20.100000000Z"))
    assert [d[1] for d in first_dead([head, worker])] == ["w", "h"]
    unknown = (n0, "h", State(True, False, "exited", 1, "0001-01-01T00:00:00Z"))
    assert [d[1] for d in first_dead([unknown, worker])] == ["w", "h"]


def test_join_hint_only_after_a_long_wait() -> None:
    from pairctl.lifecycle.steps import join_hint

    cfg = resolve(parse_env(ENV), load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml"))
    assert join_hint("rendezvous", "rendezvous", 10, cfg) is None
    assert join_hint("loading weights", "rendezvous", 500, cfg) is None
    # both in distributed init: rank 1 cannot reach the head's store
    hint = join_hint("rendezvous", "rendezvous", 120, cfg)
    assert hint and "10.0.0.1:29501" in hint and "PF-NCCL-IFACE" in hint
    # rank 1 has not got that far: say where it is instead of blaming the network
    hint = join_hint("rendezvous", "loading weights", 120, cfg)
    assert hint and "has not reached distributed init (its phase: loading weights)" in hint
    assert "PF-NCCL-IFACE" not in hint


def test_a_peer_that_died_a_moment_later_is_reported_too(monkeypatch) -> None:
    """The poll saw rank 1 dead first (its inspect ran later); one more look finds rank 0,
    which went first: both reach the report, ordered by when they died."""
    from pairctl.lifecycle import steps as lifecycle
    from pairctl.nodes.docker import State
    from pairctl.nodes.ssh import nodes

    cfg = parse_env(ENV)
    n0, n1 = nodes(cfg)
    head = State(True, False, "exited", 1, "2026-11-30T10:02:20.100000000Z")
    monkeypatch.setattr(lifecycle, "inspect", lambda node, name: head)
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: None)
    worker = (n1, "w", State(True, False, "exited", 1, "2026-11-30T10:02:20.300000000Z"))
    more = lifecycle._also_dead(cfg, (n0, n1), [worker])
    assert [(n.rank, st) for n, _, st in more] == [(0, head)]
    assert [d[0].rank for d in lifecycle.first_dead([worker, *more])] == [0, 1]
    running = State(True, True, "running", None)
    monkeypatch.setattr(lifecycle, "inspect", lambda node, name: running)
    assert lifecycle._also_dead(cfg, (n0, n1), [worker]) == []
