"""Running a command on a fleet machine: here when it is this machine, else over ssh.

The same rules as a pair's rank 1 (pairctl/nodes/ssh.py): ssh always runs with BatchMode=yes and
StrictHostKeyChecking=yes, so an unknown or changed host key stops the fleet instead of
prompting or silently trusting a machine that is not the one in the inventory.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pairctl.fleet.inventory import Ssh
from pairctl.nodes.ssh import Result, ssh_to

PID_TAG = "dsv4-fleet-pid"


def is_local_address(host: str) -> bool:
    """True when `host` resolves to an address of this machine (binding to it succeeds)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def ssh_argv(host: str, ssh: Ssh, remote_cmd: str | None = None) -> list[str]:
    """ssh to a fleet machine with the inventory's ssh settings (``pairctl.nodes.ssh.ssh_to``)."""
    return ssh_to(
        host,
        user=ssh.user,
        port=ssh.port,
        identity_file=ssh.identity_file,
        known_hosts_file=ssh.known_hosts_file,
        remote_cmd=remote_cmd,
    )


@dataclass(frozen=True)
class Machine:
    """A fleet machine (a pair head or the router host) and how to run commands on it."""

    addr: str
    ssh: Ssh
    role: str

    @cached_property
    def local(self) -> bool:
        return is_local_address(self.addr)

    @property
    def label(self) -> str:
        return f"{self.role} {self.addr}" + (" (this machine)" if self.local else "")

    def argv(self, argv: list[str], cwd: str | None = None, announce: bool = False) -> list[str]:
        """What to execute here so that `argv` runs on the machine (in `cwd` if given).

        `announce` (remote only): the first output line is `PID_TAG <pid>`, the pid (and
        process group: sshd starts a command in a new session) of `argv` on the machine,
        so an interrupted fleet can signal it there.
        """
        if self.local:
            return list(argv)
        cmd = f"exec {shlex.join(argv)}"
        if cwd:
            cmd = f"cd {shlex.quote(cwd)} && {cmd}"
        if announce:
            cmd = f"echo {PID_TAG} $$; {cmd}"
        return ssh_argv(self.addr, self.ssh, cmd)

    def interrupt(self, pid: int) -> None:
        """SIGINT the process group `pid` leads on the machine (a launcher: its trap tears
        down a boot that did not finish, as on Ctrl-C)."""
        if self.local:
            try:
                os.killpg(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        else:
            self.run(["kill", "-INT", "--", f"-{pid}"], timeout=30)

    def run(self, argv: list[str], timeout: float = 60, cwd: str | None = None) -> Result:
        """Run and capture; rc 255 from a remote machine means ssh itself failed."""
        try:
            p = subprocess.run(
                self.argv(argv, cwd),
                capture_output=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
                cwd=cwd if self.local else None,
            )
        except subprocess.TimeoutExpired:
            return Result(124, "", f"timed out after {timeout:.0f}s: {argv[0]} on {self.addr}")
        except (FileNotFoundError, NotADirectoryError) as exc:
            return Result(127, "", str(exc))
        return Result(
            p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        )

    def popen(self, argv: list[str], cwd: str | None = None, **kw: Any) -> subprocess.Popen:
        """Start `argv` on the machine in a session of its own (a Ctrl-C of the fleet does
        not reach it; the fleet decides what to tell it), stdout+stderr in one text pipe.
        A remote command announces its pid first (see `argv`)."""
        return subprocess.Popen(
            self.argv(argv, cwd, announce=True),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            cwd=cwd if self.local else None,
            **kw,
        )
