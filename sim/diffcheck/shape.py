"""JSON shapes: the keys and value types of a response, never its values.

A simulator and a real server answer the same request with different text and numbers;
what a client depends on is which keys exist and what type each holds. ``shape_of`` turns
a decoded JSON value into that skeleton, and ``diff`` lists where two skeletons disagree,
by JSON path, so a report can say exactly which field is missing or typed differently.
"""

from __future__ import annotations

from typing import Any

Shape = Any  # str (scalar type) | dict[str, Shape] | list[Shape] (one merged element shape)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def merge(a: Shape, b: Shape) -> Shape:
    """One shape that covers both (list elements differ, e.g. a null and an object)."""
    if a == b:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, val in b.items():
            out[key] = merge(out[key], val) if key in out else val
        return out
    if isinstance(a, list) and isinstance(b, list):
        if not a or not b:
            return a or b
        return [merge(a[0], b[0])]
    names = sorted(set(_names(a)) | set(_names(b)))
    return "|".join(names)


def _names(shape: Shape) -> list[str]:
    if isinstance(shape, dict):
        return ["object"]
    if isinstance(shape, list):
        return ["array"]
    return str(shape).split("|")


TOKEN_MAPS = ("top_logprobs",)  # completions: {token text: logprob}, keys are data


def shape_of(value: Any, key: str = "") -> Shape:
    """The skeleton of a decoded JSON value; a list's elements merge into one shape.

    An object whose keys are data (completions' ``top_logprobs`` entries map token text to
    a logprob) becomes ``{"<token>": type}``."""
    if isinstance(value, dict):
        if key in TOKEN_MAPS and all(isinstance(v, (int, float)) for v in value.values()):
            return {"<token>": "float"} if value else {}
        return {str(k): shape_of(v, str(k)) for k, v in sorted(value.items())}
    if isinstance(value, list):
        if not value:
            return []
        out = shape_of(value[0], key)
        for item in value[1:]:
            out = merge(out, shape_of(item, key))
        return [out]
    return _scalar(value)


def describe(shape: Shape) -> str:
    if isinstance(shape, dict):
        return "object"
    if isinstance(shape, list):
        return "array"
    return str(shape)


def diff(sim: Shape, real: Shape, path: str = "$") -> list[tuple[str, str, str]]:
    """Where ``sim`` differs from ``real``: (json path, sim side, real side) per difference.

    A key only one side has is reported with ``absent`` on the other; a nullable field
    that one side filled and the other left null is a type difference (``null`` vs ``str``),
    because clients that do not expect null break on it.
    """
    if isinstance(sim, dict) and isinstance(real, dict):
        out: list[tuple[str, str, str]] = []
        for key in sorted(set(sim) | set(real)):
            sub = f"{path}.{key}"
            if key not in sim:
                out.append((sub, "absent", describe(real[key])))
            elif key not in real:
                out.append((sub, describe(sim[key]), "absent"))
            else:
                out += diff(sim[key], real[key], sub)
        return out
    if isinstance(sim, list) and isinstance(real, list):
        if sim and real:
            return diff(sim[0], real[0], path + "[]")
        return []  # an empty array fits any element shape
    if sim != real:
        return [(path, describe(sim), describe(real))]
    return []
