"""Is the launch itself sound? Known failure modes of the config, the argv as vLLM's own
parser reads it, and an open endpoint."""

from __future__ import annotations

from typing import Protocol

from pairctl.pair.plan import FORBIDDEN_ENV, build_rank
from pairctl.pair.recipe import Recipe
from pairctl.preflight.check import FAIL, PASS, WARN, Check, CheckSpec, Need, View
from pairctl.preflight.evidence import ArgvCheck


class EnvFile(Protocol):
    """What PF-NO-COMPRESSED-MLA reads of an env file (a PairConfig and the resolved pair
    both have it)."""

    @property
    def env_file(self) -> str: ...

    @property
    def unknown(self) -> tuple[str, ...]: ...


PF_NO_COMPRESSED_MLA = CheckSpec(
    "PF-NO-COMPRESSED-MLA",
    title=f"{FORBIDDEN_ENV} is set nowhere: recipe env, env file, extra vLLM args",
    remedy=f"remove {FORBIDDEN_ENV} from the recipe, env file and extra args "
    "(its toggle hang once wedged a host's unified memory)",
    needs=(Need.CONFIG,),
    decide=lambda v: check_no_compressed_mla(v.pair, v.recipe, v.passthrough),
)


def check_no_compressed_mla(env: EnvFile, recipe: Recipe, passthrough: list[str]) -> Check:
    """``env``: the env file (a PairConfig or the resolved pair) and the variables it set
    that pairctl does not know."""
    where = []
    if FORBIDDEN_ENV in recipe.env:
        where.append("recipe env")
    if FORBIDDEN_ENV in env.unknown:
        where.append(f"env file {env.env_file}")
    if any(FORBIDDEN_ENV in a for a in passthrough):
        where.append("extra vLLM args")
    if where:
        return PF_NO_COMPRESSED_MLA.verdict(FAIL, f"{FORBIDDEN_ENV} set in {', '.join(where)}")
    return PF_NO_COMPRESSED_MLA.verdict(PASS, "not set")


def _head_no_ray(v: View) -> Check:
    """PF-NO-RAY on what rank 0 would actually run (recipe + extra args, last one wins)."""
    head = build_rank(v.pair, 0)
    return check_no_ray(list(head.vllm_argv), head.env)


PF_NO_RAY = CheckSpec(
    "PF-NO-RAY",
    title="the effective --distributed-executor-backend is mp (PyTorch distributed), with "
    "no Ray flag and no env key with a RAY word (e.g. VLLM_USE_RAY_SPMD_WORKER)",
    remedy="use distributed-executor-backend: mp; with Ray TP=2 collapses onto one GPU",
    needs=(Need.CONFIG,),
    decide=_head_no_ray,
)


def effective_backend(argv: list[str]) -> str | None:
    """The last --distributed-executor-backend value (argparse: last one wins)."""
    val = None
    for i, a in enumerate(argv):
        if a == "--distributed-executor-backend" and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith("--distributed-executor-backend="):
            val = a.split("=", 1)[1]
    return val


def check_no_ray(argv: list[str], env: dict[str, str]) -> Check:
    backend = effective_backend(argv)
    ray_flags = [
        a
        for a in argv
        if a.startswith("--") and "ray" in a.split("=")[0].lower() and a not in ("--no-ray",)
    ]
    ray_env = [k for k in env if "RAY" in k.upper().split("_")]
    if backend != "mp" or ray_flags or ray_env:
        detail = f"distributed-executor-backend={backend}"
        if ray_flags:
            detail += f"; ray flags {ray_flags}"
        if ray_env:
            detail += f"; ray env {ray_env}"
        return PF_NO_RAY.verdict(FAIL, detail)
    return PF_NO_RAY.verdict(PASS, "distributed-executor-backend=mp")


PF_VLLM_ARGS = CheckSpec(
    "PF-VLLM-ARGS",
    title="both ranks' vllm serve argv pass vLLM's own parser, every flag spelled in full: "
    "the local vLLM's if importable (a rejection is then exit 2 before preflight), else the "
    "image's, in a throwaway container on SPARK1 (WARN when it could not run)",
    remedy="fix the recipe key or extra arg named (vllm serve --help=all in the image lists "
    "the flags); if the image's interpreter (the stack's) cannot import vLLM, check the image",
    needs=(Need.ARGV,),
    decide=lambda v: check_vllm_args(v.argv_check),
)


def check_vllm_args(res: ArgvCheck) -> Check:
    if not res.ran:
        return PF_VLLM_ARGS.verdict(WARN, f"not checked ({res.where or 'no parser'}): {res.detail}")
    if res.errors:
        return PF_VLLM_ARGS.verdict(FAIL, f"{res.where}: " + " | ".join(res.errors))
    note = f"; {res.detail}" if res.detail else ""
    return PF_VLLM_ARGS.verdict(PASS, f"accepted by {res.where}{note}")


def _api_key(v: View) -> Check:
    argv = list(v.pair.vllm_argv[0])
    host = "0.0.0.0"  # vLLM binds every address when --host is not given
    for i, a in enumerate(argv):
        if a == "--host" and i + 1 < len(argv):
            host = argv[i + 1]
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
    return check_api_key(host, bool(v.pair.api_key))


PF_API_KEY = CheckSpec(
    "PF-API-KEY",
    title="an endpoint bound to every address (--host 0.0.0.0) requires a key: VLLM_API_KEY "
    "in the env file (vLLM then wants Authorization: Bearer on /v1); none WARNs",
    remedy="set VLLM_API_KEY in the env file (the launcher passes it by name and its own "
    "clients send it), or bind the endpoint to one address with --host",
    needs=(Need.CONFIG,),
    decide=_api_key,
)


def check_api_key(host: str, have_key: bool) -> Check:
    if have_key:
        return PF_API_KEY.verdict(PASS, f"VLLM_API_KEY set: /v1 on {host} requires it")
    if host in ("0.0.0.0", "::", ""):
        return PF_API_KEY.verdict(
            WARN, f"--host {host or '(all)'} and no VLLM_API_KEY: anyone on the network can use it"
        )
    return PF_API_KEY.verdict(PASS, f"bound to {host} only (no key)")
