"""The endpoint a bench talks to: the forms its URL may take, readiness, and what it is.

Users copy the URL clients use (`http://HOST:8000/v1`), or type `HOST:8000`; both mean the
server's base URL here. Waiting for readiness shows progress and ends in one line that names
the URL and the cause. The spark twin simulator marks itself (owned_by "spark-twin-simulator" in
/v1/models, and an X-Spark-Twin response header), so every result can say it came from a
simulator.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

SIM_OWNER = "spark-twin-simulator"
SIM_HEADER = "x-spark-twin"


def normalize(url: str, schemes: tuple[str, ...] = ("http",)) -> str:
    """'HOST:8000', 'http://HOST:8000/', 'http://HOST:8000/v1' -> 'http://HOST:8000'.

    Raises ValueError saying what is wrong (scheme, host, port).
    """
    text = url.strip()
    if not text:
        raise ValueError("is empty; give the server's URL, e.g. http://HOST:8000")
    if "://" not in text:
        text = "http://" + text
    u = urlsplit(text)
    if u.scheme not in schemes:
        raise ValueError(
            f"{url!r}: scheme {u.scheme}:// is not supported here (use "
            + " or ".join(f"{s}://" for s in schemes)
            + ")"
        )
    if not u.hostname:
        raise ValueError(f"{url!r} has no host name, e.g. http://HOST:8000")
    try:
        u.port  # noqa: B018 - raises for a port out of range or not a number
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port (1-65535)") from None
    if u.query or u.fragment:
        raise ValueError(f"{url!r}: give the base URL without ?query or #fragment")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{u.scheme}://{u.netloc}{path}"


def url_arg(schemes: tuple[str, ...] = ("http",)) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return normalize(text, schemes)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "URL"
    return parse


def cause(e: BaseException) -> str:
    """A short reason for a failed request (not urllib3's nested repr)."""
    text = str(e)
    if isinstance(e, requests.Timeout):
        return "no answer (timed out)"
    if isinstance(e, requests.ConnectionError):
        low = text.lower()
        if "refused" in low:
            return "connection refused (nothing listens there)"
        if "name or service not known" in low or "name resolution" in low or "nodename" in low:
            return "host name does not resolve"
        if "no route" in low or "unreachable" in low:
            return "host unreachable"
        return "cannot connect"
    return text.splitlines()[0][:160] if text else type(e).__name__


@dataclass
class Identity:
    """What answered at the URL: its /v1/models body, first model, and simulator or not."""

    models: Any
    model: str
    simulator: bool
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"simulator": self.simulator, "evidence": self.evidence}

    def banner(self) -> str | None:
        if not self.simulator:
            return None
        return (
            "endpoint: SPARK-TWIN SIMULATOR (" + ", ".join(self.evidence) + ") - "
            "these figures come from a simulator, not from hardware"
        )


def identify(models: Any, headers: Any) -> Identity:
    """Read the first model id and the simulator marks from a /v1/models answer."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ValueError("answered, but not with an OpenAI model list ({data: [{id: ...}]})")
    if not isinstance(data[0].get("id"), str):
        raise ValueError("answered a model list without a model id")
    evidence = []
    if any(isinstance(m, dict) and m.get("owned_by") == SIM_OWNER for m in data):
        evidence.append(f"owned_by {SIM_OWNER}")
    if headers is not None and SIM_HEADER in {k.lower() for k in headers}:
        evidence.append("X-Spark-Twin header")
    return Identity(models, data[0]["id"], bool(evidence), evidence)


# vLLM's API server answers only once its engine is up (vllm/entrypoints/launchers/api_server/
# entry.py starts uvicorn after the engine client is built): these are final, not "booting".
FINAL_STATUSES = (401, 403, 404)


class NotReady(RuntimeError):
    """The endpoint did not answer /v1/models in time; the message is one line."""


def wait_ready(
    session: requests.Session,
    url: str,
    timeout_s: float,
    log: Callable[[str], None],
    every_s: float = 5.0,
) -> Identity:
    """Poll {url}/v1/models until it lists a model; progress every `every_s` s on `log`."""
    target = url + "/v1/models"
    t0 = time.monotonic()
    next_note = t0
    last = "no answer yet"
    while True:
        try:
            r = session.get(target, timeout=min(5.0, max(timeout_s, 0.5)))
            if r.status_code == 200:
                ident = identify(r.json(), r.headers)
                if time.monotonic() - t0 >= every_s:
                    log(f"{target} ready after {time.monotonic() - t0:.0f} s")
                return ident
            last = f"HTTP {r.status_code}"
            if r.status_code == 404:
                last += " (no OpenAI-compatible server at this URL?)"
            elif r.status_code in (401, 403):
                last += " (set --api-key or OPENAI_API_KEY)"
            if r.status_code in FINAL_STATUSES:  # an answer waiting will not change
                raise NotReady(f"{target}: {last}")
        except requests.RequestException as e:
            last = cause(e)
        except ValueError as e:
            last = str(e)
        now = time.monotonic()
        if now - t0 >= timeout_s:
            raise NotReady(f"{target} not ready after {timeout_s:g} s: {last}")
        if now >= next_note:
            log(f"waiting for {target} ({now - t0:.0f} s of {timeout_s:g} s): {last}")
            next_note = now + every_s
        time.sleep(min(1.0, max(0.0, t0 + timeout_s - now)))
