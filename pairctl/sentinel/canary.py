"""The output canary: a few greedy short-answer prompts, and what is wrong with a bad reply.

A pair can keep a fast, healthy token stream while what it says has gone bad: a changed
image or flag garbles output (replacement characters, a token loop) or answers in another
language. ``watch`` asks the prompts of ``pairctl/gate/canary_dspark.json`` on a schedule
(``run``) and logs a bad reply as an event; it never restarts for one (a restart does not
fix a bad image, and a loop of restarts would hide the cause).

Asked and checked with the quality gate's own machinery (``pairctl.gate.check``: ``ask``,
``check``, ``load_reference``), thinking off, the answer read from ``content``. Each prompt
declares its tolerance (``pairctl.gate.match``: forgive markdown emphasis, punctuation,
case; accept any of; a regex): decoding is greedy, so a harmless rendering (``**Paris**``)
the match rejected would come back every run and never clear. A reply that fails the check
is then classified, the most specific kind first: ``garble`` (U+FFFD, control characters, a
repeated-unit loop), ``drift`` (its letters are in another script than the answer's), else
``wrong``. A prompt that could not be judged (timeout, HTTP error, unparsable body, a reply
that was all reasoning) is ``error``, and an error is an event like a wrong answer: a canary
that cannot ask is a canary that would miss the fault it is there for.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from pairctl.endpoint import Endpoint, NotReady, wait_ready
from pairctl.gate.check import Asker, check, load_reference
from pairctl.log import stamp

# Package data (pyproject package-data), read from the installed package, not the clone.
CANARY_PROMPTS = Path(str(files("pairctl.gate") / "canary_dspark.json"))
OK, WRONG, GARBLE, DRIFT, ERROR = "ok", "wrong", "garble", "drift", "error"
EVENT_KINDS = (WRONG, GARBLE, DRIFT, ERROR)
LOOP = re.compile(r"(.{1,16}?)\1{5,}", re.DOTALL)  # a unit repeated 6+ times in a row
LOOP_MIN_CHARS = 12
NONPRINT_MAX = 0.05  # more than this fraction of control/unassigned characters is garble
CJK_STOPS = "。．！"  # full stops a CJK answer may end with (the gate forgives only ".")


def script_of(ch: str) -> str | None:
    """The writing system of a letter (LATIN, CYRILLIC, HAN, ...); None for a non-letter."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0]
    return "HAN" if first in ("CJK", "IDEOGRAPHIC") else first or None


def dominant_script(text: str) -> str | None:
    """The script most of the letters are in; None when there are no letters."""
    counts = Counter(s for s in map(script_of, text) if s)
    return counts.most_common(1)[0][0] if counts else None


def garble(text: str) -> str | None:
    """Why a reply is garbled, or None."""
    if "\ufffd" in text:
        return "replacement characters (U+FFFD): bytes that are not text"
    bad = sum(
        1
        for ch in text
        if unicodedata.category(ch) in ("Cc", "Cn", "Co", "Cs") and ch not in "\n\t\r"
    )
    if text and bad / len(text) > NONPRINT_MAX:
        return f"{100 * bad / len(text):.0f}% non-printable characters"
    m = LOOP.search(text)
    if m and len(m.group(0)) >= LOOP_MIN_CHARS:
        return f"a loop: {m.group(1)!r} repeated {len(m.group(0)) // len(m.group(1))} times"
    return None


def classify(spec: dict[str, Any], reply: str) -> tuple[str, str | None]:
    """(kind, why) of one reply: ok, garble, drift or wrong."""
    text = reply.strip().rstrip(CJK_STOPS)
    wrong = check(spec, text)
    if wrong is None:
        return OK, None
    g = garble(reply)
    if g:
        return GARBLE, g
    want = spec.get("script") or dominant_script(spec["answer"])
    got = dominant_script(reply)
    if want and got and got != want:
        return DRIFT, f"answered in {got} script, expected {want}: {reply[:80]!r}"
    return WRONG, wrong


@dataclass(frozen=True)
class CanaryVerdict:
    name: str
    kind: str  # ok | wrong | garble | drift | error
    detail: str | None
    reply: str | None
    seconds: float


@dataclass(frozen=True)
class CanaryResult:
    """One run of the canary set."""

    at: str  # UTC, RFC 3339
    verdicts: list[CanaryVerdict] = field(default_factory=list)

    @property
    def events(self) -> list[CanaryVerdict]:
        """Every verdict that is not ok: wrong, garbled, drifted, or not judged (error)."""
        return [v for v in self.verdicts if v.kind in EVENT_KINDS]

    @property
    def errors(self) -> list[CanaryVerdict]:
        return [v for v in self.verdicts if v.kind == ERROR]

    def summary(self) -> str:
        n = len(self.verdicts)
        right = sum(v.kind == OK for v in self.verdicts)
        return f"canary: {right}/{n} right" + (
            "; "
            + "; ".join(
                f"{v.kind.upper()} {v.name}: {v.detail}" for v in self.verdicts if v.kind != OK
            )
            if right < n
            else ""
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "passed": not self.events,
            "events": [v.name for v in self.events],
            "verdicts": [asdict(v) for v in self.verdicts],
        }


Ask = Callable[[dict[str, Any]], tuple[str | None, str | None]]


def run(ask_one: Ask, ref: dict[str, Any]) -> CanaryResult:
    """Ask every canary prompt once (``ask_one`` is the gate's ``ask`` bound to a session)."""
    at = stamp()
    out = []
    for spec in ref["prompts"]:
        t0 = time.monotonic()
        content, err = ask_one(spec)
        took = round(time.monotonic() - t0, 3)
        if err is not None:
            out.append(CanaryVerdict(spec["name"], ERROR, err, content, took))
            continue
        kind, why = classify(spec, content or "")
        out.append(CanaryVerdict(spec["name"], kind, why, content, took))
    return CanaryResult(at, out)


def run_against(
    endpoint: Endpoint, ref: dict[str, Any] | None = None, timeout_s: float = 30.0
) -> CanaryResult:
    """The canary against a pair's endpoint: its key in the headers, no proxy, the first
    model of /v1/models, greedy and thinking off at the file's max_tokens."""
    ref = ref if ref is not None else load_reference(str(CANARY_PROMPTS))
    s = endpoint.session(trust_env=False)
    try:
        key_from = "VLLM_API_KEY in the env file"
        model = wait_ready(s, endpoint, timeout_s, lambda _m: None, key_from=key_from).model
    except NotReady as exc:
        at = stamp()
        return CanaryResult(
            at, [CanaryVerdict(p["name"], ERROR, str(exc), None, 0.0) for p in ref["prompts"]]
        )
    max_tokens = int(ref["max_tokens"])
    return run(Asker(s, endpoint, model, max_tokens, False, timeout_s).ask, ref)


def failed_run(exc: BaseException) -> CanaryResult:
    """A canary run that raised: one ERROR verdict, so it is an event and not a log line."""
    at = stamp()
    why = f"the canary could not run ({type(exc).__name__}: {exc})"
    return CanaryResult(at, [CanaryVerdict("canary", ERROR, why, None, 0.0)])
