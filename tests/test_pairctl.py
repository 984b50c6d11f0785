"""pairctl's decisions on recorded evidence: env parsing and every preflight check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pairctl.config import VAR_NAMES, ConfigError, load_env_file, parse_env
from pairctl.lifecycle import phase_of
from pairctl.nodes import ssh_argv
from pairctl.plan import mask_argv
from pairctl.preflight import (
    CATALOGUE,
    FAIL,
    PASS,
    SKIP,
    WARN,
    check_distinct,
    check_foreign,
    check_hca,
    check_ifaces,
    check_image,
    check_model,
    check_no_compressed_mla,
    check_no_ray,
    check_overlays,
    check_port,
    check_self,
    check_ssh,
    decide,
)
from pairctl.probe import parse_probe
from pairctl.recipe import load_recipe

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

# Recorded probe output of a healthy rank-1 node (format of pairctl.probe's script).
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
sha256:1111
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


def ev(**kw) -> dict:
    base = {
        "reachable": True,
        "addrs": ["10.0.0.1"],
        "netdevs": ["lo", "enp1s0f1np1"],
        "ibdevs": {},
        "listen_ports": [],
        "docker_ps_rc": 0,
        "containers": [],
        "image_id": "sha256:1",
        "model_dir": True,
        "model_files": {"config.json": "aa", "tokenizer.json": "bb"},
        "tilelang_ok": True,
        "overlay_dir": True,
        "overlay_files": {"a.py": "x"},
    }
    base.update(kw)
    return base


def test_parse_probe_recorded() -> None:
    e = parse_probe(PROBE)
    assert e["complete"] and e["addrs"] == ["10.0.0.2", "127.0.0.1"]
    assert e["listen_ports"] == [22, 8000]
    assert e["containers"][0]["labels"]["dsv4.pair"] == "pair-b"
    assert e["image_id"] == "sha256:1111"
    assert e["model_files"] == {"config.json": "aaaa", "tokenizer.json": "bbbb"}
    assert e["overlay_files"] == {"dsv4_flash_overlays/__init__.py": "cccc"}
    assert e["ibdevs"]["rocep1s0f1"].endswith("0000:01:00.1")


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
    assert len({c.PAIR_ID for c in cfgs}) == len(cfgs)
    nodes = [n for c in cfgs for n in (c.SPARK1, c.SPARK2)]
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
    assert cfg.SPARK1 == "10.0.0.1" and cfg.MODEL_PATH == "/m"
    assert cfg.master_addr == "10.0.0.1" and cfg.PORT == ""  # empty = recipe's port
    assert cfg.OVERLAY_DIR == "/home/bird/vllm-overlays"
    assert cfg.unknown == ("TYPO_VAR",)


def test_ssh_files_relative_to_env_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "e.env"
    f.parent.mkdir()
    f.write_text(
        "".join(f"{k}={v}\n" for k, v in ENV.items())
        + "SSH_IDENTITY_FILE=keys/id\nSSH_KNOWN_HOSTS_FILE=/abs/kh\n"
    )
    cfg = load_env_file(f)
    assert cfg.SSH_IDENTITY_FILE == str(tmp_path / "sub" / "keys" / "id")
    assert cfg.SSH_KNOWN_HOSTS_FILE == "/abs/kh"


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


def test_phase_from_logs() -> None:
    assert phase_of("") == "starting"
    assert phase_of("SPARK-TWIN SIMULATOR\nLoading weights 1/43\n") == "loading weights"
    assert (
        phase_of("Loading weights\nCompiling graph\nCapturing CUDA graphs 3/35")
        == "capturing CUDA graphs"
    )
    assert phase_of("Waiting for rank 1 to join at 10.0.0.1:29501") == "waiting for rank 1"


def test_readme_documents_every_check_and_exit_code() -> None:
    text = (REPO / "launch" / "README.md").read_text()
    for cid in CATALOGUE:
        assert f"| {cid} |" in text, cid
    for code in range(2, 7):
        assert f"| {code} |" in text


def test_check_ssh_remedies() -> None:
    assert check_ssh(ev()).status == PASS
    c = check_ssh({"reachable": False, "rc": 255, "stderr": "Host key verification failed."})
    assert c.status == FAIL and "host key" in c.detail and "known_hosts" in c.remedy
    assert "never disable" in c.remedy


def test_check_self_and_distinct() -> None:
    r = {"SPARK1": "10.0.0.1", "SPARK2": "10.0.0.2", "MASTER_ADDR": "10.0.0.1"}
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


def test_check_foreign_pair_names_it() -> None:
    other = {"name": "dsv4-pair-b-rank1", "state": "running", "labels": {"dsv4.pair": "pair-b"}}
    mine = {"name": "dsv4-pair-a-rank1", "state": "running", "labels": {"dsv4.pair": "pair-a"}}
    c = check_foreign("pair-a", ev(), ev(containers=[other, mine]))
    assert c.status == FAIL and "pair-b" in c.detail and "rank 1" in c.detail
    assert check_foreign("pair-a", ev(containers=[mine]), ev()).status == PASS
    stopped = dict(other, state="exited")
    assert check_foreign("pair-a", ev(), ev(containers=[stopped])).status == WARN


def test_check_image_and_model() -> None:
    assert check_image("i", ev(), ev()).status == PASS
    assert check_image("i", ev(), ev(image_id=None)).status == FAIL
    assert check_image("i", ev(), ev(image_id="sha256:2")).status == FAIL
    assert check_model("/m", ev(), ev()).status == PASS
    assert check_model("/m", ev(), ev(model_dir=False)).status == FAIL
    c = check_model("/m", ev(), ev(model_files={"config.json": "zz", "tokenizer.json": "bb"}))
    assert c.status == FAIL and "config.json" in c.detail


def test_check_ports() -> None:
    assert check_port("PF-PORT-FREE", 8000, "pair-a", ev()).status == PASS
    assert check_port("PF-PORT-FREE", 8000, "pair-a", ev(listen_ports=[8000])).status == FAIL
    own = ev(
        listen_ports=[8000],
        containers=[
            {"name": "dsv4-pair-a-rank0", "state": "running", "labels": {"dsv4.pair": "pair-a"}}
        ],
    )
    assert check_port("PF-PORT-FREE", 8000, "pair-a", own).status == WARN
    assert check_port("PF-PORT-FREE", 8000, "pair-b", own).status == FAIL


def test_check_ifaces() -> None:
    cfg = parse_env(ENV)
    assert check_ifaces(cfg, ev(), ev()).status == PASS
    assert check_ifaces(cfg, ev(), ev(netdevs=["lo", "eth0"])).status == FAIL
    cfg = parse_env(dict(ENV, NCCL_SOCKET_IFNAME="enp1", GLOO_SOCKET_IFNAME="=enp1s0f1np1"))
    assert check_ifaces(cfg, ev(), ev()).status == PASS  # prefix match; '=' exact


def test_check_hca_two_rail() -> None:
    ib = parse_probe(PROBE)["ibdevs"]
    assert check_hca("rocep1s0f1,roceP2p1s0f1", [ev(ibdevs=ib)]).status == PASS
    four = check_hca("rocep1s0f0,rocep1s0f1,roceP2p1s0f1", [ev(ibdevs=ib)])
    assert four.status == FAIL and "one card" in four.detail and "110" in four.remedy
    assert check_hca("mlx5_0:1,mlx5_0:2", [ev()]).status == FAIL  # two ports, one device
    assert check_hca("", [ev()]).status == WARN
    assert check_hca("rocep1s0f1,roceP9p1s0f1", [ev(ibdevs=ib)]).status == FAIL  # absent
    assert check_hca("rocep1s0f1,roceP2p1s0f1", [ev()]).status == WARN  # no RDMA visible


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


def test_check_overlays_warn_only() -> None:
    want = {"a.py": "x"}
    assert check_overlays("/o", want, ev(), ev()).status == PASS
    assert check_overlays("/o", want, ev(), ev(overlay_dir=False)).status == WARN
    assert check_overlays("/o", want, ev(overlay_files={"a.py": "y"}), ev()).status == WARN


def test_decide_skips_rank1_checks_when_unreachable() -> None:
    cfg = parse_env(ENV)
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    evidence = {
        "resolved": {"SPARK1": "10.0.0.1", "SPARK2": "10.0.0.2", "MASTER_ADDR": "10.0.0.1"},
        "nodes": {"0": ev(), "1": {"reachable": False, "rc": 255, "stderr": "x"}},
    }
    checks = decide(cfg, recipe, [], evidence, {"a.py": "x"})
    by = {c.id: c.status for c in checks}
    assert set(by) == set(CATALOGUE)
    assert by["PF-SSH"] == FAIL and by["PF-IMAGE-MATCH"] == SKIP
    assert by["PF-SELF-IS-SPARK1"] == PASS
    evidence["nodes"]["1"] = ev(addrs=["10.0.0.2"])
    by = {c.id: c.status for c in decide(cfg, recipe, [], evidence, {"a.py": "x"})}
    assert FAIL not in by.values(), by


def test_first_dead_rank_leads_the_report() -> None:
    from pairctl.docker import State
    from pairctl.lifecycle import first_dead
    from pairctl.nodes import nodes

    n0, n1 = nodes(parse_env(ENV))
    head = (n0, "h", State(True, False, "exited", 1, "2026-11-30T10:02:20.500000000Z"))
    worker = (n1, "w", State(True, False, "exited", 1, "2026-11-30T10:02:20.100000000Z"))
    assert [d[1] for d in first_dead([head, worker])] == ["w", "h"]
    unknown = (n0, "h", State(True, False, "exited", 1, "0001-01-01T00:00:00Z"))
    assert [d[1] for d in first_dead([unknown, worker])] == ["w", "h"]


def test_join_hint_only_after_a_long_wait() -> None:
    from pairctl.lifecycle import join_hint

    cfg = parse_env(ENV)
    assert join_hint("waiting for rank 1", 10, cfg) is None
    assert join_hint("loading weights", 500, cfg) is None
    hint = join_hint("waiting for rank 1", 120, cfg)
    assert hint and "10.0.0.1:29501" in hint and "PF-NCCL-IFACE" in hint
