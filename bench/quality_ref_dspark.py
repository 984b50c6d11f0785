#!/usr/bin/env python3
"""Quality gate: 5 greedy prompts with exact-answer checks; exit non-zero on any failure.

Covers arithmetic, a fact, code output, counting and strict JSON (prompts and answers live in
quality_ref_dspark.json beside this script). Requests are non-streamed, temperature 0, fixed
max_tokens, thinking off (DSV4's chat mode) so the answer is the whole reply. A timeout, a non-200,
a malformed response body and a wrong answer each fail the prompt, and the failure names it.
Run it after any change; the launcher runs it as its post-`up` gate (launcher exit 6 on failure).

Exit codes: 0 all prompts passed; 1 at least one failed (or the endpoint is unreachable);
2 usage error.

Example: python3 bench/quality_ref_dspark.py --url http://HOST:8000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests

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
        return None, f"request failed: {e}"
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Exit codes: 0 all passed; 1 a prompt failed or endpoint unreachable; 2 usage.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="OpenAI-compatible endpoint")
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="reference prompts JSON")
    p.add_argument("--timeout-s", type=float, default=120, help="per-prompt timeout")
    p.add_argument("--max-tokens", type=int, default=None, help="override the file's max_tokens")
    p.add_argument("--thinking", action="store_true", help="render in thinking mode")
    p.add_argument("--json", dest="json_path", default=None, help="write verdicts JSON here")
    args = p.parse_args(argv)
    ref = json.loads(Path(args.prompts).read_text())
    max_tokens = args.max_tokens or int(ref["max_tokens"])
    if args.thinking and args.max_tokens is None:
        max_tokens = max(max_tokens, 4096)  # reasoning comes first and needs room
    url = args.url.rstrip("/")
    s = requests.Session()
    if args.api_key:
        s.headers["Authorization"] = f"Bearer {args.api_key}"

    model = args.model
    if model is None:
        try:
            r = s.get(url + "/v1/models", timeout=min(args.timeout_s, 30))
            model = r.json()["data"][0]["id"]
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"FAIL endpoint: cannot list models at {url}/v1/models: {e}")
            return 1

    verdicts = []
    for spec in ref["prompts"]:
        t0 = time.monotonic()
        content, err = ask(s, url, model, spec, max_tokens, args.thinking, args.timeout_s)
        if err is None:
            err = check(spec, content or "")
        verdicts.append(
            {
                "name": spec["name"],
                "passed": err is None,
                "error": err,
                "reply": content,
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
        print(f"{'PASS' if err is None else 'FAIL'} {spec['name']}" + (f": {err}" if err else ""))
    failed = [v["name"] for v in verdicts if not v["passed"]]
    print(
        f"quality gate: {len(verdicts) - len(failed)}/{len(verdicts)} passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if args.json_path:
        doc = {
            "schema_version": 1,
            "url": url,
            "model": model,
            "max_tokens": max_tokens,
            "thinking": args.thinking,
            "passed": not failed,
            "verdicts": verdicts,
        }
        Path(args.json_path).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
