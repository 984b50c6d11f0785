"""Two kinds of address: the engine's on the fabric, ssh/clients' on SPARK1/SPARK2.

The resolved pair, the recipe's ${NODE_IP} and the plan use FABRIC1/FABRIC2 for the engine
(VLLM_HOST_IP, the master address) and SPARK1 for the endpoint; PF-FABRIC-ADDR proves each
fabric address is on NCCL_SOCKET_IFNAME's interface, PF-FABRIC-REACH that rank 1 dials rank
0's master port over it (a real listener over loopback here; the launcher runs with the fake
ssh/ip of tests/fakes).
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

from pairctl.nodes.ssh import Node
from pairctl.pair.config import parse_env
from pairctl.pair.plan import build_rank, render_plan
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import resolve
from pairctl.preflight import FAIL, PASS, SKIP, WARN, fabric_ssh
from pairctl.preflight.checks_fabric import (
    check_fabric_addr,
    check_fabric_hostkey,
    check_fabric_reach,
)
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.fabric_ssh import FabricSsh
from pairctl.preflight.probe import parse_ifaddrs, parse_probe
from pairctl.preflight.reach import Reach, reach_master
from tests.fakes.fakepair import Env

REPO = Path(__file__).resolve().parents[1]
RECIPE = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
LAN = {"PAIR_ID": "pair-a", "SPARK1": "10.1.0.11", "SPARK2": "10.1.0.12"}
BASE = dict(
    LAN,
    MODEL_PATH="/models/dsv4",
    NCCL_SOCKET_IFNAME="enp1s0f1np1",
    GLOO_SOCKET_IFNAME="enp1s0f1np1",
    IMAGE="img:1",
)
SPLIT = dict(BASE, FABRIC1="192.168.100.11", FABRIC2="192.168.100.12")


def pair(**env: str):
    return resolve(parse_env(dict(BASE, **env)), RECIPE)


def node(lan: str, fabric: str) -> NodeEvidence:
    """A Spark with its LAN address on enP7s7 and its fabric address on the RoCE netdev."""
    return NodeEvidence(
        reachable=True,
        addrs=sorted([lan, fabric, "127.0.0.1"]),
        ifaddrs={"lo": ["127.0.0.1"], "enP7s7": [lan], "enp1s0f1np1": [fabric]},
    )


N0 = node("10.1.0.11", "192.168.100.11")
N1 = node("10.1.0.12", "192.168.100.12")


def names(p) -> dict[str, str | None]:
    """Every address is a literal here: it resolves to itself."""
    return {
        "SPARK1": p.spark1,
        "SPARK2": p.spark2,
        "FABRIC1": p.fabric1,
        "FABRIC2": p.fabric2,
        "MASTER_ADDR": p.master_addr,
    }


def test_the_engine_uses_the_fabric_and_clients_spark1() -> None:
    p = resolve(parse_env(SPLIT), RECIPE)
    assert (p.fabric1, p.fabric2, p.master_addr) == ("192.168.100.11", "192.168.100.12") + (
        "192.168.100.11",
    )
    assert p.endpoint == "http://10.1.0.11:8000" and p.node_addr(1) == "10.1.0.12"
    for rank, ip in ((0, "192.168.100.11"), (1, "192.168.100.12")):
        rp = build_rank(p, rank)
        assert rp.env["VLLM_HOST_IP"] == ip and rp.node == ("10.1.0.11", "10.1.0.12")[rank]
        argv = list(rp.vllm_argv)
        assert argv[argv.index("--master-addr") + 1] == "192.168.100.11"
    text = render_plan(p)
    assert "# endpoint: http://10.1.0.11:8000/v1" in text
    assert "rank 0 192.168.100.11, rank 1 192.168.100.12 (VLLM_HOST_IP)" in text
    assert "master 192.168.100.11:29501" in text


def test_fabric_defaults_to_the_ssh_addresses_and_master_addr_still_wins() -> None:
    p = pair()
    assert (p.fabric1, p.fabric2, p.master_addr) == ("10.1.0.11", "10.1.0.12", "10.1.0.11")
    assert build_rank(p, 1).env["VLLM_HOST_IP"] == "10.1.0.12"
    p = resolve(parse_env(dict(SPLIT, MASTER_ADDR="192.168.100.21")), RECIPE)
    assert p.master_addr == "192.168.100.21" and p.fabric1 == "192.168.100.11"


def test_parse_ifaddrs_reads_ip_o_addr_name_and_address() -> None:
    lines = [
        "lo 127.0.0.1/8",
        "lo ::1/128",
        "enp1s0f1np1 192.168.100.11/24",
        "enp1s0f1np1 fe80::1/64",
        "fab0@if12 10.77.0.2/24",
    ]
    got = parse_ifaddrs(lines)
    assert got["enp1s0f1np1"] == ["192.168.100.11", "fe80::1"]
    assert got["fab0"] == ["10.77.0.2"] and got["lo"] == ["127.0.0.1", "::1"]
    probe = "\n==== ifaddrs ====\neth0 10.0.0.2/24\n==== end ====\n"
    assert parse_probe(probe).ifaddrs == {"eth0": ["10.0.0.2"]}


def test_fabric_addresses_on_the_roce_interface_pass() -> None:
    p = resolve(parse_env(SPLIT), RECIPE)
    c = check_fabric_addr(p, names(p), [N0, N1])
    assert c.status == PASS, c.detail
    assert "FABRIC2 192.168.100.12 on rank 1's enp1s0f1np1" in c.detail


def test_lan_addresses_as_fabric_fail_and_name_the_link_address() -> None:
    """The day-one mistake: SPARK1/SPARK2 are the LAN, FABRIC* left empty."""
    p = pair()
    c = check_fabric_addr(p, names(p), [N0, N1])
    assert c.status == FAIL
    assert "FABRIC1=10.1.0.11 is on enP7s7, not on rank 0's enp1s0f1np1" in c.detail
    assert "(which has 192.168.100.11)" in c.detail and "FABRIC2=10.1.0.12" in c.detail
    assert "FABRIC1/FABRIC2" in c.remedy


def test_master_addr_off_the_fabric_fails_alone() -> None:
    p = resolve(parse_env(dict(SPLIT, MASTER_ADDR="10.1.0.11")), RECIPE)
    c = check_fabric_addr(p, names(p), [N0, N1])
    assert c.status == FAIL and c.detail.startswith("MASTER_ADDR=10.1.0.11 is on enP7s7")


def test_same_fabric_address_twice_and_exclusion_lists() -> None:
    p = resolve(parse_env(dict(SPLIT, FABRIC2="192.168.100.11")), RECIPE)
    assert check_fabric_addr(p, names(p), [N0, N1]).status == FAIL
    p = resolve(parse_env(dict(SPLIT, NCCL_SOCKET_IFNAME="^docker0")), RECIPE)
    assert check_fabric_addr(p, names(p), [N0, N1]).status == WARN


def test_prefix_interface_names_follow_nccl_rules_and_rank1_unreached() -> None:
    p = resolve(parse_env(dict(SPLIT, NCCL_SOCKET_IFNAME="enp1")), RECIPE)
    assert check_fabric_addr(p, names(p), [N0, N1]).status == PASS
    p = resolve(parse_env(dict(SPLIT, NCCL_SOCKET_IFNAME="=enp1")), RECIPE)
    c = check_fabric_addr(p, names(p), [N0, N1])
    assert c.status == FAIL and "no interface =enp1" in c.detail
    p = resolve(parse_env(SPLIT), RECIPE)
    c = check_fabric_addr(p, names(p), [N0])
    assert c.status == PASS and "FABRIC2 not checked" in c.detail


def test_reach_verdicts() -> None:
    p = resolve(parse_env(SPLIT), RECIPE)
    n = names(p)
    ok = check_fabric_reach(p, n, Reach(ran=True, ok=True, peer="192.168.100.12"))
    assert ok.status == PASS and "from 192.168.100.12" in ok.detail
    lan = check_fabric_reach(p, n, Reach(ran=True, ok=True, peer="10.1.0.12"))
    assert lan.status == FAIL and "does not use the fabric" in lan.detail
    shut = check_fabric_reach(p, n, Reach(ran=True, ok=False, detail="Connection refused"))
    assert shut.status == FAIL and "192.168.100.11:29501" in shut.detail
    held = Reach(detail="could not listen on 192.168.100.11:29501: Address already in use")
    assert check_fabric_reach(p, n, held).status == WARN
    assert check_fabric_reach(p, n, Reach()).status == SKIP


def _cfg():
    return parse_env(dict(BASE, SPARK1="127.0.0.1", SPARK2="127.0.0.2"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reach_master_over_loopback_reads_the_token_and_the_peer() -> None:
    """A real listener and a real connect script (run locally: Node rank 0)."""
    port = _free_port()
    r = reach_master(Node(0, "127.0.0.1", _cfg()), "127.0.0.1", port, "127.0.0.1")
    assert r.ran and r.ok and r.peer == "127.0.0.1", r
    # the port is free again (no TIME_WAIT here: rank 1 closes first) for the TCP store
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_reach_master_reports_a_held_port_and_a_wrong_target() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = reach_master(Node(0, "127.0.0.1", _cfg()), "127.0.0.1", port, "127.0.0.1")
    assert not r.ran and "in use" in r.detail
    # rank 1 dials an address where nothing listens: the connect fails, no token
    port = _free_port()
    r = reach_master(Node(0, "127.0.0.1", _cfg()), "127.0.0.1", port, "127.0.0.3")
    assert r.ran and not r.ok and r.detail


def test_launcher_preflight_fails_a_fabric_address_off_the_roce_interface(pair: Env) -> None:
    """End to end with the fakes: h1 holds SPARK1 on eth0, NCCL_SOCKET_IFNAME is lo."""
    pair.state["hosts"]["h1"]["ifaces"] = {"eth0": ["127.0.0.1"]}
    pair.save()
    p = pair.run("preflight")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "FAIL  PF-FABRIC-ADDR" in p.stdout and "FABRIC1=127.0.0.1 is on eth0" in p.stdout
    assert pair.runs() == []


def test_launcher_preflight_reaches_the_master_port_through_fake_ssh(pair: Env) -> None:
    out = pair.tmp / "pf.json"
    p = pair.run("preflight", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    ids = {c["id"]: c["status"] for c in data["checks"]}
    assert ids["PF-FABRIC-ADDR"] == "PASS" and ids["PF-FABRIC-REACH"] == "PASS"
    assert data["evidence"]["reach"]["ok"] is True
    assert len(pair.calls("ssh")) >= 2  # rank 1's probe, then its side of the reach test


# --- PF-FABRIC-HOSTKEY: the bulk copies' ssh to FABRIC2, host key checked -----------------

FAILED = "Host key verification failed."


def test_fabric_hostkey_verdicts() -> None:
    p = pair(FABRIC2="192.168.100.12")
    ok = FabricSsh(ran=True, host="192.168.100.12", known_rc=0, same_rc=0)
    assert check_fabric_hostkey(p, ok).status == PASS
    unknown = replace(ok, known_rc=255, known_err="No ED25519 host key is known ...\n" + FAILED)
    c = check_fabric_hostkey(p, unknown)
    assert c.status == WARN and "FABRIC2 192.168.100.12 is not in known_hosts" in c.detail
    assert "`ssh 192.168.100.12 true`" in c.detail and "`ssh-keygen -l -F 10.1.0.12`" in c.detail
    changed = replace(unknown, known_err="REMOTE HOST IDENTIFICATION HAS CHANGED!\n" + FAILED)
    c = check_fabric_hostkey(p, changed)
    assert c.status == WARN and "`ssh-keygen -R 192.168.100.12`" in c.detail
    other = replace(ok, same_rc=255, same_err="Host key for 10.1.0.12 has changed\n" + FAILED)
    c = check_fabric_hostkey(p, other)
    assert c.status == FAIL and "names another machine" in c.detail
    down = replace(ok, known_rc=255, known_err="connect to host 192.168.100.12 port 22: refused")
    assert check_fabric_hostkey(p, down).status == WARN
    assert check_fabric_hostkey(p, FabricSsh()).status == SKIP
    same = pair()  # FABRIC2 empty = SPARK2: PF-SSH's ssh is the copies' ssh
    assert check_fabric_hostkey(same, FabricSsh()).status == PASS
    with_port = pair(FABRIC2="192.168.100.12", SSH_PORT="2222")
    c = check_fabric_hostkey(with_port, unknown)
    assert "`ssh -p 2222 192.168.100.12 true`" in c.detail
    assert "`ssh-keygen -l -F '[10.1.0.12]:2222'`" in c.detail


KEY_H2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRank1"
KEY_H3 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther"


def fabric_pair(pair: Env, fabric_host: str, known: str) -> None:
    """FABRIC2=127.0.0.3 reaching ``fabric_host``; known_hosts lines ``known``."""
    pair.values["FABRIC2"] = "127.0.0.3"
    pair.write_env()
    pair.state["hosts"]["h3"] = dict(pair.state["hosts"]["h2"], addrs=["127.0.0.3"])
    pair.state["ssh"]["127.0.0.3"] = fabric_host
    pair.state["hostkeys"] = {"h2": KEY_H2, "h3": KEY_H3}
    pair.save()
    Path(pair.values["SSH_KNOWN_HOSTS_FILE"]).write_text(known)


def hostkey_probe(pair: Env, monkeypatch) -> FabricSsh:
    for k, v in pair.environ().items():
        monkeypatch.setenv(k, v)
    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.resolved import load

    resolved = load(pair.env_file, DEFAULT_RECIPE)
    return fabric_ssh.probe(resolved.nodes[1], resolved.fabric2)


def test_fabric_hostkey_probe_with_openssh_like_checks(pair: Env, monkeypatch) -> None:
    """The two ssh runs against the fake ssh, which checks keys as OpenSSH does."""
    fabric_pair(pair, "h2", f"127.0.0.2,127.0.0.3 {KEY_H2}\n")
    seen = hostkey_probe(pair, monkeypatch)
    assert check_fabric_hostkey(load_pair(pair), seen).status == PASS
    alias = [c["argv"] for c in pair.calls("ssh") if "HostKeyAlias=127.0.0.2" in c["argv"]]
    assert len(alias) == 1 and alias[0][alias[0].index("--") - 1] == "127.0.0.3"
    fabric_pair(pair, "h2", f"127.0.0.2 {KEY_H2}\n")  # FABRIC2 never contacted
    assert check_fabric_hostkey(load_pair(pair), hostkey_probe(pair, monkeypatch)).status == WARN
    # FABRIC2 is another machine whose key someone accepted: the copies would go there
    fabric_pair(pair, "h3", f"127.0.0.2 {KEY_H2}\n127.0.0.3 {KEY_H3}\n")
    seen = hostkey_probe(pair, monkeypatch)
    assert seen.known_rc == 0 and seen.same_rc == 255
    c = check_fabric_hostkey(load_pair(pair), seen)
    assert c.status == FAIL and "FABRIC2 127.0.0.3 presents a host key" in c.detail


def load_pair(pair: Env):
    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.resolved import load

    return load(pair.env_file, DEFAULT_RECIPE)


def test_launcher_preflight_checks_the_fabric_host_key(pair: Env) -> None:
    fabric_pair(pair, "h3", f"127.0.0.2 {KEY_H2}\n127.0.0.3 {KEY_H3}\n")
    out = pair.tmp / "pf.json"
    p = pair.run("preflight", "--json", str(out))
    assert p.returncode == 3, p.stdout + p.stderr
    assert "FAIL  PF-FABRIC-HOSTKEY" in p.stdout, p.stdout
    data = json.loads(out.read_text())
    assert data["evidence"]["fabric_ssh"]["host"] == "127.0.0.3"
    assert data["evidence"]["fabric_ssh"]["same_rc"] == 255
