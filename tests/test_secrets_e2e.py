"""Secrets are never printed: every output of ours in a rehearsal run of a pair
with an API key and an HF token is grepped for both.

Runs on the offline rehearsal (network namespaces, real sshd, the simulator as the image);
the pair's env file carries ``pairenv.FAKE_HF_TOKEN`` and ``pairenv.FAKE_API_KEY``. What is
grepped: stdout and stderr of plan, preflight (and its --json evidence), up --gate, status
(text and JSON), logs of both ranks, a bench given the key on its command line (and its
result JSON), the watchdog refusing a wrong key (with that wrong key grepped too), and down.
Each command's exit code and the lines that show it did its work are asserted first: a
command failing early would print nothing, and nothing carries no secret.
"""

from __future__ import annotations

import json
import re
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
    """Each command must have done its work (its exit code, and the lines that say so) before
    its output is searched: a command that failed early prints little, and an empty output
    carries no secret. Where the secrets travel (the containers' env), the plan names them
    without their values."""
    client = keyed.base / "client"
    outputs: dict[str, str] = {}

    def launcher(
        name: str, *args: str, env_file: Path | None = None, timeout: float = 240
    ) -> tuple[int, str, str]:
        res = run_launcher(keyed, REPO, *args, env_file=env_file, timeout=timeout)
        outputs[name] = res.stdout + res.stderr
        return res.returncode, res.stdout, outputs[name]

    def ran(name: str, want_rc: int, *args: str, **kw: object) -> tuple[str, str]:
        rc, stdout, out = launcher(name, *args, **kw)
        assert rc == want_rc, f"{name}: exit {rc}, expected {want_rc}:\n{out[-3000:]}"
        return stdout, out

    def has(name: str, out: str, *lines: str) -> None:
        missing = [ln for ln in lines if ln not in out]
        assert not missing, f"{name}: no {missing} in its output:\n{out[-3000:]}"

    endpoint = f"http://{keyed.h1.ip}:8000"
    evidence = client / "evidence.json"
    _, out = ran("plan", 0, "plan")
    # both secrets reach the containers by name only (docker run -e NAME, value from env)
    has("plan", out, f"# endpoint: {endpoint}/v1", "-e VLLM_API_KEY")
    # HF_TOKEN is the host's, for the model fetch: no container is given it, not even by name
    assert "HF_TOKEN" not in " ".join(x for x in out.splitlines() if "docker run" in x), out
    _, out = ran("preflight", 0, "preflight", "--json", str(evidence))
    has("preflight", out, "PASS  PF-")
    _, out = ran("up", 0, "up", "--gate", timeout=900)
    has("up", out, "quality gate passed")
    _, out = ran("status", 0, "status")
    assert re.search(r"pair \S+: HEALTHY", out), out
    stdout, _ = ran("status --json", 0, "status", "--json")
    assert json.loads(stdout)["verdict"] == "healthy", stdout
    _, out = ran("logs rank 0", 0, "logs", "--tail", "500")
    has("logs rank 0", out, "(APIServer pid=")
    _, out = ran("logs rank 1", 0, "logs", "--rank", "1", "--tail", "500")
    has("logs rank 1", out, "SPARK-TWIN SIMULATOR", "(Worker_TP1 pid=")

    result = client / "conc.json"
    bench = [sys.executable, "-m", "bench.bench_conc", "--url", endpoint]
    bench += ["--api-key", pairenv.FAKE_API_KEY, "--concurrency", "1", "--max-tokens", "8"]
    bench += ["--warmups", "0", "--no-progress", "--json", str(result)]
    res = keyed.h1.run(bench, cwd=str(REPO), timeout=300)
    outputs["bench_conc"] = res.stdout + res.stderr
    assert res.returncode == 0, outputs["bench_conc"]
    assert json.loads(result.read_text()), "bench_conc wrote an empty result"

    wrong = keyed.env_file.with_name("wrong-key.env")
    wrong.write_text(keyed.env_file.read_text().replace(pairenv.FAKE_API_KEY, WRONG_KEY))
    args = ("watch", "--interval", "1", "--failures", "1")
    _, out = ran("watch (wrong key)", EXIT_KEY, *args, env_file=wrong)
    has("watch (wrong key)", out, "STOP: ", "VLLM_API_KEY")
    assert "restarting the pair" not in out
    _, out = ran("status (wrong key)", EXIT_KEY, "status", env_file=wrong)
    has("status (wrong key)", out, "UNAUTHORIZED", "VLLM_API_KEY")

    ran("down", 0, "down", timeout=120)

    files = {"preflight --json": evidence, "bench --json": result}
    outputs |= {name: path.read_text() for name, path in files.items()}
    assert json.loads(outputs["preflight --json"]), "preflight wrote empty evidence"
    empty = [name for name, text in outputs.items() if not text.strip()]
    assert not empty, f"outputs with nothing in them: {empty}"
    leaks = [(name, s[:6] + "...") for name, text in outputs.items() for s in SECRETS if s in text]
    assert not leaks, f"secrets printed: {leaks}"
