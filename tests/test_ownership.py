"""The ownership proof (pairctl/status/ownership.py) shared by `status` and `watch`: its three
outcomes, the per-boot identity `up` gives rank 0 (pairctl/pair/plan.py), the twin's
``--fingerprint-mode`` (sim/twin/shapes.py), and the seed's incident: pair B's SPARK1 pointing
at pair A's head, with A's key and with B's own, against two twin heads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from pairctl.cli import frontdoor, ops
from pairctl.nodes.ssh import Result
from pairctl.status import ownership as own
from pairctl.status import pair as pst
from sim.twin import shapes
from tests.support.twin import Twin, free_port, metric, metrics, wait_http

KEY_A, KEY_B = "sk-pair-a", "sk-pair-b"
BOOT_A, BOOT_B = "a0a0a0a0a0a0", "b1b1b1b1b1b1"
NOBODY = own.Head(True, False, None)  # docker answers, no rank 0 of this pair runs


# --- the proof's outcomes ---------------------------------------------------------------


def test_proven_when_the_fingerprint_names_the_running_boot() -> None:
    p = own.judge("b", True, f"dsv4/b/{BOOT_B}", own.Head(True, True, BOOT_B))
    assert p.outcome == own.PROVEN and p.ours


@pytest.mark.parametrize(
    ("fingerprint", "head", "named"),
    [
        (f"dsv4/a/{BOOT_A}", own.Head(True, True, BOOT_B), "pair a's head"),
        (f"dsv4/a/{BOOT_A}", NOBODY, "pair a's head"),
        (
            f"dsv4/b/{BOOT_A}",
            own.Head(True, True, BOOT_B),
            f"rank 0 running on SPARK1 is boot {BOOT_B}",
        ),
        (f"dsv4/b/{BOOT_A}", NOBODY, "an old boot of ours"),
        ("vllm-0.33.0-tp2-1a2b3c4d", own.Head(True, True, BOOT_B), "not a dsv4 pair's head"),
        (None, own.Head(True, True, BOOT_B), "system_fingerprint none"),
    ],
)
def test_disproven_names_what_answered(fingerprint, head, named) -> None:
    p = own.judge("b", True, fingerprint, head)
    assert p.outcome == own.DISPROVEN and not p.ours
    assert named in p.detail, p.detail


def test_unavailable_without_boot_identity_falls_back_to_labels_and_says_so() -> None:
    p = own.judge("b", False, "vllm-0.21.1-tp2-1a2b3c4d", own.Head(True, True, None))
    assert p.outcome == own.UNAVAILABLE and p.ours and "weaker" in p.detail
    p = own.judge("b", False, f"dsv4/a/{BOOT_A}", NOBODY)  # labels alone disprove it
    assert p.outcome == own.DISPROVEN and not p.ours
    p = own.judge("b", True, f"dsv4/b/{BOOT_B}", own.Head(False, False, None, "ssh: timeout"))
    assert p.outcome == own.UNAVAILABLE and not p.ours and "ssh: timeout" in p.detail
    p = own.judge("b", True, "vllm-0.33.0-1a2b3c4d", own.Head(True, True, None))  # pre-boot-id
    assert p.outcome == own.UNAVAILABLE and p.ours and "no dsv4.boot label" in p.detail


def test_a_refused_key_is_ours_only_where_our_rank_0_runs() -> None:
    p = own.judge_refused("b", "http://h:8000/v1", NOBODY)
    assert p.outcome == own.DISPROVEN and "refused our key" in p.detail
    assert "another pair's head" in p.detail
    p = own.judge_refused("b", "http://h:8000/v1", own.Head(True, True, BOOT_B))
    assert p.ours  # our own server: a key problem (exit 9), not a foreign one


# --- the identity up gives the boot --------------------------------------------------------


def test_twin_builds_the_fingerprint_as_vllm_does() -> None:
    """vllm/entrypoints/serve/utils/fingerprint.py build_system_fingerprint, each mode."""
    v = shapes.VLLM_VERSION
    assert shapes.fingerprint(2, "0123456789", "full") == f"vllm-{v}-tp2-01234567"
    assert shapes.fingerprint(1, "0123456789", "full") == f"vllm-{v}-01234567"
    assert shapes.fingerprint(2, "0123456789", "hash") == f"vllm-{v}-01234567"
    assert shapes.fingerprint(2, "0123456789", "custom", "dsv4/a/x") == "dsv4/a/x"
    assert shapes.fingerprint(2, "0123456789", "custom") is None
    assert shapes.fingerprint(2, "0123456789", "none") is None


def test_up_labels_the_boot_and_rank_0_names_it(monkeypatch) -> None:
    from pairctl.engine.stack import load_stack
    from pairctl.pair.plan import BOOT_PLACEHOLDER, build_rank
    from tests.test_stacks import _pair

    cpu = _pair(ENGINE_STACK="cpu")
    head = build_rank(cpu, 0, boot_id=BOOT_A)
    argv = list(head.vllm_argv)
    value = argv[argv.index("--fingerprint-value") + 1]
    assert argv[argv.index("--fingerprint-mode") + 1] == "custom"
    assert value == f"dsv4/{cpu.pair_id}/{BOOT_A}"
    assert f"dsv4.boot={BOOT_A}" in head.docker_argv
    worker = build_rank(cpu, 1, boot_id=BOOT_A)
    assert f"dsv4.boot={BOOT_A}" in worker.docker_argv
    assert "--fingerprint-mode" not in worker.vllm_argv
    planned = build_rank(cpu, 0)  # plan: a placeholder, and the hash is the same
    assert f"dsv4.boot={BOOT_PLACEHOLDER}" in planned.docker_argv
    assert f"dsv4.plan={cpu.plan_hash}" in head.docker_argv
    assert f"dsv4.plan={cpu.plan_hash}" in planned.docker_argv
    fork = _pair()  # the fork's vLLM may predate the flag: labels only
    assert load_stack("fork").boot_identity is None
    assert "--fingerprint-mode" not in build_rank(fork, 0, boot_id=BOOT_A).vllm_argv
    assert f"dsv4.boot={BOOT_A}" in build_rank(fork, 0, boot_id=BOOT_A).docker_argv


# --- the seed's incident, against two twin heads ---------------------------------------------


class Host:
    """SPARK1's docker as the proof sees it: the containers that run there. Every command
    run is kept, so a test can show nothing but ``docker ps`` touched the host."""

    def __init__(self, containers: list[dict]) -> None:
        self.containers = containers
        self.ran: list[list[str]] = []
        self.rank, self.addr, self.remote, self.label = 0, "127.0.0.1", False, "SPARK1"

    def run(self, argv: list[str], timeout: float = 30, **_kw) -> Result:
        self.ran.append(list(argv))
        if argv[:2] != ["docker", "ps"]:
            raise AssertionError(f"the proof ran {argv} on SPARK1")
        return Result(0, "".join(json.dumps(c) + "\n" for c in self.containers), "")


def head_row(pair: str, boot: str) -> dict:
    labels = f"dsv4.pair={pair},dsv4.rank=0,dsv4.role=head,dsv4.boot={boot}"
    return {"ID": pair, "Names": f"dsv4-{pair}-rank0", "State": "running", "Labels": labels}


def start_head(tmp: Path, name: str, key: str, boot: str) -> tuple[Twin, str]:
    port = free_port()
    args = ["m", "--port", str(port), "--host", "127.0.0.1", "--twin-profile", "rehearsal"]
    args += ["--api-key", key, "--fingerprint-mode", "custom"]
    args += ["--fingerprint-value", f"dsv4/{name}/{boot}"]
    return Twin(args, tmp, name), f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Pair A's head and pair B's head, each its own twin, key and boot."""
    tmp = tmp_path_factory.mktemp("ownership")
    a, url_a = start_head(tmp, "pair-a", KEY_A, BOOT_A)
    b, url_b = start_head(tmp, "pair-b", KEY_B, BOOT_B)
    try:
        wait_http(url_a + "/health", 30)
        wait_http(url_b + "/health", 30)
        yield {"a": url_a, "b": url_b}
    finally:
        a.stop()
        b.stop()


def pair_b(url: str, key: str, host: Host) -> SimpleNamespace:
    """Pair B as status and watch read it, its SPARK1:PORT being ``url``."""
    stack = SimpleNamespace(boot_identity="fingerprint")
    return SimpleNamespace(
        pair_id="pair-b", endpoint=url, api_key=key, stack=stack, nodes=[host, None], cfg={}
    )


def served(url: str) -> float:
    """Requests a twin head finished (vLLM's counter on its /metrics)."""
    return metric(metrics(url), "vllm:request_success_total")


def run_watch(monkeypatch, pair: SimpleNamespace, cycles: int) -> tuple[list, list, list]:
    """`watch` as ops.watchdog wires it (its real probe and proof), ``cycles`` cycles."""
    said, restarts, monitors = [], [], []
    monkeypatch.setattr(
        ops, "pair_monitors", lambda *a: SimpleNamespace(after_ok_probe=lambda: monitors.append(1))
    )
    monkeypatch.setattr(ops, "NodeWatch", lambda *a: lambda: None)
    monkeypatch.setattr(ops, "lock_busy", lambda path: False)
    monkeypatch.setattr(ops, "lock_path", lambda pair: "")
    monkeypatch.setattr(ops.watch, "printer", lambda pid: said.append)

    def serve(dog, what):
        dog.sleep = lambda s: None
        dog.run(cycles)
        return 0

    monkeypatch.setattr(ops.watch, "serve", serve)
    a = frontdoor.Args(cmd="watch", interval=0.01, failures=1, canary_every=0.0)
    assert ops.watchdog(a, pair, lambda: restarts.append(1) or 0) == 0
    return said, restarts, monitors


@pytest.mark.parametrize("key", [KEY_A, KEY_B], ids=["same-key", "different-key"])
def test_watch_for_b_takes_no_action_against_a(heads, monkeypatch, key: str) -> None:
    """B's SPARK1 is A's head: A's host runs A's rank 0, no container of B. With A's key
    the probe gets A's token; with B's own, A refuses it. Either way: no restart, no
    canary/sentinel, no exit; the reason once, not every cycle; only the probes reach A."""
    host = Host([head_row("pair-a", BOOT_A)])
    before = served(heads["a"])
    said, restarts, monitors = run_watch(monkeypatch, pair_b(heads["a"], key, host), 4)
    assert restarts == [] and monitors == [], said
    foreign = [line for line in said if line.startswith("NOT OURS")]
    assert len(foreign) == 1, said
    assert ("pair pair-a's head answered" if key == KEY_A else "refused our key") in foreign[0]
    assert all(argv[:2] == ["docker", "ps"] for argv in host.ran) and host.ran
    probes = 4 if key == KEY_A else 0  # one 1-token completion a cycle, nothing else
    assert served(heads["a"]) - before == probes


def test_watch_for_b_resumes_on_its_own_head(heads, monkeypatch) -> None:
    """B's own healthy pair is proven: the monitors run after each good probe."""
    host = Host([head_row("pair-b", BOOT_B)])
    said, restarts, monitors = run_watch(monkeypatch, pair_b(heads["b"], KEY_B, host), 3)
    assert restarts == [] and len(monitors) == 3, said
    assert not any(line.startswith("NOT OURS") for line in said), said


def status_b(monkeypatch, pair: SimpleNamespace, host: Host) -> pst.PairStatus:
    """``status`` for B (pst.collect), its ranks read from ``host`` (rank 1 running)."""
    from datetime import UTC, datetime

    def ranks(node, pair_id, now):
        if node is None:  # rank 1 on B's SPARK2, running
            return pst.RankStatus(
                1,
                "worker",
                "127.0.0.2",
                True,
                "",
                f"dsv4-{pair_id}-rank1",
                "running",
                None,
                None,
                [],
                "plan",
                BOOT_B,
            )
        return real(node, pair_id, now)

    real = pst.rank_status
    monkeypatch.setattr(pst, "rank_status", ranks)
    monkeypatch.setattr(pst, "inspect", lambda node, name: None)
    monkeypatch.setattr(pst.memory, "sample", lambda nodes: [])
    monkeypatch.setattr(pst, "status_extras", lambda *a: {})
    pair.plan_hash = "plan"
    st, _ = pst.collect(pair)
    assert datetime.now(UTC)  # collect ran to the end
    return st


@pytest.mark.parametrize("key", [KEY_A, KEY_B], ids=["same-key", "different-key"])
def test_status_for_b_says_foreign_at_a(heads, monkeypatch, key: str) -> None:
    host = Host([head_row("pair-a", BOOT_A)])
    st = status_b(monkeypatch, pair_b(heads["a"], key, host), host)
    assert st.verdict == "foreign" and st.exit_code == 10, st.reasons
    assert st.endpoint.proof == own.DISPROVEN and st.serving is None
    assert ("pair pair-a's head" if key == KEY_A else "refused our key") in st.endpoint.detail


def test_status_for_b_on_its_own_head_is_proven(heads, monkeypatch) -> None:
    host = Host([head_row("pair-b", BOOT_B)])
    st = status_b(monkeypatch, pair_b(heads["b"], KEY_B, host), host)
    assert st.verdict == "healthy" and st.exit_code == 0, st.reasons
    assert st.endpoint.proof == own.PROVEN and st.endpoint.ours == "yes"


def test_status_for_b_a_label_is_not_a_proof(heads, monkeypatch) -> None:
    """B's rank 0 runs on the host too (the label proof holds), but A answers at the port:
    the fingerprint disproves it, and none of A's figures are shown as B's."""
    host = Host([head_row("pair-a", BOOT_A), head_row("pair-b", BOOT_B)])
    st = status_b(monkeypatch, pair_b(heads["a"], KEY_A, host), host)
    assert st.verdict == "foreign" and st.serving is None, st.reasons
    assert "pair pair-a's head answered" in st.endpoint.detail


def test_watchdog_resumes_when_the_proof_holds_again() -> None:
    """Failures against a foreign server never add up to a restart; once the proof holds,
    the watchdog says so and its monitors run again."""
    from pairctl.status.watch import WatchConfig, Watchdog

    verdicts = iter(["pair a's head answered"] * 3 + [None])
    said, restarts, monitors = [], [], []
    dog = Watchdog(
        WatchConfig(failures=1),
        probe=lambda: "POST: no token generated",
        restart=lambda: restarts.append(1) or 0,
        log=said.append,
        sleep=lambda s: None,
        after_ok=lambda: monitors.append(1),
        owner=lambda: next(verdicts),
    )
    dog.run(3)
    assert restarts == [] and monitors == [] and dog.failed == 0
    assert [line[:8] for line in said] == ["NOT OURS"]
    dog.probe = lambda: None
    dog.run(1)
    assert said[-2].startswith("ownership proven again") and monitors == [1], said
