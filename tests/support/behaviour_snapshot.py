"""Record what the commands do, to prove a refactor changed nothing a user sees.

`python -m tests.support.behaviour_snapshot OUT_DIR` writes, one file per case:
- every `plan` (and `fleet plan`) output for the shipped env examples (pointed at loopback),
  with secrets, a container user and extra vLLM args set, and the usage error of a bad env;
- each bench script's `--json` result against the tests' mock server, normalised: every float
  and every clock-, path- or revision-valued field replaced by its type, so what remains is
  the structure, the counts, the statuses and the texts.
Run it before and after a change and `diff -r` the two folders; docs/testing.md says how the
pairctl reorganisation was checked with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.fakes.mock_openai import FAST_BENCH_FLAGS, MockConfig, MockServer

REPO = Path(__file__).resolve().parents[2]
VOLATILE = re.compile(
    r"(_ns|_ms|_s|_at|time|date|sha|git|path|url|host|pid|version|elapsed|request_id|_ids)$"
)
# lists whose length is the sampler's, not the run's: kept as their type only
SAMPLED = {"guard_samples", "samples", "request_ids"}


def _loopback_env(src: Path, dst: Path, extra: dict[str, str], first: int = 1) -> Path:
    text = src.read_text()
    text = re.sub(r"(?m)^SPARK1=.*$", f"SPARK1=127.0.0.{first}", text)
    text = re.sub(r"(?m)^SPARK2=.*$", f"SPARK2=127.0.0.{first + 1}", text)
    for key, value in extra.items():
        text = re.sub(rf"(?m)^{key}=.*$", "", text) + f"\n{key}={value}\n"
    dst.write_text(text)
    return dst


def _run(argv: list[str], cwd: Path) -> str:
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
    out = f"$ exit {p.returncode}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}"
    return out.replace(str(REPO), "<REPO>").replace(str(cwd), "<TMP>")


def plans(out: Path, tmp: Path) -> None:
    py = [sys.executable, "-m", "pairctl"]
    cases = {
        "example": (REPO / ".env.example", {}),
        "pair-a": (REPO / "pairs/pair-a.env.example", {}),
        "pair-b": (REPO / "pairs/pair-b.env.example", {}),
        "secrets": (
            REPO / ".env.example",
            {
                "HF_TOKEN": "hf_secret123",
                "VLLM_API_KEY": "sk-secret",
                "CONTAINER_USER": "1000:1000",
            },
        ),
        "fabric": (REPO / ".env.example", {"FABRIC1": "127.0.1.1", "FABRIC2": "127.0.1.2"}),
        "bad": (REPO / ".env.example", {"MASTER_PORT": "8000"}),
    }
    for name, (src, extra) in cases.items():
        env = _loopback_env(src, tmp / f"{name}.env", extra)
        for tag, args in {"": [], "-extra": ["--", "--max-num-seqs", "8"]}.items():
            text = _run([*py, "plan", "--env-file", str(env), *args], tmp)
            (out / f"plan-{name}{tag}.txt").write_text(text)
    fleet = tmp / "fleet.yaml"
    spec = (REPO / "pairs/fleet.yaml.example").read_text()
    spec = spec.replace("192.168.100.50", "127.0.0.50").replace("pairs/", str(tmp) + "/")
    fleet.write_text(spec)
    for first, ab in ((1, "a"), (3, "b")):
        src = REPO / f"pairs/pair-{ab}.env.example"
        _loopback_env(src, tmp / f"pair-{ab}.env", {}, first)
    (out / "fleet-plan.txt").write_text(
        _run([*py, "fleet", "plan", "--inventory", str(fleet)], tmp)
    )


def normalise(doc):
    """Structure, counts, statuses and texts survive; clocks, floats, paths do not."""
    if isinstance(doc, dict):
        return {
            k: (
                f"<{type(v).__name__}>"
                if k in SAMPLED or (VOLATILE.search(k) and not isinstance(v, dict | list))
                else normalise(v)
            )
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [normalise(v) for v in doc]
    if isinstance(doc, float):
        return "<float>"
    if isinstance(doc, str):
        return re.sub(r"http://127\.0\.0\.1:\d+", "<url>", doc.replace(str(REPO), "<REPO>"))
    return doc


# Runs long enough that no rate comes out null on a loaded box (a 16-token stream at 5 ms steps
# gave bench_conc a null aggregate one run in three): 20 ms steps, 64 tokens or more.
BENCHES = {
    "bench_ctx": ["--depths", "8k", "--max-tokens", "64", "--baseline-requests", "1"],
    "bench_conc": ["--concurrency", "1,2", "--max-tokens", "64"],
    "bench_interfere": ["--prefill-tokens", "4k", "--decode-tokens", "150", "--lead-ms", "400"],
    "chat_ttft_probe": ["--turns", "2", "--first-tokens", "1k", "--turn-tokens", "256"],
}
FAST = FAST_BENCH_FLAGS


def benches(out: Path, tmp: Path) -> None:
    cfg = MockConfig(ttft_s=0.02, step_s=0.02, prefill_tok_s=20_000, spec_metrics=True)
    with MockServer(cfg) as server:
        for name, args in BENCHES.items():
            res = tmp / f"{name}.json"
            argv = [sys.executable, "-m", f"bench.{name}", "--url", server.url, *args, *FAST]
            text = _run([*argv, "--json", str(res)], tmp).replace(server.url, "<url>")
            doc = None
            if res.exists():
                doc = normalise(json.loads(res.read_text().replace(str(tmp), "<TMP>")))
            # stdout tables carry timings: keep only the exit status and stderr's first words
            head = text.split("--- stdout")[0]
            (out / f"bench-{name}.json").write_text(
                json.dumps({"run": head, "result": doc}, indent=1, sort_keys=True) + "\n"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder to write the snapshot into (created)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = a.out / ".work"
    tmp.mkdir(exist_ok=True)
    plans(a.out, tmp)
    benches(a.out, tmp)
    print(f"snapshot written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
