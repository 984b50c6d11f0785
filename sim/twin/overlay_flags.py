"""The overlay flags as the plugin itself reads them: its registry, not a copy of it.

The twin stands in for a vLLM process with `dsv4_flash_overlays` installed, so whether an
overlay is on must be decided by the plugin's own `flags.flag_enabled` (exact "1", the
kill switch `DSV4_OVERLAYS_DISABLE=1` wins). A flag renamed in the plugin fails here at
import, not silently in a benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping

from dsv4_flash_overlays.flags import OVERLAYS, flag_enabled


def _flag_of(overlay: str) -> str:
    for ov in OVERLAYS:
        if ov.name == overlay:
            return ov.flag
    raise LookupError(
        f"dsv4_flash_overlays has no overlay {overlay!r} (it has "
        f"{', '.join(o.name for o in OVERLAYS)}); update sim/twin/overlay_flags.py"
    )


FP8_DRAFT_HEAD = _flag_of("fp8-draft-head")
ENCODE_CACHE = _flag_of("incremental-encode-cache")


def fp8_head_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the plugin would run the fp8 draft head in this environment."""
    return flag_enabled(FP8_DRAFT_HEAD, environ)


def encode_cache_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the plugin would wrap the DSV4 tokenizer with the incremental cache."""
    return flag_enabled(ENCODE_CACHE, environ)
