"""vLLM general plugin: env-gated overlays for DeepSeek-V4-Flash + DSpark.

vLLM calls ``register()`` once in every process (API server, engine core, each worker,
the headless rank-1 node too). Each overlay is off unless its env flag is ``1``, but the
weight guard, which is on unless its flag is ``0`` (see ``flags.py``);
``DSV4_OVERLAYS_DISABLE=1`` turns all of them off. Where an overlay
attaches depends on the engine stack (the seed's vLLM 0.21 fork, upstream, the CPU
build): ``hooks.py`` resolves the stack's hook points from ``DSV4_OVERLAY_HOOKS``. Each
enabled overlay logs one line, applied or not, naming the stack and the vLLM version; one
that cannot apply leaves vLLM untouched, so a plugin problem never breaks a boot (the
weight guard fails one on purpose, and only for a parameter the checkpoint did not fill).
Overlay modules are imported lazily, only when their flag is on.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading

from . import hooks
from .flags import KILL_SWITCH, OVERLAYS, STAGE_TIMING_DIR, flag_enabled, invalid_flags

__version__ = "0.1.0"

logger = logging.getLogger("dsv4_flash_overlays")

_APPLIED: dict[str, bool] = {}
_LOCK = threading.Lock()


class _ToVllmLogger(logging.Handler):
    """Hands our records to the ``vllm`` logger, whatever handlers vLLM configures later.

    vLLM configures only its own logger tree (and may reconfigure it after plugins load),
    so copying its handlers at register time is fragile; forwarding at emit time is not.
    """

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger("vllm")
        if not target.isEnabledFor(record.levelno):
            return
        for handler in target.handlers:  # its own handlers only: no second propagation
            if record.levelno >= handler.level:
                handler.handle(record)


def _route_logs_to_vllm() -> None:
    """Show our INFO lines in vLLM's log (records still propagate to the root logger,
    which has no handler in a vLLM server, so nothing is printed twice)."""
    if any(isinstance(h, _ToVllmLogger) for h in logger.handlers):
        return
    logger.addHandler(_ToVllmLogger())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def _outcome_line(name: str, table_label: str, version: str, reason: str, detail: str = "") -> None:
    """The one line per overlay a process logs: applied or not, in which stack, and why."""
    if reason:
        logger.warning(
            "dsv4-flash-overlays: %s not applied (%s, vLLM %s, pid %d): %s; vLLM left untouched",
            name,
            table_label,
            version,
            os.getpid(),
            reason,
        )
    else:
        logger.info(
            "dsv4-flash-overlays: %s active (%s, vLLM %s, pid %d)%s",
            name,
            table_label,
            version,
            os.getpid(),
            f": {detail}" if detail else "",
        )


def register() -> None:
    """Entry point for ``vllm.general_plugins``; safe to call more than once."""
    with _LOCK:
        _route_logs_to_vllm()
        if os.environ.get(KILL_SWITCH, "") == "1":
            if not _APPLIED:
                logger.info(
                    "dsv4-flash-overlays: %s=1, no overlay applied (pid %d)",
                    KILL_SWITCH,
                    os.getpid(),
                )
            for overlay in OVERLAYS:
                _APPLIED.setdefault(overlay.name, False)
            return
        bad = invalid_flags()
        if bad and not _APPLIED:
            logger.warning("dsv4-flash-overlays: invalid values ignored for %s", ", ".join(bad))
        table = None
        for overlay in OVERLAYS:
            if overlay.name in _APPLIED:
                continue
            if not flag_enabled(overlay.flag):
                _APPLIED[overlay.name] = False
                continue
            table = table or hooks.load_table()
            detail = ""
            try:
                res = hooks.resolve(overlay.name, table)
                if res.ok:
                    module = importlib.import_module(f"{__name__}.{overlay.module}")
                    outcome = module.apply(res)
                    reason, detail = outcome.reason, outcome.detail
                else:
                    reason = res.reason
            except Exception as exc:  # never break a vLLM boot because of an overlay
                reason = f"{type(exc).__name__}: {exc}"
            _APPLIED[overlay.name] = not reason
            _outcome_line(overlay.name, table.label, hooks.vllm_version(), reason, detail)
        _stage_timing()


def _stage_timing() -> None:
    """Measurement only, after the overlays so its wrappers are the outermost ones."""
    if not os.environ.get(STAGE_TIMING_DIR, "") or STAGE_TIMING_DIR in invalid_flags():
        return
    try:
        from . import stage_timing

        stage_timing.apply()
    except Exception as exc:  # measurement never breaks a boot either
        logger.warning(
            "dsv4-flash-overlays: stage timing not installed (%s: %s)", type(exc).__name__, exc
        )


def applied() -> dict[str, bool]:
    """Which overlays this process applied (for tests and status output)."""
    with _LOCK:
        return dict(_APPLIED)
