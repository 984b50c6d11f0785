"""The corpus through the OpenAI Python SDK itself (when `openai` is installed).

The raw probe (probe.py) compares bodies; this asks the question a user of the SDK asks:
does the SDK accept the answer (its pydantic models parse every response and chunk), and
which exception class does an error become? Only the cases the SDK can send as-is (no
bad JSON, no unknown route) run here; `vllm bench serve`'s extra fields go in
``extra_body``.
"""

from __future__ import annotations

from typing import Any

from sim.diffcheck import corpus

SDK_FIELDS = {"ignore_eos", "repetition_penalty"}  # vLLM-only: sent as extra_body


def available() -> bool:
    try:
        import openai  # noqa: F401
    except ImportError:
        return False
    return True


def _call(client: Any, case: corpus.Case) -> dict[str, Any]:
    body = dict(case.body or {})
    extra = {k: body.pop(k) for k in list(body) if k in SDK_FIELDS}
    api = client.chat.completions if case.path == corpus.CHAT else client.completions
    out = api.create(**body, extra_body=extra or None, extra_headers=case.headers or None)
    if case.stream:
        chunks = list(out)
        return {"result": "ok", "chunks": len(chunks) > 0}
    return {"result": "ok", "object": out.object}


def run(base: str, model: str, max_len: int, api_key: str | None) -> dict[str, Any]:
    """Per case: ``ok`` or the SDK's exception class and status code."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=api_key or "none", max_retries=0)
    out: dict[str, Any] = {}
    for case in corpus.build(model, max_len):
        if case.raw is not None or case.body is None:
            continue
        try:
            out[case.name] = _call(client, case)
        except openai.APIStatusError as exc:
            out[case.name] = {"result": type(exc).__name__, "status": exc.status_code}
        except openai.APIError as exc:
            out[case.name] = {"result": type(exc).__name__}
        except TypeError as exc:  # a field the SDK's signature does not take
            out[case.name] = {"result": "not sendable", "why": str(exc)[:120]}
    return out
