"""The acceptance probe's measurement: one fixed prompt, asked greedy, and how its own drafts
were accepted at each position.

Live acceptance is a property of the traffic as much as of the draft (prose ~2 tokens a
verify step, code ~4.5, tool calls an easy first token and harder later ones), so no band
recorded from traffic can tell a broken draft from traffic of another shape. The probe asks
the same few prompts (``probe_prompts.json``: prose, code, an agent's JSON) every time,
greedy (temperature 0) in chat mode, so the text the draft must guess is the same each time
and only the draft (or the engine under it) can move its acceptance.

Per request, from whichever the server gives:

- **per request** (``PER_REQUEST``): vLLM 0.33 started with
  ``--per-request-spec-decode-metrics summary|detailed`` puts
  ``metrics.speculative_decoding.acceptance_histogram`` in the response
  (vllm/entrypoints/generate/base/serving.py ``build_spec_decoding_metrics``,
  vllm/v1/metrics/stats.py ``RequestSpecDecodeMetrics``): entry ``j`` counts this request's
  verify steps that accepted exactly ``j`` draft tokens. Exact whatever else the pair serves.
- **by difference** (``BY_DIFFERENCE``): without it, the pair's /metrics counters
  ``vllm:spec_decode_num_drafts`` and ``..._num_accepted_tokens_per_pos`` read before and
  after the request (vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``). That is the probe's
  alone only when nothing else ran meanwhile: it is asked only when /metrics shows no request
  running or waiting, and kept only when ``vllm:generation_tokens`` grew by exactly the
  reply's ``completion_tokens`` (every draft belongs to a decode step, which generates a
  token, so another request's drafts would have shown as more tokens). Otherwise the
  measurement is dropped (``BUSY``), never judged.

Both give ``A_k``, the verify steps whose first ``k + 1`` drafts were accepted (the
per-position counter's meaning, ``observe_draft`` in vllm/v1/spec_decode/metrics.py), over
``drafts`` verify steps; ``A_k / drafts`` is what vLLM logs as per-position acceptance.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from pairctl.status.metrics import (
    ACCEPTED_PER_POS,
    DRAFTS,
    GENERATION,
    RUNNING,
    WAITING,
    Scrape,
)

# Package data (pyproject package-data), read from the installed package, not the clone.
PROBE_PROMPTS = Path(str(files("pairctl.sentinel") / "probe_prompts.json"))
PER_REQUEST, BY_DIFFERENCE = "per-request", "by-difference"
BUSY, NO_SPEC, FEW_DRAFTS, ERROR = "busy", "no-spec", "few-drafts", "error"
# /metrics families the probe reads (parse keeps only these lines).
FAMILIES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "vllm:generation_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
SETTLE_S = 5.0  # how long the counters may take to show the reply's last step
SETTLE_POLL_S = 0.2


class ProbeSetError(ValueError):
    """A probe prompts file that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class ProbePrompt:
    name: str
    kind: str  # prose | code | agent: what kind of text it makes the draft guess
    prompt: str


@dataclass(frozen=True)
class ProbeSet:
    prompts: tuple[ProbePrompt, ...]
    max_tokens: int
    min_drafts: int  # fewer verify steps than this: the reading is too small to judge
    source: str  # the file's name, recorded with the record

    def names(self) -> list[str]:
        return [p.name for p in self.prompts]


def load_set(path: str | Path = PROBE_PROMPTS) -> ProbeSet:
    """The probe prompts file, checked before any request."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        prompts = tuple(
            ProbePrompt(str(x["name"]), str(x["kind"]), str(x["prompt"])) for x in doc["prompts"]
        )
        out = ProbeSet(prompts, int(doc["max_tokens"]), int(doc["min_drafts"]), p.name)
    except OSError as exc:
        raise ProbeSetError(f"cannot read {p}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeSetError(
            f'{p}: needs {{"max_tokens": N, "min_drafts": N, "prompts": [{{"name", "kind", '
            f'"prompt"}}, ...]}} ({exc})'
        ) from None
    names = out.names()
    if not prompts or len(set(names)) != len(names) or out.max_tokens < 1 or out.min_drafts < 1:
        raise ProbeSetError(f"{p}: prompts with distinct names, max_tokens and min_drafts >= 1")
    return out


@dataclass(frozen=True)
class Measurement:
    """One probe request's acceptance."""

    name: str
    drafts: int  # verify steps that drafted
    accepted: tuple[int, ...]  # A_k, k = 0 .. K-1
    tokens: int  # the reply's completion_tokens
    method: str  # PER_REQUEST | BY_DIFFERENCE
    seconds: float

    @property
    def per_pos(self) -> tuple[float, ...]:
        """P(position k accepted) = A_k / drafts."""
        return tuple(a / self.drafts if self.drafts else 0.0 for a in self.accepted)

    @property
    def mean_length(self) -> float:
        """Tokens per verify step, the bonus token included: 1 + sum(A_k) / drafts."""
        return 1.0 + (sum(self.accepted) / self.drafts if self.drafts else 0.0)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["per_pos"] = [round(x, 4) for x in self.per_pos]
        out["mean_length"] = round(self.mean_length, 4)
        return out


@dataclass(frozen=True)
class Skip:
    """A probe request that gave nothing to judge, and why (``reason``: BUSY, NO_SPEC,
    FEW_DRAFTS or ERROR)."""

    name: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def from_histogram(hist: list[int]) -> tuple[int, tuple[int, ...]]:
    """(drafts, A_k) of vLLM's per-request ``acceptance_histogram`` (entry j: verify steps
    that accepted exactly j drafts, j = 0..K): A_k = steps that accepted more than k."""
    drafts = sum(hist)
    return drafts, tuple(sum(hist[k + 1 :]) for k in range(len(hist) - 1))


def _per_pos(s: Scrape) -> dict[int, float]:
    return {int(k): v for k, v in s.by_label(ACCEPTED_PER_POS, "position").items()}


def busy(s: Scrape) -> str | None:
    """Why the pair is not idle (requests running or waiting), or None."""
    running, waiting = s.total(RUNNING) or 0.0, s.total(WAITING) or 0.0
    if running or waiting:
        return f"{running:.0f} request(s) running, {waiting:.0f} waiting"
    return None


@dataclass(frozen=True)
class Answer:
    """What a probe request brought back: its completion tokens and, if the server sends
    them, its per-request spec-decode metrics (``metrics.speculative_decoding``)."""

    tokens: int
    spec: dict[str, Any] | None


Ask = Callable[[ProbePrompt], "Answer | str"]  # an Answer, or why there is none


def measure(
    prompt: ProbePrompt,
    metrics: Callable[[], Scrape],
    ask: Ask,
    min_drafts: int,
    per_request: bool | None = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    settle_s: float = SETTLE_S,
) -> Measurement | Skip:
    """One probe request and its acceptance (see the module docstring).

    ``per_request``: whether the server sends per-request metrics: True, the probe need not
    wait for an idle pair; False, a busy pair is not asked; None (not known yet), a busy
    pair is asked once, and the reply says which. ``metrics`` reads /metrics, ``ask`` sends
    the prompt; their exceptions are the caller's.
    """
    before = metrics()
    if before.total(DRAFTS) is None:
        return Skip(prompt.name, NO_SPEC, "no vllm:spec_decode_* counters: drafting is off")
    why = None if per_request else busy(before)
    if why and per_request is False:
        return Skip(prompt.name, BUSY, f"the pair is busy ({why}): asked later")
    t0 = clock()
    answer = ask(prompt)
    if isinstance(answer, str):
        return Skip(prompt.name, ERROR, answer)
    took = round(clock() - t0, 3)
    hist = spec_histogram(answer)
    if hist is not None:
        drafts, accepted = from_histogram(hist)
        m = Measurement(prompt.name, drafts, accepted, answer.tokens, PER_REQUEST, took)
        return _checked(m, min_drafts)
    if why:
        return Skip(
            prompt.name,
            BUSY,
            f"the pair is busy ({why}) and the server sends no per-request spec-decode "
            "metrics: asked later",
        )
    return _by_difference(prompt, before, metrics, answer, took, min_drafts, clock, sleep, settle_s)


def spec_histogram(answer: Answer) -> list[int] | None:
    """The reply's ``metrics.speculative_decoding.acceptance_histogram``, if it has one."""
    hist = (answer.spec or {}).get("acceptance_histogram")
    if isinstance(hist, list) and hist and all(isinstance(x, int) for x in hist):
        return hist
    return None


def _by_difference(
    prompt: ProbePrompt,
    before: Scrape,
    metrics: Callable[[], Scrape],
    answer: Answer,
    took: float,
    min_drafts: int,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    settle_s: float,
) -> Measurement | Skip:
    """The counters' increase over the request, kept only when it is the request's alone."""
    gen0, drafts0, pos0 = (
        before.total(GENERATION) or 0.0,
        before.total(DRAFTS) or 0.0,
        _per_pos(before),
    )
    deadline = clock() + settle_s
    while True:
        after = metrics()
        gen, drafts = (
            (after.total(GENERATION) or 0.0) - gen0,
            (after.total(DRAFTS) or 0.0) - drafts0,
        )
        if gen < 0 or drafts < 0:
            return Skip(prompt.name, ERROR, "the counters went down: the server restarted")
        if gen > answer.tokens:
            return Skip(
                prompt.name,
                BUSY,
                f"other requests generated {gen - answer.tokens:.0f} token(s) during the probe: "
                "its drafts are not its own, not judged",
            )
        if gen == answer.tokens and (busy(after) is None or clock() >= deadline):
            break
        if clock() >= deadline:
            return Skip(
                prompt.name,
                ERROR,
                f"/metrics counted {gen:.0f} of the reply's {answer.tokens} tokens after "
                f"{settle_s:g} s",
            )
        sleep(SETTLE_POLL_S)
    pos = _per_pos(after)
    accepted = tuple(round(pos[k] - pos0.get(k, 0.0)) for k in sorted(pos))
    m = Measurement(prompt.name, round(drafts), accepted, answer.tokens, BY_DIFFERENCE, took)
    return _checked(m, min_drafts)


def _checked(m: Measurement, min_drafts: int) -> Measurement | Skip:
    if m.drafts < min_drafts:
        return Skip(
            m.name,
            FEW_DRAFTS,
            f"{m.drafts} verify step(s) drafted ({m.tokens} tokens): fewer than the "
            f"{min_drafts} a reading needs",
        )
    return m
