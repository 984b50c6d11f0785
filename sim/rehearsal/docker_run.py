"""`docker run` for the rehearsal runtime: a container record, then its supervisor.

The command line is parsed by `docker_args` (the same parser the launcher unit tests'
fake docker uses); what happens after parsing is what dockerd would do: look up the
image, resolve env, bind mounts and devices, refuse a taken name, record the container,
and start `supervise` (which runs the command in its own PID and mount namespace, and its
own network namespace for `--network none`).

`--entrypoint E` replaces the image's ENTRYPOINT (`""` clears it), as in docker. A
`--device` must exist on the host (dockerd refuses a missing one); it is recorded in
HostConfig.Devices but not made visible inside: the simulator opens no RDMA device, and a
test host has none (the rehearsal's env file points RDMA_DEVICE_DIR at a directory of
real character-device nodes, so preflight's check stays the real one). `run --rm` without
`-d` is attached: it waits, prints the output, removes the container and exits with its
code.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sim.rehearsal.docker_args import require_contract, run_args
from sim.rehearsal.store import Store, StoreError, now_iso, write_json_atomic

BIN_DIR = Path(__file__).resolve().parent / "bin"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def cmd_run(store: Store, args: list[str]) -> int:
    """`docker run -d ...`: record the container, start its supervisor, print the ID."""
    run = run_args(args)
    require_contract(run)
    image_name, cmd = run.image, run.cmd
    image = store.image(image_name)
    if image is None:
        raise StoreError(
            f"Unable to find image '{image_name}' locally\ndocker: Error response from daemon:"
            f" pull access denied for {image_name.split(':')[0]}, repository does not exist "
            "or may require 'docker login'.\nSee 'docker run --help'.",
            code=125,
        )
    if run.entrypoint is not None:
        entry = [run.entrypoint] if run.entrypoint else []
    else:
        entry = list(image.get("Entrypoint") or [])
    argv = entry + cmd  # what runs: ENTRYPOINT, then CMD (Config keeps them apart)
    if not argv:
        raise StoreError(
            "docker: Error response from daemon: no command specified.\nSee 'docker run --help'.",
            code=125,
        )
    for dev in run.devices:
        if not Path(dev["PathOnHost"]).exists():
            raise StoreError(
                "docker: Error response from daemon: error gathering device information while "
                f'adding custom device "{dev["PathOnHost"]}": no such file or directory.',
                code=125,
            )
    labels = run.label_dict()
    env = [f"PATH={BIN_DIR}:{BASE_PATH}", f"HOSTNAME={socket.gethostname()}", "HOME=/root"]
    env += image["Env"] + store.injected_env()
    for item in run.env:
        if "=" in item:
            env.append(item)
        elif item in os.environ:  # `-e NAME` passes the caller's value, unprinted
            env.append(f"{item}={os.environ[item]}")
    merged: dict[str, str] = {}
    for item in env:
        key, _, value = item.partition("=")
        merged[key] = value
    mounts = [parse_volume(store, v) for v in run.volumes]
    shm = run.shm_size if run.shm_size is not None else 64 << 20
    with store.lock():
        name = run.name or f"rehearsal_{store.new_id()[:8]}"
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
            "Entrypoint": entry or None,
            "AutoRemove": run.rm,
            "Labels": labels,
            "Env": [f"{k}={v}" for k, v in merged.items()],
            "Mounts": mounts,
            "WorkingDir": "",
            "User": run.user or "",
            "Hostname": socket.gethostname(),
            "HostConfig": {
                "NetworkMode": run.network,
                "IpcMode": run.ipc or "private",
                "ShmSize": shm,
                "Ulimits": run.ulimits,
                "Binds": [
                    f"{m['Source']}:{m['Destination']}" + (":ro" if not m["RW"] else "")
                    for m in mounts
                ],
                "Devices": run.devices,
                "AutoRemove": run.rm,
                "DeviceRequests": (
                    [
                        {
                            "Driver": "",
                            "Count": -1,
                            "DeviceIDs": None,
                            "Capabilities": [["gpu"]],
                            "Options": {},
                            "Gpus": run.gpus,
                        }
                    ]
                    if run.gpus
                    else None
                ),
            },
        }
        write_json_atomic(cdir / "config.json", config)
        write_json_atomic(cdir / "state.json", {"Status": "created", "ExitCode": 0})
        (cdir / "log").touch()
    exe = argv[0]
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
    if not run.detach:
        return _attached(store, cid)
    print(cid)
    return 0


def _attached(store: Store, cid: str) -> int:
    """`run --rm` in the foreground: wait for the exit, print the output, remove it."""
    cdir = store.cdir(cid)
    while store.state(cid).get("Status") == "running":
        time.sleep(0.05)
    code = int(store.state(cid).get("ExitCode") or 0)
    sys.stdout.buffer.write((cdir / "log").read_bytes())
    sys.stdout.flush()
    shutil.rmtree(cdir, ignore_errors=True)
    return code
