"""Kernel timestamps on a client TCP socket: connect, departure stamps, the receive loop.

Linux SO_TIMESTAMPING (Documentation/networking/timestamping.rst in the kernel tree) stamps each
received segment when it arrives and each sent one when it leaves, so a thread that waited for
the GIL does not make a token look late or a request look early. Stamps are CLOCK_REALTIME; they
are turned into CLOCK_MONOTONIC (the clock of every other time here) with one offset per request.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

# Kernel timestamps (Linux; asm-generic values, the same on x86_64 and aarch64; Python does not
# export the names). SO_TIMESTAMPING gives a software stamp when each received segment arrives
# (ancillary data of recvmsg) and when the request's bytes leave (error queue, read afterwards).
# Older kernels: SO_TIMESTAMPNS (receive only). Neither: user-space stamps.
_LINUX = sys.platform.startswith("linux")
SO_TIMESTAMPNS = 35
SO_TIMESTAMPING = 37
_TS_TX = 1 << 1  # SOF_TIMESTAMPING_TX_SOFTWARE
_TS_FLAGS = _TS_TX | (1 << 3) | (1 << 4) | (1 << 11)  # + RX_SOFTWARE | SOFTWARE | OPT_TSONLY
_ANC = socket.CMSG_SPACE(48)
_ERRQ_ANC = socket.CMSG_SPACE(48) + socket.CMSG_SPACE(64)


def connect(host: str, port: int, timeout_s: float = 600.0) -> socket.socket:
    """Connected socket with TCP_NODELAY and kernel send/receive timestamps when available."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not _LINUX:
        return sock  # the option numbers below are Linux's
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TS_FLAGS)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # no kernel stamps: user-space stamps are used instead
    return sock


def clock_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, to turn kernel socket stamps into monotonic time.

    Bracketed by two monotonic reads and retried: with 64 threads, a GIL switch between two
    plain reads would put milliseconds of error into every stamp of that request.
    """
    best = None
    for _ in range(tries):
        m1 = time.monotonic_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m2 = time.monotonic_ns()
        if best is None or m2 - m1 < best[0]:
            best = (m2 - m1, r - (m1 + m2) // 2)
        if m2 - m1 < 20_000:
            break
    return best[1]  # type: ignore[index]


_OFFSET: list[int] = []  # [offset_ns, measured_at_monotonic_ns]


def clock_offset_cached(max_age_s: float = 2.0) -> int:
    """The clock offset, re-measured at most every max_age_s (it only drifts by NTP slew, ppm).

    Both stamps of a request use the same offset, so it cancels in TTFT and every gap; only the
    plausibility bounds below need it to be roughly right.
    """
    now = time.monotonic_ns()
    if not _OFFSET or now - _OFFSET[1] > max_age_s * 1e9:
        _OFFSET[:] = [clock_offset_ns(), now]
    return _OFFSET[0]


def kernel_ns(cdata: bytes) -> int | None:
    """First timespec of a timestamp control message (the software stamp), realtime ns."""
    if len(cdata) < 16:
        return None
    sec, nsec = struct.unpack_from("qq", cdata)
    return sec * 1_000_000_000 + nsec if sec else None


def tx_stamps(sock: socket.socket, timeout_s: float) -> list[int]:
    """Departure stamp(s) of what was sent so far (realtime ns), then TX stamping off.

    Loopback and NIC software stamps are queued by the time send() returns. TX stamping is
    switched off before the response is read: measured here, leaving it on for the whole stream
    made a stdlib server's small SSE writes arrive in 40 ms bursts.
    """
    out: list[int] = []
    if not _LINUX:
        return out
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TS_FLAGS & ~_TS_TX)
    except OSError:
        return out  # SO_TIMESTAMPING unsupported: SO_TIMESTAMPNS or nothing is in use
    sock.setblocking(False)  # a socket with a timeout would poll() for POLLIN instead
    try:
        while True:
            try:
                _d, anc, _f, _a = sock.recvmsg(64, _ERRQ_ANC, socket.MSG_ERRQUEUE)
            except OSError:  # BlockingIOError when empty
                return out
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                    t = kernel_ns(cdata)
                    if t is not None:
                        out.append(t)
    finally:
        sock.settimeout(timeout_s)


class Receiver:
    """The receive loop of one response and its stamps.

    Per recv the loop only keeps (bytes, kernel stamp, user stamp); the kernel stamp is the
    segment's arrival time, so a thread that waited for the GIL after recv() returned does not
    make the event look late. The user stamp is kept to report that wait (wake_lag_max_ms).
    """

    def __init__(self) -> None:
        self.bufs: list[bytes] = []
        self.user: list[int] = []
        self.kern: list[bytes] = []  # raw timespec per recv (b"" if none)
        self.offset_ns = 0  # CLOCK_REALTIME - CLOCK_MONOTONIC, to convert kernel stamps

    def run(self, sock: socket.socket) -> None:
        recvmsg = sock.recvmsg
        now = time.monotonic_ns
        ap_b, ap_u, ap_k = self.bufs.append, self.user.append, self.kern.append
        tail = b""
        while True:
            data, anc, _flags, _addr = recvmsg(262144, _ANC)
            t = now()
            if not data:
                return
            ap_b(data)
            ap_u(t)
            ap_k(anc[-1][2] if anc else b"")
            # Stop on the chunked terminator even if the server keeps the socket open.
            tail = (tail + data)[-7:]
            if tail.endswith(b"\r\n0\r\n\r\n") or tail == b"0\r\n\r\n":
                return

    def stamps(self) -> list[int]:
        """Kernel arrival per recv in monotonic ns (user stamp where the kernel gave none).

        Not clamped to the user stamp: send and receive stamps share one clock offset, which
        cancels in every difference; clamping one side would turn offset noise into error.
        """
        out = []
        for u, k in zip(self.user, self.kern, strict=True):
            kt = kernel_ns(k)
            ok = kt is not None and -10 * 1_000_000_000 < kt - self.offset_ns - u < 1_000_000_000
            out.append(kt - self.offset_ns if ok else u)  # type: ignore[operator]
        return out

    def max_lag_ms(self) -> float | None:
        st = self.stamps()
        if not st or not any(self.kern):
            return None
        return max(u - k for u, k in zip(self.user, st, strict=True)) / 1e6
