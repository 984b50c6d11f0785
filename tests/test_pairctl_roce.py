"""PF-ROCE-GID: decisions on recorded sysfs GID tables, and the probe's parsing of them."""

from __future__ import annotations

import subprocess

from pairctl.preflight import FAIL, PASS, SKIP, WARN, Check
from pairctl.preflight.checks_rdma import check_roce_gid
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.probe import parse_probe
from pairctl.preflight.roce import PROBE_SECTION, Gid, parse_gids

V4 = "0000:0000:0000:0000:0000:ffff:c0a8:6401"
LL = "fe80:0000:0000:0000:0ac4:7aff:fe11:2233"


def table(dev: str, v2_index: int, port: int = 1) -> list[Gid]:
    """A Spark-like GID table: link-local v1/v2 at 0/1, IPv4 v1 at v2_index-1, v2 at v2_index."""
    lines = [
        f"{dev} {port} 0 {LL} IB/RoCE v1",
        f"{dev} {port} 1 {LL} RoCE v2",
        f"{dev} {port} {v2_index - 1} {V4} IB/RoCE v1",
        f"{dev} {port} {v2_index} {V4} RoCE v2",
    ]
    return parse_gids(lines)


HCA = "rocep1s0f1,roceP2p1s0f1"


def both(idx0: int, idx1: int) -> list[list[Gid]]:
    """GID tables of rank 0 and rank 1 (list index = rank)."""
    return [
        table("rocep1s0f1", idx0) + table("roceP2p1s0f1", idx0),
        table("rocep1s0f1", idx1) + table("roceP2p1s0f1", idx1),
    ]


def gid_verdict(hca: str, gid_index: str, tables: list[list[Gid]]) -> tuple[str, str]:
    """PF-ROCE-GID on the nodes that answered, each with its recorded GID table."""
    check = check_roce_gid(hca, gid_index, [NodeEvidence(roce_gids=t) for t in tables])
    assert isinstance(check, Check) and check.id == "PF-ROCE-GID"
    assert bool(check.remedy) == (check.status in (FAIL, WARN))
    return check.status, check.detail


def test_auto_index_same_everywhere_passes_and_names_it() -> None:
    status, detail = gid_verdict(HCA, "", both(3, 3))
    assert status == PASS and "index 3" in detail


def test_pinned_index_that_drifted_on_rank1_fails_with_right_index() -> None:
    status, detail = gid_verdict(HCA, "3", both(3, 5))
    assert status == FAIL
    assert "rank 1" in detail and "index is 5" in detail and "rank 0" not in detail


def test_pinned_index_pointing_at_roce_v1_fails() -> None:
    status, _ = gid_verdict(HCA, "2", both(3, 3))  # index 2 is the v1 entry of the IPv4 GID
    assert status == FAIL


def test_pinned_index_correct_passes() -> None:
    assert gid_verdict(HCA, "5", both(5, 5))[0] == PASS


def test_auto_with_differing_indices_warns() -> None:
    status, detail = gid_verdict(HCA, "", both(3, 5))
    assert status == WARN and "differs" in detail


def test_second_half_without_ipv4_warns_a_node_without_any_fails() -> None:
    """eugr/spark-vllm-docker docs/NETWORKING.md assigns an IP to one PCIe half only: the
    other half of the port then has no IPv4 GID, which is no reason to stop the pair."""
    tables = both(3, 3)
    tables[1] = [g for g in tables[1] if not (g.dev == "roceP2p1s0f1" and g.gid == V4)]
    status, detail = gid_verdict(HCA, "", tables)
    assert status == WARN and "rank 1 roceP2p1s0f1:1" in detail and "twin half" in detail
    tables[1] = [g for g in tables[1] if g.gid != V4]
    status, detail = gid_verdict(HCA, "", tables)
    assert status == FAIL and "no RoCEv2 IPv4 GID on any port" in detail
    assert "rank 1 rocep1s0f1:1, rank 1 roceP2p1s0f1:1" in detail
    # a pinned index is still checked on the half that has the address
    assert gid_verdict(HCA, "5", both(3, 3))[0] == FAIL


def test_no_rdma_devices_skips() -> None:
    assert gid_verdict(HCA, "", [[], []])[0] == SKIP
    assert gid_verdict(HCA, "", [[]])[0] == SKIP  # rank 1 not reached, rank 0 has none


def test_empty_hca_list_checks_every_port_found() -> None:
    tables = [table("rocep1s0f0", 3) + table("rocep1s0f1", 3)]
    assert gid_verdict("", "", tables)[0] == PASS
    tables[0] = [g for g in tables[0] if not (g.dev == "rocep1s0f0" and g.gid == V4)]
    assert gid_verdict("", "", tables)[0] == WARN  # the unused port has no address
    tables[0] = [g for g in tables[0] if g.gid != V4]
    assert gid_verdict("", "", tables)[0] == FAIL


def test_explicit_port_in_hca_entry_is_honoured() -> None:
    tables = [table("rocep1s0f1", 3, port=2)]
    assert gid_verdict("rocep1s0f1:2", "", tables)[0] == PASS
    assert gid_verdict("rocep1s0f1:1", "", tables)[0] == FAIL


def test_parse_drops_malformed_lines() -> None:
    recs = parse_gids(["mlx5_0 1 3 " + V4 + " RoCE v2", "garbage", "mlx5_0 x 3 g RoCE v2"])
    assert recs == [Gid(dev="mlx5_0", port=1, index=3, gid=V4, type="RoCE v2")]


def test_probe_section_runs_under_sh_and_parses(tmp_path) -> None:
    """The shell fragment is valid POSIX sh; with no RDMA devices it yields an empty table."""
    script = "sec() { printf '\\n==== %s ====\\n' \"$1\"; }\n" + PROBE_SECTION + "sec end\n"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    ev = parse_probe(out)
    assert ev.complete and ev.roce_gids == []
