"""Conversations through the router while one pair dies: who moved, what failed, how fast.

Each conversation is a client thread sending turn after turn (streamed, whole history each
time, its own X-Session-ID). `run` lets them settle on their pairs, kills one pair's head
mid-conversation, keeps talking until every conversation has had turns after the kill, and
reports:
- requests that were in flight on the killed pair when it died (lost; counted, expected);
- any other failed request, above all one sent after the kill (the router's job is to
  make these zero);
- which conversations changed pair (only the killed pair's may);
- how long until the router's own view (`/workers`) marked the pair unhealthy.
A failed turn is sent again (as a client would), so a conversation never skips a turn.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests


@dataclass
class Turn:
    """One request of a conversation, as the client saw it."""

    session: str
    n: int
    t0: float
    t1: float = 0.0
    pair: str | None = None
    ok: bool = False
    error: str = ""
    text: str = ""
    reasoning: str = ""


def one_turn(
    url: str, model: str, session: str, history: list[dict[str, str]], n: int, max_tokens: int
) -> Turn:
    """POST one streamed turn; never raises. `pair` is set as soon as headers arrive."""
    q = f"Turn {n} of conversation {session}: add one more idea to the list so far."
    body = {
        "model": model,
        "messages": [*history, {"role": "user", "content": q}],
        "max_tokens": max_tokens,
        "stream": True,
        # DSV4's chat mode: the answer (what goes into the history) comes at once; in
        # thinking mode, the default, a short max_tokens is all reasoning (in `reasoning`)
        "chat_template_kwargs": {"thinking": False},
    }
    t = Turn(session, n, time.monotonic())
    done = False
    try:
        with requests.post(
            f"{url}/v1/chat/completions",
            json=body,
            stream=True,
            timeout=60,
            headers={"X-Session-ID": session},
        ) as r:
            t.pair = r.headers.get("X-Spark-Pair")
            if r.status_code != 200:
                t.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return t
            for raw in r.iter_lines(decode_unicode=True):
                if not raw or not raw.startswith("data:"):
                    continue
                data = raw[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    t.error = f"stream error: {chunk['error']}"
                    return t
                for c in chunk.get("choices", []):
                    delta = c.get("delta") or {}
                    t.text += delta.get("content") or ""
                    t.reasoning += delta.get("reasoning") or ""
        t.ok = done and bool(t.text or t.reasoning)
        if not t.ok:
            t.error = "stream ended without [DONE]" if not done else "no text"
    except (requests.RequestException, ValueError) as exc:
        t.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        t.t1 = time.monotonic()
    return t


class Conversation:
    """A client thread: turns until told to stop; a failed turn is sent again."""

    def __init__(self, url: str, model: str, session: str, max_tokens: int) -> None:
        self.url, self.model, self.session, self.max_tokens = url, model, session, max_tokens
        self.history: list[dict[str, str]] = []
        self.turns: list[Turn] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def step(self) -> Turn:
        t = one_turn(
            self.url,
            self.model,
            self.session,
            self.history,
            len(self.history) // 2,
            self.max_tokens,
        )
        self.turns.append(t)
        if t.ok:
            q = f"Turn {t.n} of conversation {self.session}: add one more idea to the list so far."
            self.history += [
                {"role": "user", "content": q},
                {"role": "assistant", "content": t.text},
            ]
        return t

    def _loop(self) -> None:
        while not self.stop.is_set():
            t = self.step()
            if not t.ok:
                time.sleep(0.05)

    def ok_after(self, when: float) -> int:
        return sum(1 for t in self.turns if t.ok and t.t0 > when)


@dataclass
class Report:
    """What a failover run saw."""

    killed: str
    home: dict[str, str]
    turns: list[Turn]
    kill_at: float
    marked_down_s: float | None
    lost_in_flight: list[Turn] = field(default_factory=list)
    unexpected: list[Turn] = field(default_factory=list)
    moved: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"killed {self.killed} with {len(self.turns)} requests sent so far; sessions: "
            + ", ".join(f"{s}->{p}" for s, p in sorted(self.home.items())),
            "router marked it down after "
            + (f"{self.marked_down_s:.1f} s" if self.marked_down_s is not None else "NEVER"),
            f"client errors on requests in flight on {self.killed} when it died: "
            f"{len(self.lost_in_flight)}",
            "client errors on any other request (sent after the kill, or to the other pair): "
            f"{len(self.unexpected)}",
        ]
        for t in self.lost_in_flight + self.unexpected:
            out.append(f"  {t.session} turn {t.n} (pair {t.pair}): {t.error}")
        for s, pairs in sorted(self.moved.items()):
            out.append(f"  {s}: {self.home[s]} -> {', '.join(pairs)}")
        return out


def wait_marked_down(
    router_url: str, worker_url: str, since: float, limit_s: float
) -> float | None:
    """Seconds from `since` until the router's /workers counts `worker_url` unhealthy."""
    while time.monotonic() - since < limit_s:
        try:
            rows = requests.get(f"{router_url}/workers", timeout=2).json().get("workers", [])
            if any(w.get("url") == worker_url and not w.get("is_healthy") for w in rows):
                return time.monotonic() - since
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.1)
    return None


def settle(convs: list[Conversation], turns: int) -> dict[str, str]:
    """A few turns per conversation (all in parallel); each must stay on one pair."""

    def warm(c: Conversation) -> None:
        while sum(t.ok for t in c.turns) < turns and len(c.turns) < turns + 3:
            c.step()

    threads = [threading.Thread(target=warm, args=(c,)) for c in convs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    home: dict[str, str] = {}
    for c in convs:
        pairs = {t.pair for t in c.turns if t.ok}
        if len(pairs) != 1 or sum(t.ok for t in c.turns) < turns:
            raise AssertionError(f"{c.session} did not settle on one pair: {c.turns}")
        home[c.session] = pairs.pop() or "?"
    return home


def run(
    router_url: str,
    model: str,
    sessions: list[str],
    victim: str,
    victim_url: str,
    kill: Callable[[], None],
    mark_down_limit_s: float,
    turns_after: int = 3,
    max_tokens: int = 64,
) -> Report:
    """Settle, kill `victim` mid-conversation, talk on, then report (see module doc)."""
    convs = [Conversation(router_url, model, s, max_tokens) for s in sessions]
    home = settle(convs, 2)
    if victim not in home.values() or len(set(home.values())) < 2:
        raise AssertionError(f"sessions must cover both pairs to test failover: {home}")
    for c in convs:
        c.thread.start()
    time.sleep(1.0)  # every conversation has a request in flight
    # The moment of death is when kill() returns (it finds the head's pid first, which
    # takes a subprocess: a CI run saw requests sent during that lookup, then cut by the
    # kill, counted as "sent after the kill").
    kill()
    kill_at = time.monotonic()
    marked = wait_marked_down(router_url, victim_url, kill_at, mark_down_limit_s)
    deadline = time.monotonic() + 120
    while any(c.ok_after(kill_at) < turns_after for c in convs):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for c in convs:
        c.stop.set()
    for c in convs:
        c.thread.join(timeout=70)
    turns = [t for c in convs for t in c.turns]
    return classify(Report(victim, home, turns, kill_at, marked))


def classify(rep: Report) -> Report:
    """Sort the failed turns (in flight on the victim vs any other) and find who moved."""
    for t in rep.turns:
        if t.ok:
            continue
        if t.t0 < rep.kill_at and t.pair in (rep.killed, None):
            rep.lost_in_flight.append(t)
        else:
            rep.unexpected.append(t)
    for s, home in rep.home.items():
        after = sorted(
            {t.pair or "?" for t in rep.turns if t.session == s and t.ok and t.t0 > rep.kill_at}
        )
        if after != [home]:
            rep.moved[s] = after
    return rep
