"""Running commands on the group's nodes: rank 0 locally, ranks 1.. over ssh.

ssh always runs with ``BatchMode=yes`` and ``StrictHostKeyChecking=yes``: an unknown or
changed host key is a hard failure, never a prompt or a silent accept. (The seed's incident
was stopped only by a host-key failure; we keep that guard on by construction.)
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from pairctl.pair.config import PairConfig

SSH_CONNECT_TIMEOUT_S = 10
# Options that decide which host keys are trusted: set here only, never by a caller.
_TRUST_OPTIONS = frozenset(
    {
        "batchmode",
        "stricthostkeychecking",
        "userknownhostsfile",
        "globalknownhostsfile",
        "knownhostscommand",
    }
)


def ssh_to(
    host: str,
    *,
    user: str = "",
    port: str = "",
    identity_file: str = "",
    known_hosts_file: str = "",
    remote_cmd: str | None = None,
    options: tuple[str, ...] = (),
) -> list[str]:
    """The one ssh argv builder (pairs and fleets): BatchMode and strict host-key checking
    always on; empty settings mean ssh's defaults. ``options`` are more ``-o K=V``; one
    that says which host keys to trust is refused (ValueError), so no caller can loosen
    the checking."""
    for opt in options:
        if opt.partition("=")[0].strip().lower() in _TRUST_OPTIONS:
            raise ValueError(f"ssh option {opt!r} is the launcher's to set, not a caller's")
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
        "-o",
        "ServerAliveInterval=15",
    ]
    if known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={known_hosts_file}"]
    for opt in options:
        argv += ["-o", opt]
    if identity_file:
        argv += ["-i", identity_file, "-o", "IdentitiesOnly=yes"]
    if port:
        argv += ["-p", port]
    if user:
        argv += ["-l", user]
    argv.append(host)
    if remote_cmd is not None:
        argv += ["--", remote_cmd]
    return argv


def ssh_argv(
    cfg: PairConfig,
    remote_cmd: str | None = None,
    host: str = "",
    options: tuple[str, ...] = (),
) -> list[str]:
    """ssh argv for SPARK2 (or ``host``: another rank's node, or a rank's fabric address),
    with the pair's SSH_* settings (the same for every remote node)."""
    return ssh_to(
        host or cfg["SPARK2"],
        user=cfg["SSH_USER"],
        port=cfg["SSH_PORT"],
        identity_file=cfg["SSH_IDENTITY_FILE"],
        known_hosts_file=cfg["SSH_KNOWN_HOSTS_FILE"],
        remote_cmd=remote_cmd,
        options=options,
    )


@dataclass(frozen=True)
class Result:
    """A finished command."""

    rc: int
    out: str
    err: str


@dataclass(frozen=True)
class Node:
    """One node of the group. ``remote`` nodes (every rank but 0) are reached with ssh_argv:
    at ``addr`` (SPARK<rank+1>), or at ``ssh_host`` when set (the rank's fabric address,
    for the bulk copies: pairctl.nodes.fabric)."""

    rank: int
    addr: str
    cfg: PairConfig
    ssh_host: str = ""
    ssh_options: tuple[str, ...] = ()  # more ``-o K=V`` (preflight's HostKeyAlias check)

    @property
    def remote(self) -> bool:
        return self.rank != 0

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.addr}{', fabric' if self.ssh_host else ''})"

    def wrap(self, argv: list[str], secret_names: tuple[str, ...] = ()) -> list[str]:
        """argv to run locally for a command meant for this node.

        Remote secrets are read from stdin, one line each, into the environment of the
        remote command, so their values never appear on any command line.
        """
        if not self.remote:
            return list(argv)
        cmd = shlex.join(argv)
        if secret_names:
            reads = "".join(f"IFS= read -r {n}; " for n in secret_names)
            cmd = f"{reads}export {' '.join(secret_names)}; exec {cmd}"
        return ssh_argv(self.cfg, cmd, self.ssh_host or self.addr, self.ssh_options)

    def ssh_argv(self, remote_cmd: str | None = None) -> list[str]:
        """The ssh command line that reaches this node (its SPARK, or ``ssh_host``) with this
        pair's ssh settings."""
        return ssh_argv(self.cfg, remote_cmd, self.ssh_host or self.addr, self.ssh_options)

    def run(
        self,
        argv: list[str],
        timeout: float = 60,
        stdin: str | bytes | None = None,
        secrets: tuple[tuple[str, str], ...] = (),
    ) -> Result:
        """Run argv on the node and capture output; rc 255 with ssh = ssh itself failed.

        ``secrets`` (name, value) reach the command's environment: locally via the process
        environment, remotely via stdin (so not together with ``stdin``).
        """
        data = stdin.encode() if isinstance(stdin, str) else stdin
        env = None
        names = tuple(n for n, _ in secrets)
        if secrets and self.remote:
            if data is not None:
                raise ValueError("secrets and stdin cannot both go to a remote command")
            data = "".join(f"{v}\n" for _, v in secrets).encode()
        elif secrets:
            env = dict(os.environ, **dict(secrets))
        try:
            p = subprocess.run(
                self.wrap(argv, names if self.remote else ()),
                input=data,
                capture_output=True,
                timeout=timeout,
                check=False,
                env=env,
                stdin=subprocess.DEVNULL if data is None else None,
            )
        except subprocess.TimeoutExpired:
            return Result(124, "", f"timed out after {timeout:.0f}s: {argv[0]}")
        except FileNotFoundError as exc:
            return Result(127, "", str(exc))
        return Result(
            p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        )

    def run_script(self, script: str, timeout: float = 60) -> Result:
        """Run a POSIX sh script (read from stdin) on the node."""
        return self.run(["sh", "-s"], timeout=timeout, stdin=script)


def nodes(cfg: PairConfig) -> tuple[Node, ...]:
    """(rank 0 = SPARK1 local, rank R = SPARK<R+1> over ssh), one per rank of the group."""
    return tuple(Node(r, cfg.spark(r), cfg) for r in range(cfg.nnodes))
