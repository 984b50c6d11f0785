"""Rehearsal test hosts on one machine: netns + veth + bridge + a real sshd each.

A pair rehearsal has two hosts, a fleet rehearsal five (two pairs and a router host).
What a host is made of (prefix `P`, e.g. `dsv4r`; host `N` = 1, 2, ...):
- network namespace `P-hN`, with `lo` and two NICs, like a real Spark's LAN port and its
  ConnectX-7 link: `P-if0` (the ssh/client network) on a veth whose other end `P-hN` sits
  on the bridge `P-br0` (which also has the `.254` address, so the machine itself can reach
  the hosts: tests and the chat request come from there), and `P-fab0` (the fabric, the
  same name on every host like the NCCL interface of a real pair) on a veth whose other
  end `P-hNf` sits on the bridge `P-br1`, a second subnet the machine has no address on:
  only the hosts reach each other there, so traffic between ranks cannot take the LAN by
  accident;
- its own hostname (UTS namespace) and its own "local disk": every command on the host
  runs in a mount namespace where `BASE/node` is a bind mount of `BASE/hosts/hN/node`, so
  the same path (model dir, overlay dir, TileLang cache, docker state) holds different
  files on each host, as on two real machines;
- its own `sshd -f BASE/hosts/hN/sshd/sshd_config` with its own host key, listening on
  the host's IP; `AuthorizedKeysFile` in BASE; `SetEnv` puts the process runtime
  (`bin/docker`, `bin/vllm`) first on PATH and names the host's docker state dir.

Building and removing the hosts is `provision.py`'s job; this module says what a host is
and how to run a command on it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sim.rehearsal.store import STATE_ENV

BIN_DIR = Path(__file__).resolve().parent / "bin"
SSHD = "/usr/sbin/sshd"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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


def run_local(argv: Sequence[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    """Run a command on the machine itself (not on a host); `check` raises HarnessError."""
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
    fabric_ip: str = ""  # the host's address on the fabric (the pair's FABRIC1/FABRIC2)
    fabric_nic: str = ""  # its interface there (NCCL_SOCKET_IFNAME)

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
        res = run_local(["ip", "netns", "pids", self.netns], check=False)
        return [int(p) for p in res.stdout.split()]

    def sshd_pid(self) -> int | None:
        try:
            return int((self.root / "sshd" / "sshd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def process_cmdlines(self) -> list[str]:
        """`PID: command line` of every process on the host except its sshd listener:
        what is left after `down` must be nothing."""
        sshd = self.sshd_pid()
        out = []
        for pid in self.pids():
            if pid == sshd:
                continue
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            out.append(f"{pid}: " + raw.replace(b"\0", b" ").decode(errors="replace").strip())
        return out


@dataclass
class Pair:
    """The hosts (two for a pair; more for a fleet) plus the ssh client files they share."""

    prefix: str
    base: Path
    subnet: str
    bridge: str
    gateway: str
    hosts: list[Host]
    fabric_subnet: str = ""  # the second network, between the hosts only
    fabric_bridge: str = ""
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
