"""API-key check of the twin's HTTP surface, as vLLM 0.33 applies it.

vLLM requires ``Authorization: Bearer <key>`` when ``--api-key`` or ``VLLM_API_KEY`` is set
(vllm/entrypoints/serve/middleware/register.py), only on paths under the guarded prefixes
and never for OPTIONS (vllm/entrypoints/serve/middleware/authenticate.py); a miss is
401 ``{"error": "Unauthorized"}``. As in vLLM, ``--api-key`` (one or more keys) takes
precedence over VLLM_API_KEY, which is what the launcher passes.
"""

from __future__ import annotations

import hashlib
import hmac
import os

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
UNAUTHORIZED = {"error": "Unauthorized"}


def tokens(api_keys: list[str] | None = None) -> list[bytes]:
    """The accepted keys, hashed: ``--api-key``'s, else VLLM_API_KEY (register.py's rule)."""
    keys = [k for k in (api_keys or [os.environ.get("VLLM_API_KEY") or ""]) if k]
    return [hashlib.sha256(k.encode()).digest() for k in keys]


def allowed(method: str, path: str, authorization: str | None, want: list[bytes]) -> bool:
    """True when the request may pass: no key configured, unguarded path, or a valid bearer."""
    if not want or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
        return True
    scheme, _, param = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    got = hashlib.sha256(param.encode()).digest()
    return any(hmac.compare_digest(got, t) for t in want)
