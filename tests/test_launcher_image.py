"""`up` reads the image on each node before its `docker run`: the image's own PYTHONPATH is
kept (the overlay path appended), the stack's PATH entries go in front of the image's PATH,
and its ENTRYPOINT is replaced by the stack's `--entrypoint` (the fork's /opt/env/bin/vllm);
`plan`, which contacts no node, says what it assumed instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import NO_CUDA_JIT
from tests.fakes.fakepair import IMAGE, IMAGE_ID, Env, pair_endpoint


@pytest.fixture()
def pair(tmp_path: Path):
    with pair_endpoint() as srv:
        env = Env(tmp_path, srv.port)
        Path(env.values["OVERLAY_DIR"]).mkdir()  # the overlays are there: PYTHONPATH is set
        for host in ("h1", "h2"):
            env.state["hosts"][host]["images"][IMAGE] = {
                "Id": IMAGE_ID,
                "Env": ["PATH=/usr/bin", "PYTHONPATH=/opt/image-libs"],
                "Entrypoint": ["vllm", "serve"],
            }
        env.save()
        yield env


def test_up_keeps_the_images_pythonpath_and_replaces_its_entrypoint(pair: Env) -> None:
    p = pair.run("up")
    assert p.returncode == 0, p.stdout + p.stderr
    runs = pair.runs()
    assert [r["host"] for r in runs] == ["h2", "h1"]  # worker first
    for run in runs:
        argv = run["argv"]
        assert "PYTHONPATH=/opt/image-libs:/opt/dsv4-flash-overlays" in argv
        fork_path = "/opt/env/bin:/opt/env/nvvm/bin:/opt/env/targets/sbsa-linux/nvvm/bin"
        assert f"PATH={fork_path}:/usr/bin" in argv  # in front of the image's own PATH
        assert argv[argv.index("--entrypoint") + 1] == "/opt/env/bin/vllm"
        image_at = argv.index(IMAGE)
        assert argv[image_at + 1] == "serve" and "vllm" not in argv[image_at:]
        assert argv[argv.index("--device") + 1].endswith(":/dev/infiniband")
    assert "image ENTRYPOINT ['vllm', 'serve']" in p.stderr
    assert "--entrypoint /opt/env/bin/vllm" in p.stderr


def test_up_stops_when_the_image_is_missing_on_the_node(pair: Env) -> None:
    del pair.state["hosts"]["h2"]["images"][IMAGE]
    pair.save()
    p = pair.run("up")
    assert p.returncode == 3 and "PF-IMAGE-MATCH" in p.stdout
    assert pair.runs() == []


def test_plan_states_its_assumption(pair: Env) -> None:
    p = pair.run("plan")
    assert p.returncode == 0, p.stderr
    assert "assumed (plan contacts no node): the image sets no PYTHONPATH" in p.stdout
    assert "-e PYTHONPATH=/opt/dsv4-flash-overlays" in p.stdout
    assert pair.calls() == []


def test_start_reads_the_inspect_output_or_says_what_to_do(capsys) -> None:
    from pairctl.lifecycle.steps import image_facts
    from pairctl.nodes.ssh import nodes
    from pairctl.pair.config import parse_env

    cfg = parse_env(
        {
            "PAIR_ID": "p",
            "SPARK1": "10.0.0.1",
            "SPARK2": "10.0.0.2",
            "MODEL_PATH": "/m",
            "NCCL_SOCKET_IFNAME": "e",
            "GLOO_SOCKET_IFNAME": "e",
        }
    )
    node = nodes(cfg)[1]
    ok = '[{"Id": "sha256:1", "Config": {"Env": ["PYTHONPATH=/x"], "Entrypoint": null}}]\nrc=0\n'
    facts = image_facts(node, "img:1", ok)
    assert facts is not None and facts.env_value("PYTHONPATH") == "/x" and facts.entrypoint is None
    assert image_facts(node, "img:1", "[]\nError: No such image: img:1\nrc=1\n") is None
    err = capsys.readouterr().err
    assert "docker image inspect img:1 failed on rank 1 (10.0.0.2) (rc=1)" in err
    assert "pull or load the image there" in err


# --- a digest-pinned IMAGE: rank 1 runs the name image ship gave it --------------------------

DIGEST_IMAGE = "ghcr.io/example/dspark@sha256:" + "d1" * 32
PINNED = "ghcr.io/example/dspark:pinned-" + "d1" * 32


def test_up_runs_a_digest_pinned_image_by_its_rank1_name(tmp_path: Path) -> None:
    """Rank 0 pulled IMAGE by digest; rank 1 got it by docker load, untagged, and image ship
    named it ``repo:pinned-D`` (docker cannot tag a digest). `up` and its preflight ask
    rank 1 for that name, and `plan` shows it, contacting no node."""
    with pair_endpoint() as srv:
        env = Env(tmp_path, srv.port)
        env.values["IMAGE"] = DIGEST_IMAGE
        env.write_env()
        Path(env.values["OVERLAY_DIR"]).mkdir()
        record = {"Id": IMAGE_ID, "Env": ["PATH=/usr/bin"], "Entrypoint": None}
        pulled = dict(record, RepoDigests=[DIGEST_IMAGE])
        env.state["hosts"]["h1"]["images"] = {DIGEST_IMAGE: pulled}
        env.state["hosts"]["h2"]["images"] = {PINNED: record}  # no RepoDigests after a load
        env.save()
        p = env.run("plan")
        assert p.returncode == 0, p.stderr
        rank1_line, rank0_line = [ln for ln in p.stdout.splitlines() if ln.startswith("docker run")]
        assert f" {PINNED} serve " in rank1_line and f" {DIGEST_IMAGE} serve " in rank0_line
        p = env.run("up")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "PASS  PF-IMAGE-MATCH" in p.stdout, p.stdout
        images = {r["host"]: r["argv"][r["argv"].index("serve") - 1] for r in env.runs()}
        assert images == {"h2": PINNED, "h1": DIGEST_IMAGE}


def test_preflight_names_rank1s_local_name_when_it_is_missing(tmp_path: Path) -> None:
    """Before image ship, rank 1 has no ``repo:pinned-D`` (even if it pulled the digest
    itself): PF-IMAGE-MATCH says which name it looked for and who makes it."""
    with pair_endpoint() as srv:
        env = Env(tmp_path, srv.port)
        env.values["IMAGE"] = DIGEST_IMAGE
        env.write_env()
        record = {"Id": IMAGE_ID, "RepoDigests": [DIGEST_IMAGE]}
        env.state["hosts"]["h1"]["images"] = {DIGEST_IMAGE: record}
        env.state["hosts"]["h2"]["images"] = {IMAGE_ID: record}  # the ID, not the name
        env.save()
        p = env.run("preflight")
        line = next(ln for ln in p.stdout.splitlines() if "PF-IMAGE-MATCH" in ln)
        assert "FAIL" in line and f"rank 1 has no {PINNED}" in p.stdout, p.stdout
        assert "image ship" in p.stdout


# --- the fork Dockerfile verifies what it built -----------------------------------------------

DOCKERFILE = Path(__file__).resolve().parents[1] / "launch" / "image" / "Dockerfile"
# The vLLM the fork stack runs: the base's, which the fork's files leave alone. Its boot banner
# says 0.21.1rc1.dev339+g1967a5627bc3 (ecohash-co/deepseek-v4-flash-dgx-spark-vllm027
# docs/02-before-after.md); recipes/stacks/fork.yaml, once it exists, must say the same.
FORK_VLLM = "0.21.1rc1.dev339+g1967a5627bc3"


def dockerfile_lines() -> list[str]:
    """The Dockerfile's logical lines, continuations joined as docker's parser joins them."""
    out, cur = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not cur:
            continue
        if line.endswith("\\"):
            cur += line[:-1]
            continue
        out.append(cur + line)
        cur = ""
    return [ln for ln in out if ln.strip()]


def verify_step() -> str:
    """The shell command of the RUN that imports the built vLLM (the last instruction)."""
    runs = [ln for ln in dockerfile_lines() if ln.startswith("RUN ") and "import vllm" in ln]
    assert len(runs) == 1, "launch/image/Dockerfile has no RUN that imports the built vLLM"
    return runs[0].removeprefix("RUN ")


def stack_vllm() -> str:
    if (Path(__file__).resolve().parents[1] / "recipes" / "stacks" / "fork.yaml").is_file():
        from pairctl.engine.stack import load_stack

        return load_stack("fork").vllm
    return FORK_VLLM


def test_dockerfile_verifies_the_fork_imports_at_the_stacks_vllm_version() -> None:
    lines = dockerfile_lines()
    args = dict(
        ln.removeprefix("ARG ").split("=", 1) for ln in lines if ln.startswith("ARG ") and "=" in ln
    )
    assert args["VLLM_VERSION"] == stack_vllm() == FORK_VLLM
    assert args["PYTHON"] == "/opt/env/bin/python"  # the base's micromamba env, as the fork's
    step = verify_step()
    assert step.startswith('WANT_VLLM="${VLLM_VERSION}" "${PYTHON}" -c ')
    assert "vllm.__version__" in step and 'os.environ["WANT_VLLM"]' in step
    assert "from vllm.v1.spec_decode.dspark_proposer import DSparkProposer" in step
    assert lines[-1].startswith("RUN ") and "import vllm" in lines[-1]  # after the fork's files


@pytest.mark.needs_vllm
def test_the_verify_step_fails_on_an_image_without_the_forks_vllm(tmp_path: Path) -> None:
    """The step, run as docker would (bash -o pipefail -c) with this machine's vLLM 0.33 in
    place of the image's: the version check refuses it, and with the version matched the
    import of the fork's DSparkProposer does (upstream vLLM has no dspark_proposer)."""
    import subprocess
    import sys

    import vllm

    step = verify_step()

    def run(version: str) -> subprocess.CompletedProcess:
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHON": sys.executable,
            "VLLM_VERSION": version,
            **NO_CUDA_JIT,
        }
        return subprocess.run(
            ["bash", "-o", "pipefail", "-c", step],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )

    p = run(FORK_VLLM)
    assert p.returncode != 0
    assert f"vLLM {vllm.__version__} in the image, {FORK_VLLM} expected" in p.stderr, p.stderr
    p = run(vllm.__version__)
    assert p.returncode != 0 and "dspark_proposer" in p.stderr, p.stderr
