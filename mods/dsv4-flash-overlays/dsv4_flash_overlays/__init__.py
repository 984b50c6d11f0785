"""vLLM general plugin: env-gated overlays for DeepSeek-V4-Flash + DSpark on vLLM 0.33.

vLLM calls ``register()`` once in every process (API server, engine core, each worker,
the headless rank-1 node too). Each overlay is off unless its env flag is ``1``
(see ``flags.py``); an overlay that cannot apply logs one warning and leaves vLLM
untouched, so a plugin problem never breaks a boot.
"""

from __future__ import annotations

import importlib
import logging
import os

from .flags import OVERLAYS, flag_enabled

logger = logging.getLogger("dsv4_flash_overlays")

_APPLIED: dict[str, bool] = {}


def register() -> None:
    """Entry point for ``vllm.general_plugins``; safe to call more than once."""
    for overlay in OVERLAYS:
        if overlay.name in _APPLIED:
            continue
        if not flag_enabled(overlay.flag):
            _APPLIED[overlay.name] = False
            continue
        try:
            module = importlib.import_module(f"{__name__}.{overlay.module}")
            ok = bool(module.apply())
        except Exception as exc:  # never break a vLLM boot because of an overlay
            logger.warning(
                "dsv4-flash-overlays: %s could not be applied (%s: %s); vLLM left untouched",
                overlay.name, type(exc).__name__, exc,
            )
            ok = False
        _APPLIED[overlay.name] = ok
        if ok:
            logger.info("dsv4-flash-overlays: %s installed (pid %d)", overlay.name, os.getpid())


def applied() -> dict[str, bool]:
    """Which overlays this process applied (for tests and status output)."""
    return dict(_APPLIED)
