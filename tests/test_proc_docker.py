"""The rehearsal's process runtime (`sim/rehearsal/bin/docker`), tested directly.

It stands in for Docker under the launcher, so it must fail where docker fails (unknown
flags, missing image, name conflicts) and report real process state (a crash shows as
exited with its code), or the launcher's rehearsal would prove nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.rehearsal.docker_args import verdict
from sim.rehearsal.store import Store, proc_start_time, remove_created_paths, write_json_atomic
from tests.conftest import require

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "sim" / "rehearsal" / "bin" / "docker"
FAKE_DOCKER = REPO / "tests" / "fakes" / "bin" / "docker"

needs_root = pytest.mark.needs_root  # the runtime: unshare --mount/--pid, bind mounts


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    st = tmp_path / "state"
    st.mkdir()
    yield st
    # Kill whatever a failing test left running, remove mount points the runtime made.
    for cdir in (st / "containers").glob("*"):
        subprocess.run([str(DOCKER), "rm", "-f", cdir.name], env=_env(st), capture_output=True)
    remove_created_paths(st)


def _env(st: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DSV4R_DOCKER_STATE": str(st), **extra}


def docker(st: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DOCKER), *args], env=_env(st, **extra), capture_output=True, text=True, timeout=60
    )


def run_d(st: Path, *args: str, **extra: str) -> str:
    res = docker(st, "run", "-d", "--network", "host", *args, **extra)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def wait_state(st: Path, name: str, want: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = json.loads(docker(st, "inspect", name).stdout)[0]
        if info["State"]["Status"] == want or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


@needs_root
def test_run_records_labels_env_mounts_and_ps_json(
    state: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    docker(state, "load-fake", "img:1", "abc123")
    src = tmp_path / "src"
    src.mkdir()
    (src / "marker").write_text("seen inside")
    # The mount point's nearest existing ancestor holds no other mounts (unlike tmp_path,
    # which holds the state dir): the runtime overlays it privately.
    far = tmp_path_factory.mktemp("far")
    cid = run_d(
        state,
        "--name",
        "dsv4-p-rank0",
        "--label",
        "dsv4.pair=p",
        "--label",
        "dsv4.rank=0",
        "--gpus",
        "all",
        "--ipc",
        "host",
        "--shm-size",
        "1g",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "-v",
        f"{src}:{far}/new/mnt:ro",
        "-e",
        "A=1",
        "img:1",
        "sh",
        "-c",
        f"cat {far}/new/mnt/marker; echo; sleep 30",
    )
    assert len(cid) == 64
    deadline = time.monotonic() + 10
    while not docker(state, "logs", cid).stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    # The missing mount point exists inside the container only (a private overlay on its
    # nearest existing ancestor): nothing was created on the machine's filesystem.
    assert docker(state, "logs", cid).stdout.startswith("seen inside")
    assert not (far / "new").exists()
    assert not (state / "created-paths.txt").exists()
    rows = [
        json.loads(line)
        for line in docker(
            state,
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            "label=dsv4.pair=p",
            "--format",
            "{{json .}}",
        ).stdout.splitlines()
    ]
    assert [r["ID"] for r in rows] == [cid]
    assert rows[0]["Names"] == "dsv4-p-rank0" and rows[0]["State"] == "running"
    assert set(rows[0]["Labels"].split(",")) == {"dsv4.pair=p", "dsv4.rank=0"}
    # AND semantics of label filters: a second, non-matching label filter hides it.
    assert (
        docker(
            state,
            "ps",
            "-a",
            "--filter",
            "label=dsv4.pair=p",
            "--filter",
            "label=dsv4.rank=1",
            "-q",
        ).stdout
        == ""
    )
    info = json.loads(docker(state, "inspect", "dsv4-p-rank0").stdout)[0]
    assert info["State"]["Running"] is True and info["State"]["Pid"] > 0
    assert info["Config"]["Labels"] == {"dsv4.pair": "p", "dsv4.rank": "0"}
    assert "A=1" in info["Config"]["Env"]
    assert info["HostConfig"]["Ulimits"][0] == {"Name": "memlock", "Soft": -1, "Hard": -1}
    assert info["HostConfig"]["ShmSize"] == 1 << 30
    assert info["Mounts"][0]["RW"] is False
    assert (
        docker(state, "image", "inspect", "--format", "{{.Id}}", "img:1").stdout.strip()
        == "sha256:abc123"
    )
    assert docker(state, "inspect", "--format", "{{.State.Running}}", cid).stdout.strip() == "true"
    assert docker(state, "rm", "-f", cid).returncode == 0
    assert docker(state, "ps", "-a", "-q").stdout == ""


@needs_root
def test_mount_point_under_root_is_created_recorded_and_removable(
    state: Path, tmp_path: Path
) -> None:
    # `/` cannot get a private overlay: the mount point is made for real, and recorded so
    # the harness removes it (only if empty).
    docker(state, "load-fake", "img", "1")
    dst = Path(f"/dsv4r-test-{os.getpid()}/deep")
    run_d(state, "--name", "r", "-v", f"{tmp_path}:{dst}", "img", "ls", str(dst))
    wait_state(state, "r", "exited")
    created = (state / "created-paths.txt").read_text().split()
    assert str(dst) in created and str(dst.parent) in created
    remove_created_paths(state)
    assert not dst.parent.exists() and tmp_path.exists()


@needs_root
def test_crash_shows_exited_with_code_and_logs(state: Path) -> None:
    docker(state, "load-fake", "img", "1")
    run_d(state, "--name", "c", "img", "sh", "-c", "echo one; echo two; echo boom >&2; exit 7")
    info = wait_state(state, "c", "exited")
    assert info["State"]["Running"] is False and info["State"]["ExitCode"] == 7
    ps = docker(state, "ps", "-a", "--format", "{{.State}} {{.Status}}").stdout
    assert ps.startswith("exited Exited (7)")
    assert docker(state, "ps", "-q").stdout == ""  # without -a: running only
    assert docker(state, "logs", "c").stdout.splitlines() == ["one", "two", "boom"]
    assert docker(state, "logs", "--tail", "1", "c").stdout == "boom\n"
    assert docker(state, "rm", "c").returncode == 0  # exited: no -f needed


@needs_root
def test_killed_process_shows_signal_exit_code(state: Path) -> None:
    docker(state, "load-fake", "img", "1")
    run_d(state, "--name", "k", "img", "sleep", "60")
    pid = json.loads(docker(state, "inspect", "k").stdout)[0]["State"]["Pid"]
    os.kill(pid, 9)
    info = wait_state(state, "k", "exited")
    assert info["State"]["ExitCode"] == 137


@needs_root
def test_mounts_are_real_and_read_only_where_asked(state: Path, tmp_path: Path) -> None:
    docker(state, "load-fake", "img", "1")
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "f").write_text("payload")
    run_d(
        state,
        "--name",
        "m",
        "-v",
        f"{ro}:{tmp_path}/in-ro:ro",
        "-v",
        f"{rw}:{tmp_path}/in-rw",
        "img",
        "sh",
        "-c",
        f"cat {tmp_path}/in-ro/f; touch {tmp_path}/in-ro/x || echo RO; "
        f"echo written > {tmp_path}/in-rw/out",
    )
    wait_state(state, "m", "exited")
    out = docker(state, "logs", "m").stdout
    assert "payload" in out and "RO" in out
    assert (rw / "out").read_text() == "written\n"
    assert not (ro / "x").exists()


@needs_root
def test_rm_force_kills_the_whole_container(state: Path) -> None:
    docker(state, "load-fake", "img", "1")
    # A background child in a new session escapes the process group; the PID namespace
    # still takes it down with the container.
    # Durations unique to this run, so a concurrent run's sleepers are not counted.
    a, b = 700000 + os.getpid() % 100000, 800000 + os.getpid() % 100000
    run_d(
        state,
        "--name",
        "tree",
        "img",
        "sh",
        "-c",
        f"setsid sleep {a} & sleep {b} & echo started; wait",
    )
    info = wait_state(state, "tree", "running")
    wanted = (f"sleep\x00{a}".encode(), f"sleep\x00{b}".encode())
    deadline = time.monotonic() + 10
    while True:
        marks = [
            p
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and any(w in _cmdline(p) for w in wanted)
        ]
        if len(marks) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(marks) == 2, "the test's sleepers did not start"
    refused = docker(state, "rm", "tree")
    assert refused.returncode == 1 and "cannot remove a running container" in refused.stderr
    assert docker(state, "rm", "-f", "tree").returncode == 0
    assert all(not p.exists() or not _cmdline(p) for p in marks)
    assert not Path(f"/proc/{info['State']['Pid']}/cmdline").exists() or not _cmdline(
        Path(f"/proc/{info['State']['Pid']}")
    )
    assert docker(state, "ps", "-a", "-q").stdout == ""


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


@needs_root
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "-d", "--network", "host", "--bogus", "img", "x"], "unknown flag: --bogus"),
        (["run", "-d", "--network", "host", "--rm", "img", "x"], "outside the subset"),
        (["run", "--network", "none", "img", "x"], "only `docker run -d`"),
        (["run", "--rm", "--network", "bridge", "img", "x"], "--network none"),
        (
            ["run", "-d", "--network", "host", "--device", "/nonexistent/ib", "img", "x"],
            'adding custom device "/nonexistent/ib"',
        ),
        (["run", "-d", "-Z", "img", "x"], "unknown shorthand flag: 'Z' in -Z"),
        (["run", "-d", "--network", "host", "nope:1", "x"], "Unable to find image 'nope:1'"),
        (["run", "-d", "--network", "host", "--shm-size", "lots", "img", "x"], "invalid size"),
        (
            ["run", "-d", "--network", "host", "--ulimit", "bogus=1", "img", "x"],
            "invalid ulimit type",
        ),
        (["run", "-d", "--network", "bridge", "img", "x"], "--network host"),
        (["run", "-d", "--network", "host", "img", "no-such-exe"], "executable file not found"),
        (["ps", "--bogus"], "unknown flag: --bogus"),
    ],
)
def test_bad_invocations_fail_like_docker(state: Path, args: list[str], needle: str) -> None:
    docker(state, "load-fake", "img", "1")
    res = docker(state, *args)
    assert res.returncode in (125, 127), res
    assert needle in res.stderr
    assert docker(state, "ps", "-q").stdout == ""  # nothing started (docker may leave "created")


@needs_root
def test_name_conflict_and_missing_container(state: Path) -> None:
    docker(state, "load-fake", "img", "1")
    run_d(state, "--name", "dup", "img", "sleep", "30")
    res = docker(state, "run", "-d", "--network", "host", "--name", "dup", "img", "sleep", "1")
    assert res.returncode == 125 and 'name "/dup" is already in use' in res.stderr
    missing = docker(state, "inspect", "ghost")
    assert missing.returncode == 1 and json.loads(missing.stdout) == []
    assert "No such container: ghost" in docker(state, "rm", "-f", "ghost").stderr
    assert docker(state, "image", "inspect", "ghost:1").returncode == 1


@needs_root
def test_env_by_name_passes_callers_value_and_injected_env(state: Path) -> None:
    docker(state, "load-fake", "img", "1", "--env", "FROM_IMAGE=yes")
    (state / "inject.env").write_text("# test fault\nTWIN_FAULT=crash:loading\n")
    run_d(
        state,
        "--name",
        "e",
        "-e",
        "SECRET_TOKEN",
        "-e",
        "UNSET_ONE",
        "img",
        "sh",
        "-c",
        "env",
        SECRET_TOKEN="s3cret",
    )
    wait_state(state, "e", "exited")
    env = docker(state, "logs", "e").stdout.splitlines()
    assert "SECRET_TOKEN=s3cret" in env and not any(e.startswith("UNSET_ONE") for e in env)
    assert "FROM_IMAGE=yes" in env and "TWIN_FAULT=crash:loading" in env
    assert any(e.startswith("PATH=") and "sim/rehearsal/bin" in e for e in env)


@needs_root
def test_logs_follow_ends_when_container_exits(state: Path) -> None:
    docker(state, "load-fake", "img", "1")
    run_d(state, "--name", "f", "img", "sh", "-c", "echo a; sleep 1; echo b")
    t0 = time.monotonic()
    res = docker(state, "logs", "-f", "f")
    assert res.stdout == "a\nb\n" and time.monotonic() - t0 < 8


def test_without_state_dir_it_says_where_it_works() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DSV4R_DOCKER_STATE"}
    res = subprocess.run([str(DOCKER), "ps"], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "rehearsal test host" in res.stderr


def _real_docker() -> str | None:
    """The real docker CLI (not our shim), which parses every flag before it looks for a
    daemon (docker/cli: cobra/pflag parse, then the API client connects): a free, exact
    oracle for flag syntax."""
    path = shutil.which("docker")
    return path if path and "rehearsal" not in path else None


def _real_verdict(argv: list[str]) -> bool:
    """True if the real docker CLI accepted the flags (then failed to reach a daemon)."""
    real = _real_docker()
    assert real
    res = subprocess.run(
        [real, *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )
    # Flags parsed; stopped where a daemon is needed: connecting, or (with --device) asking
    # the daemon's OS to validate the device paths.
    return any(
        m in res.stderr for m in ("Cannot connect to the Docker daemon", "unknown server OS")
    )


def _our_verdict(argv: list[str]) -> bool:
    """True if our parser (the runtime's and the unit tests' fake docker's) accepts them."""
    return verdict(argv) is None


FLAG_CORPUS = [
    "run -d --name n --label dsv4.pair=p --network host --gpus all --ipc host "
    "--shm-size 16g --ulimit memlock=-1 --ulimit stack=67108864 -v /a:/b:ro -e A=1 -e B "
    "img vllm serve /m --port 8000",
    "run --detach=true --net=host --name=n -l a=b --volume=/a:/b --env=A=1 img x",
    "run -d --network host --shm-size 512m img x",
    "run -d --network host --ulimit nofile=1024:2048 img x",
    "run -d --bogus img x",
    "run -d -Z img x",
    "run -d --network host --shm-size lots img x",
    "run -d --ulimit bogus=1 img x",
    "run -d --ulimit memlock img x",
    "run -d --name",
    "ps -a --no-trunc --filter label=a=b --filter label=c --format '{{json .}}'",
    "ps --bogus",
    "logs --tail 5 -f n",
    "logs -n 3 n",
    "logs --follow=true n",
    "rm -f a b",
    "rm --force=true a",
    "rm -x a",
    "inspect n",
    "inspect --format '{{.State.Running}}' n",
    "inspect -f '{{json .Config.Labels}}' a b",
    "logs --tail abc n",
    "image inspect --format '{{.Id}}' img:1",
    "image inspect --bogus img:1",
    "image inspect",
    "ps extra",
    "rm",
    # the launcher's rank line since the RDMA devices and the explicit entrypoint
    "run -d --name n --label dsv4.pair=p --network host --gpus all --ipc host "
    "--device /dev/infiniband:/dev/infiniband --entrypoint vllm --ulimit memlock=-1 "
    "-v /c/vllm:/c/vllm -v /c/triton:/c/triton -e VLLM_CACHE_ROOT=/c/vllm -e NCCL_NET=IB "
    "-e VLLM_API_KEY img serve /m --port 8000",
    "run -d --network host --device /dev/infiniband img x",
    "run -d --network host --entrypoint= img x",
    "run -d --network host --user 1000:1000 img x",
    "run -d --network host -u=1000 img x",
    "run -d --network host --user",
    # the throwaway argv check: attached, removed after, no network, the image's python3
    "run --rm --label dsv4.pair=p --label dsv4.role=argcheck --network none --gpus all "
    "-e VLLM_LOGGING_LEVEL=ERROR --entrypoint python3 img -c 'print(1)' '[[\"m\"]]'",
    # the image probe: attached, removed after, no network, no GPU, the stack's interpreter
    "run --rm --label dsv4.pair=p --label dsv4.role=imageprobe --network none "
    "-v /ov:/opt/dsv4-flash-overlays:ro -e PATH=/opt/env/bin:/usr/bin "
    "--entrypoint /opt/env/bin/python img -c 'print(1)'",
    "run --rm --entrypoint",
    "run --rm --device",
    # image ship: save on rank 0, load on rank 1
    "save -o /tmp/x.tar img:1",
    "save --output=/tmp/x.tar img:1 img:2",
    "save",
    "save -o",
    "save --bogus img",
    "load -i /dev/null",  # the client opens the file before it connects
    "load --input=/dev/null -q",
    "load extra",
    "load -x",
    # image ship names a digest-pinned image on rank 1 (it loads untagged)
    "tag sha256:" + "ab" * 32 + " reg/img:pinned-" + "cd" * 32,
    "tag img:1 img:2",
    "tag img:1",
    "tag a b c",
    "tag --bogus a b",
]


@pytest.mark.parametrize("line", FLAG_CORPUS)
def test_flag_verdicts_match_the_real_docker_cli(line: str) -> None:
    require(_real_docker() is not None, "no real docker CLI on PATH to compare with")
    argv = shlex.split(line)
    assert _our_verdict(argv) == _real_verdict(argv), line


@pytest.mark.parametrize("line", FLAG_CORPUS)
def test_unit_test_fake_docker_parses_like_the_runtime(tmp_path: Path, line: str) -> None:
    """The launcher unit tests' fake docker (tests/fakes) rejects exactly what the runtime
    rejects, with the same words: one parser, so a bad flag fails in the unit tests too."""
    st = tmp_path / "state.json"
    st.write_text(json.dumps({"hosts": {"h1": {"images": {}, "containers": []}}}))
    argv = shlex.split(line)
    res = subprocess.run(
        [str(FAKE_DOCKER), *argv],
        env={**os.environ, "FAKE_STATE": str(st), "FAKE_HOST": "h1", "FAKE_PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=30,
    )
    want = verdict(argv)
    if want is None:
        assert "See 'docker" not in res.stderr, res.stderr
    else:
        assert res.returncode == 125 and want in res.stderr, res


@needs_root
def test_device_is_recorded_and_entrypoint_replaces_the_images(state: Path, tmp_path: Path) -> None:
    """`--device` of an existing path is recorded (the runtime exposes nothing inside);
    `--entrypoint` replaces the image's ENTRYPOINT, `--entrypoint ""` clears it."""
    docker(state, "load-fake", "img", "1", "--entrypoint", "echo", "--entrypoint", "from-image")
    run_d(state, "--name", "image-ep", "img", "arg")
    run_d(
        state,
        "--name",
        "own-ep",
        "--device",
        f"{tmp_path}:/dev/infiniband",
        "--entrypoint",
        "printf",
        "img",
        "%s-%s\\n",
        "a",
        "b",
    )
    run_d(state, "--name", "no-ep", "--entrypoint=", "img", "echo", "plain")
    for name, want in (("image-ep", "from-image arg"), ("own-ep", "a-b"), ("no-ep", "plain")):
        wait_state(state, name, "exited")
        assert docker(state, "logs", name).stdout.strip() == want, name
    info = json.loads(docker(state, "inspect", "own-ep").stdout)[0]
    assert info["HostConfig"]["Devices"] == [
        {
            "PathOnHost": str(tmp_path),
            "PathInContainer": "/dev/infiniband",
            "CgroupPermissions": "rwm",
        }
    ]
    assert info["Config"]["Entrypoint"] == ["printf"] and info["Path"] == "printf"
    image = json.loads(docker(state, "image", "inspect", "img").stdout)[0]
    assert image["Config"]["Entrypoint"] == ["echo", "from-image"]


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_container_whose_supervisor_has_not_recorded_its_exit_still_runs(
    tmp_path: Path,
) -> None:
    """Between the process's exit and its supervisor recording the code, `state` must not
    make up an exit code (137): an attached `run --rm` on a loaded CI box exited 137 in that
    window instead of its container's 3. Only with the supervisor gone too is it 137."""
    store = Store(tmp_path)
    cdir = store.cdir("c1")
    cdir.mkdir(parents=True)
    me = os.getpid()
    write_json_atomic(
        cdir / "state.json",
        {
            "Status": "running",
            "ExitCode": 0,
            "Pid": _dead_pid(),
            "SupervisorPid": me,
            "SupervisorStart": proc_start_time(me),
        },
    )
    assert store.state("c1")["Status"] == "running"
    write_json_atomic(
        cdir / "state.json",
        {"Status": "running", "ExitCode": 0, "Pid": _dead_pid(), "SupervisorPid": _dead_pid()},
    )
    st = store.state("c1")
    assert (st["Status"], st["ExitCode"]) == ("exited", 137)


@needs_root
def test_run_rm_is_attached_isolated_and_removed(state: Path) -> None:
    """The argv check's throwaway: output on stdout, its exit code, no network, gone after."""
    docker(state, "load-fake", "img", "1")
    res = docker(
        state,
        "run",
        "--rm",
        "--network",
        "none",
        "--label",
        "dsv4.pair=p",
        "img",
        "sh",
        "-c",
        "echo out; echo err >&2; cat /proc/net/dev | tail -n +3 | wc -l; exit 3",
    )
    assert res.returncode == 3, res.stderr
    assert res.stdout.split() == ["out", "err", "1"]  # loopback only: its own network
    assert docker(state, "ps", "-a", "-q").stdout == ""


@needs_root
@pytest.mark.needs_vllm
def test_argv_check_runs_the_images_own_parser_in_a_throwaway(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pairctl.preflight.argcheck on a host without vLLM: the image's interpreter (the engine
    stack's; the upstream stack's python3, here the venv's, which has vLLM 0.33) parses both
    ranks' argv in a labelled --rm container; a bad flag is named with where it came from,
    and no container is left behind."""
    from pairctl.nodes.ssh import Node
    from pairctl.pair.config import parse_env
    from pairctl.pair.recipe import load_recipe
    from pairctl.pair.resolved import resolve
    from pairctl.preflight.argcheck import run_in_image

    pybin = tmp_path / "image-bin"
    pybin.mkdir()
    (pybin / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (pybin / "python3").chmod(0o755)
    docker(
        state,
        "load-fake",
        "img:1",
        "ab12",
        "--env",
        f"PATH={pybin}:/usr/bin:/bin",
        "--env",
        "VLLM_TARGET_DEVICE=cpu",  # this machine has no GPU for the platform
    )
    monkeypatch.setenv("PATH", f"{DOCKER.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("DSV4R_DOCKER_STATE", str(state))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = parse_env(
        {
            "PAIR_ID": "p",
            "SPARK1": "127.0.0.1",
            "SPARK2": "127.0.0.2",
            "MODEL_PATH": "/models/dsv4",
            "NCCL_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
            "IMAGE": "img:1",
            "ENGINE_STACK": "upstream",  # its interpreter is the image's python3 (on PATH)
        }
    )
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    node = Node(0, "127.0.0.1", cfg)
    res = run_in_image(node, resolve(cfg, recipe, ["--bogus-flag", "1"]), "sha256:ab12")
    assert res.ran and "vLLM 0.33.0" in res.where, res
    assert res.errors == [
        "both ranks: extra vLLM args after --: vLLM's parser says: unrecognized arguments: "
        "--bogus-flag 1"
    ]
    assert docker(state, "ps", "-a", "-q").stdout == ""


def test_save_then_load_carries_the_id_and_env_not_the_registry_digest(
    tmp_path: Path,
) -> None:
    """image ship's round trip on the runtime (no root: save/load start no process): the
    tar docker save writes (manifest.json + config blob named by the ID), loaded on
    another host under the same ID with the image's env; RepoDigests dropped, as docker
    does for a loaded image."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    image_id = "sha256:" + "cd" * 32
    res = docker(
        a,
        "load-fake",
        "img:1",
        image_id,
        "--env",
        "PYTHONPATH=/x",
        "--digest",
        "reg/img@sha256:" + "ee" * 32,
    )
    assert res.returncode == 0, res.stderr
    tar = tmp_path / "img.tar"
    res = docker(a, "save", "-o", str(tar), "img:1")
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert tar.stat().st_mode & 0o777 == 0o600  # docker/cli CopyToFile: a CreateTemp file
    assert not list(tmp_path.glob(".docker_temp_*"))
    res = docker(b, "load", "-i", str(tar))
    assert res.returncode == 0 and res.stdout == "Loaded image: img:1\n", res
    info = json.loads(docker(b, "image", "inspect", "img:1").stdout)[0]
    assert info["Id"] == image_id and info["RepoDigests"] == []
    assert info["Config"]["Env"] == ["PYTHONPATH=/x"]
    assert docker(b, "image", "inspect", "--format", "{{.Id}}", "img:1").stdout.strip() == image_id


def test_save_and_load_fail_like_docker(tmp_path: Path) -> None:
    st = tmp_path / "st"
    st.mkdir()
    res = docker(st, "save", "-o", str(tmp_path / "x.tar"), "nope:1")
    assert res.returncode == 1 and "reference does not exist" in res.stderr
    assert not (tmp_path / "x.tar").exists()
    res = docker(st, "load", "-i", str(tmp_path / "missing.tar"))
    assert res.returncode == 1 and "no such file or directory" in res.stderr
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all" * 100)
    res = docker(st, "load", "-i", str(bad))
    assert res.returncode == 1 and "Error response from daemon" in res.stderr


def test_an_image_saved_by_digest_loads_untagged_and_tag_names_it(tmp_path: Path) -> None:
    """`docker save repo@sha256:D` writes no name (moby/moby#22011; #46533 keeps it so for
    the containerd store), so the load prints the ID and only the ID finds the image, with
    no RepoDigests; `docker tag ID NAME` names it, and a digest is refused as the target
    (moby client/image_tag.go), as image ship meets them on rank 1."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    image_id = "sha256:" + "cd" * 32
    ref = "reg/img@sha256:" + "ee" * 32
    assert docker(a, "load-fake", ref, image_id, "--digest", ref).returncode == 0
    assert docker(a, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() == image_id
    tar = tmp_path / "img.tar"
    assert docker(a, "save", "-o", str(tar), ref).returncode == 0
    res = docker(b, "load", "-i", str(tar))
    assert res.returncode == 0 and res.stdout == f"Loaded image ID: {image_id}\n", res
    missing = docker(b, "image", "inspect", ref)
    assert missing.returncode == 1 and f"No such image: {ref}" in missing.stderr
    info = json.loads(docker(b, "image", "inspect", image_id).stdout)[0]
    assert info["Id"] == image_id and info["RepoTags"] == [] and info["RepoDigests"] == []
    refused = docker(b, "tag", image_id, ref)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "refusing to create a tag with a digest reference"
    pinned = "reg/img:pinned-" + "ee" * 32
    assert docker(b, "tag", image_id, pinned).returncode == 0
    info = json.loads(docker(b, "image", "inspect", pinned).stdout)[0]
    assert info["Id"] == image_id and info["RepoTags"] == [pinned]
    res = docker(b, "tag", "nope:1", "x:1")
    assert res.returncode == 1 and "No such image: nope:1" in res.stderr
