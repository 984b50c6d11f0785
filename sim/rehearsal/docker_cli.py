"""`docker` for a rehearsal test host: exactly the CLI subset the launcher may use.

The subset is fixed by docs/INTERFACES.md ("The docker CLI subset the launcher uses").
Parsing is strict on purpose: a flag the real CLI does not know fails with docker's own
`unknown flag` wording, and a real docker flag outside the subset fails too, saying so,
so a launcher that drifts from the contract is caught here rather than on a Spark.

Harness-only subcommand: `docker load-fake IMAGE ID [--env K=V]...` "loads" an image on
this host with the given ID, so tests can give the two hosts different image IDs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.rehearsal import gotemplate
from sim.rehearsal.store import Store, StoreError, alive, now_iso, write_json_atomic

BIN_DIR = Path(__file__).resolve().parent / "bin"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Real `docker run` flags the rehearsal does not implement: named in the error so the
# reader knows the launcher left the contract (not that it typed a non-flag).
_REAL_RUN_FLAGS = {
    "--rm",
    "-i",
    "--interactive",
    "-t",
    "--tty",
    "--privileged",
    "--device",
    "--cap-add",
    "--cap-drop",
    "--entrypoint",
    "-w",
    "--workdir",
    "--restart",
    "-p",
    "--publish",
    "--env-file",
    "--mount",
    "-u",
    "--user",
    "--init",
    "--pid",
    "--runtime",
    "--security-opt",
    "--hostname",
    "-h",
    "--add-host",
    "--memory",
    "-m",
    "--cpus",
    "--pull",
    "--platform",
    "--label-file",
    "--log-driver",
    "--log-opt",
    "--stop-signal",
    "--stop-timeout",
}


class UsageError(StoreError):
    """Flag errors exit 125 with docker's hint line, like the real CLI."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(f"{message}\nSee 'docker {command} --help'.", code=125)


@dataclass
class FlagSpec:
    """Flags of one subcommand: canonical name -> (aliases, takes_value, repeatable)."""

    bools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    repeat: set[str] = field(default_factory=set)


def parse_flags(
    args: list[str], spec: FlagSpec, command: str, interspersed: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """pflag-style parsing: `--k v`, `--k=v`, `-k v`, `-kv`; stops at the first
    positional when `interspersed` is False (docker run: the rest is the command)."""
    lookup: dict[str, tuple[str, bool]] = {}
    for name, aliases in spec.bools.items():
        for alias in aliases:
            lookup[alias] = (name, False)
    for name, aliases in spec.values.items():
        for alias in aliases:
            lookup[alias] = (name, True)
    opts: dict[str, Any] = {n: False for n in spec.bools}
    opts.update({n: ([] if n in spec.repeat else None) for n in spec.values})
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positional.extend(args[i + 1 :])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            if not interspersed:
                positional.extend(args[i + 1 :])
                break
            i += 1
            continue
        if arg.startswith("--"):
            key, eq, inline = arg.partition("=")
        else:
            key, inline = arg[:2], arg[2:]
            eq = "=" if inline else ""
            inline = inline.removeprefix("=")
        if key not in lookup:
            note = ""
            if command == "run" and key in _REAL_RUN_FLAGS:
                note = (
                    "\n(rehearsal runtime: a real docker flag outside the subset in "
                    "docs/INTERFACES.md; extend the contract and the runtime together)"
                )
            if key.startswith("--"):
                message = f"unknown flag: {key}"
            else:
                message = f"unknown shorthand flag: '{key[1:]}' in {arg}"
            raise UsageError(message + note, command)
        name, takes_value = lookup[key]
        if takes_value:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise UsageError(f"flag needs an argument: {key}", command)
            if name in spec.repeat:
                opts[name].append(value)
            else:
                opts[name] = value
        else:
            if eq and inline not in ("true", "false"):
                raise UsageError(f'invalid argument "{inline}" for "{key}" flag', command)
            opts[name] = inline != "false"
        i += 1
    return opts, positional


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgt]?)b?$", re.IGNORECASE)
_ULIMITS = {
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
}


def parse_size(text: str) -> int:
    """Docker's RAMInBytes: `16g`, `512m`, `1024`."""
    m = _SIZE.match(text.strip())
    if not m:
        raise UsageError(
            f'invalid argument "{text}" for "--shm-size" flag: invalid size: \'{text}\'', "run"
        )
    mult = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(m.group(1)) * mult[m.group(2).lower()])


def parse_ulimit(text: str) -> dict[str, Any]:
    name, eq, limits = text.partition("=")
    if not eq or name not in _ULIMITS:
        raise UsageError(
            f'invalid argument "{text}" for "--ulimit" flag: invalid ulimit type: {name}', "run"
        )
    soft, _, hard = limits.partition(":")
    try:
        soft_i = int(soft)
        hard_i = int(hard) if hard else soft_i
    except ValueError:
        raise UsageError(
            f'invalid argument "{text}" for "--ulimit" flag: invalid ulimit argument: {limits}',
            "run",
        ) from None
    return {"Name": name, "Soft": soft_i, "Hard": hard_i}


def parse_volume(store: Store, text: str) -> dict[str, Any]:
    """`-v SRC:DST[:ro|rw]` as a bind mount; creates a missing SRC like dockerd does."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[1].startswith("/"):
        raise StoreError(
            f"docker: Error response from daemon: invalid volume "
            f"specification: '{text}'.\nSee 'docker run --help'.",
            code=125,
        )
    src, dst = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if not src.startswith("/"):
        raise StoreError(
            f"rehearsal runtime: named volume {src!r} is not supported "
            "(the launcher's contract uses bind mounts only)",
            code=125,
        )
    if mode not in ("ro", "rw"):
        raise StoreError(f"docker: Error response from daemon: invalid mode: {mode}.", code=125)
    src_path = Path(src)
    if not src_path.exists():
        src_path.mkdir(parents=True)
        store.record_created_path(src_path)
    return {
        "Type": "bind",
        "Source": src,
        "Destination": dst,
        "Mode": mode if mode == "ro" else "",
        "RW": mode == "rw",
        "Propagation": "rprivate",
    }


RUN_SPEC = FlagSpec(
    bools={"detach": ("-d", "--detach")},
    values={
        "name": ("--name",),
        "label": ("--label", "-l"),
        "network": ("--network", "--net"),
        "gpus": ("--gpus",),
        "ipc": ("--ipc",),
        "shm_size": ("--shm-size",),
        "ulimit": ("--ulimit",),
        "volume": ("-v", "--volume"),
        "env": ("-e", "--env"),
    },
    repeat={"label", "ulimit", "volume", "env"},
)


def cmd_run(store: Store, args: list[str]) -> int:
    opts, rest = parse_flags(args, RUN_SPEC, "run", interspersed=False)
    if not rest:
        raise UsageError('"docker run" requires at least 1 argument.', "run")
    if not opts["detach"]:
        raise StoreError(
            "rehearsal runtime: only `docker run -d` is implemented (docs/INTERFACES.md)", code=125
        )
    network = opts["network"] or "default"
    if network != "host":
        raise StoreError(
            f"rehearsal runtime: --network {network} is not supported; the "
            "contract is --network host",
            code=125,
        )
    image_name, cmd = rest[0], rest[1:]
    image = store.image(image_name)
    if image is None:
        raise StoreError(
            f"Unable to find image '{image_name}' locally\ndocker: Error response from daemon:"
            f" pull access denied for {image_name.split(':')[0]}, repository does not exist "
            "or may require 'docker login'.\nSee 'docker run --help'.",
            code=125,
        )
    if not cmd:
        raise StoreError(
            "docker: Error response from daemon: no command specified.\nSee 'docker run --help'.",
            code=125,
        )
    labels: dict[str, str] = {}
    for item in opts["label"]:
        key, _, value = item.partition("=")
        labels[key] = value
    env = [f"PATH={BIN_DIR}:{BASE_PATH}", f"HOSTNAME={socket.gethostname()}", "HOME=/root"]
    env += image["Env"] + store.injected_env()
    for item in opts["env"]:
        if "=" in item:
            env.append(item)
        elif item in os.environ:  # `-e NAME` passes the caller's value, unprinted
            env.append(f"{item}={os.environ[item]}")
    merged: dict[str, str] = {}
    for item in env:
        key, _, value = item.partition("=")
        merged[key] = value
    mounts = [parse_volume(store, v) for v in opts["volume"]]
    shm = parse_size(opts["shm_size"]) if opts["shm_size"] else 64 << 20
    ulimits = [parse_ulimit(u) for u in opts["ulimit"]]
    with store.lock():
        name = opts["name"] or f"rehearsal_{store.new_id()[:8]}"
        for other in store.all_ids():
            if store.config(other)["Name"] == name:
                raise StoreError(
                    f"docker: Error response from daemon: Conflict. The container name "
                    f'"/{name}" is already in use by container "{other}". You have to remove '
                    "(or rename) that container to be able to reuse that name.\n"
                    "See 'docker run --help'.",
                    code=125,
                )
        cid = store.new_id()
        cdir = store.cdir(cid)
        cdir.mkdir()
        config = {
            "Id": cid,
            "Name": name,
            "Created": now_iso(),
            "Image": image_name,
            "ImageId": image["Id"],
            "Cmd": cmd,
            "Labels": labels,
            "Env": [f"{k}={v}" for k, v in merged.items()],
            "Mounts": mounts,
            "WorkingDir": "",
            "Hostname": socket.gethostname(),
            "HostConfig": {
                "NetworkMode": network,
                "IpcMode": opts["ipc"] or "private",
                "ShmSize": shm,
                "Ulimits": ulimits,
                "Binds": [
                    f"{m['Source']}:{m['Destination']}" + (":ro" if not m["RW"] else "")
                    for m in mounts
                ],
                "DeviceRequests": (
                    [
                        {
                            "Driver": "",
                            "Count": -1,
                            "DeviceIDs": None,
                            "Capabilities": [["gpu"]],
                            "Options": {},
                            "Gpus": opts["gpus"],
                        }
                    ]
                    if opts["gpus"]
                    else None
                ),
            },
        }
        write_json_atomic(cdir / "config.json", config)
        write_json_atomic(cdir / "state.json", {"Status": "created", "ExitCode": 0})
        (cdir / "log").touch()
    exe = cmd[0]
    found = Path(exe).exists() if "/" in exe else shutil.which(exe, path=merged["PATH"])
    if not found:
        write_json_atomic(cdir / "state.json", {"Status": "created", "ExitCode": 127})
        raise StoreError(
            "docker: Error response from daemon: failed to create task for container: "
            f'exec: "{exe}": executable file not found in $PATH: unknown.',
            code=127,
        )
    subprocess.Popen(
        [sys.executable, "-m", "sim.rehearsal.supervise", "run", str(cdir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
        cwd="/",
        env=dict(os.environ),
    )
    deadline = time.monotonic() + 10
    while store.raw_state(cid).get("Status") == "created":
        if time.monotonic() > deadline:
            raise StoreError(
                "rehearsal runtime: the container supervisor did not start "
                f"within 10 s (see {cdir}/log)",
                code=125,
            )
        time.sleep(0.01)
    print(cid)
    return 0


def _status_text(state: dict[str, Any], created: str) -> str:
    def ago(stamp: str | None) -> str:
        if not stamp:
            return "0 seconds"
        t0 = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        secs = max(0, int(time.time() - t0))
        return f"{secs} seconds" if secs < 120 else f"{secs // 60} minutes"

    status = state.get("Status")
    if status == "running":
        return f"Up {ago(state.get('StartedAt'))}"
    if status == "removing":
        return "Removal In Progress"
    if status == "exited":
        return f"Exited ({state.get('ExitCode', 0)}) {ago(state.get('FinishedAt'))} ago"
    return "Created"


def _ps_row(store: Store, cid: str, no_trunc: bool) -> dict[str, Any]:
    cfg, st = store.config(cid), store.state(cid)
    command = " ".join(cfg["Cmd"])
    if not no_trunc and len(command) > 20:
        command = command[:19] + "…"
    created = cfg["Created"]
    return {
        "Command": f'"{command}"',
        "CreatedAt": f"{created[:10]} {created[11:19]} +0000 UTC",
        "ID": cid if no_trunc else cid[:12],
        "Image": cfg["Image"],
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(cfg["Labels"].items())),
        "LocalVolumes": "0",
        "Mounts": ",".join(m["Source"] for m in cfg["Mounts"]),
        "Names": cfg["Name"],
        "Networks": cfg["HostConfig"]["NetworkMode"],
        "Ports": "",
        "RunningFor": "",
        "Size": "0B",
        "State": st["Status"],
        "Status": _status_text(st, created),
    }


def _matches(store: Store, cid: str, filters: list[str]) -> bool:
    """docker ps filter semantics: label filters AND, other keys OR within a key."""
    cfg, st = store.config(cid), store.state(cid)
    by_key: dict[str, list[str]] = {}
    for f in filters:
        key, eq, value = f.partition("=")
        if not eq or key not in ("label", "name", "id", "status"):
            raise StoreError(f"Error response from daemon: invalid filter '{f}'")
        by_key.setdefault(key, []).append(value)
    for want in by_key.get("label", []):
        k, eq, v = want.partition("=")
        if k not in cfg["Labels"] or (eq and cfg["Labels"][k] != v):
            return False
    if "name" in by_key and not any(re.search(n, cfg["Name"]) for n in by_key["name"]):
        return False
    if "id" in by_key and not any(cid.startswith(i) for i in by_key["id"]):
        return False
    return not ("status" in by_key and st["Status"] not in by_key["status"])


PS_SPEC = FlagSpec(
    bools={"all": ("-a", "--all"), "no_trunc": ("--no-trunc",), "quiet": ("-q", "--quiet")},
    values={"filter": ("-f", "--filter"), "format": ("--format",)},
    repeat={"filter"},
)


def cmd_ps(store: Store, args: list[str]) -> int:
    opts, rest = parse_flags(args, PS_SPEC, "ps")
    if rest:
        raise UsageError('"docker ps" accepts no arguments.', "ps")
    ids = sorted(store.all_ids(), key=lambda c: store.config(c)["Created"], reverse=True)
    for cid in ids:
        if not _matches(store, cid, opts["filter"]):
            continue
        row = _ps_row(store, cid, opts["no_trunc"])
        if not opts["all"] and row["State"] != "running":
            continue
        if opts["quiet"]:
            print(row["ID"])
        elif opts["format"]:
            print(gotemplate.render(opts["format"], row))
        else:
            print(f"{row['ID']}  {row['Image']}  {row['Command']}  {row['Status']}  {row['Names']}")
    return 0


def inspect_object(store: Store, cid: str) -> dict[str, Any]:
    cfg, st = store.config(cid), store.state(cid)
    status = st["Status"]
    return {
        "Id": cid,
        "Created": cfg["Created"],
        "Path": cfg["Cmd"][0],
        "Args": cfg["Cmd"][1:],
        "State": {
            "Status": status,
            "Running": status in ("running", "removing"),
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": status == "dead",
            "Pid": st.get("Pid", 0) if status == "running" else 0,
            "ExitCode": st.get("ExitCode", 0),
            "Error": "",
            "StartedAt": st.get("StartedAt", "0001-01-01T00:00:00Z"),
            "FinishedAt": st.get("FinishedAt", "0001-01-01T00:00:00Z"),
        },
        "Image": cfg["ImageId"],
        "Name": "/" + cfg["Name"],
        "RestartCount": 0,
        "LogPath": str(store.cdir(cid) / "log"),
        "HostConfig": cfg["HostConfig"],
        "Mounts": cfg["Mounts"],
        "Config": {
            "Hostname": cfg["Hostname"],
            "Env": cfg["Env"],
            "Cmd": cfg["Cmd"],
            "Image": cfg["Image"],
            "Labels": cfg["Labels"],
            "Entrypoint": None,
            "WorkingDir": cfg["WorkingDir"],
        },
        "NetworkSettings": {"Networks": {cfg["HostConfig"]["NetworkMode"]: {}}},
    }


def _print_inspected(found: list[dict], fmt: str | None, rc: int) -> int:
    """Print inspect results like docker: one rendered --format line each, else a JSON array."""
    if fmt:
        for obj in found:
            print(gotemplate.render(fmt, obj))
    else:
        print(json.dumps(found, indent=4))
    return rc


INSPECT_SPEC = FlagSpec(values={"format": ("-f", "--format"), "type": ("--type",)})


def cmd_inspect(store: Store, args: list[str]) -> int:
    opts, refs = parse_flags(args, INSPECT_SPEC, "inspect")
    if not refs:
        raise UsageError('"docker inspect" requires at least 1 argument.', "inspect")
    found, rc = [], 0
    for ref in refs:
        try:
            found.append(inspect_object(store, store.resolve(ref)))
        except StoreError:
            print(f"Error: No such object: {ref}", file=sys.stderr)
            rc = 1
    return _print_inspected(found, opts["format"], rc)


IMAGE_INSPECT_SPEC = FlagSpec(values={"format": ("-f", "--format")})


def cmd_image(store: Store, args: list[str]) -> int:
    if not args or args[0] != "inspect":
        raise StoreError(
            "rehearsal runtime: only `docker image inspect` is implemented (docs/INTERFACES.md)"
        )
    opts, refs = parse_flags(args[1:], IMAGE_INSPECT_SPEC, "image inspect")
    if not refs:
        raise UsageError('"docker image inspect" requires at least 1 argument.', "image inspect")
    found, rc = [], 0
    for ref in refs:
        image = store.image(ref)
        if image is None:
            print(f"Error: No such image: {ref}", file=sys.stderr)
            rc = 1
            continue
        found.append({"Id": image["Id"], "RepoTags": [ref], "Config": {"Env": image["Env"]}})
    return _print_inspected(found, opts["format"], rc)


LOGS_SPEC = FlagSpec(bools={"follow": ("-f", "--follow")}, values={"tail": ("-n", "--tail")})


def cmd_logs(store: Store, args: list[str]) -> int:
    opts, refs = parse_flags(args, LOGS_SPEC, "logs")
    if len(refs) != 1:
        raise UsageError('"docker logs" requires exactly 1 argument.', "logs")
    cid = store.resolve(refs[0])
    path = store.cdir(cid) / "log"
    data = path.read_bytes()
    tail = opts["tail"]
    if tail not in (None, "all"):
        try:
            n = int(tail)
        except ValueError:
            raise UsageError(f'invalid argument "{tail}" for "-n, --tail" flag', "logs") from None
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-n:]) if n > 0 else b""
    out = sys.stdout.buffer
    out.write(data)
    out.flush()
    if not opts["follow"]:
        return 0
    pos = path.stat().st_size
    while True:
        running = store.state(cid)["Status"] == "running" if store.cdir(cid).exists() else False
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except OSError:
            return 0
        if chunk:
            pos += len(chunk)
            out.write(chunk)
            out.flush()
        elif not running:
            return 0
        time.sleep(0.1)


RM_SPEC = FlagSpec(bools={"force": ("-f", "--force")})


def _kill_and_wait(st: dict[str, Any]) -> None:
    """SIGKILL the container's process group and its PID-namespace init; wait for both."""
    for kill, target in ((os.killpg, st.get("Pgid")), (os.kill, st.get("Pid"))):
        if target:
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 15
    while alive(st.get("Pid"), st.get("PidStart")):
        if time.monotonic() > deadline:
            raise StoreError("rehearsal runtime: container processes did not die within 15 s")
        time.sleep(0.02)
    sup = st.get("SupervisorPid")
    deadline = time.monotonic() + 5
    while sup and alive(sup, None) and time.monotonic() < deadline:
        time.sleep(0.02)


def cmd_rm(store: Store, args: list[str]) -> int:
    opts, refs = parse_flags(args, RM_SPEC, "rm")
    if not refs:
        raise UsageError('"docker rm" requires at least 1 argument.', "rm")
    rc = 0
    for ref in refs:
        try:
            with store.lock():
                cid = store.resolve(ref)
                st = store.state(cid)
                if st["Status"] in ("running", "removing") and not opts["force"]:
                    raise StoreError(
                        f"Error response from daemon: You cannot remove a running container "
                        f"{cid}. Stop the container before attempting removal or force remove"
                    )
                write_json_atomic(
                    store.cdir(cid) / "state.json", dict(store.raw_state(cid), Status="removing")
                )
            _kill_and_wait(st)
            shutil.rmtree(store.cdir(cid), ignore_errors=True)
            print(ref)
        except StoreError as exc:
            print(str(exc), file=sys.stderr)
            rc = 1
    return rc


def cmd_load_fake(store: Store, args: list[str]) -> int:
    """Harness-only: register IMAGE with ID on this host (`--env K=V` = image ENV)."""
    opts, rest = parse_flags(
        args, FlagSpec(values={"env": ("--env", "-e")}, repeat={"env"}), "load-fake"
    )
    if len(rest) != 2:
        raise UsageError("usage: docker load-fake IMAGE ID [--env K=V]...", "load-fake")
    store.load_image(rest[0], rest[1], opts["env"])
    print(f"Loaded image: {rest[0]}")
    return 0


COMMANDS = {
    "run": cmd_run,
    "ps": cmd_ps,
    "inspect": cmd_inspect,
    "image": cmd_image,
    "logs": cmd_logs,
    "rm": cmd_rm,
    "load-fake": cmd_load_fake,
}

HELP = """Usage:  docker COMMAND   (rehearsal process runtime; no Docker engine involved)

The subset of the docker CLI in docs/INTERFACES.md, run as plain processes on a
rehearsal test host (state in $DSV4R_DOCKER_STATE):
  run -d --name N --label K=V... --network host --gpus all --ipc host
         [--shm-size S] [--ulimit X]... [-v SRC:DST[:ro]]... [-e K=V]... IMAGE ARG...
  ps -a [--no-trunc] [--filter label=K=V]... [--format '{{json .}}']
  inspect [--format T] CONTAINER...
  image inspect [--format '{{.Id}}'] IMAGE...
  logs [--tail N] [-f] CONTAINER
  rm -f CONTAINER...
  load-fake IMAGE ID [--env K=V]...   (harness only: "load" an image with this ID)
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(HELP, end="")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"docker: '{command}' is not a docker command (rehearsal runtime implements: "
            f"{', '.join(sorted(COMMANDS))}).\nSee 'docker --help'",
            file=sys.stderr,
        )
        return 1
    if "--help" in rest[:1] or "-h" in rest[:1]:
        print(HELP, end="")
        return 0
    try:
        return COMMANDS[command](Store.from_env(), rest)
    except gotemplate.TemplateError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except StoreError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
