"""`launch/dspark_launch.sh sync-overlays`: copies the overlays to both nodes, sha256-verified."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pairctl.overlays import parse_sums, verify
from pairctl.preflight import local_overlay_files
from tests.fakes.fakepair import FAKES, REPO, SECRET, Env, free_port

LAUNCHER = REPO / "launch" / "dspark_launch.sh"


def _src(tmp: Path) -> Path:
    src = tmp / "src"
    pkg = src / "dsv4_flash_overlays"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("# overlay\n")
    (pkg / "flags.py").write_bytes(b"X = '\xc3\xa9'\n\x00\xff binary-ish\n")
    (pkg / "__pycache__" / "flags.cpython-311.pyc").write_bytes(b"junk")
    (src / "dsv4_flash_overlays-0.1.dist-info").mkdir()
    (src / "dsv4_flash_overlays-0.1.dist-info" / "entry_points.txt").write_text("[x]\n")
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
    assert local_overlay_files(dest) == local_overlay_files(src)
    ssh = pair.calls("ssh")
    assert ssh and all("StrictHostKeyChecking=yes" in c["argv"] for c in ssh)


def test_sync_unreachable_node_fails(tmp_path: Path) -> None:
    pair = Env(tmp_path, free_port())
    pair.state["ssh_fail"] = "ssh: connect to host 127.0.0.2 port 22: Connection timed out"
    pair.save()
    p = _run(pair, "--src", str(_src(tmp_path)))
    assert p.returncode == 1 and "rank 1" in p.stdout


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
