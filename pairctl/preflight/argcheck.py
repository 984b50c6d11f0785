"""Recipe typos stop before anything starts: the final vLLM argv, read by vLLM's own parser.

Both ranks' ``vllm serve`` argv (recipe + per-rank wiring + extra args) go through
``make_arg_parser`` (vllm/entrypoints/common/cli_args.py, the parser ``vllm serve`` builds)
and ``validate_parsed_serve_args``. Where that parser comes from:

- vLLM importable where pairctl runs (a dev box, CI): ``plan``/``preflight`` run it
  locally and a rejection is a config error (exit 2) naming the recipe key or extra arg.
- otherwise (a Spark: vLLM lives in the image): preflight runs the *image's* parser in a
  throwaway container on SPARK1 (``docker run --rm --entrypoint INTERPRETER IMAGE -c ...``,
  the engine stack's interpreter, e.g. the fork's ``/opt/env/bin/python``; labelled with
  this pair), since the deployed fork may differ from upstream 0.33.
  PF-VLLM-ARGS decides on the result.

argparse accepts any unambiguous prefix of a flag (``--max-num-seq`` is read as
``--max-num-seqs``), so the check also requires every flag to be spelled in full: a typo
that happens to be a prefix today becomes an error the day vLLM adds a longer flag.

A passed check is remembered (``$XDG_CACHE_HOME/dsv4-flash-spark/argcheck``), keyed by the
parser (vLLM version, or image ID) and the argv with the launcher-owned values (model
path, ports, master address) left out: those come from the validated env file. Importing
vLLM costs seconds; the same argv need not pay it twice.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from pairctl.nodes.docker import throwaway_argv
from pairctl.nodes.ssh import Node
from pairctl.pair.config import ConfigError
from pairctl.pair.recipe import Recipe
from pairctl.pair.resolved import ResolvedPair
from pairctl.preflight.evidence import ArgvCheck

MARK = "@@DSV4-ARGCHECK@@"
ROLE = "argcheck"
MODE_ENV = "PAIRCTL_ARGCHECK"  # auto (default) | image: skip the local parser
_WIRING = ("--port", "--master-addr", "--master-port")

# Where `vllm serve`'s parser (make_arg_parser, validate_parsed_serve_args) lives: it moved
# between releases (0.33: vllm/entrypoints/common/cli_args.py; 0.32, the CPU engine:
# vllm/entrypoints/launchers/cli_args.py; earlier ones vllm/entrypoints/openai/cli_args.py),
# and the stacks' images run different releases.
PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)

# Runs as `PYTHON -c SCRIPT ARGVS_JSON` locally or in the image; prints MARK + JSON.
_SCRIPT = r"""
import contextlib, io, json, os, sys
out = {"vllm": None, "results": [], "error": None}
try:
    import importlib, vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    for name in @@PARSER_MODULES@@:
        try:
            cli = importlib.import_module(name)
            break
        except ImportError:
            cli = None
    if cli is None:
        raise ImportError("no vLLM serve parser module among @@PARSER_MODULES@@")
    validate_parsed_serve_args = cli.validate_parsed_serve_args
    parser = cli.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
except Exception as exc:
    out["error"] = "cannot build vLLM's serve parser: %s: %s" % (type(exc).__name__, exc)
else:
    out["vllm"] = getattr(vllm, "__version__", "?")
    known = set(parser._option_string_actions)
    for argv in json.loads(sys.argv[1]):
        res = {"ok": True, "flag": "", "error": ""}
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                validate_parsed_serve_args(parser.parse_args(argv))
        except SystemExit:
            lines = [l for l in err.getvalue().splitlines() if ": error: " in l]
            res = {"ok": False, "flag": "", "error": lines[-1].split(": error: ", 1)[1]
                   if lines else err.getvalue().strip()[-300:]}
        except Exception as exc:
            res = {"ok": False, "flag": "", "error": "%s: %s" % (type(exc).__name__, exc)}
        if res["ok"]:
            for tok in argv:
                if not tok.startswith("--"):
                    continue
                name = tok.split("=", 1)[0]
                full = "--" + name[2:].replace("_", "-").split(".", 1)[0]
                if full not in known:
                    took = sorted(o for o in known if o.startswith(full))
                    res = {"ok": False, "flag": name, "error": "%s is not a flag of vllm "
                           "serve%s" % (name, "; argparse would read it as %s (a prefix "
                           "match): write the full name" % took[0] if took else "")}
                    break
        out["results"].append(res)
print("@@DSV4-ARGCHECK@@" + json.dumps(out))
"""
SCRIPT = _SCRIPT.replace("@@PARSER_MODULES@@", repr(PARSER_MODULES))


def rank_argvs(pair: ResolvedPair) -> list[list[str]]:
    """What follows ``vllm serve`` for rank 0 and rank 1 (built once, in the resolved pair)."""
    return [list(pair.vllm_argv[r][2:]) for r in pair.ranks]


def explain(flag: str, error: str, recipe: Recipe, passthrough: list[str]) -> str:
    """Name where a rejected flag came from: the recipe key or the extra args after --."""
    named = flag or next((w for w in error.replace("/", " ").split() if w.startswith("--")), "")
    named = named.rstrip(":,'\"")
    key = named[2:].split("=", 1)[0]
    extra = {a.split("=", 1)[0] for a in passthrough if a.startswith("--")}
    if named and named.split("=", 1)[0] in extra:
        where = "extra vLLM args after --"
    elif key in recipe.serve:
        where = f"recipe {recipe.path}: serve key {key!r}"
    else:
        where = f"recipe {recipe.path} serve keys or the extra args"
    return f"{where}: vLLM's parser says: {error}"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsv4-flash-spark" / "argcheck"


def _key(parser_id: str, argvs: list[list[str]]) -> str:
    norm = []
    for argv in argvs:
        out = ["MODEL", *argv[1:]]
        for i, tok in enumerate(out[:-1]):
            if tok in _WIRING:
                out[i + 1] = "WIRING"
        norm.append(out)
    return hashlib.sha256(json.dumps([parser_id, norm]).encode()).hexdigest()


def _cached(parser_id: str, argvs: list[list[str]]) -> bool:
    return (_cache_dir() / f"{_key(parser_id, argvs)}.ok").is_file()


def _remember(parser_id: str, argvs: list[list[str]]) -> None:
    try:
        d = _cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{_key(parser_id, argvs)}.ok").write_text(parser_id + "\n")
    except OSError:
        pass  # a cache that cannot be written only costs time


def parse_output(
    text: str, where: str, recipe: Recipe, passthrough: list[str], ranks: int = 2
) -> ArgvCheck:
    """The check script's stdout → ArgvCheck (errors explained per rank)."""
    line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        tail = " ".join(text.strip().splitlines()[-3:])[-300:]
        return ArgvCheck(where, False, f"the parser printed no verdict: {tail or 'no output'}")
    data = json.loads(line[len(MARK) :])
    if data.get("error"):
        return ArgvCheck(where, False, str(data["error"]))
    if data.get("vllm"):
        ver = data["vllm"]
        where = f"{where} {ver}" if where.endswith("vLLM") else f"{where} (vLLM {ver})"
    by_why: dict[str, list[int]] = {}
    for rank, res in enumerate(data.get("results", [])[:ranks]):
        if not res.get("ok"):
            why = explain(str(res.get("flag", "")), str(res.get("error", "")), recipe, passthrough)
            by_why.setdefault(why, []).append(rank)
    errors = [f"{_who(r, ranks)}: {why}" for why, r in by_why.items()]
    return ArgvCheck(where, True, "", errors)


def _who(got: list[int], ranks: int) -> str:
    """ "both ranks" (a pair) or "every rank" (a group) when all said it, else which."""
    if len(got) == ranks > 1:
        return "both ranks" if ranks == 2 else "every rank"
    if len(got) == 1:
        return f"rank {got[0]}"
    return "ranks " + ", ".join(str(r) for r in got)


def local_parser() -> str | None:
    """``vllm==X`` when vLLM is importable here and the mode allows it, else None."""
    if os.environ.get(MODE_ENV, "auto") == "image":
        return None
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return f"vllm=={importlib.metadata.version('vllm')}"
    except importlib.metadata.PackageNotFoundError:
        return "vllm==?"


def run_local(pair: ResolvedPair) -> ArgvCheck | None:
    """Check with the local vLLM; None when it is not importable (or the mode says image)."""
    parser_id = local_parser()
    if parser_id is None:
        return None
    recipe, passthrough = pair.recipe, list(pair.passthrough)
    argvs = rank_argvs(pair)
    where = "this machine's vLLM"
    if _cached(parser_id, argvs):
        version = parser_id.partition("==")[2]
        return ArgvCheck(f"{where} {version}", True, "passed before (cached)")
    try:
        out, err = run_script_locally(argvs)
    except subprocess.TimeoutExpired:
        return ArgvCheck(where, False, "the local parser did not answer within 300 s")
    res = parse_output(out, where, recipe, passthrough, len(argvs))
    if not res.ran:
        res = ArgvCheck(where, False, f"{res.detail} {err.strip()[-300:]}".strip())
    elif res.ok:
        _remember(parser_id, argvs)
    return res


# vLLM 0.33's kernel package humming-kernels starts, at import, two background interpreters that
# JIT-build CUDA kernels (`build_humming_launcher_in_bg` in humming/ops/utils.py,
# `build_nvrtc_compile_binary_in_bg` in humming/utils/nvrtc.py), ~8 CPU-s between them. A parser
# needs no kernels, and without CUDA they can only fail: humming's own switch turns them off.
NO_CUDA_JIT = {"HUMMING_DISABLE_PARALLEL_BUILD": "1"}


def run_script_locally(argvs: list[list[str]]) -> tuple[str, str]:
    """SCRIPT with this interpreter (a child process: importing vLLM picks a platform for
    the whole process); returns its stdout and stderr."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the parser needs a platform; CPU will do
    for name, value in NO_CUDA_JIT.items():  # an operator's own setting is kept
        env.setdefault(name, value)
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    return p.stdout, p.stderr


def require_local(pair: ResolvedPair) -> ArgvCheck | None:
    """``plan``/``preflight``: the local check, a rejection raised as a config error."""
    res = run_local(pair)
    if res is not None and res.errors:
        raise ConfigError(
            "vLLM would refuse this command line; nothing was started:\n  "
            + "\n  ".join(res.errors)
        )
    return res


def plan_note(res: ArgvCheck | None, nnodes: int = 2) -> str:
    """One comment line for ``plan`` saying what checked the argv."""
    if res is None:
        return (
            "argv not checked here (vLLM is not importable on this machine): preflight "
            "checks it with the image's own parser (PF-VLLM-ARGS)"
        )
    if res.ok:
        extra = f"; {res.detail}" if res.detail else ""
        ranks = "both ranks" if nnodes == 2 else f"all {nnodes} ranks"
        return f"argv of {ranks} accepted by vLLM's serve parser ({res.where}{extra})"
    return f"argv NOT checked: {res.where}: {res.detail}"


def container_argv(pair_id: str, image: str, argvs: list[list[str]], interpreter: str) -> list[str]:
    """The throwaway container (docker.throwaway_argv): the image's interpreter (the
    stack's) runs SCRIPT on both ranks' argvs."""
    # vLLM's parser needs a platform: the GPU it will really run on.
    opts = ["--gpus", "all", "-e", "VLLM_LOGGING_LEVEL=ERROR"]
    return throwaway_argv(
        pair_id, ROLE, image, interpreter, SCRIPT, opts=opts, args=[json.dumps(argvs)]
    )


def run_in_image(node: Node, pair: ResolvedPair, image_id: str) -> ArgvCheck:
    """Check with the image's parser in a throwaway container on ``node`` (SPARK1)."""
    recipe, passthrough = pair.recipe, list(pair.passthrough)
    argvs = rank_argvs(pair)
    parser_id = f"image:{image_id}"
    where = f"image {image_id[:19]} on {node.label}"
    if _cached(parser_id, argvs):
        return ArgvCheck(where, True, "passed before (cached)")
    argv = container_argv(pair.pair_id, pair.image, argvs, pair.stack.interpreter)
    res = node.run(argv, timeout=300)
    out = parse_output(res.out, where, recipe, passthrough, len(argvs))
    if not out.ran:
        err = (res.err or "").strip()[-300:]
        out = ArgvCheck(where, False, f"rc={res.rc}: {out.detail} {err}".strip())
    elif out.ok:
        _remember(parser_id, argvs)
    return out
