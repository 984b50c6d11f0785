"""launch/dspark_launch.sh end to end against fake docker/ssh/ip/ss (tests/fakes).

What must hold: failure paths never reach ``docker run``; ``down`` and cleanup touch only
this pair's labelled containers; secrets are never printed; exit codes follow
docs/INTERFACES.md; ``up`` on a healthy pair changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import require
from tests.fakes.fakepair import FAKES, LAUNCHER, REPO, SECRET, Env


def test_help_and_bad_args(pair: Env) -> None:
    p = pair.run("--help")
    assert p.returncode == 0 and "preflight" in p.stdout and "Exit codes" in p.stdout
    p = pair.run("frobnicate")
    assert p.returncode == 2 and "unknown argument" in p.stderr
    p = pair.run("up", "--timeout", "soon")
    assert p.returncode == 2 and "--timeout" in p.stderr
    assert pair.calls() == [] and pair.calls("ssh") == []


def test_plan_has_exact_lines_and_masks_secret(pair: Env) -> None:
    p = pair.run("plan", "--", "--max-num-seqs", "16")
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("docker run")]
    assert len(lines) == 2
    worker, head = lines  # rank 1 first: that is the start order
    for line, rank, role in ((worker, 1, "worker"), (head, 0, "head")):
        for frag in (
            f"--name dsv4-pair-a-rank{rank}",
            "--label dsv4.pair=pair-a",
            f"--label dsv4.rank={rank}",
            f"--label dsv4.role={role}",
            "--network host --gpus all --ipc private --shm-size 8g",
            f"{pair.values['OVERLAY_DIR']}:/opt/dsv4-flash-overlays:ro",
            "-e PYTHONPATH=/opt/dsv4-flash-overlays",
            "-e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=600",
            # the fork stack (the recipe's): its vllm, its env, its flags after the recipe's
            "--entrypoint /opt/env/bin/vllm",
            "-e VLLM_USE_B12X_MOE=1",
            "-e VLLM_ENGINE_READY_TIMEOUT_S=3600",
            f"--node-rank {rank}",
            "--master-addr 127.0.0.1",
            "--long-prefill-token-threshold 4096",
            "--max-num-seqs 1 ",  # capped: the image is not known to carry the Keys patch
            "--trust-remote-code --block-size 256",
            f"--port {pair.values['PORT']}",
        ):
            assert frag in line, (frag, line)
        # the ranks run offline: HF_TOKEN (set in this env file) is in neither container
        assert "HF_TOKEN" not in line
        assert line.endswith("--max-num-seqs 16"), "passthrough must come last (CLI wins)"
    assert "--headless" in worker and "--headless" not in head
    assert pair.calls() == [], "plan must not run docker"


@pytest.mark.parametrize(
    "line,needle",
    [
        ("PORT=eighty", "PORT"),
        ("SPARK2=", "SPARK2"),
        ("this is not an assignment", "malformed line"),
        ("MODEL_PATH=relative/path", "MODEL_PATH"),
    ],
)
def test_malformed_env_exits_2_and_touches_nothing(pair: Env, line: str, needle: str) -> None:
    text = pair.env_file.read_text()
    key = line.split("=")[0]
    text = "".join(x + "\n" for x in text.splitlines() if not x.startswith(key + "="))
    pair.env_file.write_text(text + line + "\n")
    cmds = ("up", "down", "plan", "preflight", "status") if needle == "PORT" else ("up", "plan")
    for cmd in cmds:
        p = pair.run(cmd)
        assert p.returncode == 2, (cmd, p.stderr)
        assert needle in p.stderr
    assert pair.calls() == [] and pair.calls("ssh") == []


def test_missing_required_var_named(pair: Env) -> None:
    del pair.values["SPARK1"]
    pair.write_env()
    p = pair.run("plan")
    assert p.returncode == 2 and "SPARK1 is missing" in p.stderr


def test_ssh_failure_is_preflight_fail_without_side_effects(pair: Env) -> None:
    pair.state["ssh_fail"] = "Host key verification failed."
    pair.save()
    p = pair.run("up")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "PF-SSH" in p.stdout and "host key" in p.stdout
    assert pair.runs() == [] and pair.removes() == []
    for c in pair.calls("ssh"):
        assert "BatchMode=yes" in c["argv"] and "StrictHostKeyChecking=yes" in c["argv"]


def test_foreign_pair_on_rank1_fails_and_survives(pair: Env) -> None:
    pair.add_container("h2", "dsv4-pair-b-rank1", "pair-b", 1)
    p = pair.run("up")
    assert p.returncode == 3
    assert "PF-FOREIGN-PAIR" in p.stdout and "pair-b" in p.stdout
    assert pair.runs() == [] and pair.removes() == []
    assert [c["Name"] for c in pair.load()["hosts"]["h2"]["containers"]] == ["dsv4-pair-b-rank1"]


def test_concurrent_up_for_same_pair_is_refused(pair: Env) -> None:
    import fcntl

    with open(pair.tmp / "dsv4-launch-pair-a-127.0.0.1.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        p = pair.run("up")
    assert p.returncode == 3 and "another up/down" in p.stderr
    assert pair.runs() == [] and pair.removes() == []


def test_self_not_spark1_fails(pair: Env) -> None:
    pair.state["hosts"]["h1"]["addrs"] = ["10.9.9.9"]
    pair.values["SPARK1"] = "10.9.9.8"
    pair.write_env()
    pair.save()
    p = pair.run("preflight")
    assert p.returncode == 3 and "PF-SELF-IS-SPARK1" in p.stdout
    assert "FAIL  PF-SELF-IS-SPARK1" in p.stdout


def test_port_taken_by_foreign_process_fails(pair: Env) -> None:
    pair.state["hosts"]["h1"]["listen"] = [int(pair.values["PORT"])]
    pair.save()
    p = pair.run("up")
    assert p.returncode == 3 and "FAIL  PF-PORT-FREE" in p.stdout
    assert pair.runs() == []


def test_preflight_json_evidence(pair: Env) -> None:
    out = pair.tmp / "pf.json"
    p = pair.run("preflight", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    ids = {c["id"]: c["status"] for c in data["checks"]}
    assert ids["PF-SSH"] == "PASS" and ids["PF-IMAGE-MATCH"] == "PASS"
    assert ids["PF-OVERLAYS"] == "WARN"  # overlay dir absent: warn only
    assert ids["PF-HCA-2RAIL"] == "WARN"  # empty list
    assert SECRET not in out.read_text()
    assert pair.runs() == []


def test_up_starts_worker_then_head_and_is_idempotent(pair: Env) -> None:
    pair.add_container("h1", "dsv4-pair-a-rank0", "pair-a", 0, state="exited")  # stale
    pair.add_container("h1", "dsv4-pair-b-rank0", "pair-b", 0, state="exited")  # other pair
    p = pair.run("up")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "healthy after" in p.stderr
    runs = pair.runs()
    assert [(r["host"], r["argv"][r["argv"].index("--name") + 1]) for r in runs] == [
        ("h2", "dsv4-pair-a-rank1"),
        ("h1", "dsv4-pair-a-rank0"),
    ]
    assert [r["argv"][2:] for r in pair.removes()] == [["dsv4-pair-a-rank0-id"]]
    assert any("WARN" in x and "without overlays" in x for x in p.stderr.splitlines())
    assert "/opt/dsv4-flash-overlays" not in " ".join(runs[0]["argv"])
    names = {c["Name"] for c in pair.load()["hosts"]["h1"]["containers"]}
    assert "dsv4-pair-b-rank0" in names
    # HF_TOKEN (set in the env file) reached neither container: the ranks run with
    # HF_HUB_OFFLINE=1 and only `model fetch` downloads; and no command line (docker argv,
    # ssh argv, remote command) ever carried it.
    for host in ("h1", "h2"):
        (mine,) = [
            c
            for c in pair.load()["hosts"][host]["containers"]
            if c["Name"].startswith("dsv4-pair-a")
        ]
        assert "HF_TOKEN" not in mine["Env"] and mine["Env"]["HF_HUB_OFFLINE"] == "1"
    assert SECRET not in pair.log_path.read_text()

    before = len(pair.calls())
    p = pair.run("up")
    assert p.returncode == 0 and "already up and healthy" in p.stdout
    new = pair.calls()[before:]
    assert not [c for c in new if c["argv"][0] in ("run", "rm")]

    p = pair.run("status")
    assert p.returncode == 0
    assert "dsv4-pair-a-rank0 running" in p.stdout and "dsv4-pair-a-rank1 running" in p.stdout
    assert "running 2, waiting 1" in p.stdout


def test_down_touches_only_this_pair(pair: Env) -> None:
    pair.add_container("h1", "dsv4-pair-a-rank0", "pair-a", 0)
    pair.add_container("h2", "dsv4-pair-a-rank1", "pair-a", 1)
    pair.add_container("h1", "dsv4-pair-b-rank0", "pair-b", 0)
    pair.add_container("h2", "dsv4-pair-b-rank1", "pair-b", 1)
    pair.state["hosts"]["h2"]["containers"].append(
        {
            "ID": "unlabelled-id",
            "Name": "someone-else",
            "State": "running",
            "ExitCode": 0,
            "Labels": {},
            "Logs": [],
        }
    )
    pair.save()
    p = pair.run("down")
    assert p.returncode == 0, p.stderr
    st = pair.load()
    assert {c["Name"] for c in st["hosts"]["h1"]["containers"]} == {"dsv4-pair-b-rank0"}
    assert {c["Name"] for c in st["hosts"]["h2"]["containers"]} == {
        "dsv4-pair-b-rank1",
        "someone-else",
    }
    removed = [a for r in pair.removes() for a in r["argv"][2:]]
    assert sorted(removed) == ["dsv4-pair-a-rank0-id", "dsv4-pair-a-rank1-id"]
    for c in pair.calls():
        if c["argv"][0] == "ps":
            assert any(a.startswith("label=dsv4.pair=pair-a") for a in c["argv"])


def test_rank1_crash_during_boot_tears_down_both(dead_pair: Env) -> None:
    dead_pair.state["hosts"]["h2"]["run"] = "exited"
    dead_pair.save()
    p = dead_pair.run("up", "--timeout", "30")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "rank 1" in p.stderr and "rank crashed (fake)" in p.stderr
    st = dead_pair.load()
    assert st["hosts"]["h1"]["containers"] == [] and st["hosts"]["h2"]["containers"] == []


def test_timeout_tears_down_both(dead_pair: Env) -> None:
    p = dead_pair.run("up", "--timeout", "1")
    assert p.returncode == 5, p.stdout + p.stderr
    assert "TIMEOUT" in p.stderr
    st = dead_pair.load()
    assert st["hosts"]["h1"]["containers"] == [] and st["hosts"]["h2"]["containers"] == []


def test_logs_rank1_goes_over_ssh(pair: Env) -> None:
    pair.add_container("h2", "dsv4-pair-a-rank1", "pair-a", 1)
    p = pair.run("logs", "--rank", "1", "--tail", "5")
    assert p.returncode == 0, p.stderr
    assert "Application startup complete." in p.stdout
    assert pair.calls()[-1]["host"] == "h2"


def test_generated_docker_lines_parse_with_real_docker_client(pair: Env) -> None:
    docker = shutil.which("docker")
    require(docker is not None, "no docker client on PATH (this machine kind ships one)")
    from pairctl.contracts import DEFAULT_RECIPE
    from pairctl.pair.plan import build_rank
    from pairctl.pair.resolved import load

    resolved = load(pair.env_file, DEFAULT_RECIPE)
    for rank in (0, 1):  # the line up runs, unmasked (secrets travel by name: -e NAME)
        _assert_real_client_parses(docker, list(build_rank(resolved, rank).docker_argv))
    # the throwaway container preflight runs the image's own vLLM parser in
    from pairctl.pair.config import load_env_file
    from pairctl.pair.recipe import load_recipe
    from pairctl.pair.resolved import resolve
    from pairctl.preflight.argcheck import container_argv, rank_argvs

    cfg = load_env_file(pair.env_file)
    recipe = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")
    resolved_pair = resolve(cfg, recipe)
    line = container_argv(
        cfg["PAIR_ID"], "img:1", rank_argvs(resolved_pair), resolved_pair.stack.interpreter
    )
    _assert_real_client_parses(docker, line[1:])


def _assert_real_client_parses(docker: str, argv: list[str]) -> None:
    """The real client parsed every flag and stopped where it needs a daemon: connecting, or
    (with --device) asking the daemon's OS to validate the device paths."""
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock")
    p = subprocess.run(
        [docker, *argv], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    msg = p.stdout + p.stderr
    assert "unknown flag" not in msg and "invalid argument" not in msg, msg
    assert any(
        m in msg
        for m in ("Cannot connect to the Docker daemon", "docker.sock", "unknown server OS")
    ), msg


def test_shellcheck_clean() -> None:
    sc = shutil.which("shellcheck")
    require(sc is not None, "shellcheck not installed (make system-deps)")
    scripts = [LAUNCHER, *sorted(FAKES.iterdir())]
    p = subprocess.run([sc, "-x", *map(str, scripts)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout


def test_failed_quality_gate_exits_6_and_leaves_endpoint(pair: Env) -> None:
    p = pair.run("up", "--gate", timeout=120)  # the fake does not know the answers: gate fails
    assert p.returncode == 6, p.stdout + p.stderr
    assert "quality gate FAILED" in p.stderr
    st = pair.load()
    assert len(st["hosts"]["h1"]["containers"]) == 1 and len(st["hosts"]["h2"]["containers"]) == 1
