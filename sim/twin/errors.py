"""vLLM's error bodies and small fixed answers, as the real server sends them (the
differential check, sim/diffcheck, holds the twin to them)."""

from __future__ import annotations

import json
import re
from typing import Any

from sim.twin.params import BadRequest

# Starlette's answer for a route nobody serves
NOT_FOUND = {"detail": "Not Found"}


def error(message: str, code: int, kind: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse (vllm/entrypoints/serve/engine/protocol.py)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# vLLM hides file paths in error messages (vllm/entrypoints/serve/exception_handling/utils.py)
_PATHS = (
    re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+"),
    re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+"),
)


def sanitized(message: str) -> str:
    for pat in _PATHS:
        message = pat.sub("<path>", message)
    return message


def json_invalid(exc: json.JSONDecodeError) -> BadRequest:
    """A body that is not JSON, as FastAPI's validation answers it (pydantic's json_invalid,
    reported by vLLM's RequestValidationError handler as type "Bad Request")."""
    loc = f"body.{exc.pos}"
    detail = {
        "type": "json_invalid",
        "loc": loc,
        "msg": "JSON decode error",
        "input": "<dict of 0 items>",
        "ctx": {"error": exc.msg},
    }
    return BadRequest(f"1 validation error:\n  {detail}", loc, kind="Bad Request")


# /v1/models permission entry (vllm/entrypoints/openai/models/protocol.py ModelPermission)
def permission(created: int) -> dict[str, Any]:
    return {
        "id": f"modelperm-{created:016x}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
