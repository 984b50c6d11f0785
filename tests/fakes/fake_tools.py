"""Fake docker/ssh/ip/ss for the launcher's unit tests (put tests/fakes/bin first on PATH).

Every call is appended to $FAKE_LOG as a JSON line {"host", "tool", "argv"} so tests can
assert what was (and was not) run. Per-host state lives in $FAKE_STATE (JSON):
  {"hosts": {"h1": {"addrs": [...], "ifaces": {name: [addr]} (optional), "listen": [...],
                    "images": {ref: id | {"Id", "Env", "Entrypoint", "RepoDigests"}},
                    (`docker save -o` / `load -i` write and read the runtime's tar)
                    "containers": [{"ID","Name","State","ExitCode","Labels":{},"Logs":[]}],
                    "run": "running" | "exited",
                    "throwaway": {"out": "...", "rc": 0},
                    "throwaways": {ROLE: {"out": "...", "rc": 0}}}},
   "ssh": {"ADDR": "h2"}, "ssh_fail": ""}
`docker run --rm` (attached: the launcher's argv check, role argcheck, or the image probe,
role imageprobe) prints the host's reply for the container's dsv4.role label ("throwaways",
else "throwaway") and exits with its rc, standing in for the image's interpreter; no
container is recorded.
The local host is $FAKE_HOST (default h1); ssh runs the remote command with FAKE_HOST set to
the mapped host. ssh refuses to run without BatchMode=yes and StrictHostKeyChecking=yes.

docker's command line is parsed by `sim.rehearsal.docker_args`, the rehearsal runtime's
strict parser (checked against the real docker client in tests/test_proc_docker.py): a
flag the real client rejects, or one outside the contract in docs/INTERFACES.md, fails
here with docker's wording and exit 125, as it would on a Spark. Only the state behind
the commands is this file's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sim.rehearsal import docker_args, imagetar

STATE = Path(os.environ.get("FAKE_STATE", "/nonexistent"))
HOST = os.environ.get("FAKE_HOST", "h1")


@contextmanager
def state():
    with open(STATE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(STATE.read_text())
        yield data
        # Atomic: ssh/ip/ss read without the lock, while the launcher asks both nodes at once.
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, STATE)


def record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("FAKE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"host": HOST, "tool": tool, "argv": argv}) + "\n")


def die(msg: str, code: int = 1) -> None:
    print(msg, file=sys.stderr)
    sys.exit(code)


def find(h: dict, ref: str) -> dict | None:
    for c in h["containers"]:
        if c["ID"] == ref or c["Name"] == ref or c["ID"].startswith(ref):
            return c
    return None


def docker(argv: list[str]) -> None:
    if not argv:
        die("fake docker: no command")
    cmd, rest = argv[0], argv[1:]
    handlers = {
        "run": _run,
        "ps": _ps,
        "inspect": _inspect,
        "image": _image,
        "logs": _logs,
        "rm": _rm,
        "save": _save,
        "load": _load,
    }
    if cmd not in handlers:
        die(f"fake docker: unsupported command {cmd}")
    with state() as st:
        try:
            handlers[cmd](st["hosts"][HOST], rest)
        except docker_args.CliError as exc:
            die(str(exc), exc.code)


def _run(h: dict, rest: list[str]) -> None:
    run = docker_args.run_args(rest)
    docker_args.require_contract(run)
    env = {}
    for item in run.env:  # bare -e NAME takes the client's value, like docker
        k, eq, v = item.partition("=")
        env[k] = v if eq else os.environ.get(k, "")
    if run.image not in h.get("images", {}):
        die(f"Unable to find image '{run.image}' locally", 125)
    if run.rm and not run.detach:
        role = run.label_dict().get("dsv4.role", "")
        reply = (h.get("throwaways") or {}).get(role) or h.get("throwaway")
        if reply is None:
            die("fake docker: no throwaway reply configured for this host", 1)
        print(reply.get("out", ""))
        sys.exit(int(reply.get("rc", 0)))
    name = run.name or f"fake_{uuid.uuid4().hex[:8]}"
    if find(h, name):
        die(f'Conflict. The container name "/{name}" is already in use', 125)
    behaviour = h.get("run", "running")
    cid = uuid.uuid4().hex * 2
    h["containers"].append(
        {
            "ID": cid,
            "Name": name,
            "Labels": run.label_dict(),
            "State": "running" if behaviour == "running" else "exited",
            "ExitCode": 0 if behaviour == "running" else 1,
            "Logs": [
                "(SparkTwin pid=7) INFO 11-30 10:00:00 [spark-twin] SPARK-TWIN SIMULATOR",
                "(Worker_TP0 pid=7) INFO 11-30 10:00:01 [model_runner.py:399] "
                "Loading model from scratch...",
            ]
            + ([] if behaviour == "running" else ["RuntimeError: rank crashed (fake)"]),
            "Cmd": run.cmd,
            "Env": env,
            "StartedAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        }
    )
    print(cid)


def _ps(h: dict, rest: list[str]) -> None:
    ps = docker_args.ps_args(rest)
    if ps.format not in (None, "{{json .}}") or ps.quiet:
        die("fake docker: ps prints only --format '{{json .}}' rows (extend fake_tools.py)")
    for c in h["containers"]:
        if not ps.all and c["State"] != "running":
            continue
        ok = True
        for f in ps.filters:
            _, _, want = f.partition("=")
            k, eq, v = want.partition("=")
            if k not in c["Labels"] or (eq and c["Labels"][k] != v):
                ok = False
        if ok:
            row = {
                "ID": c["ID"],
                "Names": c["Name"],
                "State": c["State"],
                "Labels": ",".join(f"{k}={v}" for k, v in c["Labels"].items()),
            }
            print(json.dumps(row))


def _inspect(h: dict, rest: list[str]) -> None:
    ins = docker_args.inspect_args(rest)
    if ins.format is not None:
        die("fake docker: inspect --format is not modelled (extend fake_tools.py)")
    found, missing = [], []
    for ref in ins.refs:
        c = find(h, ref)
        if c is None:
            missing.append(ref)
            continue
        state = {
            "Running": c["State"] == "running",
            "Status": c["State"],
            "StartedAt": c.get("StartedAt", "0001-01-01T00:00:00Z"),
        }
        found.append(
            {
                "Id": c["ID"],
                "State": dict(state, ExitCode=c["ExitCode"]),
                "Config": {"Labels": c["Labels"]},
            }
        )
    print(json.dumps(found))
    if missing:
        die("\n".join(f"Error: No such object: {ref}" for ref in missing))


def _image(h: dict, rest: list[str]) -> None:
    ins = docker_args.image_inspect_args(rest)
    images = h.get("images", {})
    for ref in ins.refs:
        if ref not in images:
            die(f"Error: No such image: {ref}")
    found = []
    for ref in ins.refs:
        img = images[ref] if isinstance(images[ref], dict) else {"Id": images[ref]}
        found.append(
            {
                "Id": img["Id"],
                "RepoTags": [ref],
                "RepoDigests": img.get("RepoDigests", []),
                "Config": {"Env": img.get("Env", []), "Entrypoint": img.get("Entrypoint")},
            }
        )
    if ins.format == "{{.Id}}":
        print("\n".join(i["Id"] for i in found))
    else:
        print(json.dumps(found))


def _logs(h: dict, rest: list[str]) -> None:
    logs = docker_args.logs_args(rest)
    c = find(h, logs.ref)
    if c is None:
        die(f"Error: No such container: {logs.ref}")
    lines = c.get("Logs", [])
    n = logs.tail_lines()
    if n is not None:
        lines = lines[-n:] if n > 0 else []
    print("\n".join(lines))


def _rm(h: dict, rest: list[str]) -> None:
    rm = docker_args.rm_args(rest)
    for ref in rm.refs:
        c = find(h, ref)
        if c is None:
            die(f"Error: No such container: {ref}")
        if c["State"] == "running" and not rm.force:
            die(f"Error response from daemon: You cannot remove a running container {c['ID']}.")
        h["containers"].remove(c)
        print(ref)


def _image_record(images: dict, ref: str) -> dict:
    img = images[ref]
    return img if isinstance(img, dict) else {"Id": img, "Env": [], "Entrypoint": None}


def _save(h: dict, rest: list[str]) -> None:
    """`docker save -o FILE IMAGE...`: the same tar as the rehearsal runtime (imagetar)."""
    sv = docker_args.save_args(rest)
    images = h.get("images", {})
    for ref in sv.refs:
        if ref not in images:
            die("Error response from daemon: reference does not exist")
    if sv.output is None:
        die("fake docker: save writes only with -o FILE (extend fake_tools.py)")
    with open(sv.output, "wb") as fh:
        imagetar.write(fh, [(ref, _image_record(images, ref)) for ref in sv.refs])


def _load(h: dict, rest: list[str]) -> None:
    """`docker load -i FILE`: each tagged image of the tar, under its saved ID."""
    ld = docker_args.load_args(rest)
    if ld.input is None:
        die("fake docker: load reads only -i FILE (extend fake_tools.py)")
    try:
        with open(ld.input, "rb") as fh:
            found = imagetar.read(fh)
    except OSError as exc:
        die(f"open {ld.input}: {exc.strerror.lower()}")
    except ValueError as exc:
        die(f"Error response from daemon: {exc}")
    for ref, image in found:
        h.setdefault("images", {})[ref] = image
        if not ld.quiet:
            print(f"Loaded image: {ref}")


def ssh(argv: list[str]) -> None:
    opts: list[str] = []
    i = 0
    target = None
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-o", "-i", "-p", "-l"):
            opts.append(f"{a} {argv[i + 1]}")
            i += 2
            continue
        if a.startswith("-"):
            opts.append(a)
            i += 1
            continue
        if target is None:
            target = a
            i += 1
            continue
        break
    remote = " ".join(argv[i:])
    if "-o BatchMode=yes" not in opts or "-o StrictHostKeyChecking=yes" not in opts:
        die("fake ssh: refusing: BatchMode=yes and StrictHostKeyChecking=yes are required", 255)
    st = json.loads(STATE.read_text())
    if st.get("ssh_fail"):
        die(st["ssh_fail"], 255)
    addr = (target or "").split("@")[-1]
    host = st.get("ssh", {}).get(addr)
    if host is None:
        die(f"ssh: connect to host {addr} port 22: Connection timed out", 255)
    env = dict(os.environ, FAKE_HOST=host)
    p = subprocess.run(["sh", "-c", remote], env=env, stdin=sys.stdin, check=False)
    sys.exit(p.returncode)


def ip(argv: list[str]) -> None:
    """``ip -o addr show``: a host's "ifaces" ({name: [addr]}) when set, else its "addrs",
    loopback ones on lo (where Linux has 127.0.0.0/8) and the rest on eth0."""
    st = json.loads(STATE.read_text())
    h = st["hosts"][HOST]
    ifaces = h.get("ifaces") or {}
    if not ifaces:
        for a in h.get("addrs", []):
            ifaces.setdefault("lo" if a.startswith("127.") else "eth0", []).append(a)
    n = 0
    for name, addrs in ifaces.items():
        for a in addrs:
            n += 1
            print(f"{n}: {name}    inet {a}/24 brd 0.0.0.0 scope global {name}")


def ss(argv: list[str]) -> None:
    st = json.loads(STATE.read_text())
    for p in st["hosts"][HOST].get("listen", []):
        print(f"LISTEN 0      4096         0.0.0.0:{p}      0.0.0.0:*")


def main() -> None:
    tool, argv = sys.argv[1], sys.argv[2:]
    record(tool, argv)
    {"docker": docker, "ssh": ssh, "ip": ip, "ss": ss}[tool](argv)


if __name__ == "__main__":
    main()
