"""Docker without sudo on both nodes: when docker refuses the operator's user (not in the
``docker`` group), preflight names the node and the exact fix, the one the README's
Quickstart runs on both nodes, instead of "image not found" or a bare docker error."""

from __future__ import annotations

from pathlib import Path

from pairctl.nodes.docker_access import DOCKER_GROUP_FIX, RELOGIN, group_fix, permission_denied
from pairctl.preflight import FAIL
from pairctl.preflight.checks_identity import check_foreign
from pairctl.preflight.checks_match import check_image
from pairctl.preflight.evidence import NodeEvidence
from tests.fakes.fakepair import FAKES, Env

REPO = Path(__file__).resolve().parents[1]
# The docker CLI's words for a user outside the docker group (docker 24-27, then 28+).
DENIED_OLD = (
    "permission denied while trying to connect to the Docker daemon socket at "
    'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.24/containers/'
    'json": dial unix /var/run/docker.sock: connect: permission denied'
)
DENIED_NEW = (
    "permission denied while trying to connect to the docker API at unix:///var/run/docker.sock"
)


def test_the_docker_cli_refusal_is_recognised_and_nothing_else() -> None:
    assert permission_denied(DENIED_OLD) and permission_denied(DENIED_NEW)
    assert not permission_denied("Error: No such image: img:1")
    assert not permission_denied("Cannot connect to the Docker daemon at unix:///x.sock.")
    assert not permission_denied("ssh: Permission denied (publickey).")


def test_both_checks_that_ask_docker_say_the_group_fix_per_node() -> None:
    ok = NodeEvidence(reachable=True, docker_ps_rc=0, image_id="sha256:1")
    denied = NodeEvidence(
        reachable=True, docker_ps_rc=1, docker_ps_error=DENIED_OLD, image_error=DENIED_OLD
    )
    c = check_foreign("pair-a", ok, denied)
    assert c.status == FAIL and c.detail == group_fix(1)
    assert DOCKER_GROUP_FIX in c.detail and "SPARK2" in c.detail
    c = check_image("img:1", denied, ok)
    assert c.status == FAIL and c.detail == group_fix(0)
    assert DOCKER_GROUP_FIX in c.detail and RELOGIN in c.detail and "not found" not in c.detail


DENYING_DOCKER = """#!/bin/sh
# docker as a user outside the docker group sees it on rank 1 (h2); rank 0 is fine
if [ "$FAKE_HOST" = h2 ]; then
  echo '{denied}' >&2
  exit 1
fi
exec {fakes}/docker "$@"
"""


def test_preflight_on_a_pair_whose_rank1_user_is_not_in_the_docker_group(pair: Env) -> None:
    shim = pair.tmp / "shim"
    shim.mkdir()
    (shim / "docker").write_text(DENYING_DOCKER.format(denied=DENIED_NEW, fakes=FAKES))
    (shim / "docker").chmod(0o755)
    p = pair.run("preflight", path_first=shim)
    assert p.returncode == 3, p.stdout + p.stderr
    for check in ("PF-FOREIGN-PAIR", "PF-IMAGE-MATCH"):
        line = next(ln for ln in p.stdout.splitlines() if check in ln)
        assert line.startswith("FAIL"), p.stdout
    fix = (
        "rank 1: docker refused this user (permission denied on /var/run/docker.sock): "
        f"run `{DOCKER_GROUP_FIX}`"
    )
    assert p.stdout.count(fix) == 2, p.stdout


def test_the_quickstarts_add_the_user_to_the_docker_group_on_both_nodes() -> None:
    """What preflight tells the operator is what both Quickstarts already had them run."""
    for readme in (REPO / "README.md", REPO / "launch" / "README.md"):
        text = readme.read_text()
        start = text.index("## Quickstart")
        quick = text[start : text.index("\n## ", start + 1)]
        assert DOCKER_GROUP_FIX in quick and RELOGIN in quick, readme
        at = quick.index(DOCKER_GROUP_FIX)
        near = quick[max(0, at - 400) : at + 400]
        assert "both" in near.lower() and "SPARK2" in near, readme
