"""Quality gate: 5 greedy prompts with exact-answer checks; exit non-zero on any failure.

Covers arithmetic, a fact, code output, counting and strict JSON (prompts and answers live in
quality_ref_dspark.json beside this script). Requests are non-streamed, temperature 0, fixed
max_tokens, thinking off (DSV4's chat mode) so the answer is the whole reply. A timeout, a non-200,
a malformed response body and a wrong answer each fail the prompt, and the failure names it.
Run it after any change; the launcher runs it as its post-`up` gate (launcher exit 6 on failure).

Exit codes: 0 all prompts passed; 1 at least one failed (or the endpoint is unreachable);
2 usage error.

Example: python -m bench.quality_ref_dspark --url http://HOST:8000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from bench.benchlib import argtypes, endpoint

DEFAULT_PROMPTS = Path(__file__).resolve().with_name("quality_ref_dspark.json")


def normalise(text: str) -> str:
    """Forgive only whitespace, a trailing full stop, and inline-code backticks around the reply."""
    t = text.strip()
    if len(t) > 1 and t.startswith("`") and t.endswith("`") and "\n" not in t:
        t = t.strip("`").strip()
    return t[:-1].rstrip() if t.endswith(".") else t


def check(spec: dict[str, Any], content: str) -> str | None:
    """None if the reply is right, else why not."""
    if spec["check"] == "json":
        try:
            got = json.loads(content.strip())
        except ValueError:
            return f"reply is not strict JSON: {content[:120]!r}"
        want = json.loads(spec["answer"])
        return None if got == want else f"expected JSON {want}, got {got}"
    if normalise(content) == spec["answer"]:
        return None
    return f"expected {spec['answer']!r}, got {content[:120]!r}"


def ask(
    session: requests.Session,
    url: str,
    model: str,
    spec: dict[str, Any],
    max_tokens: int,
    thinking: bool,
    timeout_s: float,
) -> tuple[str | None, str | None]:
    """(content, error) for one prompt; every transport/protocol failure becomes an error text."""
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": spec["prompt"]}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "stream": False,
        "chat_template_kwargs": {"thinking": thinking},
    }
    try:
        r = session.post(url + "/v1/chat/completions", json=payload, timeout=timeout_s)
    except requests.Timeout:
        return None, f"timeout after {timeout_s:g}s"
    except requests.RequestException as e:
        return None, f"request to {url}/v1/chat/completions failed: {endpoint.cause(e)}"
    if r.status_code != 200:
        return None, f"HTTP {r.status_code}: {r.text[:200]}"
    try:
        doc = r.json()
        content = doc["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, f"malformed response JSON: {r.text[:200]!r}"
    if not isinstance(content, str) or not content.strip():
        return None, "empty reply (no content)"
    return content, None


def load_reference(path: str) -> dict[str, Any]:
    """The reference prompts file, checked before any request (argparse type: exit 2)."""
    shape = (
        'needs {"max_tokens": N, "prompts": [{"name", "prompt", "answer", '
        '"check": "exact"|"json"}, ...]}'
    )
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{path} is not valid JSON ({e})") from None
    prompts = doc.get("prompts") if isinstance(doc, dict) else None
    ok = (
        isinstance(prompts, list)
        and prompts
        and isinstance(doc.get("max_tokens"), int)
        and doc["max_tokens"] >= 1
        and all(
            isinstance(p, dict)
            and all(isinstance(p.get(k), str) for k in ("name", "prompt", "answer"))
            and p.get("check") in ("exact", "json")
            for p in prompts
        )
    )
    if not ok:
        raise argparse.ArgumentTypeError(f"{path} {shape}")
    return doc


load_reference.__name__ = "reference prompts file"


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        type=endpoint.url_arg(("http", "https")),
        default="http://127.0.0.1:8000",
        help="the server's base URL; HOST:PORT and a trailing /v1 are accepted",
    )
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token")
    p.add_argument(
        "--session-id",
        default=None,
        help="send X-Session-ID: ID with every request (a router with session affinity then "
        "sends the whole gate to one pair)",
    )
    p.add_argument(
        "--prompts",
        type=load_reference,
        default=str(DEFAULT_PROMPTS),
        help="reference prompts JSON",
    )
    p.add_argument(
        "--timeout-s", type=argtypes.positive_float, default=120, help="per-prompt timeout"
    )
    p.add_argument(
        "--ready-timeout-s",
        type=argtypes.positive_float,
        default=30,
        help="wait this long for /v1/models (progress on stderr)",
    )
    p.add_argument(
        "--max-tokens",
        type=argtypes.positive_int,
        default=None,
        help="override the file's max_tokens",
    )
    p.add_argument("--thinking", action="store_true", help="render in thinking mode")
    p.add_argument(
        "--json",
        dest="json_path",
        type=argtypes.output_file,
        default=None,
        help="write verdicts JSON here (its directory must exist)",
    )


@dataclass
class Verdict:
    """One prompt's outcome; `error` says why it failed (None when it passed)."""

    name: str
    passed: bool
    error: str | None
    reply: str | None
    seconds: float


@dataclass
class GateResult:
    """Every prompt's verdict, and what the gate concludes from them."""

    url: str
    model: str
    max_tokens: int
    thinking: bool
    verdicts: list[Verdict]
    identity: endpoint.Identity | None = None

    @property
    def failed(self) -> list[str]:
        return [v.name for v in self.verdicts if not v.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "url": self.url,
            "model": self.model,
            "simulator": bool(self.identity and self.identity.simulator),
            "endpoint": None if self.identity is None else self.identity.to_json(),
            "max_tokens": self.max_tokens,
            "thinking": self.thinking,
            "passed": not self.failed,
            "verdicts": [asdict(v) for v in self.verdicts],
        }


def run_gate(
    s: requests.Session,
    url: str,
    model: str,
    ref: dict[str, Any],
    max_tokens: int,
    args: argparse.Namespace,
) -> list[Verdict]:
    """Ask every reference prompt in turn, printing PASS/FAIL as each verdict comes in."""
    verdicts = []
    for spec in ref["prompts"]:
        t0 = time.monotonic()
        content, err = ask(s, url, model, spec, max_tokens, args.thinking, args.timeout_s)
        if err is None:
            err = check(spec, content or "")
        verdicts.append(
            Verdict(spec["name"], err is None, err, content, round(time.monotonic() - t0, 3))
        )
        print(f"{'PASS' if err is None else 'FAIL'} {spec['name']}" + (f": {err}" if err else ""))
    return verdicts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Exit codes: 0 all passed; 1 a prompt failed or endpoint unreachable; 2 usage.",
    )
    add_cli_args(p)
    return p.parse_args(argv)


def gate_max_tokens(ref: dict[str, Any], args: argparse.Namespace) -> int:
    """--max-tokens, else the file's; thinking mode needs room for the reasoning first."""
    n = args.max_tokens or int(ref["max_tokens"])
    return max(n, 4096) if args.thinking and args.max_tokens is None else n


def print_summary(result: GateResult) -> None:
    n, failed = len(result.verdicts), result.failed
    print(
        f"quality gate: {n - len(failed)}/{n} passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if result.identity is not None and result.identity.simulator:
        print(
            "endpoint: SPARK-TWIN SIMULATOR ("
            + ", ".join(result.identity.evidence)
            + "): it serves the reference answers from its profile, so a pass here says "
            "nothing about a model"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ref = args.prompts
    max_tokens = gate_max_tokens(ref, args)
    url = args.url
    s = requests.Session()
    if args.api_key:
        s.headers["Authorization"] = f"Bearer {args.api_key}"
    if args.session_id:
        s.headers["X-Session-ID"] = args.session_id
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        ident = endpoint.wait_ready(s, url, args.ready_timeout_s, log)
    except endpoint.NotReady as e:
        print(f"FAIL endpoint: {e}")
        return 1
    model = args.model if args.model is not None else ident.model
    verdicts = run_gate(s, url, model, ref, max_tokens, args)
    result = GateResult(url, model, max_tokens, args.thinking, verdicts, ident)
    print_summary(result)
    if args.json_path:
        try:
            Path(args.json_path).write_text(json.dumps(result.to_json(), indent=1) + "\n")
        except OSError as e:
            print(f"FAIL writing --json {args.json_path}: {e.strerror or e}")
            return 1
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
