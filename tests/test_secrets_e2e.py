"""Secrets are never printed: every output of ours in a rehearsal run of a pair
with an API key and an HF token is grepped for both.

Runs on the offline rehearsal (network namespaces, real sshd, the simulator as the image);
the pair's env file carries ``pairenv.FAKE_HF_TOKEN`` and ``pairenv.FAKE_API_KEY``. What is
grepped: stdout and stderr of plan, preflight (and its --json evidence), up --gate, status
(text and JSON), logs of both ranks, a bench given the key on its command line (and its
result JSON), the watchdog refusing a wrong key (with that wrong key grepped too), and down.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sim.rehearsal import hosts, pairenv
from tests.support.rehearsal import pair_fixture, run_launcher

pytestmark = pytest.mark.needs_netns

REPO = Path(__file__).resolve().parents[1]
WRONG_KEY = "sk-wrongKeyNeverPrinted0000"
SECRETS = (pairenv.FAKE_HF_TOKEN, pairenv.FAKE_API_KEY, WRONG_KEY)
EXIT_KEY = 9

pair = pair_fixture("dsv4s", with_env=False)


@pytest.fixture(scope="module")
def keyed(pair: hosts.Pair):
    pair.env_file = pairenv.prepare(pair, api_key=pairenv.FAKE_API_KEY)
    pairenv.copy_overlays(pair, REPO)
    try:
        yield pair
    finally:
        run_launcher(pair, REPO, "down", timeout=120)


def test_no_output_of_ours_carries_a_secret(keyed: hosts.Pair) -> None:
    client = keyed.base / "client"
    outputs: dict[str, str] = {}

    def launcher(name: str, *args: str, env_file: Path | None = None, timeout: float = 240):
        res = run_launcher(keyed, REPO, *args, env_file=env_file, timeout=timeout)
        outputs[name] = res.stdout + res.stderr
        return res.returncode

    evidence = client / "evidence.json"
    launcher("plan", "plan")
    launcher("preflight", "preflight", "--json", str(evidence))
    assert launcher("up", "up", "--gate", timeout=900) == 0, outputs["up"]
    assert launcher("status", "status") == 0, outputs["status"]
    launcher("status --json", "status", "--json")
    launcher("logs rank 0", "logs", "--tail", "500")
    launcher("logs rank 1", "logs", "--rank", "1", "--tail", "500")

    result = client / "conc.json"
    url = f"http://{keyed.h1.ip}:8000"
    bench = [sys.executable, "-m", "bench.bench_conc", "--url", url]
    bench += ["--api-key", pairenv.FAKE_API_KEY, "--concurrency", "1", "--max-tokens", "8"]
    bench += ["--warmups", "0", "--no-progress", "--json", str(result)]
    res = keyed.h1.run(bench, cwd=str(REPO), timeout=300)
    outputs["bench_conc"] = res.stdout + res.stderr
    assert res.returncode == 0, outputs["bench_conc"]

    wrong = keyed.env_file.with_name("wrong-key.env")
    wrong.write_text(keyed.env_file.read_text().replace(pairenv.FAKE_API_KEY, WRONG_KEY))
    rc = launcher(
        "watch (wrong key)", "watch", "--interval", "1", "--failures", "1", env_file=wrong
    )
    assert rc == EXIT_KEY, outputs["watch (wrong key)"]
    assert "restarting the pair" not in outputs["watch (wrong key)"]
    launcher("status (wrong key)", "status", env_file=wrong)

    assert launcher("down", "down", timeout=120) == 0, outputs["down"]

    files = {"preflight --json": evidence, "bench --json": result}
    outputs |= {name: path.read_text() for name, path in files.items()}
    leaks = [(name, s[:6] + "...") for name, text in outputs.items() for s in SECRETS if s in text]
    assert not leaks, f"secrets printed: {leaks}"
