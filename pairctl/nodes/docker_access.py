"""Docker without sudo on both nodes: the operator's user in the ``docker`` group.

The launcher runs ``docker`` as the operator on rank 0 and, over ssh, on rank 1; a user not
in the ``docker`` group gets "permission denied" on ``/var/run/docker.sock`` from every
command. Docker's post-install steps for Linux say what fixes it (add the user to the
group, then a new login: docs.docker.com/engine/install/linux-postinstall/), and the
README's Quickstart does it on both nodes; preflight says it again, naming the node,
whenever a docker call there was refused this way.
"""

from __future__ import annotations

# One line each, as the Quickstart shows them (tests/test_readme_commands.py checks that).
DOCKER_GROUP_FIX = 'sudo usermod -aG docker "$USER"'
RELOGIN = "newgrp docker"

# The docker CLI's wording: "permission denied while trying to connect to the Docker daemon
# socket at unix:///var/run/docker.sock: ..." (docker <= 27), "... to the docker API at
# unix:///var/run/docker.sock" (docker 28 and later).
_MARKERS = (
    "permission denied while trying to connect to the docker",
    "docker.sock: connect: permission denied",
)


def permission_denied(err: str) -> bool:
    """True when ``err`` is docker refusing this user its socket."""
    low = err.lower()
    return any(m in low for m in _MARKERS)


def group_fix(rank: int) -> str:
    """What to run when docker refused the user on ``rank``'s node, exactly."""
    where = "on this machine (SPARK1)" if rank == 0 else "on SPARK2 (`ssh SPARK2` first)"
    after = (
        f"then log out and in again (or `{RELOGIN}` in this shell)"
        if rank == 0
        else "a new ssh login has the group"
    )
    return (
        f"rank {rank}: docker refused this user (permission denied on /var/run/docker.sock): "
        f"run `{DOCKER_GROUP_FIX}` {where}, {after}"
    )
