"""The quality gate: 5 greedy prompts with exact-answer checks against an endpoint.

It lives with operations because the launcher runs it after ``up`` (launcher exit 6 on a
failure) and pairctl imports nothing of bench; ``python -m bench.quality_ref_dspark`` and
``python -m pairctl.gate`` are its command lines (``pairctl.gate.cli``), ``run_gate`` its
in-process call, ``run_for_pair`` the call for a pair's own endpoint. What is asked and how
a reply is judged: ``pairctl.gate.check``.

Exit codes (``run_gate``'s return value, and the command line's): pairctl.contracts.GATE_EXITS
(``python -m pairctl contracts gate`` prints them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pairctl.contracts import GATE_EXITS, GATE_PROMPT_TIMEOUT_S, GATE_READY_TIMEOUT_S, codes
from pairctl.endpoint import KEY_FROM_FLAGS, Endpoint, NotReady, wait_ready
from pairctl.gate.check import (
    DEFAULT_PROMPTS,
    Asker,
    GateResult,
    Verdict,
    ask_all,
    check,
    load_reference,
    max_tokens_for,
    normalise,
    print_summary,
)
from pairctl.log import log

__all__ = [
    "DEFAULT_PROMPTS",
    "GateOptions",
    "GateResult",
    "Verdict",
    "check",
    "load_reference",
    "normalise",
    "run_for_pair",
    "run_gate",
]


EXIT_OK = codes(GATE_EXITS)["EXIT_OK"]
EXIT_FAIL = codes(GATE_EXITS)["EXIT_FAIL"]


@dataclass(frozen=True)
class GateOptions:
    """The gate's knobs, one per flag of its command line (same defaults)."""

    prompts: dict[str, Any] | None = None  # a loaded reference file; None: DEFAULT_PROMPTS
    model: str | None = None  # None: the first of /v1/models
    timeout_s: float = GATE_PROMPT_TIMEOUT_S  # per prompt
    ready_timeout_s: float = GATE_READY_TIMEOUT_S  # wait this long for /v1/models
    max_tokens: int | None = None  # None: the file's (4096 at least in thinking mode)
    thinking: bool = False
    json_path: str | None = None  # write the verdicts JSON here


def run_gate(
    endpoint: Endpoint,
    options: GateOptions | None = None,
    *,
    trust_env: bool = True,
    key_from: str = KEY_FROM_FLAGS,
) -> int:
    """Ask every prompt in this process; PASS/FAIL lines and the summary on stdout, waiting
    progress on stderr. Returns the exit code.

    The endpoint brings its key and X-Session-ID. ``trust_env=False`` keeps HTTP(S)_PROXY of
    the environment out of the way (a pair's own endpoint: ``run_for_pair``).
    """
    opts = options or GateOptions()
    ref = opts.prompts if opts.prompts is not None else load_reference(str(DEFAULT_PROMPTS))
    max_tokens = max_tokens_for(ref, opts.max_tokens, opts.thinking)
    s = endpoint.session(trust_env=trust_env)
    try:
        ident = wait_ready(s, endpoint, opts.ready_timeout_s, log, key_from=key_from)
    except NotReady as e:
        print(f"FAIL endpoint: {e}")
        return EXIT_FAIL
    model = opts.model if opts.model is not None else ident.model
    verdicts = ask_all(
        Asker(s, endpoint, model, max_tokens, opts.thinking, opts.timeout_s).ask, ref
    )
    result = GateResult(endpoint.base, model, max_tokens, opts.thinking, verdicts, ident)
    print_summary(result)
    if opts.json_path:
        try:
            Path(opts.json_path).write_text(json.dumps(result.to_json(), indent=1) + "\n")
        except OSError as e:
            print(f"FAIL writing --json {opts.json_path}: {e.strerror or e}")
            return EXIT_FAIL
    return EXIT_FAIL if result.failed else EXIT_OK


def run_for_pair(endpoint: Endpoint | str, api_key: str | None = None) -> int:
    """The post-``up`` gate against a pair's own endpoint, in this process.

    The key (the pair's VLLM_API_KEY) goes into the session's headers, never onto a command
    line or into an environment; an HTTP(S)_PROXY of the operator's shell is not put between
    the gate and the pair (the session does not read the environment).
    """
    ep = endpoint if isinstance(endpoint, Endpoint) else Endpoint.parse(endpoint)
    key_from = "VLLM_API_KEY in the env file"
    return run_gate(ep.with_auth(api_key or ep.api_key), trust_env=False, key_from=key_from)
