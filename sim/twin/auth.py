"""API-key check of the twin's HTTP surface, as vLLM 0.33 applies it.

vLLM requires ``Authorization: Bearer <key>`` when ``--api-key`` or ``VLLM_API_KEY`` is set
(vllm/entrypoints/serve/middleware/register.py), only on paths under the guarded prefixes
and never for OPTIONS (vllm/entrypoints/serve/middleware/authenticate.py); a miss is
401 ``{"error": "Unauthorized"}``. The launcher passes the key as VLLM_API_KEY, so the twin
reads that variable.
"""

from __future__ import annotations

import hashlib
import hmac
import os

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
UNAUTHORIZED = {"error": "Unauthorized"}


def tokens() -> list[bytes]:
    key = os.environ.get("VLLM_API_KEY") or ""
    return [hashlib.sha256(key.encode()).digest()] if key else []


def allowed(method: str, path: str, authorization: str | None, want: list[bytes]) -> bool:
    """True when the request may pass: no key configured, unguarded path, or a valid bearer."""
    if not want or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
        return True
    scheme, _, param = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    got = hashlib.sha256(param.encode()).digest()
    return any(hmac.compare_digest(got, t) for t in want)
