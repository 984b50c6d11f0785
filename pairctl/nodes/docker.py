"""The docker CLI subset the launcher uses (docs/INTERFACES.md), on either node.

Every selection of containers is by this pair's label, and is re-checked client-side on the
labels docker returns: even a runtime that ignored ``--filter`` could not make ``down``
touch another pair's container.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from pairctl.nodes import docker_access
from pairctl.nodes.ssh import Node, Result
from pairctl.pair.plan import LABEL_PAIR, LABEL_ROLE

PS_FORMAT = "{{json .}}"


@dataclass(frozen=True)
class Container:
    """One ``docker ps`` row."""

    id: str
    name: str
    state: str
    labels: dict[str, str]

    @property
    def pair(self) -> str | None:
        return self.labels.get(LABEL_PAIR)

    @property
    def running(self) -> bool:
        return self.state.lower() == "running"


def parse_labels(text: str) -> dict[str, str]:
    """``"k=v,k=v"`` (docker ps .Labels) → dict; a dict is passed through."""
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k.strip()] = v.strip()
    return out


def parse_ps(text: str) -> list[Container]:
    """Parse ``docker ps --format '{{json .}}'`` output (one object per line)."""
    out: list[Container] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        names = row.get("Names", "")
        if isinstance(names, list):
            names = ",".join(names)
        out.append(
            Container(
                id=str(row.get("ID", "")),
                name=str(names).lstrip("/"),
                state=str(row.get("State", "")),
                labels=parse_labels(row.get("Labels", "")),
            )
        )
    return out


def ps_argv(label_filter: str) -> list[str]:
    return [
        "docker",
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        f"label={label_filter}",
        "--format",
        PS_FORMAT,
    ]


def throwaway_argv(
    pair_id: str,
    role: str,
    image: str,
    interpreter: str,
    script: str,
    *,
    opts: Sequence[str] = (),
    args: Sequence[str] = (),
) -> list[str]:
    """A one-shot ``interpreter -c script`` in ``image``: labelled with the pair and ``role``
    (so ``down`` finds one left behind), no network, removed after. ``opts`` go before the
    entrypoint (mounts, env, GPUs), ``args`` after the script."""
    return [
        "docker",
        "run",
        "--rm",
        "--label",
        f"{LABEL_PAIR}={pair_id}",
        "--label",
        f"{LABEL_ROLE}={role}",
        "--network",
        "none",
        *opts,
        "--entrypoint",
        interpreter,
        image,
        "-c",
        script,
        *args,
    ]


def pair_containers(node: Node, pair_id: str) -> tuple[list[Container], Result]:
    """This pair's containers on the node (filtered by docker and again here)."""
    res = node.run(ps_argv(f"{LABEL_PAIR}={pair_id}"), timeout=30)
    if res.rc != 0:
        return [], res
    return [c for c in parse_ps(res.out) if c.pair == pair_id], res


def labelled_containers(node: Node) -> tuple[list[Container], Result]:
    """Every pair's containers on the node (any ``dsv4.pair`` label): whose is running here.
    Only read, to name another pair; nothing selected from this list is ever touched."""
    res = node.run(ps_argv(LABEL_PAIR), timeout=30)
    if res.rc != 0:
        return [], res
    return [c for c in parse_ps(res.out) if c.pair], res


def remove_pair(node: Node, pair_id: str) -> tuple[list[str], str | None]:
    """``docker rm -f`` this pair's containers on the node. Returns (names, error)."""
    mine, res = pair_containers(node, pair_id)
    if res.rc != 0:
        return [], f"{node.label}: docker ps failed: {(res.err or res.out).strip()[:300]}"
    if not mine:
        return [], None
    rm = node.run(["docker", "rm", "-f", *[c.id or c.name for c in mine]], timeout=120)
    if rm.rc != 0:
        return [], f"{node.label}: docker rm failed: {(rm.err or rm.out).strip()[:300]}"
    return [c.name for c in mine], None


# docker's client, when it cannot talk to its daemon (docker/cli, moby client): the daemon
# is not running, or the user may not open its socket (not in the `docker` group:
# docker_access.permission_denied knows the clients' wordings).
DAEMON_DOWN = "cannot connect to the docker daemon"
# moby's answer for an image the daemon does not have (daemon/images: "No such image: REF").
NO_SUCH_IMAGE = "no such image"


def node_user(node: Node) -> str:
    """The user docker runs as on ``node``: ours here, SSH_USER (else ours) on rank 1."""
    me = os.environ.get("USER") or os.environ.get("LOGNAME") or "$USER"
    return (node.cfg["SSH_USER"] or me) if node.remote else me


def daemon_problem(text: str, where: str, user: str) -> str | None:
    """What to do when docker's output says its daemon cannot be asked (None otherwise:
    an answer such as "No such image" is the daemon's, not a problem reaching it)."""
    low = text.lower()
    said = next((ln.strip() for ln in text.splitlines() if "docker" in ln.lower()), "")
    if DAEMON_DOWN in low:
        return (
            f"docker's daemon does not answer on {where} ({said}): start it there "
            "(sudo systemctl start docker; sudo systemctl enable docker keeps it on at boot)"
        )
    if docker_access.permission_denied(text):
        return (
            f"{user} may not use docker on {where} (permission denied on the docker socket): "
            f"add the user to the docker group there (sudo usermod -aG docker {user}), then "
            "log in again (a new ssh session) so the group applies"
        )
    return None


@dataclass(frozen=True)
class State:
    """What ``docker inspect`` says about a container."""

    exists: bool
    running: bool
    status: str
    exit_code: int | None
    finished_at: str = ""
    started_at: str = ""  # RFC 3339; docker's zero time "0001-01-01T00:00:00Z" = never


def inspect(node: Node, name: str) -> State | None:
    """State of a container; None when docker itself (or ssh) could not answer."""
    res = node.run(["docker", "inspect", name], timeout=30)
    if res.rc != 0:
        low = (res.err + res.out).lower()
        if "no such" in low or "not found" in low:
            return State(False, False, "missing", None)
        return None
    try:
        data = json.loads(res.out)
        st = data[0]["State"]
    except (json.JSONDecodeError, LookupError, TypeError):
        return None
    code = st.get("ExitCode")
    return State(
        True,
        bool(st.get("Running")),
        str(st.get("Status", "")),
        int(code) if isinstance(code, int) else None,
        str(st.get("FinishedAt") or ""),
        str(st.get("StartedAt") or ""),
    )


def logs_tail(node: Node, name: str, lines: int = 40) -> str:
    """Last ``lines`` of a container's log (stdout+stderr merged), or the error."""
    res = node.run(["docker", "logs", "--tail", str(lines), name], timeout=30)
    text = res.out + res.err
    return text if text.strip() else f"(no log output; rc={res.rc})"
