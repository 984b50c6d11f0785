"""End to end: the real launcher on two netns test hosts (real sshd, process runtime,
simulator). The lifecycle, then each fault the launcher must handle (README
"Troubleshooting": unreachable or mis-keyed rank 1, a rank dying during boot, a foreign
process or pair, a launcher copied to the wrong machine, a malformed env file), each
ending in a clear message, the documented exit code (docs/INTERFACES.md) and no orphan
process or container.

Each test starts from a clean pair (the `fresh` fixture restores sshd, known_hosts,
overlays and injected faults, and force-removes anything a failing test left), but the
orphan checks run inside the tests, before that safety net, so an orphan is a failure.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pairctl.pair.plan import BOOT_PLACEHOLDER, LABEL_BOOT
from sim.rehearsal import chat, hosts, pairenv
from sim.rehearsal.docker_args import run_args
from tests.support.rehearsal import http_get_on, pair_fixture, run_launcher

pytestmark = pytest.mark.needs_netns

REPO = Path(__file__).resolve().parents[1]
PAIR_ID = "rehearsal"
LABEL = f"dsv4.pair={PAIR_ID}"
EXIT_USAGE, EXIT_PREFLIGHT, EXIT_BOOT = 2, 3, 4

pair = pair_fixture("dsv4e")


@pytest.fixture(scope="module")
def ready(pair: hosts.Pair) -> hosts.Pair:
    pairenv.copy_overlays(pair, REPO)
    return pair


def _force_clean(pair: hosts.Pair) -> None:
    """Safety net between tests: restore the pair to its pristine state."""
    for host in pair.hosts:
        pair.start_sshd(host)
        (host.disk / "docker" / "inject.env").unlink(missing_ok=True)
        ids = host.docker("ps", "-a", "-q", "--no-trunc").stdout.split()
        if ids:
            host.docker("rm", "-f", *ids)
        sshd = host.sshd_pid()
        for pid in host.pids():
            if pid != sshd:
                subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    backup = pair.known_hosts.with_suffix(".orig")
    if backup.exists():
        shutil.copyfile(backup, pair.known_hosts)
    pairenv.copy_overlays(pair, REPO)


@pytest.fixture()
def fresh(ready: hosts.Pair) -> Iterator[hosts.Pair]:
    shutil.copyfile(ready.known_hosts, ready.known_hosts.with_suffix(".orig"))
    yield ready
    _force_clean(ready)


def launch(
    pair: hosts.Pair, *args: str, env_file: Path | None = None, timeout: float = 240
) -> tuple[int, str]:
    """Run the launcher on host 1; returns (exit code, stdout+stderr). Never leaks the
    (fake) HF_TOKEN, whatever the command."""
    res = run_launcher(pair, REPO, *args, env_file=env_file, timeout=timeout)
    out = res.stdout + res.stderr
    assert pairenv.FAKE_HF_TOKEN not in out, "the launcher printed HF_TOKEN"
    return res.returncode, out


def containers(host: hosts.Host) -> list[dict]:
    res = host.docker("ps", "-a", "--no-trunc", "--format", "{{json .}}")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def assert_no_orphans(pair: hosts.Pair, allowed: tuple[str, ...] = ()) -> None:
    """No container and no process on either host except sshd and `allowed` substrings."""
    deadline = time.monotonic() + 5  # an ssh session may take a moment to close
    while True:
        left = {
            h.name: [c["Names"] for c in containers(h) if not any(a in c["Names"] for a in allowed)]
            + [p for p in h.process_cmdlines() if not any(a in p for a in allowed)]
            for h in pair.hosts
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(left.values()), f"orphans left: {left}"


def inject(host: hosts.Host, fault: str) -> None:
    (host.disk / "docker" / "inject.env").write_text(f"TWIN_FAULT={fault}\n")


def pair_pids(host: hosts.Host) -> dict[str, tuple[str, int]]:
    """name -> (container ID, init pid) of every container on the host."""
    return {
        c["Names"]: (c["ID"], json.loads(host.docker("inspect", c["ID"]).stdout)[0]["State"]["Pid"])
        for c in containers(host)
    }


def assert_plan_is_what_ran(pair: hosts.Pair, plan_text: str) -> None:
    """`plan` claims to print exactly what `up` runs; the runtime recorded what did run."""
    runs = [shlex.split(ln) for ln in plan_text.splitlines() if ln.startswith("docker run ")]
    assert len(runs) == 2, plan_text
    real = shutil.which("docker")  # the real CLI parses every flag before it needs a daemon
    for argv in runs:
        if real and "rehearsal" not in real:
            res = subprocess.run(
                [real, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=30,
                env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
            )
            # parsed; stopped at the daemon (connecting, or its OS for --device)
            reached = ("Cannot connect to the Docker daemon", "unknown server OS")
            assert any(m in res.stderr for m in reached), res.stderr
        name = run_args(argv[2:]).name
        assert name is not None
        host = pair.h1 if name.endswith("rank0") else pair.h2
        info = json.loads(host.docker("inspect", name).stdout)[0]
        # plan cannot know the boot id `up` draws: it prints a placeholder wherever it goes
        # (the label, the fingerprint value); the container's label says which one was drawn
        boot = info["Config"]["Labels"].get(LABEL_BOOT, "")
        assert re.fullmatch(r"[0-9a-f]{12}", boot), info["Config"]["Labels"]
        run = run_args([a.replace(BOOT_PLACEHOLDER, boot) for a in argv[2:]])
        assert info["Config"]["Labels"] == run.label_dict()
        assert info["HostConfig"]["Binds"] == run.volumes
        assert info["HostConfig"]["NetworkMode"] == run.network == "host"
        assert info["HostConfig"]["IpcMode"] == run.ipc == "private"
        assert info["HostConfig"]["ShmSize"] == 8 << 30
        assert info["HostConfig"]["Ulimits"] == run.ulimits
        assert [run.image, *info["Config"]["Cmd"]] == [pairenv.IMAGE, *run.cmd]
        assert info["Config"]["Entrypoint"] == [run.entrypoint] == ["vllm"]
        assert info["HostConfig"]["Devices"] == run.devices
        assert run.devices[0]["PathInContainer"] == "/dev/infiniband"
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        for item in run.env:
            key, eq, value = item.partition("=")
            if not eq or value == "***":  # a secret: by name or masked, never on a command
                # line, yet it arrived; HF_TOKEN is the host's (model fetch), in no container
                assert env[key] == {"VLLM_API_KEY": pairenv.FAKE_API_KEY}[key], key
            else:
                assert env[key] == value, key


def test_lifecycle_up_chat_status_noop_down(fresh: hosts.Pair) -> None:
    """up (with one overlay file missing on rank 1: warns, boots; and a stale, exited
    container of this pair on rank 1: replaced) -> chat -> logs -> plan == what ran ->
    status -> up again changes nothing -> down leaves nothing. One boot covers these
    cases, because a boot is the expensive part of these tests."""
    pair = fresh
    stale = pair.h2.docker(
        "run",
        "-d",
        "--name",
        f"dsv4-{PAIR_ID}-rank1",
        "--label",
        LABEL,
        "--label",
        "dsv4.rank=1",
        "--label",
        "dsv4.role=worker",
        "--network",
        "host",
        pairenv.IMAGE,
        "sh",
        "-c",
        "exit 1",
    )
    assert stale.returncode == 0, stale.stderr
    overlay = pair.h2.on_disk(pairenv.layout(pair).overlay_dir)
    victim = sorted(
        p for p in (overlay / "dsv4_flash_overlays").glob("*.py") if p.name != "__init__.py"
    )[0]
    victim.unlink()
    rc, out = launch(pair, "up", "--timeout", "120")
    assert rc == 0, out
    assert "healthy" in out
    warns = [ln for ln in out.splitlines() if "WARN" in ln and "OVERLAY" in ln.upper()]
    assert warns and any(victim.name in ln for ln in out.splitlines()), out
    reply = chat.stream_chat(f"http://{pair.h1.ip}:8000", "Say hello.", max_tokens=16)
    assert reply.simulator and (reply.content or reply.reasoning)
    assert reply.usage.get("completion_tokens", 0) > 0
    rc, out = launch(pair, "status")
    assert rc == 0, out
    assert f"dsv4-{PAIR_ID}-rank0 running" in out and f"dsv4-{PAIR_ID}-rank1 running" in out
    rc, out = launch(pair, "logs", "--rank", "1")
    assert rc == 0 and "SPARK-TWIN SIMULATOR" in out and "(Worker_TP1 pid=" in out, out
    rc, plan_text = launch(pair, "plan")
    assert rc == 0, plan_text
    assert_plan_is_what_ran(pair, plan_text)
    before = [pair_pids(h) for h in pair.hosts]
    assert set(before[0]) == {f"dsv4-{PAIR_ID}-rank0"}
    assert set(before[1]) == {f"dsv4-{PAIR_ID}-rank1"}
    assert before[1][f"dsv4-{PAIR_ID}-rank1"][0] != stale.stdout.strip(), "stale not replaced"
    rc, out = launch(pair, "up")
    assert rc == 0, out
    assert "nothing changed" in out.lower() or "already" in out.lower()
    assert [pair_pids(h) for h in pair.hosts] == before, "up on a healthy pair restarted it"
    rc, out = launch(pair, "down")
    assert rc == 0, out
    assert_no_orphans(pair)


def test_rank1_sshd_down_fails_preflight(fresh: hosts.Pair) -> None:
    pair = fresh
    pair.stop_sshd(pair.h2)
    rc, out = launch(pair, "up", "--timeout", "60")
    assert rc == EXIT_PREFLIGHT, out
    assert "PF-SSH" in out and "FAIL" in out
    assert_no_orphans(pair)


def test_rank1_host_key_mismatch_fails_preflight(fresh: hosts.Pair) -> None:
    # The seed's incident: a copied launcher reaching a host whose key it does not know.
    pair = fresh
    lines = pair.known_hosts.read_text().splitlines()
    h1_key = lines[0].split(" ", 1)[1]
    pair.known_hosts.write_text(f"{lines[0]}\n{pair.h2.ip},{pair.h2.name} {h1_key}\n")
    rc, out = launch(pair, "up", "--timeout", "60")
    assert rc == EXIT_PREFLIGHT, out
    assert "PF-SSH" in out and "host key" in out.lower()
    assert_no_orphans(pair)


def test_rank1_crash_during_boot_tears_down_both(fresh: hosts.Pair) -> None:
    pair = fresh
    inject(pair.h2, "crash:compiling:rank1")
    rc, out = launch(pair, "up", "--timeout", "120")
    assert rc == EXIT_BOOT, out
    assert "rank 1" in out and "FAIL" in out
    assert "compiling" in out.lower()  # the dead rank's log tail was printed
    assert_no_orphans(pair)


def test_head_crash_after_rank1_joined_tears_down_both(fresh: hosts.Pair) -> None:
    pair = fresh
    inject(pair.h1, "crash:loading:rank0")
    rc, out = launch(pair, "up", "--timeout", "120")
    assert rc == EXIT_BOOT, out
    assert "rank 0" in out and "FAIL" in out
    # the head's log tail shows rank 1 had joined: vLLM's line after the rendezvous
    assert "rank 0 in world size 2 is assigned as" in out, out
    assert_no_orphans(pair)


def test_port_taken_by_foreign_process_fails_preflight(fresh: hosts.Pair) -> None:
    pair = fresh
    squatter = pair.h1.popen(
        ["python3", "-m", "http.server", "8000", "--bind", pair.h1.ip],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if http_get_on(pair.h1, f"http://{pair.h1.ip}:8000/").returncode == 0:
                break
            time.sleep(0.1)
        rc, out = launch(pair, "up", "--timeout", "60")
        assert rc == EXIT_PREFLIGHT, out
        assert "PF-PORT-FREE" in out and "8000" in out
        assert squatter.poll() is None, "the launcher killed a process it does not own"
        assert_no_orphans(pair, allowed=("http.server",))
    finally:
        squatter.kill()
        squatter.wait()


def test_other_pairs_container_on_rank1_survives(fresh: hosts.Pair) -> None:
    pair = fresh
    other = pair.h2.docker(
        "run",
        "-d",
        "--name",
        "dsv4-pair-b-rank1",
        "--label",
        "dsv4.pair=pair-b",
        "--label",
        "dsv4.rank=1",
        "--label",
        "dsv4.role=worker",
        "--network",
        "host",
        pairenv.IMAGE,
        "sleep",
        "600",
    )
    assert other.returncode == 0, other.stderr
    other_id = other.stdout.strip()
    rc, out = launch(pair, "up", "--timeout", "60")
    assert rc == EXIT_PREFLIGHT, out
    assert "PF-FOREIGN-PAIR" in out and "pair-b" in out
    rc, out = launch(pair, "down")
    assert rc == 0, out
    (survivor,) = containers(pair.h2)
    assert survivor["ID"] == other_id and survivor["State"] == "running"
    assert_no_orphans(pair, allowed=("dsv4-pair-b-rank1", "sleep 600", other_id))


def test_launcher_run_on_the_wrong_machine_fails_preflight(fresh: hosts.Pair) -> None:
    # A launcher copied to another machine (here: rank 1 itself) must refuse, not act.
    pair = fresh
    assert pair.env_file is not None
    res = pair.h2.run(
        [str(REPO / "launch" / "dspark_launch.sh"), "up", "--env-file", str(pair.env_file)],
        env={"PAIRCTL_POLL_S": "0.5"},
        timeout=120,
        cwd=str(REPO / "launch"),
    )
    out = res.stdout + res.stderr
    assert res.returncode == EXIT_PREFLIGHT, out
    assert "PF-SELF-IS-SPARK1" in out and "FAIL" in out
    assert_no_orphans(pair)


def _established(host: hosts.Host, port_filter: str) -> list[tuple[str, str]]:
    """(local, peer) address:port of the host's established TCP connections matching an
    ``ss`` filter, e.g. ``sport = :29501``."""
    res = host.run(["ss", "-Htn", "state", "established", f"( {port_filter} )"])
    assert res.returncode == 0, res.stderr
    return [(ln.split()[-2], ln.split()[-1]) for ln in res.stdout.splitlines() if ln.strip()]


def test_ranks_talk_over_the_fabric_and_clients_over_spark1(fresh: hosts.Pair) -> None:
    """Two kinds of address, end to end: each host has a second NIC (the fabric); the env
    file names FABRIC1/FABRIC2 on it (MASTER_ADDR empty = FABRIC1) and NCCL_SOCKET_IFNAME is
    it. Preflight proves both addresses sit there and that rank 1 dials the master port
    from FABRIC2; the running ranks' connection (the twin's rank 1 dials MASTER_ADDR, as
    vLLM's TCP store client does) is between the fabric addresses, while the endpoint and
    ssh stay on SPARK1/SPARK2."""
    pair = fresh
    h1, h2 = pair.h1, pair.h2
    assert h1.fabric_ip and h1.fabric_ip != h1.ip and h2.fabric_nic == h1.fabric_nic
    rc, out = launch(pair, "preflight")
    assert rc == 0, out
    assert "PASS  PF-FABRIC-ADDR" in out and f"FABRIC2 {h2.fabric_ip} on rank 1's" in out
    assert "PASS  PF-FABRIC-REACH" in out and f"from {h2.fabric_ip}" in out, out
    rc, plan_text = launch(pair, "plan")
    assert rc == 0, plan_text
    assert f"VLLM_HOST_IP={h1.fabric_ip}" in plan_text
    assert f"VLLM_HOST_IP={h2.fabric_ip}" in plan_text
    assert f"--master-addr {h1.fabric_ip}" in plan_text
    assert f"# endpoint: http://{h1.ip}:8000/v1" in plan_text
    rc, out = launch(pair, "up", "--timeout", "120")
    assert rc == 0, out
    on_h1 = _established(h1, "sport = :29501")
    assert on_h1 and all(local == f"{h1.fabric_ip}:29501" for local, _ in on_h1), on_h1
    assert all(peer.startswith(f"{h2.fabric_ip}:") for _, peer in on_h1), on_h1
    on_h2 = _established(h2, "dport = :29501")
    assert on_h2 and all(peer == f"{h1.fabric_ip}:29501" for _, peer in on_h2), on_h2
    # nothing between the ranks on the ssh/client network
    assert not [c for c in on_h1 if c[1].startswith(f"{h2.ip}:")]
    reply = chat.stream_chat(f"http://{h1.ip}:8000", "Say hello.", max_tokens=8)
    assert reply.usage.get("completion_tokens", 0) > 0
    rc, out = launch(pair, "down")
    assert rc == 0, out
    assert_no_orphans(pair)


def test_fabric_left_on_the_ssh_network_fails_preflight(fresh: hosts.Pair) -> None:
    """The day-one mistake: FABRIC1/FABRIC2 empty, so the engine would use the ssh
    addresses, which are not on NCCL_SOCKET_IFNAME's interface."""
    pair = fresh
    assert pair.env_file is not None
    bad = pair.env_file.with_name("lan.env")
    text = pair.env_file.read_text()
    text = text.replace(f"FABRIC1={pair.h1.fabric_ip}", "FABRIC1=")
    bad.write_text(text.replace(f"FABRIC2={pair.h2.fabric_ip}", "FABRIC2="))
    rc, out = launch(pair, "up", env_file=bad, timeout=120)
    assert rc == EXIT_PREFLIGHT, out
    assert "FAIL  PF-FABRIC-ADDR" in out
    assert f"FABRIC1={pair.h1.ip} is on {pair.h1.nic}" in out, out
    assert_no_orphans(pair)


def test_spark2_equal_to_spark1_is_refused(fresh: hosts.Pair) -> None:
    pair = fresh
    assert pair.env_file is not None
    bad = pair.env_file.with_name("same.env")
    bad.write_text(
        pair.env_file.read_text().replace(f"SPARK2={pair.h2.ip}", f"SPARK2={pair.h1.ip}")
    )
    rc, out = launch(pair, "up", env_file=bad, timeout=120)
    assert rc in (EXIT_USAGE, EXIT_PREFLIGHT), out
    assert "SPARK2" in out
    assert_no_orphans(pair)


@pytest.mark.parametrize(
    ("command", "edit", "needle"),
    [
        ("up", lambda text: text.replace("PAIR_ID=rehearsal\n", ""), "PAIR_ID"),
        ("up", lambda text: text.replace("PORT=8000", "PORT=eighty"), "PORT"),
        ("up", lambda text: text + "SPARK3 10.0.0.3\n", "malformed line"),
        # Has an '=', but python-dotenv cannot parse it: must not be skipped with a warning.
        # (`plan`: a config error is exit 2 for every command, and plan never boots a pair.)
        ("plan", lambda text: text + "this line is not KEY=VALUE\n", ""),
    ],
)
def test_malformed_env_is_a_usage_error(fresh: hosts.Pair, command: str, edit, needle: str) -> None:
    pair = fresh
    assert pair.env_file is not None
    bad = pair.env_file.with_name("bad.env")
    bad.write_text(edit(pair.env_file.read_text()))
    rc, out = launch(pair, command, env_file=bad, timeout=90)
    assert rc == EXIT_USAGE, out
    assert needle in out
    assert_no_orphans(pair)


def test_sync_overlays_reaches_both_disks_over_ssh(fresh: hosts.Pair) -> None:
    pair = fresh
    lay = pairenv.layout(pair)
    for host in pair.hosts:
        shutil.rmtree(host.on_disk(lay.overlay_dir))
    assert pair.env_file is not None
    res = pair.h1.run(
        [
            str(REPO / "launch" / "dspark_launch.sh"),
            "sync-overlays",
            "--env-file",
            str(pair.env_file),
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    src = REPO / "mods" / "dsv4-flash-overlays"
    want = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if "__pycache__" not in p.parts
        and not any(part.endswith(".egg-info") or part == "build" for part in p.parts)
    )
    for host in pair.hosts:
        dst = host.on_disk(lay.overlay_dir)
        got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*.py"))
        assert got == want, host.name
        for rel in want:
            assert (dst / rel).read_bytes() == (src / rel).read_bytes()
    assert_no_orphans(pair)
