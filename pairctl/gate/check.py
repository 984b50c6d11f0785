"""What the quality gate asks and how it judges a reply.

Five greedy prompts with exact answers (quality_ref_dspark.json beside this module):
arithmetic, a fact, code output, counting and strict JSON. Requests are non-streamed,
temperature 0, fixed max_tokens, thinking off (DSV4's chat mode) so the answer is the whole
reply. The answer is read from ``content`` only (``pairctl.gate.reply``): in thinking mode
a real DSV4 puts its thinking in ``reasoning``, and a reply that is all reasoning fails
saying so. A timeout, a non-200, a malformed response body and a wrong answer each fail the
prompt, and the failure names it. A prompt may declare tolerant matching
(``pairctl.gate.match``: forgive emphasis, punctuation, case; accept any of; a regex).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pairctl.endpoint import Endpoint, Identity, cause
from pairctl.gate import match
from pairctl.gate.reply import Reply, from_body

if TYPE_CHECKING:
    import requests

DEFAULT_PROMPTS = Path(__file__).resolve().with_name("quality_ref_dspark.json")
CHAT_PATH = "/v1/chat/completions"


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
    if match.declared(spec):
        if match.matches(spec, content):
            return None
        return f"expected {match.expected(spec)}, got {content[:120]!r}"
    if normalise(content) == spec["answer"]:
        return None
    return f"expected {spec['answer']!r}, got {content[:120]!r}"


@dataclass(frozen=True)
class Asker:
    """What every prompt of one run shares (session, endpoint, model, request knobs), so
    each prompt is asked the same way; ``ask`` is what ``ask_all``/``run`` call per prompt."""

    session: requests.Session
    endpoint: Endpoint
    model: str
    max_tokens: int
    thinking: bool
    timeout_s: float

    def ask(self, spec: dict[str, Any]) -> tuple[str | None, str | None]:
        """(content, error) for one prompt; every transport/protocol failure becomes an error
        text, and so does a reply without an answer (all reasoning: it says how many tokens)."""
        reply, err = self.reply(spec)
        if reply is None:
            return None, err
        why = reply.no_answer()
        return (None, why) if why else (reply.content, None)

    def reply(self, spec: dict[str, Any]) -> tuple[Reply | None, str | None]:
        """(reply, None), or (None, error) when no reply body came back (transport, HTTP
        status, malformed JSON). ``thinking`` asks in DSV4's thinking mode
        (chat_template_kwargs)."""
        import requests

        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": spec["prompt"]}],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "stream": False,
            "chat_template_kwargs": {"thinking": self.thinking},
        }
        target = self.endpoint.url(CHAT_PATH)
        try:
            r = self.session.post(target, json=payload, timeout=self.timeout_s)
        except requests.Timeout:
            return None, f"timeout after {self.timeout_s:g}s"
        except requests.RequestException as e:
            return None, f"request to {target} failed: {cause(e)}"
        if r.status_code != 200:
            return None, f"HTTP {r.status_code}: {r.text[:200]}"
        try:
            return from_body(r.json()), None
        except (ValueError, KeyError, IndexError, TypeError):
            return None, f"malformed response JSON: {r.text[:200]!r}"


def load_reference(path: str) -> dict[str, Any]:
    """The reference prompts file, checked before any request (argparse type: exit 2)."""
    shape = (
        'needs {"max_tokens": N, "prompts": [{"name", "prompt", "answer", '
        '"check": "exact"|"json", optional "forgive", "accept", "regex"}, ...]}'
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
    for p in prompts:
        bad = match.problems(p)
        if bad:
            raise argparse.ArgumentTypeError(f"{path}: prompt {p['name']}: {'; '.join(bad)}")
    return doc


load_reference.__name__ = "reference prompts file"


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
    identity: Identity | None = None

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


def ask_all(
    ask_one: Callable[[dict[str, Any]], tuple[str | None, str | None]],
    ref: dict[str, Any],
) -> list[Verdict]:
    """Ask every reference prompt in turn, printing PASS/FAIL as each verdict comes in."""
    verdicts = []
    for spec in ref["prompts"]:
        t0 = time.monotonic()
        content, err = ask_one(spec)
        if err is None:
            err = check(spec, content or "")
        verdicts.append(
            Verdict(spec["name"], err is None, err, content, round(time.monotonic() - t0, 3))
        )
        print(f"{'PASS' if err is None else 'FAIL'} {spec['name']}" + (f": {err}" if err else ""))
    return verdicts


def max_tokens_for(ref: dict[str, Any], max_tokens: int | None, thinking: bool) -> int:
    """--max-tokens, else the file's; thinking mode needs room for the reasoning first."""
    n = max_tokens or int(ref["max_tokens"])
    return max(n, 4096) if thinking and max_tokens is None else n


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
