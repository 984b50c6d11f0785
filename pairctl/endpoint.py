"""The endpoint a client talks to: one frozen object, its URL parsed once.

Users copy the URL clients use (``http://HOST:8000/v1``), or type ``HOST:8000``; both mean
the server's base URL here. ``Endpoint.parse`` normalises that text once, and from then on
scheme, host, port and base path are fields: a request formats bytes from them, and no
caller strips slashes or splits the URL again. The API key rides along for ``headers()``
and ``session()`` but never shows in ``repr`` or ``str`` (a log line or a result file must
not carry it).

Readiness lives here too, because the quality gate (pairctl) and the benches (bench) both
wait for it: polling ``/v1/models`` shows progress and ends in one line that names the URL
and the cause. The spark twin simulator marks itself (owned_by "spark-twin-simulator" in
/v1/models, and an X-Spark-Twin response header), so every result can say it came from a
simulator.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

if TYPE_CHECKING:  # requests is imported where a session is made, not by every pairctl step
    import requests

SIM_OWNER = "spark-twin-simulator"
SIM_HEADER = "x-spark-twin"
DEFAULT_PORT = {"http": 80, "https": 443}


def _split(url: str, schemes: tuple[str, ...]) -> tuple[SplitResult, str]:
    """(the split of the text, its base path): the one urlsplit an endpoint costs."""
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
    return u, path


def normalize(url: str, schemes: tuple[str, ...] = ("http",)) -> str:
    """'HOST:8000', 'http://HOST:8000/', 'http://HOST:8000/v1' -> 'http://HOST:8000'.

    Raises ValueError saying what is wrong (scheme, host, port).
    """
    u, path = _split(url, schemes)
    return f"{u.scheme}://{u.netloc}{path}"


@dataclass(frozen=True)
class Endpoint:
    """A server's base URL, split once, with the credentials every request to it carries.

    Build it with ``Endpoint.parse(text)`` (the URL rules above) or ``Endpoint.for_host``;
    ``str(ep)`` is the base URL (what result files record), ``repr`` leaves the key out.
    """

    base: str  # normalised: no trailing slash, no /v1
    scheme: str
    host: str  # as urlsplit gives it: lower case, an IPv6 literal without brackets
    port: int  # the default port of the scheme when the URL names none
    path: str = ""  # base path below the host ('' or '/proxy'), no trailing slash
    api_key: str | None = field(default=None, repr=False)
    session_id: str | None = None  # X-Session-ID on every request (a router's affinity key)

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        schemes: tuple[str, ...] = ("http",),
        api_key: str | None = None,
        session_id: str | None = None,
    ) -> Endpoint:
        """Normalise and split ``url`` (ValueError says what is wrong with it)."""
        u, path = _split(url, schemes)
        return cls(
            base=f"{u.scheme}://{u.netloc}{path}",
            scheme=u.scheme,
            host=u.hostname or "",
            port=u.port or DEFAULT_PORT[u.scheme],
            path=path,
            api_key=api_key or None,
            session_id=session_id or None,
        )

    @classmethod
    def for_host(cls, host: str, port: int, *, api_key: str | None = None) -> Endpoint:
        """http://HOST:PORT of a pair's own address; an IPv6 literal gets its brackets."""
        name = f"[{host}]" if ":" in host else host
        return cls.parse(f"http://{name}:{port}", api_key=api_key)

    def __str__(self) -> str:
        return self.base

    def url(self, path: str = "") -> str:
        """The full URL of ``path`` ('/v1/models') on this server."""
        return self.base + path

    def headers(self) -> dict[str, str]:
        """What every request carries: the bearer token and the session id, when set."""
        out = {}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        if self.session_id:
            out["X-Session-ID"] = self.session_id
        return out

    def with_auth(self, api_key: str | None, session_id: str | None = None) -> Endpoint:
        """The same server with this key and session id (no re-parse of the URL)."""
        return replace(self, api_key=api_key or None, session_id=session_id or None)

    def with_session(self, session_id: str | None) -> Endpoint:
        """The same server and key, another X-Session-ID (one per conversation)."""
        return replace(self, session_id=session_id or None)

    def session(self, *, trust_env: bool) -> requests.Session:
        """A requests session with ``headers()`` set.

        ``trust_env=False`` for a pair's own endpoint: HTTP(S)_PROXY, NO_PROXY and .netrc of
        the operator's shell are not for it. The benches pass True: a user measuring through
        a proxy of their own keeps it.
        """
        import requests  # lazy: only steps that talk HTTP pay for the import

        s = requests.Session()
        s.trust_env = trust_env
        s.headers.update(self.headers())
        return s


def endpoint_arg(schemes: tuple[str, ...] = ("http",)) -> Callable[[str], Endpoint]:
    """argparse type of ``--url``: an Endpoint, or a usage error saying what is wrong."""

    def parse(text: str) -> Endpoint:
        try:
            return Endpoint.parse(text, schemes=schemes)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "URL"
    return parse


SESSION_HELP = (
    "send X-Session-ID: ID with every request, so a router with session affinity "
    "(launch/dspark_launch.sh fleet) keeps the run on one pair"
)


def add_endpoint_args(
    p: argparse.ArgumentParser, schemes: tuple[str, ...] = ("http",), session_help: str = ""
) -> None:
    """The flags that name an endpoint, the same for every bench and the gate: --url (parsed
    once into an Endpoint), --model, --api-key (default $OPENAI_API_KEY), --session-id.
    ``endpoint_of(args)`` puts the key and session on the parsed URL."""
    p.add_argument(
        "--url",
        type=endpoint_arg(schemes),
        default="http://127.0.0.1:8000",
        help="the server's base URL; HOST:PORT and a trailing /v1 are accepted",
    )
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token")
    p.add_argument("--session-id", default=None, help=session_help or SESSION_HELP)


def redacted_argv(argv: list[str]) -> list[str]:
    """A command line as a result file records it: ``--api-key``'s value as ``***``."""
    out, hide = [], False
    for word in argv:
        if hide:
            out.append("***")
        elif word.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(word)
        hide = word == "--api-key"
    return out


def endpoint_of(args: argparse.Namespace) -> Endpoint:
    """--url's Endpoint with --api-key and --session-id on it (the URL is not parsed again)."""
    return args.url.with_auth(args.api_key, args.session_id)


def cause(e: BaseException) -> str:
    """A short reason for a failed request (not urllib3's nested repr)."""
    import requests

    text = str(e)
    if isinstance(e, requests.Timeout):
        return "no answer (timed out)"
    if isinstance(e, requests.exceptions.SSLError):
        low = text.lower()
        # OpenSSL's words when the other side answers TLS's hello with plain HTTP bytes.
        if any(w in low for w in ("wrong_version_number", "wrong version number", "record layer")):
            return (
                "TLS handshake failed: the server looks like plain HTTP; use http://, not https://"
            )
        first = text.splitlines()[0][-160:] if text else "SSLError"
        return f"TLS handshake failed ({first})"
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


# Where a command's key comes from, as its 401/403 hint names it (the benches and the gate;
# a command that reads the key elsewhere passes its own words to wait_ready).
KEY_FROM_FLAGS = "--api-key or OPENAI_API_KEY"


def key_hint(endpoint: Endpoint, key_from: str = KEY_FROM_FLAGS) -> str:
    """Why a 401/403 came back (vLLM's middleware answers 401 {"error": "Unauthorized"} on
    /v1, vllm/entrypoints/serve/middleware/authenticate.py): the key given was refused, or
    none was given. ``key_from`` names the option or variable the key really comes from."""
    if endpoint.api_key:
        return (
            f" (the server refused the API key given as {key_from}; use the key the server "
            "was started with: vllm serve's --api-key, or VLLM_API_KEY in its environment)"
        )
    return f" (the server requires an API key: set {key_from})"


class NotReady(RuntimeError):
    """The endpoint did not answer /v1/models in time; the message is one line."""


def wait_ready(
    session: requests.Session,
    endpoint: Endpoint,
    timeout_s: float,
    log: Callable[[str], None],
    every_s: float = 5.0,
    key_from: str = KEY_FROM_FLAGS,
) -> Identity:
    """Poll /v1/models until it lists a model; progress every `every_s` s on `log`; a
    401/403 ends the wait at once, naming ``key_from`` (where the caller's key comes from)."""
    import requests

    target = endpoint.url("/v1/models")
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
                last += key_hint(endpoint, key_from)
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
