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

Which pair answered a turn: the simulator says so in `X-Spark-Pair`. Real vLLM says nothing
of the kind, so with ``counters`` (sim/rehearsal/whichpair.py) the settling turns go one at a
time and each is attributed to the pair whose own finished-request counter went up; after
the kill, a turn without the header was sent either before it (the router kept it on its
session's home pair, as settling showed) or after it, when the killed head no longer answers
(checked) and the survivor's own counter must account for every answered turn.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from sim.rehearsal.chat import sse_data
from sim.rehearsal.whichpair import Counters


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
            for data in sse_data(r):
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
    # with counters (real engines): whether the killed head still answered afterwards, and
    # how many requests the survivor's own counter finished from `counted_from` on
    victim_answers: bool | None = None
    counted_from: float | None = None
    survivor_finished: float | None = None

    @property
    def survivor(self) -> str | None:
        """The one pair left, if the sessions lived on exactly two."""
        rest = set(self.home.values()) - {self.killed}
        return rest.pop() if len(rest) == 1 else None

    def answered_since(self, when: float) -> int:
        return sum(1 for t in self.turns if t.ok and t.t0 > when)

    def where(self, t: Turn) -> str | None:
        """The pair that had turn ``t``: its header, else (attributed runs) the session's
        home before the kill and the survivor after it while the killed head stays dead."""
        if t.pair is not None or self.counted_from is None:
            return t.pair
        if t.t0 < self.kill_at:
            return self.home.get(t.session)
        return self.survivor if self.victim_answers is False else None

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
            out.append(f"  {t.session} turn {t.n} (pair {self.where(t)}): {t.error}")
        if self.counted_from is not None:
            n = self.survivor_finished
            out.append(
                f"{self.survivor}'s own vllm:request_success_total: "
                f"{'?' if n is None else f'{n:g}'} finished since the kill, "
                f"{self.answered_since(self.counted_from)} turns "
                f"answered; {self.killed}'s head "
                + ("still answers" if self.victim_answers else "no longer answers")
            )
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


def settle(
    convs: list[Conversation], turns: int, counters: Counters | None = None
) -> dict[str, str]:
    """A few turns per conversation (all in parallel; one at a time with ``counters``, each
    attributed by them); each conversation must stay on one pair."""

    def step(c: Conversation) -> None:
        if counters is None:
            c.step()
            return
        t, pair = counters.served(c.step)
        t.pair = t.pair or pair

    def warm(c: Conversation) -> None:
        while sum(t.ok for t in c.turns) < turns and len(c.turns) < turns + 3:
            step(c)

    if counters is None:
        threads = [threading.Thread(target=warm, args=(c,)) for c in convs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    else:
        for _ in range(turns + 3):
            for c in convs:
                if sum(t.ok for t in c.turns) < turns and len(c.turns) < turns + 3:
                    step(c)
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
    counters: Counters | None = None,
) -> Report:
    """Settle, kill `victim` mid-conversation, talk on, then report (see module doc)."""
    convs = [Conversation(router_url, model, s, max_tokens) for s in sessions]
    home = settle(convs, 2, counters)
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
    before = counters.read() if counters else {}
    counted_from = time.monotonic()
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
    rep = Report(victim, home, turns, kill_at, marked)
    if counters is not None:
        rep.counted_from = counted_from
        rep.victim_answers = answers(victim_url)
        rep.survivor_finished = finished_since(counters, rep, before)
    return classify(rep)


def finished_since(
    counters: Counters, rep: Report, before: dict[str, float | None]
) -> float | None:
    """What the survivor's own counter finished since ``before``, read until it covers the
    answered turns or 5 s pass (it counts a request just after the client has its end)."""
    pair, want = rep.survivor, rep.answered_since(rep.counted_from or rep.kill_at)
    if pair is None or before.get(pair) is None:
        return None
    deadline = time.monotonic() + 5
    while True:
        now = counters.read().get(pair)
        got = None if now is None else now - (before[pair] or 0)
        if got is None or got >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def answers(url: str) -> bool:
    """Whether anything still answers HTTP at ``url`` (a killed head's port is closed)."""
    try:
        requests.get(f"{url}/health", timeout=3)
        return True
    except requests.RequestException:
        return False


def classify(rep: Report) -> Report:
    """Sort the failed turns (in flight on the victim vs any other) and find who moved."""
    for t in rep.turns:
        if t.ok:
            continue
        if t.t0 < rep.kill_at and rep.where(t) in (rep.killed, None):
            rep.lost_in_flight.append(t)
        else:
            rep.unexpected.append(t)
    for s, home in rep.home.items():
        after = sorted(
            {
                rep.where(t) or "?"
                for t in rep.turns
                if t.session == s and t.ok and t.t0 > rep.kill_at
            }
        )
        if after != [home]:
            rep.moved[s] = after
    return rep
