"""`up` reads the image on each node before its `docker run`: the image's own PYTHONPATH is
kept (the overlay path appended), the stack's PATH entries go in front of the image's PATH,
and its ENTRYPOINT is replaced by the stack's `--entrypoint` (the fork's /opt/env/bin/vllm);
`plan`, which contacts no node, says what it assumed instead."""

from __future__ import annotations

from pathlib import Path

import pytest

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
