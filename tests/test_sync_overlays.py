"""`launch/dspark_launch.sh sync-overlays`: copies the overlays to both nodes, sha256-verified."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path, PurePosixPath

import pytest

from pairctl.engine.overlays import ManifestError, parse_sums, ship_list, shipped_files, verify
from pairctl.preflight import PASS
from pairctl.preflight.checks_match import check_overlays
from pairctl.preflight.evidence import NodeEvidence
from tests.conftest import require
from tests.fakes.fakepair import FAKES, REPO, SECRET, Env, free_port

LAUNCHER = REPO / "launch" / "dspark_launch.sh"
PLUGIN = REPO / "mods" / "dsv4-flash-overlays"
SHIPS = [
    "README.md",
    "dsv4_flash_overlays-0.1.dist-info/entry_points.txt",
    "dsv4_flash_overlays/__init__.py",
    "dsv4_flash_overlays/flags.py",
    "dsv4_flash_overlays/fp8_configs.json",
    "pyproject.toml",
]

# What the overlay must not ship: the fp8 tuner and its offline helpers (they run from a
# clone, bench/kernels/fp8_tune), and no import of the root project's packages, which are
# not on the Sparks' overlay path.
TUNER_MODULES = {"tune.py", "search.py", "evalset.py", "timing.py", "reference.py", "table.py"}
ROOT_PACKAGES = {"bench", "pairctl", "sim", "perfmodel", "tests"}


def _src(tmp: Path) -> Path:
    """An overlay folder with the plugin's real ship list, and litter that must stay home."""
    src = tmp / "src"
    pkg = src / "dsv4_flash_overlays"
    (pkg / "__pycache__").mkdir(parents=True)
    (src / "pyproject.toml").write_bytes((PLUGIN / "pyproject.toml").read_bytes())
    (src / "README.md").write_text("# overlays\n")
    (pkg / "__init__.py").write_text("# overlay\n")
    (pkg / "flags.py").write_bytes(b"X = '\xc3\xa9'\n\x00\xff binary-ish\n")
    (pkg / "fp8_configs.json").write_text("{}\n")
    (pkg / "__pycache__" / "flags.cpython-311.pyc").write_bytes(b"junk")
    (src / "dsv4_flash_overlays-0.1.dist-info").mkdir()
    (src / "dsv4_flash_overlays-0.1.dist-info" / "entry_points.txt").write_text("[x]\n")
    # strays: a bench result in the package and at the top, an editable install's egg-info
    (pkg / "fp8_head_run12.json").write_text('{"tok_s": 1}\n')
    (src / "results").mkdir()
    (src / "results" / "run1.json").write_text("{}\n")
    (src / "dsv4_flash_overlays.egg-info").mkdir()
    (src / "dsv4_flash_overlays.egg-info" / "PKG-INFO").write_text("Name: x\n")
    return src


def _run(pair: Env, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PATH=f"{FAKES}:{os.environ['PATH']}",
        FAKE_STATE=str(pair.state_path),
        FAKE_LOG=str(pair.log_path),
        FAKE_HOST="h1",
        FAKE_PY=sys.executable,
        PAIRCTL_PYTHON=sys.executable,
    )
    p = subprocess.run(
        [str(LAUNCHER), "sync-overlays", "--env-file", str(pair.env_file), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert SECRET not in p.stdout + p.stderr
    return p


def test_sync_copies_verifies_and_replaces(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    src = _src(tmp_path)
    dest = Path(pair.values["OVERLAY_DIR"])
    dest.mkdir()
    (dest / "stale.py").write_text("old")
    p = _run(pair, "--src", str(src))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("sha256 verified") == 2
    assert (dest / "dsv4_flash_overlays" / "flags.py").read_bytes() == (
        src / "dsv4_flash_overlays" / "flags.py"
    ).read_bytes()
    assert not (dest / "stale.py").exists(), "old copy must be replaced, not merged"
    assert not (dest / "dsv4_flash_overlays" / "__pycache__").exists()
    shipped = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert shipped == SHIPS, "exactly the ship list arrives: no result, egg-info or pyc"
    assert shipped_files(dest) == shipped_files(src)
    ssh = pair.calls("ssh")
    assert ssh and all("StrictHostKeyChecking=yes" in c["argv"] for c in ssh)


def test_sync_unreachable_node_fails(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    pair.state["ssh_fail"] = "ssh: connect to host 127.0.0.2 port 22: Connection timed out"
    pair.save()
    p = _run(pair, "--src", str(_src(tmp_path)))
    assert p.returncode == 1 and "rank 1" in p.stdout


def test_ship_list_is_the_plugins_and_skips_strays(tmp_path: Path) -> None:
    assert ship_list(_src(tmp_path)) == SHIPS


def test_the_plugin_ships_every_tracked_file_and_nothing_else() -> None:
    """The real folder: its ship list covers each file git tracks there, and only those."""
    tracked = subprocess.run(
        ["git", "ls-files", "."], cwd=PLUGIN, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "mods/dsv4-flash-overlays is not a git checkout here"
    assert ship_list(PLUGIN) == sorted(tracked)
    assert "dsv4_flash_overlays/fp8_configs.json" in tracked


def test_what_ships_is_runtime_code_and_the_table() -> None:
    """The overlay ships what a serving process runs, its tuned table, its README and its
    metadata; the tuner, the kernels' references and the table writer stay in the clone."""
    files = ship_list(PLUGIN)
    assert (REPO / "bench" / "kernels" / "fp8_tune" / "tune.py").is_file()  # not vacuous
    assert [f for f in files if PurePosixPath(f).name in TUNER_MODULES] == []
    fp8 = sorted(f.rpartition("/")[2] for f in files if f.startswith("dsv4_flash_overlays/fp8_"))
    runtime = ["__init__.py", "configs.py", "dispatch.py", "quant.py", "w8a16.py", "w8a8.py"]
    assert fp8 == sorted([*runtime, "w8a8_once.py", "fp8_configs.json"]), fp8
    assert sorted(f for f in files if not f.endswith(".py")) == [
        "README.md",
        "dsv4_flash_overlays-0.1.0.dist-info/METADATA",
        "dsv4_flash_overlays-0.1.0.dist-info/entry_points.txt",
        "dsv4_flash_overlays-0.1.0.dist-info/top_level.txt",
        "dsv4_flash_overlays/fp8_configs.json",
        "pyproject.toml",
    ]
    for rel in (f for f in files if f.endswith(".py")):
        tree = ast.parse((PLUGIN / rel).read_text(), rel)
        for node in ast.walk(tree):  # function-level (lazy) imports included
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in ROOT_PACKAGES]
            assert not bad, f"{rel}:{node.lineno} imports {bad}: not shipped to the Sparks"


_IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, sys

    class Watch:  # records any attempt to import the root project, even a guarded one
        seen = []

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.split(".")[0] in ROOT:
                cls.seen.append(name)
            return None

    ROOT = set(sys.argv[2].split(","))
    sys.meta_path.insert(0, Watch)
    files = {}
    for name in sys.argv[1].split(","):
        files[name] = importlib.import_module(name).__file__
    print(json.dumps({"files": files, "root_imports": Watch.seen}))
    """
)


def test_every_shipped_module_imports_from_the_shipped_files_alone(tmp_path: Path) -> None:
    """A copy of exactly what ships, alone on the path: every module imports from it, and
    none tries to import the tuner or any other package of the root project."""
    require(importlib.util.find_spec("torch") is not None, "torch is not importable (vLLM's)")
    ship = tmp_path / "ship"
    modules = []
    for rel in ship_list(PLUGIN):
        (ship / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLUGIN / rel, ship / rel)
        if rel.endswith(".py"):
            modules.append(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and "DSV4" not in k}
    p = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, ",".join(modules), ",".join(sorted(ROOT_PACKAGES))],
        cwd=ship,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["root_imports"] == []
    assert "dsv4_flash_overlays.fp8_head.dispatch" in res["files"]
    assert all(f.startswith(str(ship)) for f in res["files"].values()), res["files"]


def test_ship_list_errors_name_the_fix(tmp_path: Path) -> None:
    src = _src(tmp_path)
    (src / "dsv4_flash_overlays" / "fp8_configs.json").unlink()
    with pytest.raises(ManifestError, match="fp8_configs.json.*matches no file"):
        ship_list(src)
    (src / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ManifestError, match=r"tool\.dsv4-flash-overlays\] ship"):
        ship_list(src)


def test_sync_refuses_a_folder_without_a_ship_list(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    src = _src(tmp_path)
    (src / "pyproject.toml").unlink()
    p = _run(pair, "--src", str(src))
    assert p.returncode == 1 and "pyproject.toml" in p.stdout, p.stdout + p.stderr
    assert not Path(pair.values["OVERLAY_DIR"]).exists()


def _overlays_verdict(pair: Env) -> dict:
    out = pair.tmp / "pf.json"
    p = pair.run("preflight", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    return {c["id"]: c for c in json.loads(out.read_text())["checks"]}["PF-OVERLAYS"]


def test_preflight_compares_only_shipped_files_on_the_nodes(tmp_path: Path) -> None:
    """After sync, PF-OVERLAYS passes; a stray on a node is ignored, a changed shipped file not."""
    pair = Env(tmp_path, free_port())
    p = pair.run("sync-overlays")  # the plugin folder of this checkout
    assert p.returncode == 0, p.stdout + p.stderr
    dest = Path(pair.values["OVERLAY_DIR"])
    (dest / "results").mkdir()
    (dest / "results" / "fp8_head_run11.json").write_text("{}\n")
    (dest / "dsv4_flash_overlays" / "notes.txt").write_text("left on the node\n")
    c = _overlays_verdict(pair)
    assert c["status"] == "PASS", c
    assert c["detail"] == f"{len(ship_list(PLUGIN))} files match on both"
    (dest / "README.md").write_text("edited on the node\n")
    c = _overlays_verdict(pair)
    assert c["status"] == "WARN" and "differs from repo: README.md" in c["detail"], c
    (dest / "README.md").unlink()
    c = _overlays_verdict(pair)
    assert c["status"] == "WARN" and "missing README.md" in c["detail"], c


def test_a_stray_in_the_source_folder_is_not_expected_on_the_nodes(tmp_path: Path) -> None:
    """PF-OVERLAYS' expectation is the ship list: a local result file adds nothing to it."""
    src = _src(tmp_path)
    want = shipped_files(src)
    node = NodeEvidence(overlay_dir=True, overlay_files=dict(want), reachable=True)
    assert check_overlays("/o", want, node, node).status == PASS
    assert not any("run" in k or "egg-info" in k or "results" in k for k in want)


def test_verify_detects_corruption() -> None:
    want = {"a.py": "1" * 64, "b.py": "2" * 64}
    have = parse_sums(f"{'1' * 64}  ./a.py\n{'3' * 64}  ./b.py\n{'4' * 64}  ./c.py\n")
    assert verify(want, have) == ["checksum mismatch b.py", "unexpected c.py"]
    assert verify(want, {"a.py": "1" * 64}) == ["missing b.py"]
    assert verify(want, dict(want)) == []


def test_sync_bad_args() -> None:
    p = subprocess.run(
        [str(LAUNCHER), "sync-overlays", "--bogus"], capture_output=True, text=True, check=False
    )
    assert p.returncode == 2 and "unknown argument" in p.stderr
