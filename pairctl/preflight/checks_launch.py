"""Does the launch itself stay clear of two known failure modes? Config only, no node."""

from __future__ import annotations

from pairctl.config import PairConfig
from pairctl.plan import FORBIDDEN_ENV, build_rank
from pairctl.preflight.check import FAIL, PASS, Check, CheckSpec, Need, View
from pairctl.recipe import Recipe

PF_NO_COMPRESSED_MLA = CheckSpec(
    "PF-NO-COMPRESSED-MLA",
    title=f"{FORBIDDEN_ENV} is set nowhere: recipe env, env file, extra vLLM args",
    remedy=f"remove {FORBIDDEN_ENV} from the recipe, env file and extra args "
    "(its toggle hang once wedged a host's unified memory)",
    needs=(Need.CONFIG,),
    decide=lambda v: check_no_compressed_mla(v.cfg, v.recipe, v.passthrough),
)


def check_no_compressed_mla(cfg: PairConfig, recipe: Recipe, passthrough: list[str]) -> Check:
    where = []
    if FORBIDDEN_ENV in recipe.env:
        where.append("recipe env")
    if FORBIDDEN_ENV in cfg.unknown:
        where.append(f"env file {cfg.env_file}")
    if any(FORBIDDEN_ENV in a for a in passthrough):
        where.append("extra vLLM args")
    if where:
        return PF_NO_COMPRESSED_MLA.verdict(FAIL, f"{FORBIDDEN_ENV} set in {', '.join(where)}")
    return PF_NO_COMPRESSED_MLA.verdict(PASS, "not set")


def _head_no_ray(v: View) -> Check:
    """PF-NO-RAY on what rank 0 would actually run (recipe + extra args, last one wins)."""
    head = build_rank(v.cfg, v.recipe, 0, v.passthrough)
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
