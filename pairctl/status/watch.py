"""The watchdog (``launch/dspark_launch.sh watch``): one real token every N seconds; after K
failures in a row, the pair is torn down and brought up again, with backoff.

A pair can look alive and serve nothing: a rank died and the survivor holds its memory, the
engine hung, a NCCL timeout took the workers. ``/health`` alone does not see all of these,
so each probe asks for a 1-token completion, which needs both ranks to run a step. The
restart is ``down`` then ``up`` in this process (pairctl.lifecycle.updown: same lock, same
preflight, same teardown on a failed boot); a failed ``up`` is retried after a backoff that
doubles up to a cap. While another ``up``/``down`` of the pair holds its lock, probes are not
counted: an operator's maintenance is not an outage. A 401/403 is a configuration error, never an
outage: the key in the env file is wrong (or missing), a restart cannot fix it, so the
watchdog says so and stops with exit 9 (``EXIT_KEY``) without touching the pair. Each cycle
also reads both nodes' memory (``pairctl.status.memwatch``: a band change is one line, never
a restart); when a restart is due and rank 1 does not answer ssh (a wedged or rebooting
host), the watchdog waits for ssh, then restarts (its ``down`` removes this pair's
containers by label on both nodes). Every event is one line with a UTC timestamp on stdout
(journald keeps it under systemd; see launch/dsv4-watch@.service).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pairctl.contracts import (
    EXIT_INTERRUPTED,
    EXIT_KEY,
    EXIT_OK,
    WATCH_BACKOFF_MAX_S,
    WATCH_BACKOFF_S,
    WATCH_FAILURES,
    WATCH_INTERVAL_S,
    WATCH_PROBE_TIMEOUT_S,
    meaning,
)
from pairctl.lifecycle.steps import KEY_STATUSES, key_problem, session
from pairctl.log import log, stamp

# While waiting for a wedged rank 1's ssh, one "still waiting" line this often.
LOST_HEARTBEAT_S = 600.0
# While the server answering is not proven this pair's: the same reason again this often.
FOREIGN_HEARTBEAT_S = 300.0


@dataclass(frozen=True)
class WatchConfig:
    interval_s: float = WATCH_INTERVAL_S  # between probes
    failures: int = WATCH_FAILURES  # consecutive failed probes before a restart
    probe_timeout_s: float = WATCH_PROBE_TIMEOUT_S  # one 1-token completion, queueing included
    backoff_s: float = WATCH_BACKOFF_S  # wait after a failed restart, doubled each time
    backoff_max_s: float = WATCH_BACKOFF_MAX_S


class KeyRejected(Exception):
    """The endpoint answered 401/403: the pair's key is wrong or missing (not an outage)."""


@dataclass(frozen=True)
class Answer:
    """What one 1-token probe saw: why it failed (None: a token came), and the
    ``system_fingerprint`` of the completion, if one answered 200 (the ownership proof's
    evidence, pairctl.status.ownership)."""

    why: str | None
    fingerprint: str | None = None
    completed: bool = False  # /v1/completions answered 200 with a body


def probe_token(base: str, timeout: float, api_key: str = "") -> str | None:
    """Generate one token (greedy 1-token completion). None when it worked, else why not.

    Asked without any proxy and with the pair's API key (``lifecycle.session``). Raises
    ``KeyRejected`` on 401/403: no number of restarts makes a wrong key right."""
    return probe_answer(base, timeout, api_key).why


def probe_answer(base: str, timeout: float, api_key: str = "") -> Answer:
    """``probe_token``, keeping the completion's ``system_fingerprint``."""
    import requests

    s = session(api_key)
    try:
        r = s.get(f"{base}/v1/models", timeout=timeout)
        if r.status_code in KEY_STATUSES:
            raise KeyRejected(f"GET {base}/v1/models: {key_problem(r.status_code, bool(api_key))}")
        if r.status_code != 200:
            return Answer(f"GET {base}/v1/models: HTTP {r.status_code}")
        data = r.json().get("data") or []
        if not data:
            return Answer(f"GET {base}/v1/models: no model listed")
        model = data[0]["id"]
        r = s.post(
            f"{base}/v1/completions",
            json={"model": model, "prompt": "1 2 3", "max_tokens": 1, "temperature": 0},
            timeout=timeout,
        )
        if r.status_code in KEY_STATUSES:
            raise KeyRejected(
                f"POST {base}/v1/completions: {key_problem(r.status_code, bool(api_key))}"
            )
        if r.status_code != 200:
            return Answer(f"POST {base}/v1/completions: HTTP {r.status_code}: {r.text[:200]}")
        body = r.json()
        fp = body.get("system_fingerprint")
        fp = fp if isinstance(fp, str) else None
        tokens = (body.get("usage") or {}).get("completion_tokens")
        if not body.get("choices") or tokens != 1:
            why = f"POST {base}/v1/completions: no token generated ({str(body)[:200]})"
            return Answer(why, fp, True)
        return Answer(None, fp, True)
    except requests.Timeout:
        return Answer(f"{base}: no answer within {timeout:g} s")
    except requests.ConnectionError:
        return Answer(f"{base}: connection failed (nothing listening, or host down)")
    except requests.RequestException as exc:
        return Answer(f"{base}: {type(exc).__name__}: {str(exc)[:200]}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Answer(f"{base}: malformed answer: {exc}")


class Watchdog:
    """The probe/restart loop; every effect is injected, so the policy is unit-tested."""

    def __init__(
        self,
        cfg: WatchConfig,
        probe: Callable[[], str | None],
        restart: Callable[[], int],
        log: Callable[[str], None],
        busy: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        nodes: Callable[[], str | None] = lambda: None,
        after_ok: Callable[[], None] | None = None,
        owner: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        # After each probe: None when the server that answered is this pair's (or nothing
        # answered to judge), else why it is not (pairctl.status.ownership.Prover.foreign):
        # then no restart, no monitor, no count toward one.
        self.owner = owner
        self.foreign_said: tuple[str, float] | None = None
        # Runs after each good probe: the acceptance sentinel and output canary
        # (pairctl.sentinel.monitors). It only logs; nothing it finds restarts the pair.
        self.after_ok = after_ok
        self.probe, self.restart, self.log = probe, restart, log
        self.busy, self.sleep, self.clock = busy, sleep, clock
        self.nodes = nodes  # each cycle: memory events; why rank 1's ssh fails (a wedge)
        self.lost_since: float | None = None  # when a due restart began waiting for ssh
        self.lost_said = 0.0  # when the wait was last logged
        self.failed = 0
        self.backoff = cfg.backoff_s
        self.healthy_once = False
        self.restarted_ok = False  # a restart succeeded and no probe has confirmed it yet
        self.restarts = 0

    def tick(self) -> float:
        """One probe (and a restart if due). Returns how long to sleep before the next."""
        if self.busy():
            if self.failed:
                self.log(
                    f"another up/down of this pair holds its lock: {self.failed} failure(s) "
                    "forgotten, not probing"
                )
            self.failed = 0
            return self.cfg.interval_s
        lost = self.nodes()
        why = self.probe()
        foreign = self.owner()
        if foreign is not None:
            return self._foreign(foreign)
        if self.foreign_said is not None:
            self.foreign_said = None
            self.log("ownership proven again: the server answering is this pair's; resuming")
        if why is None:
            if self.failed:
                self.log(f"ok: a token again after {self.failed} failed probe(s)")
            elif self.restarted_ok:
                self.log(f"ok: the restarted pair generated a token (restart {self.restarts})")
            elif not self.healthy_once:
                self.log("ok: the pair generated a token")
            self.failed, self.healthy_once, self.restarted_ok = 0, True, False
            self.lost_since = None
            self.backoff = self.cfg.backoff_s
            self._monitors()
            return self.cfg.interval_s
        self.failed += 1
        if self.failed <= self.cfg.failures:
            self.log(f"FAIL {self.failed}/{self.cfg.failures}: {why}")
        elif self.lost_since is not None:
            pass  # waiting for rank 1's ssh: wait_for_ssh says so, with a heartbeat
        else:  # the last restart failed and its back-off is over: restart again at once
            self.log(f"FAIL again after failed restart {self.restarts}: {why}")
        if self.failed < self.cfg.failures:
            return self.cfg.interval_s
        if lost is not None or self.lost_since is not None:
            wait = self.wait_for_ssh(lost)
            if wait is not None:
                return wait
        self.log(f"{self.failed} failed probes in a row: restarting the pair (down, then up)")
        t0 = self.clock()
        rc = self.restart()
        took = self.clock() - t0
        self.restarts += 1
        if rc == EXIT_OK:
            self.log(f"restart {self.restarts}: pair up again after {took:.0f} s")
            self.failed, self.backoff, self.restarted_ok = 0, self.cfg.backoff_s, True
            return self.cfg.interval_s
        wait = self.backoff
        self.backoff = min(self.backoff * 2, self.cfg.backoff_max_s)
        why = meaning(rc)
        self.log(
            f"restart {self.restarts} FAILED after {took:.0f} s (up exit {rc}: {why}); "
            f"next probe in {wait:.0f} s"
        )
        return wait

    def _foreign(self, why: str) -> float:
        """Not this pair's server: take no action against it, say so (one line per change
        of reason, then every FOREIGN_HEARTBEAT_S), keep watching."""
        now = self.clock()
        said = self.foreign_said
        if said is None or said[0] != why or now - said[1] >= FOREIGN_HEARTBEAT_S:
            self.foreign_said = (why, now)
            self.log(
                f"NOT OURS: {why}. No restart, no canary, no record against it; "
                "watching until the proof holds again"
            )
        self.failed = 0
        return self.cfg.interval_s

    def wait_for_ssh(self, lost: str | None) -> float | None:
        """A restart is due but a headless rank does not answer ssh: the host is wedged or rebooting
        (README troubleshooting: "Host wedged, ssh banner timeout": wait for ssh, docker
        rm -f, relaunch). Wait (no restart, no backoff) while it is lost; once it answers,
        None: the restart's down removes this pair's containers (by label) on both nodes
        and its up relaunches."""
        now = self.clock()
        if lost is not None:
            if self.lost_since is None:
                self.lost_since = self.lost_said = now
                self.log(
                    f"{lost}: the host may be wedged (unified memory) or rebooting; waiting "
                    "for ssh to answer before removing this pair's containers and relaunching"
                )
            elif now - self.lost_said >= LOST_HEARTBEAT_S:
                self.lost_said = now
                self.log(f"still waiting for ssh after {now - self.lost_since:.0f} s: {lost}")
            return self.cfg.interval_s
        took = now - self.lost_since if self.lost_since is not None else 0.0
        self.lost_since = None
        self.log(
            f"ssh to every rank answers again after {took:.0f} s: removing this pair's "
            "containers on every node and relaunching"
        )
        return None

    def _monitors(self) -> None:
        if self.after_ok is None:
            return
        try:
            self.after_ok()
        except Exception as exc:  # noqa: BLE001 - a monitor's bug must not stop the watchdog
            self.log(f"monitors failed this round ({type(exc).__name__}: {exc}); no restart")

    def run(self, cycles: int | None = None) -> None:
        n = 0
        while cycles is None or n < cycles:
            self.sleep(self.tick())
            n += 1


class Stop(KeyboardInterrupt):
    """SIGTERM/SIGINT: leave the loop (and any running restart) cleanly. A KeyboardInterrupt,
    so a restart's boot tears its half-started pair down on it (pairctl.lifecycle.updown) and
    no ``except Exception`` (a monitor's guard) swallows it."""


def serve(dog: Watchdog, what: str) -> int:
    """Run until SIGTERM (exit 0: how systemd stops it), SIGINT/Ctrl-C or SIGHUP (exit 130,
    the table's "interrupted"), or until the endpoint rejects the key (exit 9)."""

    def stop(signum: int, _frame: Any) -> None:
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        dog.log(f"watching {what}")
        dog.run()
    except KeyboardInterrupt as exc:  # Stop, or a restart's boot re-raising its Interrupted
        name = str(exc) or "SIGINT"
        dog.log(f"{name}: watchdog stopped")
        return EXIT_OK if name == "SIGTERM" else EXIT_INTERRUPTED
    except KeyRejected as exc:
        dog.log(
            f"STOP: {exc}. A key problem is configuration, not an outage: the pair was not "
            f"restarted. Fix VLLM_API_KEY in the env file, then start watch again (exit "
            f"{EXIT_KEY})"
        )
        return EXIT_KEY
    return EXIT_OK


def printer(pair_id: str) -> Callable[[str], None]:
    def say(msg: str) -> None:
        log(msg, prefix=f"{stamp()} watch {pair_id}: ", stream=sys.stdout)

    return say
