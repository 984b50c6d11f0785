"""Bad input on the day-one commands (`image ship`, the env file's IMAGE) answered before any
work, in words that name the fix; docker's own failures told apart.

Each case failed on the code before: `--stage ''` shipped the tar through the current
directory and `/`, a stage that is a file or under /proc ended in a traceback, every docker
failure read "not on rank 0: build it", and IMAGE=upper/Case:tag passed the config check.
The real docker client (no daemon here) is the oracle for docker's words and grammar.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pairctl.nodes.docker import daemon_problem
from pairctl.pair.config import ConfigError, parse_env
from pairctl.pair.imageref import problem
from tests.conftest import require
from tests.fakes.fakepair import Env

EXIT_RUNTIME, EXIT_USAGE = 1, 2
NO_DAEMON = "unix:///nonexistent/docker.sock"


def real_docker() -> str:
    """The real docker client (not the rehearsal's shim): it parses, then needs a daemon."""
    path = shutil.which("docker")
    require(path is not None and "rehearsal" not in path, "no real docker client on PATH")
    assert path is not None
    return path


def nothing_shipped(pair: Env) -> bool:
    return not [c for c in pair.calls() if c["argv"][:1] in (["save"], ["load"])]


# ---- --stage ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stage", "needle"),
    [
        ("", "--stage is empty"),
        ("relative/stage", "must be an absolute path"),
        ("/proc/dsv4-stage", "--stage /proc/dsv4-stage: cannot write under /proc"),
        ("FILE", "is a file, not a directory"),
        ("FILE/sub", "is a file, not a directory"),
    ],
)
def test_a_stage_that_cannot_hold_the_tar_is_refused_before_docker(
    pair: Env, stage: str, needle: str
) -> None:
    afile = pair.tmp / "a-file"
    afile.write_text("x")
    pair.state["hosts"]["h2"]["images"] = {}  # rank 1 lacks the image: a ship would copy it
    pair.save()
    p = pair.run("image", "ship", "--stage", stage.replace("FILE", str(afile)))
    assert p.returncode == EXIT_USAGE, (p.stdout, p.stderr)
    assert needle in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert pair.calls() == [] and pair.calls("ssh") == []  # not even docker image inspect


@pytest.mark.parametrize("argv", [["--stage=--pull"], ["--stage", "--pull"], ["--stage=-x"]])
def test_stage_does_not_take_an_option_as_its_directory(pair: Env, argv: list[str]) -> None:
    p = pair.run("image", "ship", *argv)
    assert p.returncode == EXIT_USAGE and "--stage" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and pair.calls() == []


def test_a_stage_that_does_not_exist_yet_is_fine(pair: Env) -> None:
    pair.state["hosts"]["h2"]["images"] = {}
    pair.save()
    stage = pair.tmp / "new" / "stage"
    p = pair.run("image", "ship", "--stage", str(stage))
    assert p.returncode == 0, p.stderr
    assert list(stage.iterdir()) == []  # created; the writability probe left nothing behind


# ---- docker's own failures ----------------------------------------------------------------------
def test_ship_with_no_docker_daemon_says_start_docker_not_build_it(pair: Env) -> None:
    bin_dir = pair.tmp / "real-docker"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(real_docker())
    stage = pair.tmp / "stage"
    p = pair.run(
        "image", "ship", "--stage", str(stage), path_first=bin_dir, env={"DOCKER_HOST": NO_DAEMON}
    )
    assert p.returncode == EXIT_RUNTIME, (p.stdout, p.stderr)
    assert "Cannot connect to the Docker daemon" in p.stderr  # docker's own words, kept
    assert "docker's daemon does not answer on rank 0" in p.stderr
    assert "systemctl start docker" in p.stderr
    assert "--build" not in p.stderr and "build it" not in p.stderr
    assert not stage.exists()


def _stderr_as_nobody(tmp: Path) -> str:
    """What the real client prints to a user outside the docker group: a root-only socket,
    asked as uid 65534 (setpriv), as on a node where the user was never added."""
    setpriv = shutil.which("setpriv")
    require(setpriv is not None, "setpriv (util-linux) not installed")
    sock_path = tmp / "docker.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(sock_path))
        srv.listen(1)
        os.chmod(sock_path, 0o600)
        argv = [str(setpriv), "--reuid=65534", "--regid=65534", "--clear-groups", real_docker()]
        argv += ["image", "inspect", "--format", "{{.Id}}", "vllm-dspark:test"]
        env = dict(os.environ, DOCKER_HOST=f"unix://{sock_path}")
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode != 0
    return res.stderr


@pytest.mark.needs_root
def test_permission_denied_on_the_docker_socket_says_add_the_user_to_the_group(
    tmp_path: Path,
) -> None:
    err = _stderr_as_nobody(tmp_path)
    assert "permission denied while trying to connect to the Docker daemon socket" in err, err
    why = daemon_problem(err, "rank 1 (127.0.0.2)", "bird")
    assert why is not None
    assert "usermod -aG docker bird" in why and "rank 1 (127.0.0.2)" in why
    assert "log in again" in why


def test_the_daemon_being_down_is_told_from_an_image_that_is_not_there() -> None:
    env = dict(os.environ, DOCKER_HOST=NO_DAEMON)
    res = subprocess.run(
        [real_docker(), "image", "inspect", "x"], capture_output=True, text=True, env=env
    )
    down = daemon_problem(res.stderr, "rank 0 (127.0.0.1)", "bird")
    assert down is not None and "systemctl start docker" in down
    # moby's not-found answer (daemon/images: "No such image: REF"), as the client shows it
    assert daemon_problem("Error response from daemon: No such image: x:latest\n", "n", "u") is None
    assert daemon_problem("Error: No such image: x\n", "n", "u") is None


# ---- IMAGE as docker reads it -------------------------------------------------------------------
# (reference, accepted by docker): the real client's verdict is checked below, one by one.
REFS = [
    ("vllm-dspark:test", True),
    ("ghcr.io/bjk110/vllm-spark:unholy-fusion-prod-ready", True),
    ("vllm/vllm-openai:v0.27.1", True),
    ("localhost:5000/x:y", True),
    ("[::1]:5000/x:y", True),
    ("Registry.Example.com/x:Tag", True),
    ("a__b/c", True),
    ("a/b:c@sha256:" + "ab" * 32, True),
    ("x@sha512:" + "ab" * 64, True),
    ("x:" + "t" * 128, True),
    ("upper/Case:tag", False),
    ("Upper:tag", False),
    ("ok/name:-bad", False),
    ("x:" + "t" * 129, False),
    ("x:", False),
    ("a//b", False),
    ("a___b", False),
    ("a/-b", False),
    ("x y", False),
    ("x@sha256:abc", False),
    ("x@sha256:" + "0" * 32, False),
    ("x@sha256:" + "AB" * 32, False),
    ("x@md5:" + "ab" * 16, False),
    ("ab" * 32, False),
    ("a/" + "b" * 254, False),
]


@pytest.mark.parametrize(("ref", "docker_ok"), REFS, ids=[r[:40] for r, _ in REFS])
def test_image_references_are_judged_as_the_real_docker_client_judges_them(
    ref: str, docker_ok: bool
) -> None:
    env = dict(os.environ, DOCKER_HOST=NO_DAEMON)
    res = subprocess.run(
        [real_docker(), "pull", "--", ref], capture_output=True, text=True, env=env, timeout=30
    )
    assert ("Cannot connect to the Docker daemon" in res.stderr) is docker_ok, res.stderr
    assert (problem(ref) is None) is docker_ok, problem(ref)


def env_with(image: str) -> dict[str, str | None]:
    return {
        "PAIR_ID": "pair-a",
        "SPARK1": "10.0.0.1",
        "SPARK2": "10.0.0.2",
        "MODEL_PATH": "/models/dsv4",
        "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
        "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
        "IMAGE": image,
    }


def test_image_with_upper_case_is_a_config_error_in_dockers_words() -> None:
    with pytest.raises(ConfigError) as e:
        parse_env(env_with("upper/Case:tag"))
    assert "IMAGE='upper/Case:tag'" in str(e.value)
    assert "repository name (upper/Case) must be lowercase" in str(e.value)


def test_an_upper_case_first_part_is_refused_as_the_registry_host_docker_would_call() -> None:
    """docker takes it (a capitalised first part is a registry host to it), so it is the one
    refusal docker does not make: a pull would go to a machine named UPPER."""
    with pytest.raises(ConfigError) as e:
        parse_env(env_with("UPPER/case:tag"))
    assert "registry host named 'UPPER'" in str(e.value) and "upper/case:tag" in str(e.value)


def test_a_recipe_image_docker_refuses_is_a_recipe_error(tmp_path: Path) -> None:
    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.recipe import load_recipe

    text = DEFAULT_RECIPE.read_text().replace(
        "image: vllm-dspark:codex-dspark-harness-integration", "image: Vllm-Dspark:x"
    )
    assert "Vllm-Dspark:x" in text
    bad = tmp_path / "recipe.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_recipe(str(bad))
    assert "container.image 'Vllm-Dspark:x'" in str(e.value) and "lowercase" in str(e.value)
