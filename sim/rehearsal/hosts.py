"""Two rehearsal test hosts on one machine: netns + veth + bridge + a real sshd each.

What a host is made of (prefix `P`, e.g. `dsv4r`; host `N` = 1 or 2):
- network namespace `P-hN`, with `lo` and one NIC (`P-if0`, the same name on both hosts,
  like the NCCL interface of a real pair) on a veth whose other end `P-hN` sits on the
  bridge `P-br0` (which also has the `.254` address, so the machine itself can reach the
  hosts: tests and the chat request come from there);
- its own hostname (UTS namespace) and its own "local disk": every command on the host
  runs in a mount namespace where `BASE/node` is a bind mount of `BASE/hosts/hN/node`, so
  the same path (model dir, overlay dir, TileLang cache, docker state) holds different
  files on each host, as on two real machines;
- its own `sshd -f BASE/hosts/hN/sshd/sshd_config` with its own host key, listening on
  the host's IP; `AuthorizedKeysFile` in BASE; `SetEnv` puts the process runtime
  (`bin/docker`, `bin/vllm`) first on PATH and names the host's docker state dir.

Everything is removed by `teardown`, and leftovers of a crashed run with the same prefix
are removed before a new pair is built (`clean_leftovers`). A lock file per prefix stops
two live runs from sharing names; give a different prefix to run two at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sim.rehearsal.store import CREATED_PATHS_FILE, STATE_ENV

BIN_DIR = Path(__file__).resolve().parent / "bin"
SSHD = "/usr/sbin/sshd"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")

# Runs first in every command on a host: hostname, the host's "local disk", and (for
# sshd) a private /run holding the privilege-separation dir sshd insists on.
_HOST_ENTER = r"""set -e
hostname "$1"
mount --bind "$2" "$3"
if [ "$4" = 1 ]; then mount -t tmpfs -o mode=755 rehearsal-run /run; mkdir -m 755 /run/sshd; fi
shift 4
exec "$@"
"""

Log = Callable[[str], None]


class HarnessError(RuntimeError):
    """A failure to build or remove the test hosts; the message names the fix."""


def _run(argv: Sequence[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise HarnessError(
            f"`{' '.join(argv)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}"
        )
    return res


@dataclass(frozen=True)
class Host:
    """One test host. `run`/`argv` execute a command *on* it (its netns, hostname, disk)."""

    name: str
    rank: int
    ip: str
    nic: str
    base: Path

    @property
    def netns(self) -> str:
        return self.name

    @property
    def root(self) -> Path:
        """Backing dir of this host's files, as seen from the machine."""
        return self.base / "hosts" / self.name

    @property
    def disk(self) -> Path:
        """Backing dir of the host's local disk (seen on the host as `node_view`)."""
        return self.root / "node"

    @property
    def node_view(self) -> Path:
        """The path under which the host sees its own local disk."""
        return self.base / "node"

    @property
    def state_dir(self) -> Path:
        """The docker state dir, as the host sees it."""
        return self.node_view / "docker"

    @property
    def runtime_dir(self) -> Path:
        """The host's own XDG_RUNTIME_DIR (the launcher keeps its per-pair lock there), so
        nothing the launcher writes lands in the machine's shared /tmp."""
        return self.node_view / "run"

    def on_disk(self, host_path: Path | str) -> Path:
        """Translate a path on the host's local disk to the machine's backing path."""
        rel = Path(host_path).relative_to(self.node_view)
        return self.disk / rel

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment of a login on this host (what sshd's SetEnv gives)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4R_")}
        env.update(
            {
                "PATH": f"{BIN_DIR}:{BASE_PATH}",
                STATE_ENV: str(self.state_dir),
                "DSV4R_HOST": self.name,
                "HOME": "/root",
                "XDG_RUNTIME_DIR": str(self.runtime_dir),
            }
        )
        env.update(extra or {})
        return env

    def argv(self, argv: Sequence[str], for_sshd: bool = False) -> list[str]:
        return [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "sh",
            "-c",
            _HOST_ENTER,
            "host-enter",
            self.name,
            str(self.disk),
            str(self.node_view),
            "1" if for_sshd else "0",
            *argv,
        ]

    def run(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        check: bool = False,
        timeout: float | None = 120,
        **kw: Any,
    ) -> subprocess.CompletedProcess:
        """Run `argv` on the host, capture text output."""
        return subprocess.run(
            self.argv(argv),
            env=self.env(env),
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            **kw,
        )

    def popen(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        for_sshd: bool = False,
        **kw: Any,
    ) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv, for_sshd), env=self.env(env), **kw)

    def docker(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """The host's process runtime, as the launcher would call it there."""
        return self.run([str(BIN_DIR / "docker"), *args], check=check)

    def pids(self) -> list[int]:
        """Every process in the host's network namespace (sshd, containers, sessions)."""
        res = _run(["ip", "netns", "pids", self.netns], check=False)
        return [int(p) for p in res.stdout.split()]

    def sshd_pid(self) -> int | None:
        try:
            return int((self.root / "sshd" / "sshd.pid").read_text().strip())
        except (OSError, ValueError):
            return None


@dataclass
class Pair:
    """The two hosts plus the ssh client files the launcher on host 1 uses."""

    prefix: str
    base: Path
    subnet: str
    bridge: str
    gateway: str
    hosts: list[Host]
    ssh_user: str = "root"
    sshd_procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    lock_fh: IO[str] | None = None
    env_file: Path | None = None  # the launcher's env file, once pairenv.prepare wrote it

    @property
    def h1(self) -> Host:
        return self.hosts[0]

    @property
    def h2(self) -> Host:
        return self.hosts[1]

    @property
    def identity(self) -> Path:
        return self.base / "client" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.base / "client" / "known_hosts"

    def ssh_argv(
        self, target: Host, command: Sequence[str] = (), known_hosts: Path | None = None
    ) -> list[str]:
        """ssh as the launcher must run it: BatchMode, strict host keys, our known_hosts."""
        return [
            "ssh",
            "-i",
            str(self.identity),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "IdentitiesOnly=yes",
            f"{self.ssh_user}@{target.ip}",
            *command,
        ]

    def start_sshd(self, host: Host) -> None:
        """Start (or restart) the host's sshd and wait until it accepts connections."""
        old = self.sshd_procs.get(host.name)
        if old is not None and old.poll() is None:
            return
        sdir = host.root / "sshd"
        log = open(sdir / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
        self.sshd_procs[host.name] = host.popen(
            [SSHD, "-D", "-e", "-f", str(sdir / "sshd_config")],
            for_sshd=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_port(host.ip, 22, 10, f"sshd on {host.name} (log: {sdir / 'sshd.log'})")

    def stop_sshd(self, host: Host) -> None:
        """Stop the host's sshd (fault injection: rank 1 unreachable)."""
        proc = self.sshd_procs.pop(host.name, None)
        if proc is None:
            return
        pid = host.sshd_pid()
        for target in (pid, proc.pid):
            if target:
                try:
                    os.kill(target, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _port_open(host.ip, 22) and time.monotonic() < deadline:
            time.sleep(0.05)


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.3):
            return True
    except OSError:
        return False


def _wait_port(ip: str, port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not _port_open(ip, port):
        if time.monotonic() > deadline:
            raise HarnessError(f"{what} did not listen on {ip}:{port} within {timeout:.0f} s")
        time.sleep(0.05)


def check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise HarnessError(
            f"prefix {prefix!r} must be 2-8 lowercase letters/digits, starting "
            "with a letter (it names netns, links and temp dirs)"
        )


def _lock(prefix: str) -> IO[str]:
    path = Path(tempfile.gettempdir()) / f"{prefix}.lock"
    fh = open(path, "a+")  # noqa: SIM115 - held for the pair's lifetime
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise HarnessError(
            f"another rehearsal with prefix {prefix!r} is running (lock "
            f"{path}); wait for it or pass a different --prefix"
        ) from None
    return fh


def remove_created_paths(state_dir: Path) -> None:
    """Remove mount points the runtime created on the shared filesystem (empty only)."""
    registry = state_dir / CREATED_PATHS_FILE
    if not registry.exists():
        return
    for line in sorted(set(registry.read_text().split("\n")), key=len, reverse=True):
        path = Path(line) if line else None
        if path is None or not path.is_absolute():
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass  # not empty or in use: leave it, never remove content


def _kill_netns(ns: str) -> None:
    res = _run(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in res.stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while _run(["ip", "netns", "pids", ns], check=False).stdout.split():
        if time.monotonic() > deadline:
            raise HarnessError(f"processes in netns {ns} survived SIGKILL")
        time.sleep(0.05)


def clean_leftovers(prefix: str, log: Log = lambda _m: None) -> list[str]:
    """Remove everything an earlier run with this prefix left behind; returns what."""
    check_prefix(prefix)
    removed: list[str] = []
    ns_re = re.compile(rf"^{prefix}-h\d+$")
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns_re.match(ns):
            _kill_netns(ns)
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)", line)
        if m and m.group(1).startswith(f"{prefix}-"):
            _run(["ip", "link", "del", m.group(1)], check=False)
            removed.append(f"link {m.group(1)}")
    for tmp in Path(tempfile.gettempdir()).glob(f"{prefix}-*"):
        if tmp.is_dir() and (tmp / "REHEARSAL").exists():
            for state in (tmp / "hosts").glob("*/node/docker"):
                remove_created_paths(state)
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(f"dir {tmp}")
    for item in removed:
        log(f"removed leftover {item}")
    return removed


def _pick_subnet(prefix: str) -> str:
    used = (
        _run(["ip", "-4", "-o", "addr"], check=False).stdout
        + _run(["ip", "-4", "route"], check=False).stdout
    )
    start = zlib.crc32(prefix.encode()) % 200 + 20
    for k in range(200):
        third = (start + k) % 230 + 20
        net = f"10.213.{third}."
        if net not in used:
            return f"10.213.{third}"
    raise HarnessError("no free 10.213.X.0/24 subnet for the test hosts")


def _keygen(path: Path, comment: str) -> str:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(pair: Pair, host: Host) -> str:
    sdir = host.root / "sshd"
    return "\n".join(
        [
            "# Rehearsal test host sshd (sim/rehearsal/hosts.py); nothing system-wide.",
            "Port 22",
            f"ListenAddress {host.ip}",
            f"HostKey {sdir / 'ssh_host_ed25519_key'}",
            f"PidFile {sdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {pair.base / 'client' / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The temp dir lives under world-writable /tmp, which StrictModes rejects.
            "StrictModes no",
            "PermitUserEnvironment no",
            f"SetEnv PATH={BIN_DIR}:{BASE_PATH} {STATE_ENV}={host.state_dir} "
            f"DSV4R_HOST={host.name} XDG_RUNTIME_DIR={host.runtime_dir}",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
            "",
        ]
    )


def build_pair(prefix: str = "dsv4r", log: Log = lambda _m: None, nic: str | None = None) -> Pair:
    """Create both hosts with running sshds; on any failure, remove what was made."""
    if os.geteuid() != 0:
        raise HarnessError(
            "the rehearsal needs root (ip netns, mounts, sshd); run it as "
            "root or use the CI machine"
        )
    check_prefix(prefix)
    missing = [
        tool
        for tool in ("ip", "unshare", "nsenter", "mount", "ssh", "ssh-keygen", "ss", "flock")
        if shutil.which(tool) is None
    ] + ([] if Path(SSHD).exists() else [SSHD])
    if missing:
        raise HarnessError(
            f"missing {', '.join(missing)}: install iproute2, util-linux, "
            "openssh-server and openssh-client (make system-deps)"
        )
    lock = _lock(prefix)
    try:
        clean_leftovers(prefix, log)
        base = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        base.chmod(0o755)
        (base / "REHEARSAL").write_text("rehearsal temp dir; safe to delete\n")
        net = _pick_subnet(prefix)
        pair = Pair(
            prefix=prefix,
            base=base,
            subnet=f"{net}.0/24",
            bridge=f"{prefix}-br0",
            gateway=f"{net}.254",
            lock_fh=lock,
            hosts=[
                Host(
                    name=f"{prefix}-h{i}",
                    rank=i - 1,
                    ip=f"{net}.{i}",
                    nic=nic or f"{prefix}-if0",
                    base=base,
                )
                for i in (1, 2)
            ],
        )
    except BaseException:
        lock.close()
        raise
    try:
        _build(pair, log)
    except BaseException:
        teardown(pair, log)
        raise
    return pair


def _build(pair: Pair, log: Log) -> None:
    client = pair.base / "client"
    client.mkdir()
    (pair.base / "node").mkdir()
    client_pub = _keygen(pair.identity, f"rehearsal-client@{pair.prefix}")
    (client / "authorized_keys").write_text(client_pub + "\n")
    known = []
    for host in pair.hosts:
        for sub in ("sshd", "node/docker", "node/run"):
            (host.root / sub).mkdir(parents=True, mode=0o700)
        pub = _keygen(host.root / "sshd" / "ssh_host_ed25519_key", f"root@{host.name}")
        known.append(f"{host.ip},{host.name} {' '.join(pub.split()[:2])}")
        (host.root / "sshd" / "sshd_config").write_text(_sshd_config(pair, host))
    pair.known_hosts.write_text("\n".join(known) + "\n")
    (pair.base / "pair.json").write_text(
        json.dumps(
            {
                "prefix": pair.prefix,
                "subnet": pair.subnet,
                "bridge": pair.bridge,
                "gateway": pair.gateway,
                "hosts": [
                    {"name": h.name, "rank": h.rank, "ip": h.ip, "nic": h.nic} for h in pair.hosts
                ],
            },
            indent=1,
        )
    )
    log(
        f"network: bridge {pair.bridge} {pair.subnet}, hosts "
        + ", ".join(f"{h.name}={h.ip}" for h in pair.hosts)
    )
    _run(["ip", "link", "add", pair.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{pair.gateway}/24", "dev", pair.bridge])
    _run(["ip", "link", "set", pair.bridge, "up"])
    for host in pair.hosts:
        ns, outer, inner = host.netns, host.name, f"{host.name}p"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", ns])
        _run(["ip", "-n", ns, "link", "set", inner, "name", host.nic])
        _run(["ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", host.nic])
        _run(["ip", "-n", ns, "link", "set", host.nic, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "set", outer, "master", pair.bridge, "up"])
    for host in pair.hosts:
        pair.start_sshd(host)
        log(f"sshd up on {host.name} ({host.ip}), host key in {pair.known_hosts}")
    for target in pair.hosts:
        # ssh joins its arguments into one remote shell line: pass exactly one.
        res = pair.h1.run(pair.ssh_argv(target, [f'echo "$(hostname) ${STATE_ENV}"']))
        want = f"{target.name} {target.state_dir}"
        if res.returncode != 0 or res.stdout.strip() != want:
            raise HarnessError(
                f"ssh probe {pair.h1.name} -> {target.name} failed: "
                f"{res.stdout.strip()} {res.stderr.strip()}"
            )
    log("ssh from host 1 to both hosts works (BatchMode, strict host keys)")


def teardown(pair: Pair, log: Log = lambda _m: None) -> None:
    """Remove everything the pair made; safe to call twice and after partial builds."""
    existing = _run(["ip", "netns", "list"], check=False).stdout.split()
    for host in pair.hosts:
        if host.netns in existing:
            _kill_netns(host.netns)
    for proc in pair.sshd_procs.values():
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    pair.sshd_procs.clear()
    for host in pair.hosts:
        _run(["ip", "netns", "del", host.netns], check=False)
        _run(["ip", "link", "del", host.name], check=False)
        remove_created_paths(host.disk / "docker")
    _run(["ip", "link", "del", pair.bridge], check=False)
    shutil.rmtree(pair.base, ignore_errors=True)
    if pair.lock_fh is not None:
        Path(pair.lock_fh.name).unlink(missing_ok=True)
        pair.lock_fh.close()
        pair.lock_fh = None
    log(f"removed test hosts {', '.join(h.name for h in pair.hosts)}, {pair.bridge}, {pair.base}")


def clean_prefix(prefix: str, log: Log = lambda _m: None) -> list[str]:
    """`--clean`: remove a kept or crashed pair, refusing while a live run holds it."""
    check_prefix(prefix)
    lock = _lock(prefix)
    try:
        return clean_leftovers(prefix, log)
    finally:
        Path(lock.name).unlink(missing_ok=True)
        lock.close()


def find_kept_pair(prefix: str) -> Pair:
    """The pair a `--keep` run left with this prefix (for running commands on its hosts)."""
    check_prefix(prefix)
    for base in sorted(Path(tempfile.gettempdir()).glob(f"{prefix}-*")):
        meta = base / "pair.json"
        if (base / "REHEARSAL").exists() and meta.exists():
            data = json.loads(meta.read_text())
            return Pair(
                prefix=prefix,
                base=base,
                subnet=data["subnet"],
                bridge=data["bridge"],
                gateway=data["gateway"],
                hosts=[
                    Host(name=h["name"], rank=h["rank"], ip=h["ip"], nic=h["nic"], base=base)
                    for h in data["hosts"]
                ],
                env_file=next(iter((base / "client").glob("*.env")), None),
            )
    raise HarnessError(
        f"no kept rehearsal pair with prefix {prefix!r} (run python -m sim.rehearsal --keep first)"
    )


def build_free_pair(prefix: str, log: Log = lambda _m: None, tries: int = 10) -> Pair:
    """Build with `prefix`, or `prefix`1..9 while those are held by live runs (two people
    running the tests at once). A crashed run's prefix is free again and gets cleaned."""
    for k in range(tries):
        candidate = prefix if k == 0 else f"{prefix}{k}"
        try:
            return build_pair(candidate, log)
        except HarnessError as exc:
            if "another rehearsal with prefix" not in str(exc) or k == tries - 1:
                raise
    raise HarnessError("unreachable")


@contextmanager
def pair_up(prefix: str = "dsv4r", log: Log = lambda _m: None) -> Iterator[Pair]:
    """Context manager: build the pair, always tear it down."""
    pair = build_pair(prefix, log)
    try:
        yield pair
    finally:
        teardown(pair, log)
