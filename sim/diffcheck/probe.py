"""Send the corpus to one server and keep what a client depends on: a snapshot.

A snapshot holds, per case, the status code, the content type, the body's shape (keys and
types, `shape.shape_of`), an error's type/code/param and message, and for a stream the
shapes of its SSE chunks (consecutive equal shapes collapsed, since the number of tokens
differs between servers); then the `vllm:` metric families with their types and label
names. Values are kept only where they are the contract (error type and message). The
served model's name is replaced by ``{model}`` so two servers with different names compare.
"""

from __future__ import annotations

import json
import time
from typing import Any

import requests

from pairctl.status.metrics import family_shapes, fetch
from sim.diffcheck import corpus, sdk
from sim.diffcheck.shape import shape_of

TIMEOUT_S = 120.0


def _norm(text: str, model: str) -> str:
    return text.replace(model, "{model}") if model else text


def _collapse(shapes: list[Any]) -> list[Any]:
    out: list[Any] = []
    for s in shapes:
        if not out or out[-1] != s:
            out.append(s)
    return out


def _error(body: Any, model: str) -> dict[str, Any] | None:
    """vLLM's ErrorResponse fields, or FastAPI's ``{"detail": ...}``."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        return {
            "type": err.get("type"),
            "code": err.get("code"),
            "param": err.get("param"),
            "message": _norm(str(err.get("message")), model),
        }
    if "detail" in body:
        return {"detail": _norm(json.dumps(body["detail"]), model)}
    return None


def _read_stream(resp: requests.Response) -> tuple[list[Any], bool, list[str]]:
    shapes, done, other = [], False, []
    for line in resp.iter_lines():
        if not line:
            continue
        text = line.decode("utf-8", "replace")
        if not text.startswith("data: "):
            other.append(text[:80])
            continue
        payload = text[6:]
        if payload == "[DONE]":
            done = True
            continue
        try:
            shapes.append(shape_of(json.loads(payload)))
        except ValueError:
            other.append(payload[:80])
    return _collapse(shapes), done, other


def run_case(base: str, case: corpus.Case, model: str, api_key: str | None) -> dict[str, Any]:
    headers = dict(case.headers)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    kwargs: dict[str, Any] = {"headers": headers, "timeout": TIMEOUT_S, "stream": case.stream}
    if case.raw is not None:
        kwargs["data"] = case.raw
    elif case.body is not None:
        kwargs["json"] = case.body
    t0 = time.monotonic()
    resp = requests.request(case.method, base + case.path, **kwargs)
    out: dict[str, Any] = {
        "status": resp.status_code,
        "content_type": resp.headers.get("content-type", "").split(";")[0].strip(),
        "x_request_id": "x-request-id" in resp.headers,
    }
    if case.stream and resp.status_code == 200:
        out["chunks"], out["done"], other = _read_stream(resp)
        if other:
            out["non_data_lines"] = other
    else:
        text = resp.text
        try:
            body = json.loads(text) if text else None
        except ValueError:
            out["text"] = _norm(text[:200], model)
        else:
            out["body"] = shape_of(body)
            err = _error(body, model)
            if err:
                out["error"] = err
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


class ServerRefused(RuntimeError):
    """/v1/models did not list a model: the message says why (a key problem named as one)."""


def served_model(base: str, api_key: str | None) -> tuple[str, int]:
    """The first served name and its max_model_len (from /v1/models). A 401/403 is the
    server refusing the key (vLLM: vllm/entrypoints/serve/middleware/authenticate.py)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = requests.get(base + "/v1/models", headers=headers, timeout=10)
    where = f"GET {base}/v1/models: HTTP {r.status_code}"
    if r.status_code in (401, 403):
        if api_key:
            raise ServerRefused(
                f"{where}: the server refused the API key given with --api-key; give the key "
                "it was started with (vllm serve's --api-key, or VLLM_API_KEY in its environment)"
            )
        raise ServerRefused(f"{where}: the server requires an API key; give it with --api-key")
    try:
        data = r.json()["data"][0] if r.status_code == 200 else None
    except (ValueError, LookupError, TypeError):
        data = None
    if not isinstance(data, dict) or "id" not in data:
        raise ServerRefused(f"{where}: no OpenAI model list (is this a vLLM server?)")
    return str(data["id"]), int(data.get("max_model_len") or 0)


def record(base: str, api_key: str | None = None, progress: Any = None) -> dict[str, Any]:
    """Run the whole corpus against ``base`` (http://host:port); the snapshot."""
    base = base.rstrip("/")
    model, max_len = served_model(base, api_key)
    cases: dict[str, Any] = {}
    for case in corpus.build(model, max_len):
        if progress:
            progress(case.name)
        try:
            cases[case.name] = run_case(base, case, model, api_key)
        except requests.RequestException as exc:
            cases[case.name] = {"status": None, "transport_error": type(exc).__name__}
    text = fetch(requests, base, timeout=10)
    out = {
        "url": base,
        "model": model,
        "max_model_len": max_len,
        "cases": cases,
        "metrics": family_shapes(text),
    }
    if sdk.available():
        if progress:
            progress("the same cases through the openai SDK")
        out["sdk"] = sdk.run(base, model, max_len, api_key)
    return out
