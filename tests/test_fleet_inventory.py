"""The fleet inventory: what it accepts, and every way it refuses a fleet before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pairctl.fleet.inventory import REPO, Tuning, check_image, load_inventory, resolve
from pairctl.pair.config import ConfigError
from tests.support.fleet import fleet, inventory_data, write_inventory


def test_example_inventory_loads_with_the_example_pairs(tmp_path: Path) -> None:
    """pairs/fleet.yaml.example is valid once its pairs' env files exist."""
    data = yaml.safe_load((REPO / "pairs" / "fleet.yaml.example").read_text())
    for entry, name in zip(data["pairs"], ("pair-a", "pair-b"), strict=True):
        copy = tmp_path / f"{name}.env"
        shutil.copyfile(REPO / "pairs" / f"{name}.env.example", copy)
        entry["env_file"] = str(copy)
    f = load_inventory(write_inventory(tmp_path, data))
    assert [p.pair_id for p in f.pairs] == ["pair-a", "pair-b"]
    assert [p.endpoint for p in f.pairs] == [
        "http://192.168.100.11:8000",
        "http://192.168.100.21:8000",
    ]
    assert f.router.policy == "consistent_hash" and f.router.tuning == Tuning()
    assert f.router.url == "http://192.168.100.50:8080"


def test_paths_map_to_the_heads_checkout(tmp_path: Path) -> None:
    assert resolve("pairs/pair-a.env", "/srv/dsv4") == (
        REPO / "pairs" / "pair-a.env",
        "/srv/dsv4/pairs/pair-a.env",
    )
    assert resolve("/etc/dsv4/a.env", "/srv/dsv4") == (Path("/etc/dsv4/a.env"), "/etc/dsv4/a.env")
    f = fleet(tmp_path)
    assert f.pairs[0].remote_recipe == "/srv/dsv4/recipes/dsv4-flash-dspark.yaml"
    assert f.pairs[0].pair.port == 8000


@pytest.mark.parametrize(
    "image,ok",
    [
        ("dsv4-vllm-router:0.1.17", True),
        ("vllm/vllm-router@sha256:" + "a" * 64, True),
        ("vllm/vllm-router:nightly-20261104-abc1234", True),
        ("vllm/vllm-router", False),
        ("vllm/vllm-router:latest", False),
        ("vllm/vllm-router:nightly", False),
        ("vllm/vllm-router@sha256:1234", False),
        ("registry:5000/router", False),
    ],
)
def test_router_image_must_be_pinned(image: str, ok: bool) -> None:
    assert (check_image(image) is None) == ok


def _refused(tmp: Path, edit, needle: str) -> None:
    data = inventory_data(tmp)
    edit(data)
    with pytest.raises(ConfigError) as exc:
        load_inventory(write_inventory(tmp, data))
    assert needle in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d.update(fleet_version=2), "fleet_version"),
        (lambda d: d.update(fleet_id="Main Fleet"), "fleet_id"),
        (lambda d: d.update(extra=1), "unknown key(s) extra"),
        (lambda d: d["router"].update(helth_check_interval_s=5), "helth_check_interval_s"),
        (lambda d: d["router"].pop("image"), "router.image is required"),
        (lambda d: d["router"].update(image="vllm/vllm-router:latest"), "launch/vllm-router"),
        (lambda d: d["router"].update(policy="cache_aware"), "router.policy"),
        (lambda d: d["router"].update(port=8000, host="10.9.0.11"), "takes pair 'pair-a'"),
        (lambda d: d["router"].update(metrics_port=8080), "must differ"),
        (lambda d: d["router"].update(request_timeout_s=0), "request_timeout_s"),
        (lambda d: d["router"].update(cb_failure_threshold=True), "cb_failure_threshold"),
        (lambda d: d.update(repo_dir="srv/dsv4"), "repo_dir"),
        (lambda d: d.update(pairs=[]), "at least one pair"),
        (lambda d: d["pairs"].append({"env_file": d["pairs"][0]["env_file"]}), "own PAIR_ID"),
        (lambda d: d["pairs"].append({}), "env_file is required"),
        (lambda d: d["ssh"].update(port="ssh"), "ssh.port"),
    ],
)
def test_bad_inventories_are_refused_with_the_fix(tmp_path: Path, edit, needle: str) -> None:
    _refused(tmp_path, edit, needle)


def test_a_node_in_two_pairs_is_refused(tmp_path: Path) -> None:
    """The seed's incident at fleet scale: pair b's env file still names pair a's worker."""
    data = inventory_data(tmp_path)
    b = Path(data["pairs"][1]["env_file"])
    b.write_text(b.read_text().replace("SPARK2=10.9.0.22", "SPARK2=10.9.0.12"))
    with pytest.raises(
        ConfigError, match="node 10.9.0.12 is in pair 'pair-a' and in pair 'pair-b'"
    ):
        load_inventory(write_inventory(tmp_path, data))


def test_a_broken_pair_env_file_names_the_file(tmp_path: Path) -> None:
    data = inventory_data(tmp_path)
    a = Path(data["pairs"][0]["env_file"])
    a.write_text(a.read_text().replace("PORT=8000", "PORT=eighty"))
    with pytest.raises(ConfigError, match=r"pair-a\.env: PORT="):
        load_inventory(write_inventory(tmp_path, data))


def test_missing_inventory_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="copy pairs/fleet.yaml.example"):
        load_inventory(tmp_path / "nope.yaml")
