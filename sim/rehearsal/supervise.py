"""Container supervisor and container entry for the rehearsal's process runtime.

`supervise run CDIR` is started detached by `docker run -d` (its own session, no
terminal, so an ssh session that ran `docker run` can end). It starts the container in
a new PID namespace (the command is its init, as in docker without --init) and a private
mount namespace, records the init's pid, waits, and records the exit code: that is how
`ps`/`inspect` learn that a rank crashed, just as dockerd does.

`supervise enter CDIR` runs as PID 1 inside those namespaces: it applies the `-v` bind
mounts for real (read-only where asked) and execs the command with the container's env.
A PID namespace means `rm -f` kills everything the container started, even processes that
left its process group, because the kernel kills a PID namespace with its init.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from sim.rehearsal.store import Store, now_iso, proc_start_time, write_json_atomic

CLONE_NEWPID = 0x20000000


def _write_state(cdir: Path, **fields: object) -> None:
    """Update state.json unless the container was removed meanwhile."""
    path = cdir / "state.json"
    if not cdir.exists():
        return
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = {}
    if state.get("Status") == "removing":
        return
    state.update(fields)
    try:
        write_json_atomic(path, state)
    except OSError:
        pass  # removed between the check and the write


def _unshare_pid_ns() -> None:
    """Put this process's future children in a new PID namespace (the next child is its
    init). The supervisor stays outside and is that init's parent, so it sees the real
    exit status: `unshare --fork` reports a SIGKILLed child as plain exit 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWPID): {os.strerror(err)}")


def run(cdir: Path) -> int:
    """Start the container, record its init pid, wait, record its exit code."""
    cfg = json.loads((cdir / "config.json").read_text())
    # `--network none`: a network namespace of its own (loopback only, down), as in docker.
    net = ["--net"] if cfg["HostConfig"].get("NetworkMode") == "none" else []
    argv = [
        "unshare",
        "--mount",
        *net,
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "sim.rehearsal.supervise",
        "enter",
        str(cdir),
    ]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    _unshare_pid_ns()
    with open(cdir / "log", "ab", buffering=0) as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
        )
    _write_state(
        cdir,
        Status="running",
        Pid=proc.pid,
        PidStart=proc_start_time(proc.pid),
        Pgid=proc.pid,
        SupervisorPid=os.getpid(),
        SupervisorStart=proc_start_time(os.getpid()),
        StartedAt=now_iso(),
    )
    rc = proc.wait()
    code = 128 - rc if rc < 0 else rc
    _write_state(cdir, Status="exited", ExitCode=code, FinishedAt=now_iso())
    return 0


def _mount_points() -> list[str]:
    """Mount points visible in this mount namespace (field 5 of mountinfo)."""
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def _make_mountpoint(cdir: Path, dst: Path, is_dir: bool, overlaid: set[Path]) -> None:
    """Create a missing mount point *inside the container only*.

    The hosts share the machine's filesystem, so `mkdir /opt/dsv4-flash-overlays` there
    would leak between runs (and a concurrent run's teardown could remove it under us).
    Instead the nearest existing ancestor gets a private overlay (tmpfs upper layer) in
    this mount namespace: its content stays visible, the new directory exists only here,
    as in a container's own filesystem. Only when that ancestor is `/` or has mounts below
    it is the mount point created on the real filesystem, and recorded for the harness.
    """
    ancestor = next(p for p in dst.parents if p.exists())
    below = [m for m in _mount_points() if m.startswith(str(ancestor).rstrip("/") + "/")]
    if ancestor != Path("/") and not below and ancestor not in overlaid:
        scratch = cdir / f"scratch{len(overlaid)}"
        scratch.mkdir()
        for step in (
            ["mount", "-t", "tmpfs", "rehearsal-scratch", str(scratch)],
            ["mkdir", str(scratch / "up"), str(scratch / "work")],
            [
                "mount",
                "-t",
                "overlay",
                "rehearsal-overlay",
                "-o",
                f"lowerdir={ancestor},upperdir={scratch / 'up'},workdir={scratch / 'work'}",
                str(ancestor),
            ],
        ):
            subprocess.run(step, check=True, capture_output=True, text=True)
        overlaid.add(ancestor)
    elif ancestor not in overlaid:
        store = Store(cdir.parent.parent)
        for path in [dst, *dst.parents]:  # deepest first, so the harness can rmdir in order
            if not path.exists():
                store.record_created_path(path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        dst.mkdir(exist_ok=True)
    else:
        dst.touch()


def enter(cdir: Path) -> int:
    """Inside the namespaces: bind-mount the volumes, then exec the command."""
    cfg = json.loads((cdir / "config.json").read_text())
    # Our own /proc, so the container sees its PID namespace as docker's would.
    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=False)
    # `--ipc` other than host: the container's own /dev/shm, a tmpfs of --shm-size (docker's
    # default 64 MB), gone when the container's last process is (as docker frees it with
    # the container's IPC namespace). With --ipc host, /dev/shm is the host's.
    host_cfg = cfg["HostConfig"]
    if host_cfg.get("IpcMode") != "host":
        size = int(host_cfg.get("ShmSize") or 64 << 20)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "shm", "/dev/shm"],
            check=False,
        )
    # Stage every source first: a private overlay made for a later mount point must not
    # redirect a source path below it into the overlay's scratch layer.
    staged: list[Path] = []
    overlaid: set[Path] = set()
    try:
        for i, m in enumerate(cfg["Mounts"]):
            stage = cdir / f"src{i}"
            if Path(m["Source"]).is_dir():
                stage.mkdir()
            else:
                stage.touch()
            subprocess.run(
                ["mount", "--bind", m["Source"], str(stage)],
                check=True,
                capture_output=True,
                text=True,
            )
            staged.append(stage)
        for stage, m in zip(staged, cfg["Mounts"], strict=True):
            dst = Path(m["Destination"])
            if not dst.exists():
                _make_mountpoint(cdir, dst, stage.is_dir(), overlaid)
            subprocess.run(
                ["mount", "--bind", str(stage), str(dst)],
                check=True,
                capture_output=True,
                text=True,
            )
            if not m["RW"]:
                subprocess.run(
                    ["mount", "-o", "remount,bind,ro", str(dst)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", "") or str(exc)).strip()
        print(
            f"rehearsal runtime: mounting the volumes failed: {detail}", file=sys.stderr, flush=True
        )
        return 125
    env = dict(item.split("=", 1) for item in cfg["Env"])
    cmd = list(cfg.get("Entrypoint") or []) + list(cfg["Cmd"])  # ENTRYPOINT, then CMD
    os.chdir(cfg.get("WorkingDir") or "/")
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"exec: {cmd[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    return 127  # not reached


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("run", "enter"):
        print("usage: python -m rehearsal.supervise run|enter CONTAINER_DIR", file=sys.stderr)
        return 2
    cdir = Path(argv[1])
    return run(cdir) if argv[0] == "run" else enter(cdir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
