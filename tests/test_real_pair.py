"""The real engine under the launcher: vLLM (CPU build) as a TP=2 pair on two netns hosts.

One pair is booted for the whole module by the unchanged launcher (`up`) running the `cpu`
engine stack (recipes/stacks/cpu.yaml); the image maps to real `vllm serve` with the
launcher's line unchanged.
What is asserted is what the real engine does, not what our simulator says it does:
status's figures against the real /metrics counters over the same window, the bench
guard's token conservation on real counters (and a foreign request it must catch),
vLLM's own `vllm bench serve` against our bench, and a `down` that leaves no process and
no /dev/shm segment behind. The tests run in file order; the last one takes the pair down.
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.benchlib.cli import base_parser
from bench.benchlib.guard import GuardConfig, InFlightTracker, run_guarded
from bench.benchlib.runner import Bench
from bench.benchlib.stats import request_metrics
from pairctl.pair.plan import BOOT_PLACEHOLDER, LABEL_BOOT
from sim.rehearsal import hosts, leaks, pairenv
from tests.support.real_engine import PAIR_BOOT_LIMIT_S
from tests.support.rehearsal import pair_fixture, run_launcher

# Heavy (needs_engine, needs_netns): tests/conftest.py runs it in the one group of heavy tests,
# one after another on one worker, next to the light rest of the suite (docs/testing.md).
pytestmark = [pytest.mark.needs_netns, pytest.mark.needs_engine]

REPO = Path(__file__).resolve().parents[1]
SPEC = ("--per-request-spec-decode-metrics", "summary")

pair = pair_fixture("dsv4c", engine="cpu")


class Served:
    def __init__(self, pair: hosts.Pair, boot_s: float, shm_before: set[str]) -> None:
        self.pair = pair
        self.url = f"http://{pair.h1.ip}:8000"
        self.boot_s = boot_s
        self.shm_before = shm_before
        self.model = requests.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"]

    def launch(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        res = run_launcher(self.pair, REPO, *args, timeout=timeout)
        assert pairenv.FAKE_HF_TOKEN not in res.stdout + res.stderr
        return res

    def metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=10).text

    def complete(self, prompt: str, max_tokens: int) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        r = requests.post(f"{self.url}/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()


# One boot per module, whatever happens: pytest sets a module fixture up again for the next
# test after its setup failed, and each try of a real boot is minutes (a loaded CI run tried
# three times). A failed boot is recorded here, and every later test fails with it at once.
BOOT_FAILED: list[str] = []


@pytest.fixture(scope="module")
def served(pair: hosts.Pair) -> Served:
    if BOOT_FAILED:
        pytest.fail(f"the module's one boot failed (see its first test):\n{BOOT_FAILED[0]}")
    pairenv.copy_overlays(pair, REPO)
    shm_before = set(leaks.shm_entries())
    t0 = time.monotonic()
    limit = PAIR_BOOT_LIMIT_S  # 5x the idle boot; `up` names the slow phase if it is reached
    res = run_launcher(
        pair, REPO, "up", "--timeout", str(limit), timeout=limit + 120, vllm_args=SPEC
    )
    boot_s = time.monotonic() - t0
    # the launcher's own lines first (the phase that was slow, the FAIL), then the log tails
    own = [ln for ln in (res.stdout + res.stderr).splitlines() if not ln.lstrip().startswith("|")]
    if res.returncode != 0:
        BOOT_FAILED.append(f"up exited {res.returncode}: " + "\n".join(own[-12:]))
    assert res.returncode == 0, "\n".join(own[-40:]) + "\n" + res.stderr[-3000:]
    print(f"\nreal pair: up (preflight + boot) took {boot_s:.1f} s")
    return Served(pair, boot_s, shm_before)


def samples(text: str) -> dict[str, dict[tuple, float]]:
    """The real /metrics body as {sample name: {labels: value}}, by prometheus_client alone
    (an oracle independent of pairctl.status.metrics)."""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(sm: dict, name: str) -> float:
    return sum(sm.get(name, {}).values())


def per_pos(sm: dict) -> dict[int, float]:
    out: dict[int, float] = {}
    for labels, v in sm.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", {}).items():
        pos = int(dict(labels)["position"])
        out[pos] = out.get(pos, 0.0) + v
    return out


def quantile(q: float, before: dict, after: dict) -> float | None:
    """Prometheus histogram_quantile over the bucket increase (linear inside a bucket)."""
    name = "vllm:time_to_first_token_seconds_bucket"
    inc: dict[float, float] = {}
    for labels, v in after.get(name, {}).items():
        le = float(dict(labels)["le"])
        inc[le] = inc.get(le, 0.0) + v - before.get(name, {}).get(labels, 0.0)
    bounds = sorted(inc)
    count = inc[math.inf]
    if count <= 0:
        return None
    rank, lo, below = q * count, 0.0, 0.0
    for b in bounds:
        if inc[b] >= rank:
            if b == math.inf:
                return lo
            return lo + (b - lo) * (rank - below) / (inc[b] - below)
        lo, below = b, inc[b]
    return None


def test_the_launchers_lines_reach_the_real_engine_as_plan_shows_them(served):
    """The rank's container runs the launcher's argv, which already carries the cpu stack's
    changes (ngram drafts, no fp8 KV, eager), and the real engine reports exactly those;
    nothing between the launcher and vLLM rewrites it. The engine core and the workers
    load our plugin through vLLM's entry-point loader (its "active" line)."""
    info = json.loads(served.pair.h1.docker("inspect", "dsv4-rehearsal-rank0").stdout)[0]
    cmd = info["Config"]["Cmd"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
    assert "--kv-cache-dtype" not in cmd and "--enforce-eager" in cmd
    plan = run_launcher(served.pair, REPO, "plan", timeout=240, vllm_args=SPEC)  # as `up` ran
    assert plan.returncode == 0, plan.stderr[-2000:]
    line = next(x for x in plan.stdout.splitlines() if "--name dsv4-rehearsal-rank0 " in x)
    boot = info["Config"]["Labels"][LABEL_BOOT]  # drawn by `up`; plan shows a placeholder
    planned = shlex.split(line.replace(BOOT_PLACEHOLDER, boot))
    assert planned[planned.index(info["Config"]["Image"]) + 1 :] == cmd  # what plan printed ran
    assert "# stack cpu changes the recipe's line" in plan.stdout
    res = served.launch("logs", "--rank", "0", "--tail", "100000")
    log = res.stdout + res.stderr
    assert "rehearsal layer" not in log  # no layer any more: the log is vLLM's
    assert "method='ngram'" in log and "tensor_parallel_size=2" in log
    active = [ln for ln in log.splitlines() if "incremental-encode-cache active" in ln]
    # the plugin loads in the engine core and in the workers of both ranks' processes
    # (the API server's use of the cache is tests/test_headline_real.py's subject)
    assert any("EngineCore" in ln for ln in active), active
    assert any("Worker" in ln for ln in active), active


def test_status_figures_equal_the_real_counters_over_the_same_window(served):
    """`status --json --interval W` on host 1 while a fixed burst runs inside its window:
    with nothing before or after the burst, status's window sees exactly the counter
    changes between our own scrapes before and after. Ours before is taken once status's
    window has begun: status first asks for one token (the ownership proof's probe), which
    its window does not hold."""
    window = 25.0
    proc = served.pair.h1.popen(
        [
            str(REPO / "launch" / "dspark_launch.sh"),
            "status",
            "--json",
            "--interval",
            str(window),
            "--env-file",
            str(served.pair.env_file),
        ],
        cwd=str(REPO / "launch"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the burst goes in once status says its window runs (its first scrape is in): order,
    # not a guess of how long status takes to start on a loaded box (6 s was not enough)
    assert proc.stderr is not None
    early = []
    for line in iter(proc.stderr.readline, ""):
        early.append(line)
        if "status: measuring the serving rates" in line:
            break
    else:
        raise AssertionError("status never started its window:\n" + "".join(early))
    before = served.metrics()
    prompt = "the quick brown fox jumps over the lazy dog " * 40
    for i in range(4):
        served.complete(f"{i} {prompt}", 48)
    out, _ = proc.communicate(timeout=120)
    after = served.metrics()
    status = json.loads(out)
    s = status["serving"]
    assert s["window"] == "interval" and s["window_s"] == pytest.approx(window, abs=3)
    a, b = samples(before), samples(after)
    gen = total(b, "vllm:generation_tokens_total") - total(a, "vllm:generation_tokens_total")
    assert gen > 0
    assert s["decode_tok_s"] == pytest.approx(gen / s["window_s"], rel=1e-6)
    drafts = total(b, "vllm:spec_decode_num_drafts_total") - total(
        a, "vllm:spec_decode_num_drafts_total"
    )
    accepted = total(b, "vllm:spec_decode_num_accepted_tokens_total") - total(
        a, "vllm:spec_decode_num_accepted_tokens_total"
    )
    assert drafts > 0, "the ngram drafter proposed nothing for a repetitive prompt"
    assert s["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts, rel=1e-9)
    pa, pb = per_pos(a), per_pos(b)
    want = [(pb[k] - pa.get(k, 0.0)) / drafts for k in sorted(pb)]
    assert s["acceptance_per_pos"] == pytest.approx(want, rel=1e-9)
    hits = total(b, "vllm:prefix_cache_hits_total") - total(a, "vllm:prefix_cache_hits_total")
    queries = total(b, "vllm:prefix_cache_queries_total") - total(
        a, "vllm:prefix_cache_queries_total"
    )
    assert s["prefix_cache_hit_rate"] == pytest.approx(hits / queries, rel=1e-9)
    assert s["ttft_p50_s"] == pytest.approx(quantile(0.5, a, b), rel=1e-9)
    assert s["ttft_p95_s"] == pytest.approx(quantile(0.95, a, b), rel=1e-9)
    assert s["kv_cache_usage"] == pytest.approx(max(b["vllm:kv_cache_usage_perc"].values()))
    assert status["verdict"] == "healthy" and status["exit_code"] == 0


def _bench(served: Served) -> Bench:
    b = Bench("t", base_parser("t").parse_args(["--url", served.url, "--settle-ms", "10"]))
    b.model = served.model
    return b


def test_the_guard_conserves_tokens_on_real_counters_and_catches_a_foreign_request(served):
    """A clean wave: every counter delta is exactly our requests' (acceptance too, from the
    per-request spec-decode metrics). Then a wave with a foreign 1-token request sent and
    finished between two samples (5 s apart): sampling cannot see it, conservation must."""
    b = _bench(served)
    cfg = GuardConfig(retries=1, interval_s=5.0, grace_s=0.3, backoff_s=0.1)
    msgs = [{"role": "user", "content": "repeat: alpha beta gamma alpha beta gamma " * 8}]

    def clean(tr: InFlightTracker):
        return b.stream(b.chat_payload(msgs, 64), tr)

    gp = run_guarded(b.endpoint, clean, cfg)
    assert gp.status == "ok" and gp.retries == 0, [a.reason for a in gp.attempts]
    assert gp.conservation.acceptance == "conserved", gp.conservation.to_json()
    m = request_metrics(gp.result)
    assert m["ok"], m["error"]

    tries: list[int] = []

    def polluted(tr: InFlightTracker):
        tries.append(1)
        res = b.stream(b.chat_payload(msgs, 64), tr)
        if len(tries) == 1:
            served.complete("a foreign client", 1)  # not ours: no tracker
        return res

    gp = run_guarded(b.endpoint, polluted, cfg)
    first = gp.attempts[0]
    assert not first.clean and first.reason.startswith("conservation: "), first.reason
    assert all(
        s["running"] + (s["waiting"] or 0) <= s["ours"] for s in first.to_json()["guard_samples"]
    )
    assert gp.status == "ok" and gp.retries == 1


def test_vllm_bench_serve_agrees_with_our_bench_on_the_real_engine(served, tmp_path):
    """vLLM 0.33's own client and ours, same prompts, one at a time, greedy: the same
    acceptance length exactly (same tokens, same drafts) and the same token counts. Each
    client sends its own `cache_salt` (vLLM's per-request prefix-cache namespace), so the
    second gets no prefix-cache hits on the first one's prompts.

    Timings are held to the server's own figures over each client's window, never to the
    other client's: the two waves run one after the other, and on a loaded CI box the
    engine itself changed speed between them (vLLM's client read a median TPOT of 46 ms,
    ours 10 ms, an hour of CI lost to a 3x bound between the clients). Each client's mean
    TTFT and mean E2E latency hold the server's (vllm:time_to_first_token_seconds and
    vllm:e2e_request_latency_seconds: the server stamps arrival after the client sent and
    each token before the client read it), and each client's mean TPOT equals the
    server's vllm:request_time_per_output_token_seconds (vllm/v1/metrics/stats.py: decode
    time / (tokens - 1), the definition both clients use) within half of it plus the
    client's measured delivery lag spread over the tokens. Measured: the two agreed
    within 0.1 ms idle and 0.8 ms beside three busy loops; a client reporting inter-token
    latency (one event carries ~4.8 tokens here) would read 2.6x the server's."""
    from tests.test_bench_vllm_client import same_prompts

    n, out = 8, 24
    argv = [
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        served.url,
        "--model",
        served.model,
        "--tokenizer",
        str(pairenv.tokenizer_dir()),
        "--dataset-name",
        "random",
        "--random-input-len",
        "60",
        "--random-output-len",
        str(out),
        "--seed",
        "11",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        "1",
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "r.json",
        "--extra-body",
        '{"cache_salt": "vllm-bench-serve"}',
    ]
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", *argv]
    before = samples(served.metrics())
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    between = samples(served.metrics())
    theirs = json.loads((tmp_path / "r.json").read_text())
    assert theirs["completed"] == n and theirs["total_output_tokens"] == n * out
    b = _bench(served)
    texts = same_prompts(argv)

    def payload(text: str) -> dict:
        return {**b.chat_payload([{"role": "user", "content": text}], out), "cache_salt": "ours"}

    def wave(tr: InFlightTracker):
        return [b.stream(payload(t), tr) for t in texts]

    gp = run_guarded(b.endpoint, wave, GuardConfig(retries=1, interval_s=0.5, grace_s=0.3))
    assert gp.status == "ok", gp.reason
    after = samples(served.metrics())
    ms = [request_metrics(r) for r in gp.result]
    assert sum(r.completion_tokens for r in gp.result) == n * out
    mine = {
        "mean_ttft_ms": statistics.mean(m["ttft_ms"] for m in ms),
        "median_ttft_ms": statistics.median(m["ttft_ms"] for m in ms),
        # a request whose tokens all came in one event (the API server coalesces outputs
        # when it lags) has no TPOT of ours (None: its last token came with its first);
        # by our definition, (last - first) / (n - 1), that is 0 ms, and vllm bench serve
        # counts such a request too (vllm/benchmarks/serve.py, calculate_metrics)
        "median_tpot_ms": statistics.median(m["tpot_ms"] or 0.0 for m in ms),
        "mean_tpot_ms": statistics.mean(m["tpot_ms"] or 0.0 for m in ms),
        "mean_e2el_ms": statistics.mean(m["latency_ms"] for m in ms),
    }
    print(
        f"\nvllm bench serve vs ours: ttft {theirs['median_ttft_ms']:.1f} vs "
        f"{mine['median_ttft_ms']:.1f} ms, tpot {theirs['median_tpot_ms']:.2f} vs "
        f"{mine['median_tpot_ms']:.2f} ms (means {theirs['mean_tpot_ms']:.2f} vs "
        f"{mine['mean_tpot_ms']:.2f}), acceptance {theirs['spec_decode_acceptance_length']}"
        f" vs {gp.deltas['mean_accept_len']}"
    )
    assert gp.deltas["mean_accept_len"] == pytest.approx(
        theirs["spec_decode_acceptance_length"], rel=1e-6
    )
    for client, a, b_ in ((theirs, before, between), (mine, between, after)):

        def server_mean_ms(name: str, a=a, b_=b_) -> float:
            count = total(b_, f"{name}_count") - total(a, f"{name}_count")
            assert count == n, (name, count)
            return 1000 * (total(b_, f"{name}_sum") - total(a, f"{name}_sum")) / count

        ttft = server_mean_ms("vllm:time_to_first_token_seconds")
        e2e = server_mean_ms("vllm:e2e_request_latency_seconds")
        tpot = server_mean_ms("vllm:request_time_per_output_token_seconds")
        assert client["mean_ttft_ms"] >= ttft
        assert client["mean_e2el_ms"] >= e2e
        lag_ms = (client["mean_ttft_ms"] - ttft) + (client["mean_e2el_ms"] - e2e)
        assert abs(client["mean_tpot_ms"] - tpot) <= 0.5 * tpot + lag_ms / (out - 1), (
            client["mean_tpot_ms"],
            tpot,
            lag_ms,
        )


def _connections(host: hosts.Host) -> list[tuple[str, str]]:
    """(local, peer) of the host's established TCP connections."""
    res = host.run(["ss", "-Htn", "state", "established"])
    assert res.returncode == 0, res.stderr
    return [(ln.split()[-2], ln.split()[-1]) for ln in res.stdout.splitlines() if ln.strip()]


def test_the_real_ranks_talk_over_the_fabric_only(served):
    """Two kinds of address with the real engine: every connection between the two hosts
    (gloo's pairs, vLLM's message queues; the store on the master port is closed once the
    group is up) runs between FABRIC1 and FABRIC2; the ssh network carries only ssh and
    the clients."""
    h1, h2 = served.pair.h1, served.pair.h2
    between = [
        (lo, pe) for lo, pe in _connections(h1) if pe.rsplit(":", 1)[0] in (h2.ip, h2.fabric_ip)
    ]
    engine = [c for c in between if not c[1].endswith(":22")]
    assert engine, between
    assert all(
        lo.startswith(f"{h1.fabric_ip}:") and pe.startswith(f"{h2.fabric_ip}:") for lo, pe in engine
    ), engine


def test_down_leaves_no_process_no_container_and_no_shm_segment(served):
    """Last: `down` (docker rm -f of both ranks, i.e. SIGKILL of the engines). The ranks'
    private /dev/shm goes with them: no new segment appears in the machine's /dev/shm."""
    res = served.launch("down", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    for host in served.pair.hosts:
        assert host.docker("ps", "-a", "-q").stdout.strip() == ""
        assert host.process_cmdlines() == [], host.process_cmdlines()
    # other engines on this machine (another test's, a developer's) hold their segments
    # while they run; ours are the new ones no living process holds
    leaked = leaks.new_engine_segments(served.shm_before)
    assert not leaked, leaked
    print(f"\nreal pair: boot {served.boot_s:.1f} s (preflight included)")
