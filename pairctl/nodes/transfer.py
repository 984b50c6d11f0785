"""Copy big files from rank 0 to another rank over the pair's ssh, resumably, with progress.

The image tar (tens of GB) and the checkpoint (~150 GB in 5 GB shards) cross the fabric
once; a dropped link must not restart them from zero. Each file is appended to
``DST.partial`` on rank 1 from the byte it already holds (what ``rsync --partial --append``
does for a file that only grows) and renamed to ``DST`` once its size is right, so rank 1
never sees a half file under the real name. Rank 1 needs nothing but ``sh``, ``cat``,
``find`` and ``mv``, and the same ssh options every other command uses (host keys checked).
Progress is rich's transfer bar (bytes, bytes/s, time left) on a terminal, and one plain
line every 10 s otherwise (a log, a systemd journal), on stderr. Copies to several nodes
at once (a group of four: pairctl.nodes.fanout) share one rich display, a bar per node
(``bars_together``): rich allows one live display at a time.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from pairctl.nodes.ssh import Node

CHUNK = 8 << 20
PARTIAL = ".partial"
PLAIN_EVERY_S = 10.0


class TransferError(RuntimeError):
    """A copy or a remote listing failed; the message names the file and the cause."""


_shared: list[Progress] = []  # the display the bars of concurrent copies share, if any
_shared_lock = threading.Lock()


def _progress(console: Console) -> Progress:
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


@contextmanager
def bars_together() -> Iterator[None]:
    """In this block every copy's bar is a row of one shared display (on a terminal), so
    copies to several nodes at once each show their own progress."""
    console = Console(stderr=True)
    progress = _progress(console) if console.is_terminal else None
    if progress is None:
        yield
        return
    progress.start()
    _shared.append(progress)
    try:
        yield
    finally:
        _shared.remove(progress)
        progress.stop()


def _q(path: str) -> str:
    return shlex.quote(path)


def remote_sizes(node: Node, root: str, timeout: float = 300) -> dict[str, int]:
    """{relative path: size} of every file under ``root`` on ``node`` ({} when absent)."""
    script = f"if [ -d {_q(root)} ]; then cd {_q(root)} && find . -type f -printf '%s %P\\n'; fi"
    res = node.run(["sh", "-c", script], timeout=timeout)
    if res.rc != 0:
        raise TransferError(f"{node.label}: cannot list {root}: {res.err.strip()[-300:]}")
    out: dict[str, int] = {}
    for line in res.out.splitlines():
        size, _, rel = line.partition(" ")
        if size.isdigit() and rel:
            out[rel] = int(size)
    return out


def local_sizes(root: Path, files: Iterable[str]) -> dict[str, int]:
    return {rel: (root / rel).stat().st_size for rel in files}


@dataclass
class Bar:
    """Bytes sent of ``total``: rich's bar on a terminal, a line every 10 s elsewhere."""

    what: str
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    last_line: float = 0.0
    console: Console = field(default_factory=lambda: Console(stderr=True))
    progress: Progress | None = None
    task: int = 0
    owned: bool = True  # False: a row of the shared display (bars_together)

    def __post_init__(self) -> None:
        if not self.console.is_terminal:
            return
        with _shared_lock:
            shared = _shared[-1] if _shared else None
        if shared is not None:
            self.progress, self.owned = shared, False
        else:
            self.progress = _progress(self.console)
            self.progress.start()
        self.task = self.progress.add_task(self.what, total=self.total)

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started, 1e-6)

    def line(self) -> str:
        mib = 2**20
        return (
            f"{self.what}: {self.done / mib:.1f}/{self.total / mib:.1f} MiB, "
            f"{self.rate() / mib:.1f} MiB/s"
        )

    def update(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress.update(self.task, advance=n)
        elif time.monotonic() - self.last_line >= PLAIN_EVERY_S:
            self.last_line = time.monotonic()
            self.console.print(self.line(), highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            if self.owned:
                self.progress.stop()
        else:
            self.console.print(self.line() + " (done)", highlight=False)


@dataclass
class Sender:
    """Streams files to one node; one progress bar over all bytes still to send."""

    node: Node
    bar: Bar

    @classmethod
    def open(cls, node: Node, total: int, what: str) -> Sender:
        return cls(node, Bar(f"{what} -> {node.label}", total))

    def close(self) -> None:
        self.bar.close()

    def send(self, src: Path, dst: str, have_partial: int = 0) -> None:
        """Append ``src`` from byte ``have_partial`` to ``dst.partial`` on the node, then
        rename it to ``dst``; raises TransferError when the sizes do not end equal."""
        size = src.stat().st_size
        part = dst + PARTIAL
        if have_partial > size:  # not a prefix of this file: start over
            have_partial = 0
        head = f"mkdir -p {_q(str(Path(dst).parent))} && "
        head += f": > {_q(part)} && " if have_partial == 0 else ""
        proc = subprocess.Popen(
            self.node.wrap(["sh", "-c", f"{head}exec cat >> {_q(part)}"]),
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        assert proc.stdin is not None
        try:
            with open(src, "rb") as fh:
                fh.seek(have_partial)
                while chunk := fh.read(CHUNK):
                    proc.stdin.write(chunk)
                    self.bar.update(len(chunk))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise TransferError(
                f"{self.node.label}: writing {part} failed (rc={proc.returncode}): "
                f"{err.strip()[-300:]}; run the command again to resume"
            )
        check = f'n=$(wc -c < {_q(part)}) && [ "$n" -eq {size} ] && mv -f {_q(part)} {_q(dst)}'
        res = self.node.run(["sh", "-c", check], timeout=120)
        if res.rc != 0:
            raise TransferError(
                f"{self.node.label}: {part} did not end at {size} bytes; "
                "run the command again (it resumes from what arrived)"
            )


def send_tree(
    node: Node, src_root: Path, dst_root: str, files: list[str], what: str
) -> tuple[int, int]:
    """Copy ``files`` (relative to ``src_root``) to ``dst_root`` on ``node``: files already
    there with the right size are skipped, a ``.partial`` is resumed. Returns (files sent,
    bytes sent)."""
    there = remote_sizes(node, dst_root)
    want = local_sizes(src_root, files)
    todo = [rel for rel in files if there.get(rel) != want[rel]]
    total = sum(want[rel] - _resumable(there.get(rel + PARTIAL, 0), want[rel]) for rel in todo)
    if not todo:
        return 0, 0
    sender = Sender.open(node, total, what)
    try:
        for rel in todo:
            have = _resumable(there.get(rel + PARTIAL, 0), want[rel])
            sender.send(src_root / rel, f"{dst_root.rstrip('/')}/{rel}", have)
    finally:
        sender.close()
    return len(todo), total


def _resumable(partial: int, size: int) -> int:
    return partial if partial <= size else 0


def sha256_local(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_remote(node: Node, root: str, files: list[str], timeout: float = 7200) -> dict[str, str]:
    """{relative path: sha256} of ``files`` under ``root`` on ``node`` (sha256sum)."""
    if not files:
        return {}
    script = f"cd {_q(root)} && sha256sum -- " + " ".join(_q(f) for f in files)
    res = node.run(["sh", "-c", script], timeout=timeout)
    if res.rc != 0:
        raise TransferError(
            f"{node.label}: sha256sum under {root} failed: {res.err.strip()[-300:]}"
        )
    out = {}
    for line in res.out.splitlines():
        digest, _, name = line.partition(" ")
        out[name.strip().lstrip("*")] = digest
    return out
