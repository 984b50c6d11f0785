"""Day one on a pair: `image ship` and `model fetch|verify` against the fake tools
(tests/fakes: docker with save/load, ssh that runs the command as the other host), and the
resumable copy underneath them (pairctl.nodes.transfer) with two real directories standing in
for the two nodes' disks."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pairctl.contracts import DEFAULT_RECIPE, REPO
from pairctl.engine import imageship
from pairctl.engine.imageship import DEFAULT_DOCKERFILE, build_argv, dockerfile_for
from pairctl.engine.stack import Stack, parse_stack
from pairctl.nodes.modelfetch import INDEX, fetch, verify
from pairctl.nodes.shardcheck import shard_problem
from pairctl.nodes.transfer import TransferError, send_tree
from pairctl.pair.config import ConfigError
from pairctl.pair.resolved import ResolvedPair, load
from tests.conftest import require
from tests.fakes.fakepair import IMAGE, IMAGE_ID, SECRET, Env
from tests.support.shards import shard_bytes, write_checkpoint

EXIT_RUNTIME, EXIT_USAGE, EXIT_PREFLIGHT = 1, 2, 3
REPO_ID = "deepseek-ai/DeepSeek-V4-Flash-DSpark"
REV = "0123456789abcdef0123456789abcdef01234567"


def docker_calls(pair: Env, host: str) -> list[list[str]]:
    return [c["argv"] for c in pair.calls() if c["host"] == host]


# --- image ship ------------------------------------------------------------------------


def test_ship_copies_rank0s_image_to_rank1_and_checks_the_id(pair: Env) -> None:
    pair.state["hosts"]["h2"]["images"] = {"other-pair/engine:7": "sha256:" + "77" * 32}
    pair.save()
    stage = pair.tmp / "stage"
    p = pair.run("image", "ship", "--stage", str(stage))
    assert p.returncode == 0, p.stderr
    assert f"{IMAGE} = {IMAGE_ID} on both ranks" in p.stdout
    h2 = pair.load()["hosts"]["h2"]["images"]
    assert h2[IMAGE]["Id"] == IMAGE_ID
    assert h2["other-pair/engine:7"] == "sha256:" + "77" * 32  # a foreign image untouched
    saves = [a for a in docker_calls(pair, "h1") if a[0] == "save"]
    loads = [a for a in docker_calls(pair, "h2") if a[0] == "load"]
    assert len(saves) == 1 and saves[0][-1] == IMAGE and len(loads) == 1
    for argv in docker_calls(pair, "h1") + docker_calls(pair, "h2"):
        assert "other-pair/engine:7" not in argv
    assert list(stage.iterdir()) == []  # the tar is removed once rank 1 has the image


def test_ship_leaves_a_rank1_with_the_same_id_alone(pair: Env) -> None:
    p = pair.run("image", "ship", "--stage", str(pair.tmp / "stage"))
    assert p.returncode == 0 and "nothing to ship" in p.stdout, p.stderr
    assert not [
        a for a in docker_calls(pair, "h1") + docker_calls(pair, "h2") if a[0] in ("save", "load")
    ]


def test_ship_replaces_a_different_image_on_rank1(pair: Env) -> None:
    pair.state["hosts"]["h2"]["images"] = {IMAGE: "sha256:" + "99" * 32}
    pair.save()
    p = pair.run("image", "ship", "--stage", str(pair.tmp / "stage"))
    assert p.returncode == 0, p.stderr
    assert "replacing it with rank 0's" in p.stderr
    assert pair.load()["hosts"]["h2"]["images"][IMAGE]["Id"] == IMAGE_ID


def test_ship_without_the_image_on_rank0_says_how_to_get_it(pair: Env) -> None:
    pair.state["hosts"]["h1"]["images"] = {}
    pair.save()
    p = pair.run("image", "ship", "--stage", str(pair.tmp / "stage"))
    assert p.returncode == EXIT_RUNTIME
    assert "--build" in p.stderr and "--pull" in p.stderr
    assert not [a for a in docker_calls(pair, "h1") if a[0] == "save"]


def test_ship_refuses_off_spark1_and_bad_lines(pair: Env) -> None:
    assert pair.run("image").returncode == EXIT_USAGE
    p = pair.run("image", "ship", "--build", "--pull")
    assert p.returncode == EXIT_USAGE and "not both" in p.stderr
    assert pair.run("image", "ship", "--checksum").returncode == EXIT_USAGE
    pair.state["hosts"]["h1"]["addrs"] = ["10.9.9.9"]
    pair.save()
    p = pair.run("image", "ship")
    assert p.returncode == EXIT_PREFLIGHT and "PF-SELF-IS-SPARK1" in p.stdout


def test_build_uses_the_repos_dockerfile_with_pinned_base_and_fork() -> None:
    argv = build_argv("vllm-dspark:x")
    assert argv == [
        "docker", "build", "-t", "vllm-dspark:x",
        "-f", str(DEFAULT_DOCKERFILE), str(DEFAULT_DOCKERFILE.parent),
    ]  # fmt: skip
    text = DEFAULT_DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=" in text and "ARG FORK_COMMIT=" in text
    fork = next(line for line in text.splitlines() if line.startswith("ARG FORK_COMMIT="))
    assert len(fork.split("=", 1)[1]) == 40  # a commit, not a branch


UPSTREAM_DOCKERFILE = REPO / "launch" / "image" / "upstream" / "Dockerfile"
NODES = (SimpleNamespace(label="rank 0 (h1)"), SimpleNamespace(label="rank 1 (h2)"))


def a_stack(name: str = "upstream", **image: str) -> Stack:
    """A declared stack (the loader's own validation), built from ``image`` by default."""
    image = image or {"obtain": "build", "dockerfile": "launch/image/upstream/Dockerfile"}
    return parse_stack(
        {
            "stack_version": 1,
            "name": name,
            "vllm": "0.27.1",
            "image": image,
            "interpreter": "/usr/bin/python3",
            "entrypoint": "/usr/local/bin/vllm",
        },
        f"recipes/stacks/{name}.yaml",
    )


def test_the_stack_names_the_dockerfile_build_builds() -> None:
    assert dockerfile_for(None) == DEFAULT_DOCKERFILE  # no stack resolved: the default
    assert dockerfile_for(a_stack()) == UPSTREAM_DOCKERFILE
    argv = build_argv("dsv4-upstream:0.27.1", dockerfile_for(a_stack()))
    assert argv[-3:] == ["-f", str(UPSTREAM_DOCKERFILE), str(UPSTREAM_DOCKERFILE.parent)]
    pulled = a_stack(obtain="pull", pull="vllm/vllm-openai@sha256:" + "0" * 64)
    with pytest.raises(ConfigError, match="not built from a Dockerfile.*--pull"):
        dockerfile_for(pulled)
    with pytest.raises(ConfigError, match="does not exist"):
        dockerfile_for(a_stack(obtain="build", dockerfile="launch/image/nope/Dockerfile"))


def test_ship_build_builds_the_pairs_stack_dockerfile(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """With ResolvedPair.stack set, --build builds that stack's recipe, not the fork's."""
    seen: list[list[str]] = []
    monkeypatch.setattr(imageship, "_stream", lambda argv: seen.append(argv) or 1)
    pair = SimpleNamespace(nodes=NODES, image="dsv4-upstream:0.27.1", stack=a_stack())
    assert imageship.ship(pair, build=True) == EXIT_RUNTIME  # type: ignore[arg-type]
    assert seen == [build_argv("dsv4-upstream:0.27.1", UPSTREAM_DOCKERFILE)]
    err = capsys.readouterr().err
    assert "docker build of launch/image/upstream/Dockerfile failed" in err


def test_ship_says_how_the_pairs_stack_gets_its_image(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(imageship, "image_id", lambda node, ref: "")
    for stack, expect in (
        (a_stack(), "image ship --build, from launch/image/upstream/Dockerfile"),
        (None, "image ship --build, from launch/image/Dockerfile"),
    ):
        pair = SimpleNamespace(nodes=NODES, image="img:1", stack=stack)
        assert imageship.ship(pair) == EXIT_RUNTIME  # type: ignore[arg-type]
        err = capsys.readouterr().err
        assert expect in err and "--pull" in err, err


def test_ship_build_from_the_cli_builds_the_default_stack(pair: Env) -> None:
    p = pair.run("image", "ship", "--build", "--stage", str(pair.tmp / "stage"))
    assert p.returncode == EXIT_RUNTIME  # the fake docker builds nothing
    assert f"-f {DEFAULT_DOCKERFILE} {DEFAULT_DOCKERFILE.parent}" in p.stderr
    assert "docker build of launch/image/Dockerfile failed" in p.stderr


@pytest.mark.parametrize("dockerfile", [DEFAULT_DOCKERFILE, UPSTREAM_DOCKERFILE])
def test_the_real_docker_client_accepts_the_build_line(dockerfile: Path) -> None:
    """The client parses every flag and prepares the context, then needs a daemon."""
    docker = shutil.which("docker")
    require(docker is not None, "the docker client is not installed")
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    argv = build_argv("dsv4-check:x", dockerfile)
    p = subprocess.run(
        [str(docker), *argv[1:]], capture_output=True, text=True, env=env, timeout=60
    )
    msg = p.stdout + p.stderr
    assert "unknown flag" not in msg and "unable to prepare context" not in msg, msg
    assert "Cannot connect to the Docker daemon" in msg or "docker.sock" in msg, msg


# --- the resumable copy ------------------------------------------------------------------


@pytest.fixture()
def fakes_env(pair: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """The fake tools for in-process calls (pairctl.nodes.ssh runs ssh from PATH)."""
    for k, v in pair.environ().items():
        monkeypatch.setenv(k, v)
    return pair


def test_copy_resumes_a_partial_file_and_skips_complete_ones(fakes_env: Env, capsys) -> None:
    pair = fakes_env
    src, dst = pair.tmp / "src", pair.tmp / "far"
    src.mkdir()
    dst.mkdir()
    body = os.urandom(3 << 20)
    (src / "big.bin").write_bytes(body)
    (src / "done.bin").write_bytes(b"x" * 1000)
    (dst / "done.bin").write_bytes(b"x" * 1000)
    (dst / "big.bin.partial").write_bytes(body[: 1 << 20])
    rank1 = load(pair.env_file, DEFAULT_RECIPE).nodes[1]
    sent, nbytes = send_tree(rank1, src, str(dst), ["big.bin", "done.bin"], "test")
    assert (sent, nbytes) == (1, 2 << 20)  # only the missing 2 MiB of one file
    assert (dst / "big.bin").read_bytes() == body
    assert not (dst / "big.bin.partial").exists()
    assert pair.calls("ssh")  # rank 1 is reached over ssh
    err = capsys.readouterr().err
    assert "2.0/2.0 MiB" in err and "MiB/s" in err, err  # progress: bytes and bytes/s


def test_copy_restarts_a_partial_that_cannot_be_a_prefix(fakes_env: Env) -> None:
    pair = fakes_env
    src, dst = pair.tmp / "src", pair.tmp / "far"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_bytes(b"a" * 100)
    (dst / "f.partial").write_bytes(b"b" * 500)
    rank1 = load(pair.env_file, DEFAULT_RECIPE).nodes[1]
    assert send_tree(rank1, src, str(dst), ["f"], "t") == (1, 100)
    assert (dst / "f").read_bytes() == b"a" * 100


def test_copy_failure_names_the_node_and_says_run_again(fakes_env: Env) -> None:
    pair = fakes_env
    pair.state["ssh_fail"] = "ssh: connect to host 127.0.0.2 port 22: No route to host"
    pair.save()
    src = pair.tmp / "src"
    src.mkdir()
    (src / "f").write_bytes(b"a")
    rank1 = load(pair.env_file, DEFAULT_RECIPE).nodes[1]
    with pytest.raises(TransferError, match="rank 1"):
        send_tree(rank1, src, str(pair.tmp / "far"), ["f"], "t")


# --- model fetch / verify ------------------------------------------------------------------

FAKE_HF = """#!{py}
import json, os, struct, sys
from pathlib import Path
argv = sys.argv[1:]
Path(os.environ["FAKE_HF_LOG"]).write_text(json.dumps({{
    "argv": argv, "token": os.environ.get("HF_TOKEN") == {secret!r}}}))
dest = Path(argv[argv.index("--local-dir") + 1])
rev = argv[argv.index("--revision") + 1]
(dest / "config.json").write_text('{{"model_type": "deepseek_v4"}}')
shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
for i, s in enumerate(shards):  # real safetensors (tests/support/shards.py has the layout)
    head = json.dumps({{f"t{{i}}": {{"dtype": "U8", "shape": [4096 + i],
                                     "data_offsets": [0, 4096 + i]}}}}).encode()
    (dest / s).write_bytes(struct.pack("<Q", len(head)) + head + bytes([i]) * (4096 + i))
(dest / "model.safetensors.index.json").write_text(json.dumps(
    {{"weight_map": {{"a.weight": shards[0], "b.weight": shards[1]}}}}))
meta = dest / ".cache" / "huggingface" / "download"
meta.mkdir(parents=True, exist_ok=True)
(meta / "config.json.metadata").write_text(rev + "\\netag\\n1\\n")
(meta / "x.safetensors.incomplete").write_text("in progress")
"""


@pytest.fixture()
def hub(fakes_env: Env, monkeypatch: pytest.MonkeyPatch) -> tuple[Env, Path]:
    """A pair whose MODEL_PATH is empty, a fake `hf` CLI and the file it logs its call to."""
    pair = fakes_env
    model = pair.tmp / "models" / "dsv4"
    pair.values.update(MODEL_PATH=str(model), MODEL_REVISION=REV, MODEL_REPO=REPO_ID)
    pair.write_env()
    hf = pair.tmp / "fake-hf"
    hf.write_text(FAKE_HF.format(py=sys.executable, secret=SECRET))
    hf.chmod(hf.stat().st_mode | stat.S_IXUSR)
    log = pair.tmp / "hf.json"
    monkeypatch.setenv("FAKE_HF_LOG", str(log))
    return pair, hf


def test_fetch_downloads_the_pinned_commit_with_the_token_in_env_only(
    hub: tuple[Env, Path],
) -> None:
    pair, hf = hub
    p = pair.run("model", "fetch", "--downloader", str(hf))
    assert p.returncode == 0, p.stderr
    call = json.loads((pair.tmp / "hf.json").read_text())
    model = pair.values["MODEL_PATH"]
    assert call["argv"] == ["download", REPO_ID, "--revision", REV, "--local-dir", model]
    assert call["token"] is True  # reached the downloader; Env.run asserts it never printed
    assert "identical on both ranks" in p.stdout and "all 2 shards" in p.stdout


def test_fetch_without_a_pinned_commit_is_a_usage_error(hub: tuple[Env, Path]) -> None:
    pair, hf = hub
    pair.values["MODEL_REVISION"] = ""
    pair.write_env()
    p = pair.run("model", "fetch", "--downloader", str(hf))
    assert p.returncode == EXIT_USAGE and "MODEL_REVISION is not set" in p.stderr
    assert REPO_ID in p.stderr and pair.calls("ssh") == []


def test_fetch_copies_to_rank1_and_verify_catches_what_differs(hub: tuple[Env, Path]) -> None:
    pair, hf = hub
    resolved = load(pair.env_file, DEFAULT_RECIPE)
    far = pair.tmp / "rank1-disk"
    assert fetch(resolved, downloader_cmd=str(hf), far_root=str(far)) == 0
    model = Path(pair.values["MODEL_PATH"])
    assert (far / "model-00002-of-00002.safetensors").read_bytes() == (
        model / "model-00002-of-00002.safetensors"
    ).read_bytes()
    assert (far / ".cache/huggingface/download/config.json.metadata").is_file()  # the commit
    assert not (far / ".cache/huggingface/download/x.safetensors.incomplete").exists()
    # a same-size corruption: only the checksum sees it
    shard = far / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\xff" * shard.stat().st_size)
    assert verify(resolved, far_root=str(far)) == 0
    assert verify(resolved, checksum=True, far_root=str(far)) == EXIT_RUNTIME
    # a missing shard: the file list and the index both say so
    shard.unlink()
    assert verify(resolved, far_root=str(far)) == EXIT_RUNTIME


def test_verify_wants_the_safetensors_index(hub: tuple[Env, Path], capsys) -> None:
    pair, hf = hub
    resolved = load(pair.env_file, DEFAULT_RECIPE)
    far = pair.tmp / "rank1-disk"
    assert fetch(resolved, downloader_cmd=str(hf), far_root=str(far)) == 0
    (Path(pair.values["MODEL_PATH"]) / INDEX).unlink()
    (far / INDEX).unlink()
    assert verify(resolved, far_root=str(far)) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert f"both copies are incomplete: missing {INDEX}" in err
    assert "the copies differ" not in err  # the same on both: incomplete, not different


# --- verify: shards that are there but not whole, and copies alike in what they lack ---------

SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
SHARDS += ["model-00003-of-00003.safetensors"]


@pytest.fixture()
def two_copies(fakes_env: Env) -> tuple[ResolvedPair, Path, Path]:
    """The same small checkpoint (real safetensors shards) as rank 0's MODEL_PATH and as
    rank 1's copy (a second directory, reached over the fake ssh)."""
    pair = fakes_env
    near, far = pair.tmp / "models" / "dsv4", pair.tmp / "rank1-disk"
    write_checkpoint(near, SHARDS)
    shutil.copytree(near, far)
    pair.values.update(MODEL_PATH=str(near), MODEL_REVISION=REV, MODEL_REPO=REPO_ID)
    pair.write_env()
    return load(pair.env_file, DEFAULT_RECIPE), near, far


def test_verify_passes_two_whole_copies(two_copies, capsys) -> None:
    resolved, _near, far = two_copies
    assert verify(resolved, far_root=str(far)) == 0
    assert "all 3 shards" in capsys.readouterr().out


@pytest.mark.parametrize("cut", [0, 100, -1], ids=["empty", "cut-short", "one-byte-short"])
def test_verify_fails_a_shard_that_is_not_whole_on_both_ranks(two_copies, capsys, cut) -> None:
    resolved, near, far = two_copies
    shard = SHARDS[1]
    body = (near / shard).read_bytes()
    for root in (near, far):  # the same broken file on both: sizes and names agree
        (root / shard).write_bytes(body[:cut])
    assert verify(resolved, far_root=str(far)) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert f"both copies are incomplete: {shard} " in err, err
    assert ("0 bytes" if cut == 0 else "cut short") in err
    assert "the copies differ" not in err and "delete the broken shard" in err


def test_verify_calls_two_alike_incomplete_copies_incomplete_not_different(
    two_copies, capsys
) -> None:
    resolved, near, far = two_copies
    for root in (near, far):
        (root / SHARDS[2]).unlink()
    assert verify(resolved, far_root=str(far)) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert f"both copies are incomplete: missing {SHARDS[2]}" in err, err
    assert "the copies differ" not in err and "MISMATCH" not in err
    assert "run model fetch again: it resumes the download" in err


def test_verify_names_a_shard_only_rank1_lacks_as_a_difference(two_copies, capsys) -> None:
    resolved, _near, far = two_copies
    (far / SHARDS[0]).unlink()
    assert verify(resolved, far_root=str(far)) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert f"MISMATCH: rank 1 lacks {SHARDS[0]}" in err and "the copies differ" in err
    assert "incomplete" not in err  # rank 0 has all of it


@pytest.mark.parametrize("cut", [0, 5, 60, -1])
def test_the_shard_check_agrees_with_the_safetensors_loader(tmp_path: Path, cut: int) -> None:
    """shardcheck's verdict is the real loader's (huggingface/safetensors), whole or cut."""
    require(importlib.util.find_spec("safetensors") is not None, "safetensors not importable")
    from safetensors import safe_open

    whole = tmp_path / "whole.safetensors"
    whole.write_bytes(shard_bytes(300))
    part = tmp_path / "part.safetensors"
    part.write_bytes(whole.read_bytes()[:cut])
    assert shard_problem(whole) is None
    with safe_open(str(whole), framework="numpy") as f:
        assert list(f.keys()) == ["w"]
    assert shard_problem(part) is not None
    with pytest.raises(Exception):  # noqa: B017 - the loader's own error type varies by cause
        with safe_open(str(part), framework="numpy") as f:
            f.get_tensor("w")
