"""Prompts of a known token length built from real-looking English prose.

Why not "hello hello hello…": repeated tokens tokenize unlike real text (BPE merges them), which
makes the requested depth wrong, and can make speculative decoding unrealistically easy. We write
varied sentences from a small grammar and calibrate the length against the server's own
POST /tokenize (chat template included), so "16k" means 16k prompt tokens to the engine.
Each request starts with a fresh nonce so the prefix cache cannot serve it from an earlier one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import requests

from pairctl.endpoint import Endpoint

_ADJ = (
    "quiet old bright narrow distant careful patient heavy gentle rapid hidden northern "
    "wooden silver broken early late steady simple curious ancient modern open crowded"
).split()
_NOUN = (
    "river village engineer harbor library garden market teacher bridge valley orchard "
    "station journal council workshop mountain letter window festival kitchen ledger road "
    "lantern farmer museum signal forest island chapter merchant"
).split()
_VERB = (
    "crossed repaired described followed measured visited carried opened studied painted "
    "recorded built noticed questioned watched restored borrowed planted explained guarded"
).split()
_PREP = "near beyond behind across under beside toward through after before".split()
_ADV = "slowly quietly eventually rarely often carefully suddenly patiently briefly".split()
_TEMPLATES = (
    "The {a} {n} {v} the {a2} {n2} {p} the {n3}.",
    "Every {n} in the {a} {n2} {v} {d}, and nobody asked why.",
    "By evening the {n} had {v} the {n2}, {p} the {a} {n3}.",
    "She {v} a {a} {n} while the {n2} waited {p} the {n3}.",
    "In the {a} season, the {n} {d} {v} the {n2} of the {n3}.",
    "Records from the {n} show that the {a} {n2} was {v} {d}.",
)


def prose(n_words: int, seed: int = 0) -> str:
    """About n_words of deterministic, varied English, in paragraphs."""
    rng = random.Random(seed)
    out: list[str] = []
    words = 0
    sentences = 0
    while words < n_words:
        t = rng.choice(_TEMPLATES).format(
            a=rng.choice(_ADJ),
            a2=rng.choice(_ADJ),
            n=rng.choice(_NOUN),
            n2=rng.choice(_NOUN),
            n3=rng.choice(_NOUN),
            v=rng.choice(_VERB),
            p=rng.choice(_PREP),
            d=rng.choice(_ADV),
        )
        out.append(t)
        words += t.count(" ") + 1
        sentences += 1
        if sentences % rng.randint(4, 8) == 0:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n").strip()


_SYSRAND = random.SystemRandom()


def nonce(rng: random.Random | None = None) -> str:
    """A fixed-width tag that makes each prompt unique (defeats prefix caching).

    Drawn from the OS, not from the seeded rng: a rerun with the same --seed must not find its
    prompts in the server's prefix cache from the previous run. (rng is accepted and ignored.)
    """
    return f"[ref {_SYSRAND.randrange(10**8):08d}] "


def messages_for(text: str, tag: str = "", instruction: str = "") -> list[dict[str, str]]:
    ask = instruction or "Summarize the notes above in a few sentences."
    return [{"role": "user", "content": f"{tag}{text}\n\n{ask}"}]


def count_tokens(
    session: requests.Session, endpoint: Endpoint, model: str, messages: list[dict[str, Any]]
) -> int | None:
    """Prompt tokens as the server renders and tokenizes the chat; None if /tokenize is missing."""
    try:
        r = session.post(
            endpoint.url("/tokenize"),
            json={"model": model, "messages": messages},
            timeout=120,
        )
        if r.status_code != 200:
            return None
        return int(r.json()["count"])
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None


def calibrated_text(
    target_tokens: int,
    counter: Callable[[str], int | None],
    seed: int = 0,
    tol: float = 0.005,
) -> tuple[str, int | None]:
    """Prose whose rendered chat length is within tol of target_tokens: (text, measured count).

    Secant-style iteration on the word count; falls back to ~1.3 tokens/word when the server
    cannot count (then the measured count is None and usage.prompt_tokens is the only truth).
    """
    n_words = max(1, int(target_tokens / 1.3))
    measured = counter(prose(n_words, seed))
    if measured is None:
        return prose(n_words, seed), None
    for _ in range(8):
        if abs(measured - target_tokens) <= max(2, tol * target_tokens):
            break
        per_word = measured / n_words if n_words else 1.3
        n_words = max(1, n_words + int(round((target_tokens - measured) / max(per_word, 0.1))))
        measured = counter(prose(n_words, seed))
        if measured is None:
            break
    return prose(n_words, seed), measured
