"""A fleet holding a pair and a group of four behind one router: inventory, plan, status.

The group's four nodes are its own (a node in two entries is refused, whichever rank it
is), `fleet plan` names the group's three workers and its TP size, and `fleet status`
shows each entry's size (text and JSON).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pairctl.fleet import ops, render
from pairctl.fleet import router as rt
from pairctl.fleet.inventory import Fleet, load_inventory
from pairctl.fleet.pairs import PairView
from pairctl.pair.config import ConfigError
from tests.support.fleet import inventory_data, write_inventory

GROUP = {"SPARK3": "10.9.0.23", "SPARK4": "10.9.0.24"}


def mixed(tmp: Path, **extra: str) -> Fleet:
    """pair-a (2 Sparks) and pair-b made a group of four (10.9.0.21-24)."""
    data = inventory_data(tmp)
    b = Path(data["pairs"][1]["env_file"])
    b.write_text(b.read_text() + "".join(f"{k}={v}\n" for k, v in {**GROUP, **extra}.items()))
    return load_inventory(write_inventory(tmp, data))


def test_inventory_holds_groups_of_different_sizes(tmp_path: Path) -> None:
    f = mixed(tmp_path)
    assert [p.pair.nnodes for p in f.pairs] == [2, 4]
    plan = render.plan(f)
    assert "## pair pair-a: head 10.9.0.11, worker 10.9.0.12," in plan
    assert (
        "## pair pair-b: head 10.9.0.21, 3 workers (TP=4): 10.9.0.22, 10.9.0.23, 10.9.0.24" in plan
    )


def test_a_node_of_a_group_cannot_be_in_another_entry(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="node 10.9.0.12 is in pair 'pair-a' and in pair 'pair-b'"
    ):
        mixed(tmp_path, SPARK4="10.9.0.12")  # rank 3 of the group is pair-a's worker


def test_fleet_status_shows_each_entrys_size(tmp_path: Path) -> None:
    f = mixed(tmp_path)
    a, b = f.pairs
    st = ops.FleetStatus(
        {
            a.pair_id: PairView(a.pair_id, a.endpoint, True, "ok"),
            b.pair_id: PairView(b.pair_id, b.endpoint, True, "ok"),
        },
        [{"name": "dsv4-fleet-test-router", "state": "running", "plan": "x"}],
        "",
        rt.RouterView(True, True, "ready", {a.endpoint: True, b.endpoint: True}),
    )
    text = render.status_text(f, st)
    assert "sparks" in text.splitlines()[2]
    row = {x.split()[0]: x for x in text.splitlines() if x.startswith("pair-")}
    assert "2 (TP=2)" in row["pair-a"] and "4 (TP=4)" in row["pair-b"]
    js = st.to_json(f)
    assert js["pairs"]["pair-a"]["nnodes"] == 2 and js["pairs"]["pair-b"]["nnodes"] == 4
    assert "ready, 2/2 worker(s) healthy" in text
