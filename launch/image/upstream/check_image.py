#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The upstream image's last build step: a broken image fails the build, not the boot.

Why: everything this layer changes (a rebuilt DeepGEMM, a pinned FlashInfer, a patched vLLM
file) can go wrong in a way that still builds and then dies minutes into a boot, or worse at
the first decode (ecohash-co/deepseek-v4-flash-dgx-spark-vllm027 ``docs/03-what-i-wish-id-had.md``
section 2: "build-time assertions for every property you depend on"). This imports vLLM
and the classes the DSpark path and our overlays use, compares the versions the stack
declares, checks the interpreter and entrypoint paths the launcher will exec, and checks
that DeepGEMM carries its SM120 code. Every failure is printed, then it exits 1.

No GPU is needed (a ``docker build`` has none): nothing here runs a kernel.

    python3 check_image.py --vllm 0.27.1 --torch 2.13.0 --flashinfer 0.6.16.post3 \\
        --interpreter /usr/bin/python3 --entrypoint /usr/local/bin/vllm \\
        --import vllm.models.deepseek_v4.nvidia.dspark:DSparkDeepseekV4ForCausalLM \\
        --deep-gemm-arch sm120
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path


def version_matches(found: str, want: str) -> bool:
    """Exact, or ``want`` plus a local build tag (torch reports ``2.13.0+cu130``)."""
    return found == want or found.startswith(want + "+")


def check_versions(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(failures, what was found) for vLLM, torch and FlashInfer, each really imported."""
    failures: list[str] = []
    found: list[str] = []
    for module, want in (
        ("vllm", args.vllm),
        ("torch", args.torch),
        ("flashinfer", args.flashinfer),
    ):
        if want is None:
            continue
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # an image whose package does not import is the failure
            failures.append(f"import {module} failed: {type(exc).__name__}: {exc}")
            continue
        have = str(getattr(mod, "__version__", "?"))
        found.append(f"{module} {have}")
        if not version_matches(have, want):
            failures.append(f"{module} is {have}, the stack declares {want}")
    return failures, found


def check_imports(specs: list[str]) -> list[str]:
    """Each ``module:Attr.attr`` importable and resolvable."""
    failures = []
    for spec in specs:
        module, _, attrs = spec.partition(":")
        try:
            obj = importlib.import_module(module)
            for attr in filter(None, attrs.split(".")):
                obj = getattr(obj, attr)
        except Exception as exc:
            failures.append(f"{spec} not importable: {type(exc).__name__}: {exc}")
    return failures


def check_executable(label: str, path: str | None) -> list[str]:
    if path is None:
        return []
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return [f"{label} {path} is not an executable file in this image"]
    return []


def check_deep_gemm(token: str | None) -> list[str]:
    """DeepGEMM's package carries ``token`` (``sm120``) in its extension or JIT headers.

    DeepGEMM JIT-compiles its kernels, so the extension is a host dispatcher: the arch
    shows up as source names (the peer's Dockerfile.vllm027-gb10 checks the same two places).
    """
    if token is None:
        return []
    try:
        dg = importlib.import_module("deep_gemm")
    except Exception as exc:
        return [f"import deep_gemm failed: {type(exc).__name__}: {exc}"]
    root = Path(str(dg.__file__)).parent
    needle = token.encode()
    for so in sorted(root.glob("_C*.so")):
        if needle in so.read_bytes():
            return []
    include = root / "include"
    if include.is_dir():
        for f in include.rglob("*"):
            if f.is_file() and needle in f.read_bytes():
                return []
    return [
        f"deep_gemm at {root} has no {token!r} in its extension or include/: built for the "
        "wrong architecture (its CMake overwrites TORCH_CUDA_ARCH_LIST; rebuild it)"
    ]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", help="vllm.__version__ the stack declares (exact)")
    p.add_argument("--torch", help="torch version (exact, a +local tag allowed)")
    p.add_argument("--flashinfer", help="flashinfer.__version__ (exact)")
    p.add_argument("--interpreter", help="the python the launcher execs (absolute path)")
    p.add_argument("--entrypoint", help="the vllm console script the launcher execs")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a module (and attribute path) that must import; repeatable",
    )
    p.add_argument("--deep-gemm-arch", help="a token DeepGEMM's build must contain (sm120)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    failures, found = check_versions(args)
    failures += check_imports(args.imports)
    failures += check_executable("interpreter", args.interpreter)
    failures += check_executable("entrypoint", args.entrypoint)
    failures += check_deep_gemm(args.deep_gemm_arch)
    for failure in failures:
        print(f"IMAGE CHECK FAILED: {failure}", file=sys.stderr)
    if failures:
        return 1
    print(
        f"image check passed: {', '.join(found) or 'no versions asked'}; "
        f"{len(args.imports)} import(s) resolved"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
