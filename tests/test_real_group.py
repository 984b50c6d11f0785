"""The real engine under the launcher as one TP=4 group: vLLM (CPU build) on four netns hosts.

One group is booted for the whole module by the unchanged launcher (`up`, an env file with
SPARK1..4 and FABRIC1..4, CABLING=switched) running the `cpu` engine stack. What is
asserted is what the real engine and our tools do with four ranks: every rank runs the
launcher's N-rank argv (`--nnodes 4 --node-rank R`, ranks 1..3 headless) and the engine
reports TP=4; a streamed chat; `status` with live figures from every rank; rank 2 (not
rank 1) SIGKILLed, named by `status` as a pair's dead rank 1 is; and a `down` that leaves
no container, process or /dev/shm segment on any host. The tests run in file order; the
last one takes the group down. One boot per module (the suite's time).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sim.rehearsal import chat, groupsteps, hosts, leaks, memwatch, pairenv
from tests.support.real_engine import GROUP_BOOT_LIMIT_S
from tests.support.rehearsal import pair_fixture, run_launcher

# Outside the default suite (make test-group): one TP=4 boot of four real ranks on 2 cores
# does not fit the suite's ~12 min (docs/rehearsal.md, "A TP=4 group").
pytestmark = [pytest.mark.needs_netns, pytest.mark.needs_engine, pytest.mark.outside_suite]

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
NODES = 4
KILLED = 2

pair = pair_fixture("dsv4n", engine="cpu", nodes=NODES)


class Served:
    def __init__(self, pair: hosts.Pair, boot_s: float, shm_before: set[str], watch) -> None:
        self.pair = pair
        self.url = f"http://{pair.h1.ip}:8000"
        self.boot_s = boot_s
        self.shm_before = shm_before
        self.watch = watch


BOOT_FAILED: list[str] = []  # one boot per module: a failed one fails the rest at once


@pytest.fixture(scope="module")
def served(pair: hosts.Pair):
    if BOOT_FAILED:
        pytest.fail(f"the module's one boot failed (see its first test):\n{BOOT_FAILED[0]}")
    pairenv.copy_overlays(pair, REPO)
    shm_before = set(leaks.shm_entries())
    watch = memwatch.MemWatch(pair.hosts).start()
    t0 = time.monotonic()
    res = run_launcher(
        pair, REPO, "up", "--timeout", str(GROUP_BOOT_LIMIT_S), timeout=GROUP_BOOT_LIMIT_S + 120
    )
    boot_s = time.monotonic() - t0
    own = [ln for ln in (res.stdout + res.stderr).splitlines() if not ln.lstrip().startswith("|")]
    if res.returncode != 0:
        watch.stop()
        BOOT_FAILED.append(f"up exited {res.returncode}: " + "\n".join(own[-12:]))
    assert res.returncode == 0, "\n".join(own[-40:]) + "\n" + res.stderr[-3000:]
    assert pairenv.FAKE_HF_TOKEN not in res.stdout + res.stderr
    print(f"\nreal TP=4 group: up (preflight + boot) took {boot_s:.1f} s")
    return Served(pair, boot_s, shm_before, watch)


def test_every_rank_runs_its_part_of_the_group_and_the_engine_is_tp4(served):
    """Each host's container runs rank R of four: `--nnodes 4 --node-rank R`, the head's
    fabric address as master, ranks 1..3 headless; real vLLM says TP=4; a chat streams."""
    for rank, host in enumerate(served.pair.hosts):
        info = json.loads(host.docker("inspect", f"dsv4-rehearsal-rank{rank}").stdout)[0]
        cmd = info["Config"]["Cmd"]
        assert cmd[cmd.index("--nnodes") + 1] == "4", cmd
        assert cmd[cmd.index("--node-rank") + 1] == str(rank), cmd
        assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4", cmd
        assert cmd[cmd.index("--master-addr") + 1] == served.pair.h1.fabric_ip, cmd
        assert ("--headless" in cmd) == (rank > 0), cmd
        assert f"VLLM_HOST_IP={host.fabric_ip}" in info["Config"]["Env"]
    res = run_launcher(served.pair, REPO, "logs", "--rank", "0", "--tail", "100000")
    assert "tensor_parallel_size=4" in res.stdout + res.stderr
    reply = chat.stream_chat(served.url, "Four Sparks, one engine: say hello.")
    assert reply.chunks > 0 and reply.usage.get("completion_tokens", 0) > 0, reply
    assert not reply.simulator


def test_status_reads_every_rank_live(served):
    """`status --json`: four ranks running with uptimes, four nodes' memory (three over
    ssh), serving figures from the real /metrics, verdict healthy."""
    doc = groupsteps.status_json(served.pair, LAUNCHER)
    assert groupsteps.every_rank_live(doc, NODES) == [], json.dumps(doc)[:3000]
    assert doc["exit_code"] == 0


def test_a_dead_rank2_is_named_and_down_leaves_nothing_on_any_host(served):
    """Last: rank 2 SIGKILLed. `status` names it and does not call the group healthy (a
    pair's dead rank 1 likewise); `down` removes every rank (the headless ranks a dead
    group leaves running included): no container, process or new /dev/shm segment."""
    groupsteps.kill_rank(served.pair, "rehearsal", KILLED)
    doc = groupsteps.status_json(served.pair, LAUNCHER)
    assert groupsteps.dead_rank_named(doc, KILLED) == [], doc.get("reasons")
    res = run_launcher(served.pair, REPO, "down", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    for host in served.pair.hosts:
        assert host.docker("ps", "-a", "-q").stdout.strip() == "", host.name
        assert host.process_cmdlines() == [], host.process_cmdlines()
    time.sleep(leaks.SHM_SETTLE_S)
    assert leaks.new_engine_segments(served.shm_before) == []
    peak = served.watch.stop()
    print(f"\nreal TP=4 group: boot {served.boot_s:.1f} s (preflight included); {peak.line()}")
