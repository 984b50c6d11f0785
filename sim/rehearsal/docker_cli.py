"""`docker` for a rehearsal test host: exactly the CLI subset the launcher may use.

The subset is fixed by docs/INTERFACES.md ("The docker CLI subset the launcher uses").
Parsing is `docker_args` (strict, checked against the real client); `run` is
`docker_run`; this module dispatches and answers ps/inspect/image inspect/logs/rm and
image ship's save/load/tag.

Harness-only subcommand: `docker load-fake IMAGE ID [--env K=V]...` "loads" an image on
this host with the given ID, so tests can give the two hosts different image IDs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from sim.rehearsal import gotemplate, imagetar
from sim.rehearsal.docker_args import (
    LOAD_FAKE_SPEC,
    CliError,
    UsageError,
    image_inspect_args,
    inspect_args,
    load_args,
    logs_args,
    parse_flags,
    ps_args,
    rm_args,
    save_args,
    tag_args,
)
from sim.rehearsal.docker_run import cmd_run
from sim.rehearsal.store import Store, StoreError, alive, write_json_atomic


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


def process_argv(cfg: dict[str, Any]) -> list[str]:
    """What the container runs: its ENTRYPOINT, then its CMD (as docker does)."""
    return list(cfg.get("Entrypoint") or []) + list(cfg["Cmd"])


def _ps_row(store: Store, cid: str, no_trunc: bool) -> dict[str, Any]:
    cfg, st = store.config(cid), store.state(cid)
    command = " ".join(process_argv(cfg))
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


def cmd_ps(store: Store, args: list[str]) -> int:
    ps = ps_args(args)
    ids = sorted(store.all_ids(), key=lambda c: store.config(c)["Created"], reverse=True)
    for cid in ids:
        if not _matches(store, cid, ps.filters):
            continue
        row = _ps_row(store, cid, ps.no_trunc)
        if not ps.all and row["State"] != "running":
            continue
        if ps.quiet:
            print(row["ID"])
        elif ps.format:
            print(gotemplate.render(ps.format, row))
        else:
            print(f"{row['ID']}  {row['Image']}  {row['Command']}  {row['Status']}  {row['Names']}")
    return 0


def inspect_object(store: Store, cid: str) -> dict[str, Any]:
    cfg, st = store.config(cid), store.state(cid)
    status = st["Status"]
    return {
        "Id": cid,
        "Created": cfg["Created"],
        "Path": process_argv(cfg)[0],
        "Args": process_argv(cfg)[1:],
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
            "Entrypoint": cfg.get("Entrypoint"),
            "WorkingDir": cfg["WorkingDir"],
            "User": cfg.get("User", ""),
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


def cmd_inspect(store: Store, args: list[str]) -> int:
    ins = inspect_args(args)
    found, rc = [], 0
    for ref in ins.refs:
        try:
            found.append(inspect_object(store, store.resolve(ref)))
        except StoreError:
            print(f"Error: No such object: {ref}", file=sys.stderr)
            rc = 1
    return _print_inspected(found, ins.format, rc)


def cmd_image(store: Store, args: list[str]) -> int:
    ins = image_inspect_args(args)
    found, rc = [], 0
    for ref in ins.refs:
        image = store.image(ref)
        if image is None:
            print(f"Error: No such image: {ref}", file=sys.stderr)
            rc = 1
            continue
        found.append(
            {
                "Id": image["Id"],
                "RepoTags": store.names_of(image["Id"]),
                "RepoDigests": image.get("RepoDigests", []),
                "Config": {
                    "Env": image["Env"],
                    "Entrypoint": image.get("Entrypoint"),
                    "Cmd": None,
                },
            }
        )
    return _print_inspected(found, ins.format, rc)


def cmd_logs(store: Store, args: list[str]) -> int:
    logs = logs_args(args)
    cid = store.resolve(logs.ref)
    path = store.cdir(cid) / "log"
    data = path.read_bytes()
    n = logs.tail_lines()
    if n is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-n:]) if n > 0 else b""
    out = sys.stdout.buffer
    out.write(data)
    out.flush()
    if not logs.follow:
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
    rm = rm_args(args)
    rc = 0
    for ref in rm.refs:
        try:
            with store.lock():
                cid = store.resolve(ref)
                st = store.state(cid)
                if st["Status"] in ("running", "removing") and not rm.force:
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


def cmd_save(store: Store, args: list[str]) -> int:
    """`docker save [-o FILE] IMAGE...`: a docker-save tar (imagetar) of the named images.
    Like docker/cli's CopyToFile, -o writes a temp file beside FILE and renames it."""
    sv = save_args(args)
    images = []
    for ref in sv.refs:
        image = store.image(ref)
        if image is None:
            raise StoreError("Error response from daemon: reference does not exist")
        images.append((ref, image))
    if sv.output is None:
        if sys.stdout.isatty():
            raise StoreError("cowardly refusing to save to a terminal. Use the -o flag or redirect")
        imagetar.write(sys.stdout.buffer, images)
        return 0
    fd, tmp = tempfile.mkstemp(prefix=".docker_temp_", dir=os.path.dirname(sv.output) or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            imagetar.write(fh, images)
        os.replace(tmp, sv.output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return 0


def cmd_load(store: Store, args: list[str]) -> int:
    """`docker load [-i FILE] [-q]`: register every image of the tar under its ID (registry
    digests dropped, as docker does), printing `Loaded image: REF` for each name, or
    `Loaded image ID: sha256:...` for an image the tar names none for (one saved by digest;
    moby image/tarexport/load.go prints the ID when no tag was set)."""
    ld = load_args(args)
    try:
        src = open(ld.input, "rb") if ld.input else sys.stdin.buffer  # noqa: SIM115
    except OSError as exc:
        raise StoreError(f"open {ld.input}: {exc.strerror.lower()}") from None
    try:
        found = imagetar.read(src)
    except ValueError as exc:
        raise StoreError(f"Error response from daemon: {exc}") from None
    finally:
        if ld.input:
            src.close()
    if not found:
        raise StoreError("Error response from daemon: no images found in the archive")
    for refs, image in found:
        for ref in refs:
            store.load_image(ref, image["Id"], image["Env"], image["Entrypoint"], [])
            if not ld.quiet:
                print(f"Loaded image: {ref}")
        if not refs:
            store.load_untagged(image["Id"], image["Env"], image["Entrypoint"])
            if not ld.quiet:
                print(f"Loaded image ID: {image['Id']}")
    return 0


def cmd_tag(store: Store, args: list[str]) -> int:
    """`docker tag SOURCE TARGET` (SOURCE a name or an image ID)."""
    tg = tag_args(args)
    store.tag_image(tg.source, tg.target)
    return 0


def cmd_load_fake(store: Store, args: list[str]) -> int:
    """Harness-only: register IMAGE with ID on this host (`--env K=V` = image ENV,
    `--entrypoint W` = one word of its ENTRYPOINT, `--digest REPO@sha256:D` = a RepoDigest)."""
    opts, rest = parse_flags(args, LOAD_FAKE_SPEC, "load-fake")
    if len(rest) != 2:
        raise UsageError(
            "usage: docker load-fake IMAGE ID [--env K=V]... [--entrypoint W]... "
            "[--digest REPO@sha256:D]...",
            "load-fake",
        )
    store.load_image(rest[0], rest[1], opts["env"], opts["entrypoint"], opts["digest"])
    print(f"Loaded image: {rest[0]}")
    return 0


COMMANDS = {
    "run": cmd_run,
    "ps": cmd_ps,
    "inspect": cmd_inspect,
    "image": cmd_image,
    "logs": cmd_logs,
    "rm": cmd_rm,
    "save": cmd_save,
    "load": cmd_load,
    "tag": cmd_tag,
    "load-fake": cmd_load_fake,
}

HELP = """Usage:  docker COMMAND   (rehearsal process runtime; no Docker engine involved)

The subset of the docker CLI in docs/INTERFACES.md, run as plain processes on a
rehearsal test host (state in $DSV4R_DOCKER_STATE):
  run -d --name N --label K=V... --network host --gpus all --ipc host
         [--device SRC[:DST]]... [--entrypoint E] [--shm-size S] [--ulimit X]...
         [--user UID[:GID]] [-v SRC:DST[:ro]]... [-e K=V]... IMAGE ARG...
  run --rm [--network none] [--label K=V]... [--entrypoint E] [-e K=V]... IMAGE ARG...
         (attached: waits, prints the output, removes the container)
  ps -a [--no-trunc] [--filter label=K=V]... [--format '{{json .}}']
  inspect [--format T] CONTAINER...
  image inspect [--format '{{.Id}}'] IMAGE...
  logs [--tail N] [-f] CONTAINER
  rm -f CONTAINER...
  save [-o FILE] IMAGE...      (a docker-save tar: manifest.json + config blobs)
  load [-i FILE] [-q]          (registers each image under its saved ID; one saved by
                               digest loads untagged, as in docker)
  tag SOURCE TARGET            (SOURCE a name or an image ID; TARGET never a digest)
  load-fake IMAGE ID [--env K=V]... [--entrypoint W]... [--digest REPO@sha256:D]...
         (harness only: "load" an image with this ID)
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
    except (CliError, StoreError) as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
