"""The fork server behind tests/support/warm.py. Standard library only: it runs under either
venv's interpreter (vLLM 0.33's .venv, the CPU engine's .venv-engine).

It imports, once, the third-party modules that importing its targets (vLLM modules) brings
in, but none of vLLM's own nor this repo's: vLLM then imports afresh in every script, reading
its environment and registering its plugins, ops and configs as in a new process. Each
request runs one script (``-c CODE``, ``-m MODULE`` or a path, with arguments) in a fork of
this process, with the request's environment, working directory, sys.path and standard
streams, and answers its exit status as a new interpreter's would be.

Protocol: one JSON line a request on stdin; two JSON lines back on stdout, ``{"pid": N}``
when the script starts and ``{"rc": N}`` when it has ended (negative: killed by that signal).
"""

from __future__ import annotations

import atexit
import builtins
import hashlib
import importlib
import importlib.util
import json
import os
import runpy
import sys
import tempfile
import threading
import traceback
import types

# vLLM itself and this repo's packages import afresh in each script (a test may put its own
# copy first on PYTHONPATH); so does __main__.
OWN = {"vllm", "dsv4_flash_overlays", "pairctl", "sim", "tests", "bench", "perfmodel"}


def _third_party(name: str) -> bool:
    return name.split(".")[0] not in OWN and not name.startswith("__")


def discover(targets: list[str]) -> list[str]:
    """The modules importing ``targets`` loads, in import order (found in a forked child,
    so that this process never imports vLLM)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        names: list[str] = []
        try:
            for target in targets:
                try:
                    importlib.import_module(target)
                except Exception:  # noqa: BLE001 - a target this vLLM lacks
                    pass
            names = [m for m in list(sys.modules) if _third_party(m)]
        finally:
            os.write(w, json.dumps(names).encode())
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"[]")


def discovered(targets: list[str]) -> list[str]:
    """discover()'s list, kept in the temp folder for this interpreter's vLLM install (its
    files' path and mtime): the discovery imports all of vLLM, twice the cost of a preload.
    A stale list only changes what is preloaded, never what a script sees of vLLM."""
    spec = importlib.util.find_spec("vllm")
    origin = spec.origin if spec is not None and spec.origin else ""
    mtime = os.stat(origin).st_mtime_ns if origin else 0
    key = json.dumps([sys.prefix, origin, mtime, targets])
    name = f"dsv4-warm-python-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    path = os.path.join(tempfile.gettempdir(), name)
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        pass
    names = discover(targets)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(names, fh)
    os.replace(tmp, path)
    return names


def preload(names: list[str]) -> None:
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that needs vLLM's order stays unloaded
            pass


def _exit_code(code: object) -> int:
    """SystemExit's argument as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _redirect(req: dict) -> None:
    fd = os.open(req.get("stdin") or os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    for target, key in ((1, "stdout"), (2, "stderr")):
        fd = os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def run_script(req: dict, base_path: list[str]) -> int:
    """In the forked child: the request's script as ``python ARGV`` would run it."""
    os.setpgid(0, 0)  # a group of its own: a timeout ends the script and its children
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    _redirect(req)
    argv = req["argv"]
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    if argv[0] == "-c":
        first, sys.argv = "", ["-c", *argv[2:]]
    elif argv[0] == "-m":
        first, sys.argv = os.getcwd(), [argv[1], *argv[2:]]
    else:
        first, sys.argv = os.path.dirname(os.path.abspath(argv[0])), list(argv)
    sys.path[:] = [first, *extra, *base_path]
    importlib.invalidate_caches()
    sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
    code = 0
    try:
        if argv[0] == "-c":
            main = types.ModuleType("__main__")
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # noqa: S102
        elif argv[0] == "-m":
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        traceback.print_exc()
        code = 1
    # what interpreter shutdown does: wait for non-daemon threads, run atexit handlers
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def serve(base_path: list[str]) -> None:
    ctl_in = os.fdopen(0, "rb", buffering=0)
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = ctl_in.read(1 << 16)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_script(req, base_path)
            finally:
                os._exit(code)
        os.write(1, (json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, (json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())


def main() -> None:
    base_path = sys.path[1:]  # sys.path[0] is this file's folder
    sys.path[:] = base_path
    protocol = os.dup(1)
    os.dup2(2, 1)  # what an import prints must not reach the protocol
    preload(discovered(json.loads(sys.argv[1])))
    os.dup2(protocol, 1)
    os.close(protocol)
    os.write(1, b'{"ready": true}\n')
    serve(base_path)


if __name__ == "__main__":
    main()
