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

from rehearsal.store import now_iso, proc_start_time, write_json_atomic

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
    scripts_dir = str(Path(__file__).resolve().parents[1])
    argv = ["unshare", "--mount", "--propagation", "private",
            sys.executable, "-S", "-m", "rehearsal.supervise", "enter", str(cdir)]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "PYTHONPATH": scripts_dir}
    _unshare_pid_ns()
    with open(cdir / "log", "ab", buffering=0) as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd="/",
                                start_new_session=True)
    _write_state(cdir, Status="running", Pid=proc.pid, PidStart=proc_start_time(proc.pid),
                 Pgid=proc.pid, SupervisorPid=os.getpid(), StartedAt=now_iso())
    rc = proc.wait()
    code = 128 - rc if rc < 0 else rc
    _write_state(cdir, Status="exited", ExitCode=code, FinishedAt=now_iso())
    return 0


def enter(cdir: Path) -> int:
    """Inside the namespaces: bind-mount the volumes, then exec the command."""
    cfg = json.loads((cdir / "config.json").read_text())
    # Our own /proc, so the container sees its PID namespace as docker's would.
    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=False)
    for m in cfg["Mounts"]:
        src, dst = m["Source"], m["Destination"]
        steps = [["mount", "--bind", src, dst]]
        if not m["RW"]:
            steps.append(["mount", "-o", "remount,bind,ro", dst])
        for step in steps:
            res = subprocess.run(step, capture_output=True, text=True)
            if res.returncode != 0:
                print(f"rehearsal runtime: mount {src}:{dst} failed: {res.stderr.strip()}",
                      file=sys.stderr, flush=True)
                return 125
    env = dict(item.split("=", 1) for item in cfg["Env"])
    cmd = cfg["Cmd"]
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
