"""Can rank 1 reach rank 0's master port over the fabric? Asked before anything starts.

The launcher runs on rank 0, so it opens MASTER_ADDR:MASTER_PORT itself for a few seconds
(after rank 0's probe, so PF-MASTER-PORT-FREE judged the port before we held it), sends a
one-time token to whoever connects, and asks rank 1 over the existing ssh path to connect
and read it back (python3 on the host, else bash's /dev/tcp). The token proves rank 1
reached this listener, not some other process on the port; the address the connection
came from is the one rank 1's route to MASTER_ADDR picks, so a route that leaves over the
LAN instead of the fabric shows (PF-FABRIC-REACH compares it with FABRIC2).
"""

from __future__ import annotations

import secrets
import shlex
import socket
import threading
from dataclasses import dataclass

from pairctl.nodes.ssh import Node

LISTEN_S = 20.0  # how long the listener stays open; rank 1's connect gives up after 5 s

# Rank 1's side: connect, read the token, print it. $HOST/$PORT/$PY are bound in front.
_CONNECT = r"""
if command -v python3 >/dev/null 2>&1; then
  python3 -c "$PY" "$HOST" "$PORT"
elif command -v bash >/dev/null 2>&1; then
  timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "token=%s\n" "$(head -c 32 <&3)"' \
    "$HOST" "$PORT"
else
  echo "neither python3 nor bash on this node" >&2; exit 127
fi
"""
_PY = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.settimeout(5)
data = b""
while len(data) < 32:
    chunk = s.recv(64)
    if not chunk:
        break
    data += chunk
print("token=" + data.decode(errors="replace"))
"""


@dataclass(frozen=True)
class Reach:
    """What the reach test saw (defaults: it did not run)."""

    ran: bool = False  # the listener was up and rank 1 was asked
    ok: bool = False  # rank 1 read back this listener's token
    peer: str = ""  # the address rank 1's connection came from
    detail: str = ""  # why it did not run, or rank 1's error


def connect_script(host: str, port: int) -> str:
    """Rank 1's side with the target bound as shell variables (safely quoted)."""
    binds = {"HOST": host, "PORT": str(port), "PY": _PY}
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in binds.items()) + _CONNECT


def _plain(addr: str) -> str:
    """``::ffff:10.0.0.2`` (an IPv4 peer on a dual-stack socket) → ``10.0.0.2``."""
    return addr.removeprefix("::ffff:")


class _Listener:
    """MASTER_ADDR:MASTER_PORT held for the test; every connection gets the token."""

    def __init__(self, bind_ip: str, port: int, token: str) -> None:
        family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((bind_ip, port))
            self.sock.listen(4)
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(0.2)
        self.token = token.encode()
        self.peers: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self.peers.append(_plain(str(addr[0])))
                try:
                    conn.sendall(self.token)
                    # let rank 1 close first: the TIME_WAIT is then its, and MASTER_PORT
                    # here is left exactly as free as it was for the engine's TCP store
                    conn.settimeout(5)
                    conn.recv(1)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def reach_master(rank1: Node, bind_ip: str, port: int, host: str) -> Reach:
    """Listen on ``bind_ip:port`` here (rank 0) and have rank 1 connect to ``host:port``."""
    token = secrets.token_hex(16)
    try:
        listener = _Listener(bind_ip, port, token)
    except OSError as exc:
        why = exc.strerror or str(exc)
        return Reach(detail=f"could not listen on {bind_ip}:{port} on this machine: {why}")
    try:
        res = rank1.run_script(connect_script(host, port), timeout=LISTEN_S)
    finally:
        listener.close()
    got = next((ln[6:] for ln in res.out.splitlines() if ln.startswith("token=")), "")
    if got.strip() == token:
        return Reach(ran=True, ok=True, peer=listener.peers[-1] if listener.peers else "")
    err = (res.err or res.out).strip().splitlines()
    why = err[-1][:300] if err else f"rc={res.rc}"
    if got:
        why = f"something else answered on the port (not this listener's token); {why}"
    return Reach(ran=True, ok=False, detail=why)
