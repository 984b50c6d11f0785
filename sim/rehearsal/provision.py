"""Build and remove the rehearsal test hosts (`hosts.Host`, `hosts.Pair`): two for a pair,
five for a fleet (two pairs and a router host, sim/rehearsal/fleet.py).

`build_pair` makes the two bridges (the ssh/client network and the fabric), one netns and two
veths per host, keys, sshd configs and sshds,
and checks ssh from host 1 to every host; on any failure it removes what it made. Everything is
removed by `teardown`, and leftovers of a crashed run with the same prefix are removed
before a new pair is built (`clean_leftovers`). A lock file per prefix stops two live runs
from sharing names; give a different prefix to run two at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import IO

from sim.rehearsal.hosts import (
    BASE_PATH,
    BIN_DIR,
    SSHD,
    HarnessError,
    Host,
    Log,
    Pair,
    run_local,
)
from sim.rehearsal.store import STATE_ENV, remove_created_paths

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")


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


def _kill_netns(ns: str) -> None:
    res = run_local(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in res.stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while run_local(["ip", "netns", "pids", ns], check=False).stdout.split():
        if time.monotonic() > deadline:
            raise HarnessError(f"processes in netns {ns} survived SIGKILL")
        time.sleep(0.05)


def clean_leftovers(prefix: str, log: Log = lambda _m: None) -> list[str]:
    """Remove everything an earlier run with this prefix left behind; returns what."""
    check_prefix(prefix)
    removed: list[str] = []
    ns_re = re.compile(rf"^{prefix}-h\d+$")
    for line in run_local(["ip", "netns", "list"], check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns_re.match(ns):
            _kill_netns(ns)
            run_local(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
    for line in run_local(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)", line)
        if m and m.group(1).startswith(f"{prefix}-"):
            run_local(["ip", "link", "del", m.group(1)], check=False)
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


def _pick_subnet(prefix: str, second: int = 213) -> str:
    """A free 10.SECOND.X.0/24 (213: the ssh/client network, 214: the fabric)."""
    used = (
        run_local(["ip", "-4", "-o", "addr"], check=False).stdout
        + run_local(["ip", "-4", "route"], check=False).stdout
    )
    start = zlib.crc32(prefix.encode()) % 200 + 20
    for k in range(200):
        third = (start + k) % 230 + 20
        net = f"10.{second}.{third}."
        if net not in used:
            return f"10.{second}.{third}"
    raise HarnessError(f"no free 10.{second}.X.0/24 subnet for the test hosts")


def _keygen(path: Path, comment: str) -> str:
    run_local(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(pair: Pair, host: Host) -> str:
    sdir = host.root / "sshd"
    return "\n".join(
        [
            "# Rehearsal test host sshd (sim/rehearsal/hosts.py); nothing system-wide.",
            "Port 22",
            f"ListenAddress {host.ip}",
            # and on the fabric, as a Spark's sshd listens on every address: the bulk copies
            # (image ship, model fetch) reach rank 1 at FABRIC2
            *([f"ListenAddress {host.fabric_ip}"] if host.fabric_ip else []),
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


def build_pair(
    prefix: str = "dsv4r",
    log: Log = lambda _m: None,
    nic: str | None = None,
    n_hosts: int = 2,
) -> Pair:
    """Create `n_hosts` hosts with running sshds; on any failure, remove what was made."""
    if os.geteuid() != 0:
        raise HarnessError(
            "the rehearsal needs root (ip netns, mounts, sshd); run it as "
            "root or use the CI machine"
        )
    check_prefix(prefix)
    if not 2 <= n_hosts <= 16:
        raise HarnessError(f"n_hosts must be 2-16, not {n_hosts}")
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
        net, fab = _pick_subnet(prefix), _pick_subnet(prefix, 214)
        pair = Pair(
            prefix=prefix,
            base=base,
            subnet=f"{net}.0/24",
            bridge=f"{prefix}-br0",
            gateway=f"{net}.254",
            fabric_subnet=f"{fab}.0/24",
            fabric_bridge=f"{prefix}-br1",
            lock_fh=lock,
            hosts=[
                Host(
                    name=f"{prefix}-h{i}",
                    rank=i - 1,
                    ip=f"{net}.{i}",
                    nic=nic or f"{prefix}-if0",
                    base=base,
                    fabric_ip=f"{fab}.{i}",
                    fabric_nic=f"{prefix}-fab0",
                )
                for i in range(1, n_hosts + 1)
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
        # the fabric address too: the operator's one first contact with `ssh FABRIC2`
        # (README Quickstart step 0), whose fingerprint is the host's own
        names = ",".join(n for n in (host.ip, host.name, host.fabric_ip) if n)
        known.append(f"{names} {' '.join(pub.split()[:2])}")
        (host.root / "sshd" / "sshd_config").write_text(_sshd_config(pair, host))
    pair.known_hosts.write_text("\n".join(known) + "\n")
    (pair.base / "pair.json").write_text(
        json.dumps(
            {
                "prefix": pair.prefix,
                "subnet": pair.subnet,
                "bridge": pair.bridge,
                "gateway": pair.gateway,
                "fabric_subnet": pair.fabric_subnet,
                "fabric_bridge": pair.fabric_bridge,
                "hosts": [
                    {
                        "name": h.name,
                        "rank": h.rank,
                        "ip": h.ip,
                        "nic": h.nic,
                        "fabric_ip": h.fabric_ip,
                        "fabric_nic": h.fabric_nic,
                    }
                    for h in pair.hosts
                ],
            },
            indent=1,
        )
    )
    log(
        f"network: bridge {pair.bridge} {pair.subnet}, hosts "
        + ", ".join(f"{h.name}={h.ip}" for h in pair.hosts)
        + f"; fabric {pair.fabric_bridge} {pair.fabric_subnet}, "
        + ", ".join(f"{h.fabric_nic}={h.fabric_ip}" for h in pair.hosts)
    )
    run_local(["ip", "link", "add", pair.bridge, "type", "bridge"])
    run_local(["ip", "addr", "add", f"{pair.gateway}/24", "dev", pair.bridge])
    run_local(["ip", "link", "set", pair.bridge, "up"])
    # the fabric's bridge carries no address: the machine itself is not on the fabric
    run_local(["ip", "link", "add", pair.fabric_bridge, "type", "bridge"])
    run_local(["ip", "link", "set", pair.fabric_bridge, "up"])
    for host in pair.hosts:
        ns, outer, inner = host.netns, host.name, f"{host.name}p"
        run_local(["ip", "netns", "add", ns])
        run_local(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        run_local(["ip", "link", "set", inner, "netns", ns])
        run_local(["ip", "-n", ns, "link", "set", inner, "name", host.nic])
        run_local(["ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", host.nic])
        run_local(["ip", "-n", ns, "link", "set", host.nic, "up"])
        run_local(["ip", "-n", ns, "link", "set", "lo", "up"])
        run_local(["ip", "link", "set", outer, "master", pair.bridge, "up"])
        _add_fabric_nic(pair, host)
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
    log(f"ssh from host 1 to all {len(pair.hosts)} hosts works (BatchMode, strict host keys)")


def _add_fabric_nic(pair: Pair, host: Host) -> None:
    """The host's second NIC, on the fabric bridge (its ConnectX-7 link)."""
    ns, outer, inner = host.netns, f"{host.name}f", f"{host.name}fp"
    run_local(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
    run_local(["ip", "link", "set", inner, "netns", ns])
    run_local(["ip", "-n", ns, "link", "set", inner, "name", host.fabric_nic])
    run_local(["ip", "-n", ns, "addr", "add", f"{host.fabric_ip}/24", "dev", host.fabric_nic])
    run_local(["ip", "-n", ns, "link", "set", host.fabric_nic, "up"])
    run_local(["ip", "link", "set", outer, "master", pair.fabric_bridge, "up"])


def teardown(pair: Pair, log: Log = lambda _m: None) -> None:
    """Remove everything the pair made; safe to call twice and after partial builds."""
    existing = run_local(["ip", "netns", "list"], check=False).stdout.split()
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
        run_local(["ip", "netns", "del", host.netns], check=False)
        run_local(["ip", "link", "del", host.name], check=False)
        run_local(["ip", "link", "del", f"{host.name}f"], check=False)
        remove_created_paths(host.disk / "docker")
    run_local(["ip", "link", "del", pair.bridge], check=False)
    if pair.fabric_bridge:
        run_local(["ip", "link", "del", pair.fabric_bridge], check=False)
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
                fabric_subnet=data.get("fabric_subnet", ""),
                fabric_bridge=data.get("fabric_bridge", ""),
                hosts=[
                    Host(
                        name=h["name"],
                        rank=h["rank"],
                        ip=h["ip"],
                        nic=h["nic"],
                        base=base,
                        fabric_ip=h.get("fabric_ip", ""),
                        fabric_nic=h.get("fabric_nic", ""),
                    )
                    for h in data["hosts"]
                ],
                env_file=next(iter((base / "client").glob("*.env")), None),
            )
    raise HarnessError(
        f"no kept rehearsal pair with prefix {prefix!r} (run python -m sim.rehearsal --keep first)"
    )


def build_free_pair(
    prefix: str, log: Log = lambda _m: None, tries: int = 10, n_hosts: int = 2
) -> Pair:
    """Build with `prefix`, or `prefix`1..9 while those are held by live runs (two people
    running the tests at once). A crashed run's prefix is free again and gets cleaned."""
    for k in range(tries):
        candidate = prefix if k == 0 else f"{prefix}{k}"
        try:
            return build_pair(candidate, log, n_hosts=n_hosts)
        except HarnessError as exc:
            if "another rehearsal with prefix" not in str(exc) or k == tries - 1:
                raise
    raise HarnessError("unreachable")
