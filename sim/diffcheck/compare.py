"""Compare two snapshots (simulator vs real) into findings, each one line of the table.

Every difference is either a bug in the simulator (verdict ``DIFF``) or listed in
``DELIBERATE`` with the reason the simulator differs on purpose (verdict ``deliberate``);
docs/simulator.md carries the same list. A finding that matches is ``same``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass
from typing import Any

from sim.diffcheck import logclass
from sim.diffcheck.shape import diff as shape_diff

# (area, case glob, what glob) -> why the simulator differs on purpose.
DELIBERATE: dict[tuple[str, str, str], str] = {
    ("models", "models", "$.data[].owned_by*"): "owned_by is spark-twin-simulator: the label",
    ("body", "*", "X-Request-Id header"): "the twin always answers X-Request-Id (bench tools "
    "find /twin/requests records by it); vLLM only with --enable-request-id-headers",
    ("body", "*", "$.choices[].weight_versions"): "vLLM 0.33 (what the Sparks run) serializes "
    "weight_versions: null in every full-response choice; the CPU engine is 0.32, which has "
    "no such field (vllm/entrypoints/openai/*/protocol.py)",
    ("metrics", "*", "absent in sim"): "real vLLM family the twin does not model (not used "
    "by our tools; see docs/simulator.md, Metrics)",
    ("log", "*", "sim-only SparkTwin*"): "the twin's own lines (label, profile, faults)",
    ("log", "*", "sim-only GPU*"): "a line of vLLM's GPU path (CUDA graphs, torch.compile, "
    "KV on GPU) that the CPU engine with --enforce-eager never prints; checked against the "
    "vLLM source by tests/test_twin_log.py",
    ("log", "*", "same line, other source file"): "vLLM 0.33 moved the logger call (e.g. "
    "non-default args: api_utils.py in 0.32, entrypoints/common/startup.py in 0.33); the twin "
    "cites 0.33",
    ("log", "*", "real-only*"): "a real line the twin does not print (not read by pairctl)",
    ("stream", "bench_openai_chat", "chunk*.choices[].delta.reasoning"): "with a reasoning "
    "parser a finishing step whose text parses to nothing (e.g. trailing whitespace the parser "
    "holds back, vllm/parser/engine/parser_engine.py _strip_trailing_reasoning) is sent as "
    "DeltaMessage() {}, else with its reasoning; which one depends on the reply's text (the "
    "recorded tiny model's vs the twin's words, which never end in whitespace)",
}


@dataclass
class Finding:
    area: str  # status | body | error | stream | models | metrics | log
    case: str
    what: str
    sim: str
    real: str
    verdict: str = "DIFF"
    why: str = ""


def _deliberate(f: Finding) -> Finding:
    for (area, case, what), why in DELIBERATE.items():
        if f.area == area and fnmatch.fnmatch(f.case, case) and fnmatch.fnmatch(f.what, what):
            f.verdict, f.why = "deliberate", why
            break
    return f


def compare_case(name: str, sim: dict[str, Any], real: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    area = "models" if name == "models" else "body"
    if sim.get("status") != real.get("status"):
        out.append(
            Finding("status", name, "status code", str(sim.get("status")), str(real.get("status")))
        )
        return out
    if sim.get("content_type") != real.get("content_type"):
        out.append(
            Finding(
                "body",
                name,
                "content-type",
                sim.get("content_type", ""),
                real.get("content_type", ""),
            )
        )
    if sim.get("x_request_id") != real.get("x_request_id"):
        out.append(
            Finding(
                "body",
                name,
                "X-Request-Id header",
                str(sim.get("x_request_id")),
                str(real.get("x_request_id")),
            )
        )
    if "body" in sim or "body" in real:
        for path, a, b in shape_diff(sim.get("body"), real.get("body")):
            out.append(Finding(area, name, path, a, b))
    if sim.get("text") != real.get("text"):
        out.append(
            Finding("body", name, "non-JSON body", str(sim.get("text")), str(real.get("text")))
        )
    se, re_ = sim.get("error") or {}, real.get("error") or {}
    for key in sorted(set(se) | set(re_)):
        if se.get(key) != re_.get(key):
            out.append(Finding("error", name, f"error.{key}", str(se.get(key)), str(re_.get(key))))
    if "chunks" in sim or "chunks" in real:
        out += _compare_stream(name, sim, real)
    return out


def _compare_stream(name: str, sim: dict[str, Any], real: dict[str, Any]) -> list[Finding]:
    out = []
    a, b = sim.get("chunks") or [], real.get("chunks") or []
    if len(a) != len(b):
        out.append(
            Finding("stream", name, "distinct chunk shapes in order", str(len(a)), str(len(b)))
        )
    for i, (ca, cb) in enumerate(zip(a, b, strict=False)):
        for path, x, y in shape_diff(ca, cb, f"chunk{i}"):
            out.append(Finding("stream", name, path, x, y))
    if sim.get("done") != real.get("done"):
        out.append(
            Finding("stream", name, "data: [DONE]", str(sim.get("done")), str(real.get("done")))
        )
    return out


def compare_metrics(sim: dict[str, Any], real: dict[str, Any]) -> list[Finding]:
    out = []
    for fam in sorted(set(sim) | set(real)):
        if fam not in real:
            out.append(Finding("metrics", fam, "absent in real", sim[fam]["type"], "absent"))
        elif fam not in sim:
            out.append(Finding("metrics", fam, "absent in sim", "absent", real[fam]["type"]))
        else:
            if sim[fam]["type"] != real[fam]["type"]:
                out.append(Finding("metrics", fam, "type", sim[fam]["type"], real[fam]["type"]))
            if sim[fam]["labels"] != real[fam]["labels"]:
                out.append(
                    Finding(
                        "metrics",
                        fam,
                        "label names",
                        str(sim[fam]["labels"]),
                        str(real[fam]["labels"]),
                    )
                )
    return out


# vLLM files whose lines only the GPU worker prints (the CPU engine runs cpu_worker.py and
# cpu_model_runner.py, and --enforce-eager skips torch.compile and CUDA graphs)
GPU_FILES = {"model_runner.py", "monitor.py", "backends.py", "gpu_worker.py"}


def _gpu_path(cls: str) -> bool:
    proc, _level, fname, msg = cls.split("|", 3)
    return fname in GPU_FILES or any(w in msg for w in ("GPU", "CUDA", "backend=nccl"))


def _unfiled(cls: str) -> str:
    proc, level, _fname, msg = cls.split("|", 3)
    return f"{proc}|{level}|{msg}"


def compare_logs(kind: str, sim: list[str], real: list[str]) -> list[Finding]:
    """Sim log classes against the real log's, for one event (boot, shutdown, peer loss)."""
    out = []
    real_set, sim_set = set(real), set(sim)
    real_moved = {_unfiled(c): c for c in real}
    for cls in sim:
        if cls in real_set:
            continue
        proc = cls.split("|", 1)[0]
        if _unfiled(cls) in real_moved:
            what = "same line, other source file"
            out.append(Finding("log", kind, what, cls, real_moved[_unfiled(cls)]))
            real_set.add(real_moved[_unfiled(cls)])
            sim_set.add(real_moved[_unfiled(cls)])
            continue
        if proc == "SparkTwin":
            what = "sim-only SparkTwin line"
        elif _gpu_path(cls):
            what = "sim-only GPU-path line"
        else:
            what = "sim-only line"
        out.append(Finding("log", kind, what, cls, "absent"))
    for cls in real:
        if cls not in sim_set:
            out.append(Finding("log", kind, "real-only line", "absent", cls))
    return out


def compare(sim: dict[str, Any], real: dict[str, Any]) -> list[Finding]:
    """All findings, deliberate ones marked, then one ``same`` row per matching case."""
    out: list[Finding] = []
    for name in real["cases"]:
        found = compare_case(name, sim["cases"].get(name, {}), real["cases"][name])
        out += found or [
            Finding("case", name, "status, keys, types, error, chunks", "=", "=", "same")
        ]
    out += compare_metrics(sim.get("metrics", {}), real.get("metrics", {}))
    for name, got in (real.get("sdk") or {}).items():
        mine = (sim.get("sdk") or {}).get(name)
        if mine is not None and mine != got:
            out.append(Finding("sdk", name, "openai SDK result", str(mine), str(got)))
    for kind, real_lines in (real.get("logs") or {}).items():
        sim_lines = (sim.get("logs") or {}).get(kind)
        if sim_lines is not None:
            out += compare_logs(kind, sim_lines, real_lines)
    return [_deliberate(f) for f in out]


def as_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]


def summary(findings: list[Finding]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in findings:
        out[f.verdict] = out.get(f.verdict, 0) + 1
    return out


__all__ = ["Finding", "compare", "as_json", "summary", "logclass"]
