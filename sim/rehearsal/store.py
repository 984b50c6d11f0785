"""Per-host state of the rehearsal's process runtime (the stand-in for dockerd).

Each test host has its own state directory (env `DSV4R_DOCKER_STATE`, set by the host's
sshd `SetEnv` and by the rehearsal when it runs a command on the host). It holds the
"loaded" images and one directory per container: the immutable `config.json`, the
mutable `state.json` written by the container's supervisor, and the output `log`.

State is never trusted on its own: a container recorded as running is reported running
only while its init process really lives (pid plus start time, so a recycled pid does not
count), which is what lets the launcher's crash detection be tested honestly.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_ENV = "DSV4R_DOCKER_STATE"
# Extra container env a test injects on one host (e.g. TWIN_FAULT); harness-only.
INJECT_ENV_FILE = "inject.env"
# Mount points the runtime had to create on the shared filesystem; the harness removes them.
CREATED_PATHS_FILE = "created-paths.txt"


class StoreError(RuntimeError):
    """A runtime error with docker's wording; `code` is the CLI exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def now_iso() -> str:
    """RFC 3339 UTC with nanosecond-style precision, like dockerd."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so concurrent readers never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of `pid`, or None if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int | None, start: int | None) -> bool:
    """True if the process that was `pid` at `start` still runs."""
    if not pid:
        return False
    now = proc_start_time(pid)
    return now is not None and (start is None or now == start)


class Store:
    """The state directory of one host."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers_dir = root / "containers"
        self.containers_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> Store:
        root = os.environ.get(STATE_ENV)
        if not root:
            raise StoreError(
                f"rehearsal runtime: {STATE_ENV} is not set. This `docker` only works on a "
                "rehearsal test host (python -m sim.rehearsal sets it through the host's sshd)."
            )
        return cls(Path(root))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise create/remove, like the daemon does for names."""
        with open(self.root / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # images ------------------------------------------------------------------
    def _images_path(self) -> Path:
        return self.root / "images.json"

    def images(self) -> dict[str, dict[str, Any]]:
        path = self._images_path()
        return json.loads(path.read_text()) if path.exists() else {}

    def load_image(
        self,
        name: str,
        image_id: str,
        env: list[str],
        entrypoint: list[str] | None = None,
        digests: list[str] | None = None,
    ) -> None:
        images = self.images()
        if not image_id.startswith("sha256:"):
            image_id = "sha256:" + image_id
        images[_normalise_image(name)] = {
            "Id": image_id,
            "Env": env,
            "Entrypoint": entrypoint or None,
            "RepoDigests": digests or [],
        }
        write_json_atomic(self._images_path(), images)

    def image(self, name: str) -> dict[str, Any] | None:
        """An image as docker finds one: by name (`img` = `img:latest`), by a digest
        reference among its RepoDigests (`repo[:tag]@sha256:D`; the tag is ignored, as
        moby's reference store favours the digest), or by its full ID (`sha256:<hex>`)."""
        images = self.images()
        found = images.get(_normalise_image(name))
        if found is not None:
            return found
        digest_ref = _digest_ref(name)
        for record in images.values():
            if record["Id"] == name or digest_ref in record.get("RepoDigests", []):
                return record
        return None

    def names_of(self, image_id: str) -> list[str]:
        """The names (RepoTags) an image ID has here; none when it was loaded untagged."""
        return sorted(k for k, v in self.images().items() if v["Id"] == image_id and _is_tag(k))

    def load_untagged(
        self, image_id: str, env: list[str], entrypoint: list[str] | None = None
    ) -> None:
        """`docker load` of an image the archive names no tag for: found by its ID only."""
        self.load_image(image_id, image_id, env, entrypoint, [])

    def tag_image(self, source: str, target: str) -> None:
        """`docker tag SOURCE TARGET`: TARGET names SOURCE's image from now on."""
        record = self.image(source)
        if record is None:
            raise StoreError(f"Error response from daemon: No such image: {source}")
        images = self.images()
        images[_normalise_image(target)] = dict(record)
        write_json_atomic(self._images_path(), images)

    # containers ----------------------------------------------------------------
    def new_id(self) -> str:
        return secrets.token_hex(32)

    def cdir(self, cid: str) -> Path:
        return self.containers_dir / cid

    def all_ids(self) -> list[str]:
        return [p.name for p in self.containers_dir.iterdir() if (p / "config.json").exists()]

    def config(self, cid: str) -> dict[str, Any]:
        return json.loads((self.cdir(cid) / "config.json").read_text())

    def raw_state(self, cid: str) -> dict[str, Any]:
        try:
            return json.loads((self.cdir(cid) / "state.json").read_text())
        except (OSError, ValueError):
            return {"Status": "created", "ExitCode": 0}

    def state(self, cid: str) -> dict[str, Any]:
        """The recorded state corrected by real process liveness."""
        st = self.raw_state(cid)
        if st.get("Status") == "running" and not alive(st.get("Pid"), st.get("PidStart")):
            if alive(st.get("SupervisorPid"), st.get("SupervisorStart")):
                # Its supervisor is about to record the real exit code: until then the
                # container still runs, as docker's does until the daemon has reaped it
                # (reading 137 here made an attached `run --rm` exit 137 on a loaded box).
                return st
            # Died without its supervisor recording it (supervisor killed too).
            st = dict(
                st,
                Status="exited",
                ExitCode=st.get("ExitCode") or 137,
                FinishedAt=st.get("FinishedAt") or now_iso(),
            )
        return st

    def resolve(self, ref: str) -> str:
        """Container ID for a name, full ID or unique ID prefix (docker's lookup order)."""
        ids = self.all_ids()
        for cid in ids:
            if self.config(cid)["Name"] == ref.lstrip("/"):
                return cid
        if ref in ids:
            return ref
        matches = [cid for cid in ids if len(ref) >= 1 and cid.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        raise StoreError(f"Error response from daemon: No such container: {ref}")

    def injected_env(self) -> list[str]:
        """K=V lines a test put in the host's inject.env (e.g. a simulator fault)."""
        path = self.root / INJECT_ENV_FILE
        if not path.exists():
            return []
        return [
            ln.strip()
            for ln in path.read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")
        ]

    def record_created_path(self, path: Path) -> None:
        with open(self.root / CREATED_PATHS_FILE, "a") as fh:
            fh.write(f"{path}\n")


def _normalise_image(name: str) -> str:
    """`img` and `img:latest` are the same image, as in docker."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last or "@" in last else f"{name}:latest"


def _digest_ref(name: str) -> str:
    """`repo[:tag]@sha256:D` → `repo@sha256:D` (how RepoDigests name it); '' otherwise."""
    ref, at, digest = name.partition("@")
    if not at:
        return ""
    head, slash, last = ref.rpartition("/")
    return f"{head}{slash}{last.partition(':')[0]}@{digest}"


def _is_tag(key: str) -> bool:
    """An images.json key that is a name, not an untagged image's ID or a digest ref."""
    return not key.startswith("sha256:") and "@" not in key


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
