"""The rehearsal's two test hosts: real sshd, host keys, hostnames, disks, runtime.

These are the properties the launcher's rehearsal relies on. If one silently broke (say
ssh stopped checking host keys, or both hosts shared a disk), the end-to-end tests would
still pass while proving much less, so each is asserted here on its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.rehearsal import hosts, pairenv, provision
from tests.conftest import require
from tests.support.rehearsal import http_get_on, pair_fixture

pair = pair_fixture("dsv4t")
needs_netns = pytest.mark.needs_netns


def test_rehearsal_runs_without_pytest() -> None:
    """`make rehearse` needs no test tooling: --help, and importing every sim module,
    work in an interpreter where `import pytest` fails."""
    code = (
        "import importlib, pkgutil, runpy, sys\n"
        "sys.modules['pytest'] = None  # any `import pytest` now raises ImportError\n"
        "import sim\n"
        "for m in pkgutil.walk_packages(sim.__path__, 'sim.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "sys.argv = ['python -m sim.rehearsal', '--help']\n"
        "runpy.run_module('sim.rehearsal', run_name='__main__')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr
    assert "Offline rehearsal" in res.stdout and "--keep" in res.stdout


@needs_netns
def test_hosts_have_own_hostname_ip_and_disk(pair: hosts.Pair) -> None:
    lay = pairenv.layout(pair)
    seen = []
    for host in pair.hosts:
        res = host.run(
            [
                "sh",
                "-c",
                f"hostname; ip -o -4 addr show {host.nic}; "
                f"sha256sum {lay.model_path}/config.json; "
                f"ip -o -4 addr show {host.fabric_nic}; "
                f"echo {host.name} > {host.node_view}/whoami",
            ]
        )
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == host.name
        assert f"{host.ip}/24" in lines[1]
        seen.append(lines[2].split()[0])
        # the second NIC (the fabric), on its own subnet
        assert host.fabric_ip and f"{host.fabric_ip}/24" in lines[3]
        assert host.fabric_ip.rsplit(".", 1)[0] != host.ip.rsplit(".", 1)[0]
    assert seen[0] == seen[1]  # the same model files on both, like a synced pair
    # Same path, different disks: each host wrote its own name to the same path.
    assert (pair.h1.disk / "whoami").read_text() == f"{pair.h1.name}\n"
    assert (pair.h2.disk / "whoami").read_text() == f"{pair.h2.name}\n"


@needs_netns
def test_ssh_login_gets_runtime_on_path(pair: hosts.Pair) -> None:
    res = pair.h1.run(
        pair.ssh_argv(
            pair.h2,
            [
                'echo "$(hostname) $(command -v docker) $DSV4R_DOCKER_STATE"; '
                "docker image inspect --format '{{.Id}}' " + pairenv.IMAGE
            ],
        )
    )
    assert res.returncode == 0, res.stderr
    name, docker, state = res.stdout.splitlines()[0].split()
    assert name == pair.h2.name and docker.endswith("sim/rehearsal/bin/docker")
    assert state == str(pair.h2.state_dir)
    assert res.stdout.splitlines()[1] == pairenv.IMAGE_ID


@needs_netns
def test_wrong_known_hosts_is_a_host_key_failure(pair: hosts.Pair) -> None:
    # Pair B's launcher pointed at pair A: ssh must refuse, not prompt or accept.
    wrong = pair.base / "client" / "known_hosts.wrong"
    pub = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(pair.identity)], capture_output=True, text=True, check=True
    ).stdout.split()
    wrong.write_text(f"{pair.h2.ip} {pub[0]} {pub[1]}\n")
    res = pair.h1.run(pair.ssh_argv(pair.h2, ["true"], known_hosts=wrong))
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr
    empty = pair.base / "client" / "known_hosts.empty"
    empty.write_text("")
    res = pair.h1.run(pair.ssh_argv(pair.h2, ["true"], known_hosts=empty))
    assert res.returncode == 255 and "Host key verification failed" in res.stderr


@needs_netns
def test_container_started_over_ssh_detaches_and_serves(pair: hosts.Pair) -> None:
    port = 8765
    t0 = time.monotonic()
    res = pair.h1.run(
        pair.ssh_argv(
            pair.h2,
            [
                f"docker run -d --name web --label dsv4.pair=t --network host {pairenv.IMAGE} "
                f"python3 -m http.server {port} --bind {pair.h2.ip}"
            ],
        )
    )
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 < 5, "ssh did not return: the container kept the session"
    try:
        body = ""
        for _ in range(100):
            got = http_get_on(pair.h1, f"http://{pair.h2.ip}:{port}/")
            body = got.stdout
            if got.returncode == 0:
                break
            time.sleep(0.1)
        assert "Directory listing" in body
        # The server runs in host 2's netns and nowhere else.
        assert any("http.server" in c for c in pair.h2.process_cmdlines())
        assert not any("http.server" in c for c in pair.h1.process_cmdlines())
        ps = pair.h2.docker("ps", "-a", "--format", "{{json .}}")
        assert json.loads(ps.stdout)["Names"] == "web"
    finally:
        pair.h2.docker("rm", "-f", "web")
    assert not any("http.server" in c for c in pair.h2.process_cmdlines())


@needs_netns
def test_stopped_sshd_makes_host_unreachable_then_restarts(pair: hosts.Pair) -> None:
    pair.stop_sshd(pair.h2)
    try:
        res = pair.h1.run(pair.ssh_argv(pair.h2, ["true"]))
        assert res.returncode == 255 and "Connection refused" in res.stderr
    finally:
        pair.start_sshd(pair.h2)
    assert pair.h1.run(pair.ssh_argv(pair.h2, ["true"])).returncode == 0


def _ours(prefix: str) -> list[str]:
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [ln for ln in netns.splitlines() if ln.startswith(f"{prefix}-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [ln for ln in links.splitlines() if f" {prefix}-" in ln]
    found += [str(p) for p in Path("/tmp").glob(f"{prefix}-*")]
    found += [str(p) for p in Path("/tmp").glob(f"{prefix}.lock")]
    return found


@needs_netns
def test_teardown_and_leftover_cleanup_remove_everything() -> None:
    first = provision.build_free_pair("dsv4tc")
    prefix = first.prefix
    pairenv.load_image(first.h2)
    mnt = Path(f"/{prefix}-mnt")  # under `/`: made for real and recorded (see the runtime)
    cid = first.h2.docker(
        "run",
        "-d",
        "--network",
        "host",
        "-v",
        f"{first.base}:{mnt}/deep",
        pairenv.IMAGE,
        "sleep",
        "600",
    )
    assert cid.returncode == 0, cid.stderr
    deadline = time.monotonic() + 10
    while not (mnt / "deep").is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (mnt / "deep").is_dir()
    # Simulate a crash: drop the lock without tearing down, then build again.
    assert first.lock_fh is not None
    first.lock_fh.close()
    second = provision.build_pair(prefix)
    try:
        assert not first.base.exists(), "leftover temp dir survived"
        assert not mnt.exists(), "leftover mount point survived"
        # build_pair's own ssh check leaves a per-connection sshd exiting for a moment
        deadline = time.monotonic() + 30  # a loaded box: ample; it exits within moments
        while second.h2.pids() != [second.h2.sshd_pid()] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert second.h2.pids() == [second.h2.sshd_pid()]
        with pytest.raises(hosts.HarnessError, match="another rehearsal with prefix"):
            provision.build_pair(prefix)
    finally:
        provision.teardown(second)
    assert _ours(prefix) == []


@pytest.mark.needs_root
def test_bin_shims_are_shellcheck_clean() -> None:
    # `make lint` checks *.sh files; these two are named like the commands they replace.
    require(shutil.which("shellcheck") is not None, "shellcheck not installed (make system-deps)")
    bins = sorted(str(p) for p in hosts.BIN_DIR.iterdir())
    res = subprocess.run(["shellcheck", *bins], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
