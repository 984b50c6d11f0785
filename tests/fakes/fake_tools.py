"""Fake docker/ssh/ip/ss for the launcher's unit tests (put tests/fakes/bin first on PATH).

Every call is appended to $FAKE_LOG as a JSON line {"host", "tool", "argv"} so tests can
assert what was (and was not) run. Per-host state lives in $FAKE_STATE (JSON):
  {"hosts": {"h1": {"addrs": [...], "listen": [...], "images": {ref: id},
                    "containers": [{"ID","Name","State","ExitCode","Labels":{},"Logs":[]}],
                    "run": "running" | "exited"}},
   "ssh": {"ADDR": "h2"}, "ssh_fail": ""}
The local host is $FAKE_HOST (default h1); ssh runs the remote command with FAKE_HOST set to
the mapped host. ssh refuses to run without BatchMode=yes and StrictHostKeyChecking=yes.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

STATE = Path(os.environ.get("FAKE_STATE", "/nonexistent"))
HOST = os.environ.get("FAKE_HOST", "h1")


@contextmanager
def state():
    with open(STATE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(STATE.read_text())
        yield data
        STATE.write_text(json.dumps(data, indent=1))


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
    with state() as st:
        h = st["hosts"][HOST]
        if cmd == "run":
            opts = {"label": {}, "env": {}}
            i = 0
            while i < len(rest) and rest[i].startswith("-"):
                a = rest[i]
                if a in ("-d",):
                    i += 1
                    continue
                val = rest[i + 1]
                if a == "--name":
                    opts["name"] = val
                elif a == "--label":
                    k, _, v = val.partition("=")
                    opts["label"][k] = v
                elif a == "-e":  # bare -e NAME takes the client's value, like docker
                    k, eq, v = val.partition("=")
                    opts["env"][k] = v if eq else os.environ.get(k, "")
                i += 2
            image = rest[i]
            if image not in h.get("images", {}):
                die(f"Unable to find image '{image}' locally", 125)
            if find(h, opts["name"]):
                die(f'Conflict. The container name "/{opts["name"]}" is already in use', 125)
            behaviour = h.get("run", "running")
            cid = uuid.uuid4().hex * 2
            h["containers"].append(
                {
                    "ID": cid,
                    "Name": opts["name"],
                    "Labels": opts["label"],
                    "State": "running" if behaviour == "running" else "exited",
                    "ExitCode": 0 if behaviour == "running" else 1,
                    "Logs": ["SPARK-TWIN SIMULATOR", "Loading weights"]
                    + ([] if behaviour == "running" else ["RuntimeError: rank crashed (fake)"]),
                    "Cmd": rest[i + 1 :],
                    "Env": opts["env"],
                }
            )
            print(cid)
        elif cmd == "ps":
            filters = [rest[j + 1] for j, a in enumerate(rest) if a == "--filter"]
            for c in h["containers"]:
                ok = True
                for f in filters:
                    _, _, want = f.partition("=")
                    k, eq, v = want.partition("=")
                    if k not in c["Labels"] or (eq and c["Labels"][k] != v):
                        ok = False
                if ok:
                    print(
                        json.dumps(
                            {
                                "ID": c["ID"],
                                "Names": c["Name"],
                                "State": c["State"],
                                "Labels": ",".join(f"{k}={v}" for k, v in c["Labels"].items()),
                            }
                        )
                    )
        elif cmd == "inspect":
            c = find(h, rest[-1])
            if c is None:
                print("[]")
                die(f"Error: No such object: {rest[-1]}")
            print(
                json.dumps(
                    [
                        {
                            "Id": c["ID"],
                            "State": {
                                "Running": c["State"] == "running",
                                "Status": c["State"],
                                "ExitCode": c["ExitCode"],
                            },
                            "Config": {"Labels": c["Labels"]},
                        }
                    ]
                )
            )
        elif cmd == "image":
            ref = rest[-1]
            if ref not in h.get("images", {}):
                die(f"Error: No such image: {ref}")
            print(h["images"][ref])
        elif cmd == "logs":
            c = find(h, rest[-1])
            if c is None:
                die(f"Error: No such container: {rest[-1]}")
            lines = c.get("Logs", [])
            if "--tail" in rest:
                lines = lines[-int(rest[rest.index("--tail") + 1]) :]
            print("\n".join(lines))
        elif cmd == "rm":
            ids = [a for a in rest if not a.startswith("-")]
            for ref in ids:
                c = find(h, ref)
                if c is None:
                    die(f"Error: No such container: {ref}")
                h["containers"].remove(c)
                print(ref)
        else:
            die(f"fake docker: unsupported command {cmd}")


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
    st = json.loads(STATE.read_text())
    for n, a in enumerate(st["hosts"][HOST].get("addrs", [])):
        print(f"{n + 1}: eth0    inet {a}/24 brd 0.0.0.0 scope global eth0")


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
