"""The ranks' rendezvous over real TCP, the TP step every rank takes part in, and peer death.

Rank 0 listens on --master-addr:--master-port (the role of torch's TCPStore, which vLLM's
worker creates in ``init_process_group``) and waits until every other rank of `--nnodes N`
has joined (N - 1 of them: 1 for a pair, 3 for a group of four, each with its own
`--node-rank`); each connects, retrying until it joins. The head holds one ``Link`` per
rank (a ``Group``); a headless rank holds one, to the head. Like the real store, both
sides are silent while they wait; when the wait runs out the error carries torch's own
wording (TORCH_STORE in vllm_log: the head's DistStoreError, the worker's
DistNetworkError). After the handshake both sides of each link send a heartbeat line every
interval. A closed socket or a reset means the peer is gone, and the survivor reacts as a
vLLM rank does (serve.py ``_peer_gone``). Silence is not death: a frozen rank (SIGSTOP, a
hung host) or a partitioned link keeps its TCP connection, and real vLLM notices nothing
until a step needs that rank. Every engine step on the head is a round trip to every other
rank (``step``/``wait_step``: the TP collective of the real forward pass), so a frozen
rank stalls the head's next step until it resumes, or until the step timeout
(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS) ends the engine, as measured on the real CPU pair
(tests/data/real_engine/frozen_rank.json).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from collections.abc import Callable

from sim.twin.vllm_log import TORCH_STORE

log = logging.getLogger("twin")


class RendezvousError(RuntimeError):
    """Joining failed (timeout, rejected handshake, bind error)."""


class Link:
    """A connected pair of ranks: JSON lines, heartbeats, peer-death callback."""

    def __init__(
        self,
        sock: socket.socket,
        peer_rank: int,
        interval: float,
        on_peer_death: Callable[[str], None],
    ) -> None:
        self.sock, self.peer_rank = sock, peer_rank
        self.interval = interval
        self.on_peer_death = on_peer_death
        self._wlock = threading.Lock()
        self._rfile = sock.makefile("r", encoding="utf-8")
        self._events: dict[str, threading.Event] = {}
        self._closing = False
        self._acked = 0  # the last step the peer took part in
        self._ack_cond = threading.Condition()
        # Blocking reads: silence is not death (module docstring); a closed or reset socket
        # still ends recv at once.
        sock.settimeout(None)

    def send(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._wlock:
            self.sock.sendall(data)

    def recv(self) -> dict:
        line = self._rfile.readline()
        if not line:
            raise ConnectionError("connection closed")
        return json.loads(line)

    def step(self, n: int) -> None:
        """Head: ask the peer to take part in step ``n``."""
        try:
            self.send({"type": "step", "n": n})
        except OSError as exc:
            self._dead(f"send failed: {exc}")

    def wait_step(self, n: int, timeout: float | None) -> str:
        """Head: wait until the peer took part in step ``n``: "ok", "gone" (its socket
        closed meanwhile) or "timeout" (frozen or unreachable for ``timeout`` s)."""
        with self._ack_cond:
            done = self._ack_cond.wait_for(lambda: self._acked >= n or self._closing, timeout)
            if self._acked >= n:
                return "ok"
            return "gone" if done else "timeout"

    def event(self, name: str) -> threading.Event:
        return self._events.setdefault(name, threading.Event())

    def start(self) -> None:
        threading.Thread(target=self._beat, name="hb-send", daemon=True).start()
        threading.Thread(target=self._listen, name="hb-recv", daemon=True).start()

    def close(self) -> None:
        self._closing = True
        with self._ack_cond:
            self._ack_cond.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass

    def _beat(self) -> None:
        while not self._closing:
            try:
                self.send({"type": "hb", "t": time.time()})
            except OSError as exc:
                self._dead(f"send failed: {exc}")
                return
            time.sleep(self.interval)

    def _listen(self) -> None:
        while not self._closing:
            try:
                msg = self.recv()
            except (OSError, ValueError) as exc:
                self._dead(str(exc) or type(exc).__name__)
                return
            kind = msg.get("type")
            if kind == "step":  # rank 1's part of the step's collective
                self.send({"type": "step_ack", "n": msg.get("n", 0)})
            elif kind == "step_ack":
                with self._ack_cond:
                    self._acked = max(self._acked, int(msg.get("n", 0)))
                    self._ack_cond.notify_all()
            elif kind != "hb":
                self.event(str(kind)).set()

    def _dead(self, why: str) -> None:
        if not self._closing:
            self._closing = True
            self.on_peer_death(f"rank {self.peer_rank} is gone ({why})")
            with self._ack_cond:
                self._ack_cond.notify_all()


class _AllSet:
    """``Group.event(name)``: set once every rank's link has that event."""

    def __init__(self, events: list[threading.Event]) -> None:
        self.events = events

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for ev in self.events:
            left = None if end is None else max(end - time.monotonic(), 0.0)
            if not ev.wait(left):
                return False
        return True


class Group:
    """The head's links to every other rank, as one peer: a step is every rank's (the
    collective needs them all), and the first rank gone or silent decides it.

    A rank that is not one of the head's two ring neighbours (1 and N-1) ``hang``s the
    group when it dies: measured on the real engine (TP=4 on four netns hosts, rank 2
    SIGKILLed; docs/rehearsal.md "A TP=4 group"), ranks 1 and 3 log gloo's read error
    while rank 0 logs nothing, its next request gets no answer and /health stays 200: the
    head's step waits as for a frozen rank, until the step timeout ends the engine.
    """

    def __init__(self, links: dict[int, Link]) -> None:
        self.links = dict(sorted(links.items()))
        self.hung: set[int] = set()
        self._hung_cond = threading.Condition()

    def hang(self, rank: int) -> None:
        """Rank ``rank`` died out of the head's sight: every later step waits out its
        timeout (``wait_step`` "timeout")."""
        with self._hung_cond:
            self.hung.add(rank)
            self._hung_cond.notify_all()

    def start(self) -> None:
        for link in self.links.values():
            link.start()

    def step(self, n: int) -> None:
        for link in self.links.values():
            link.step(n)

    def wait_step(self, n: int, timeout: float | None) -> str:
        end = None if timeout is None else time.monotonic() + timeout
        for rank, link in self.links.items():
            left = None if end is None else max(end - time.monotonic(), 0.0)
            result = "timeout" if rank in self.hung else link.wait_step(n, left)
            if result == "gone" and rank in self.hung:
                result = "timeout"
            if result == "timeout" and rank in self.hung:
                self._wait_out(end)
            if result != "ok":
                return result
        return "ok"

    def _wait_out(self, end: float | None) -> None:
        """A hung step: no answer comes; only the step timeout (``end``) ends the wait."""
        while end is None or time.monotonic() < end:
            left = None if end is None else end - time.monotonic()
            with self._hung_cond:
                self._hung_cond.wait(timeout=60.0 if left is None else min(left, 60.0))

    def event(self, name: str) -> _AllSet:
        return _AllSet([link.event(name) for link in self.links.values()])

    def close(self) -> None:
        for link in self.links.values():
            link.close()


# The hello/welcome exchange on a connected socket: as torch's TCPStore client, a connected
# rank waits for the store's answer far longer than for a connection (its default store
# timeout is minutes); 30 s covers any load these tests put on a box.
HANDSHAKE_S = 30.0


def serve_rendezvous(
    addr: str, port: int, model: str, join_timeout: float
) -> tuple[socket.socket, dict]:
    """Rank 0 of a pair: listen and block until rank 1 has connected and said hello."""
    return serve_group(addr, port, model, join_timeout, 2)[1]


def serve_group(
    addr: str, port: int, model: str, join_timeout: float, world: int
) -> dict[int, tuple[socket.socket, dict]]:
    """Rank 0: listen and block until ranks 1..world-1 have each connected and said hello;
    {rank: (socket, hello)}. A second hello for a rank already in is turned away."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((addr, port))
    except OSError as exc:
        raise RendezvousError(
            "torch.distributed.DistNetworkError: "
            + TORCH_STORE["server_listen"].format(
                port, 0, -exc.errno, errno.errorcode.get(exc.errno, "?"), exc.strerror
            )
        ) from exc
    srv.listen(max(4, world))
    srv.settimeout(1.0)
    t0 = time.monotonic()
    joined: dict[int, tuple[socket.socket, dict]] = {}
    try:
        while len(joined) < world - 1:
            if join_timeout > 0 and time.monotonic() - t0 > join_timeout:
                for sock, _hello in joined.values():
                    sock.close()
                raise RendezvousError(
                    "torch.distributed.DistStoreError: "
                    + TORCH_STORE["server_timeout"].format(
                        int(join_timeout), 1 + len(joined), world
                    )
                )
            try:
                conn, peer = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(HANDSHAKE_S)
            try:
                hello = json.loads(conn.makefile("r").readline() or "{}")
            except (OSError, ValueError):
                conn.close()
                continue
            rank = hello.get("rank")
            if hello.get("type") != "hello" or rank not in range(1, world) or rank in joined:
                conn.close()
                continue
            if hello.get("model") != model:
                why = (
                    f"model mismatch: rank 0 serves {model!r}, rank {rank} has "
                    f"{hello.get('model')!r}"
                )
                conn.sendall((json.dumps({"type": "reject", "why": why}) + "\n").encode())
                conn.close()
                for sock, _hello in joined.values():
                    sock.close()
                raise RendezvousError(why + "; every rank needs the same model path and args")
            conn.sendall((json.dumps({"type": "welcome"}) + "\n").encode())
            # the peer as accept() saw it: getpeername() on a socket whose peer has gone since
            # raises ENOTCONN, and a lost peer is the Link's to report, not a crash here
            joined[rank] = (conn, {**hello, "peer": f"{peer[0]}:{peer[1]}"})
        return joined
    finally:
        srv.close()


def join_rendezvous(
    addr: str, port: int, model: str, join_timeout: float, rank: int = 1
) -> socket.socket:
    """Rank ``rank`` (1..N-1): connect to rank 0, retrying until it answers (or
    join_timeout passes)."""
    t0 = time.monotonic()
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=2.0)
            # connected: rank 0 answers once its accept loop reads the hello, which on a loaded
            # box can take seconds; giving up then (the old 2 s) left rank 0 holding a socket
            # whose peer had gone, and both ranks started over
            sock.settimeout(HANDSHAKE_S)
            hello = {"type": "hello", "rank": rank, "model": model}
            sock.sendall((json.dumps(hello) + "\n").encode())
            reply = json.loads(sock.makefile("r").readline() or "{}")
            if reply.get("type") == "welcome":
                return sock
            sock.close()
            raise RendezvousError(f"rank 0 rejected this worker: {reply.get('why', reply)}")
        except (OSError, ValueError) as exc:
            if join_timeout > 0 and time.monotonic() - t0 > join_timeout:
                raise RendezvousError(
                    "torch.distributed.DistNetworkError: "
                    + TORCH_STORE["client_timeout"].format(
                        f"{int(join_timeout * 1000)}ms", addr, port
                    )
                ) from exc
            time.sleep(0.5)
