"""The post-up quality gate against this pair, with the pair's key and without a proxy.

The gate (``python -m bench.quality_ref_dspark``) reads the bearer token from
OPENAI_API_KEY, so the pair's VLLM_API_KEY travels there through the environment, never on
its command line; NO_PROXY names the endpoint's host so an HTTP(S)_PROXY of the operator's
shell is not put between the gate and the pair (requests honours NO_PROXY).
"""

from __future__ import annotations

import os
import subprocess
import sys

from pairctl.resolved import ResolvedPair


def gate_env(pair: ResolvedPair, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if pair.api_key:
        env["OPENAI_API_KEY"] = pair.api_key
    hosts = [h for h in (env.get("NO_PROXY") or env.get("no_proxy") or "").split(",") if h]
    env["NO_PROXY"] = env["no_proxy"] = ",".join([*hosts, pair.spark1])
    return env


def run_gate(pair: ResolvedPair) -> int:
    """Run the gate against the pair's endpoint; its exit code."""
    argv = [sys.executable, "-m", "bench.quality_ref_dspark", "--url", pair.endpoint]
    sys.stdout.flush()
    return subprocess.run(argv, env=gate_env(pair, dict(os.environ)), check=False).returncode
