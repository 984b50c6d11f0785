"""``python -m dsv4_flash_overlays.check``: which overlays would apply in this image.

Preflight's image probe runs it inside the image, with the stack's DSV4_OVERLAY_HOOKS
and the recipe's flags in the env, before anything boots. It resolves every overlay's
hook points (imports the vLLM modules they name, walks the qualnames, checks signatures
and anchors) but starts no engine and patches nothing, and prints ONE JSON line:

    {"plugin": "dsv4-flash-overlays", "version": "0.1.0", "stack": "fork",
     "table": "env", "vllm": "0.21.1rc1.dev339+g1967a5627bc3",
     "overlays": {"incremental-encode-cache": {"flag": "VLLM_INCREMENTAL_ENCODE_CACHE",
                   "enabled": true, "resolvable": true, "reason": null}, ...}}

``table`` is "env" (from DSV4_OVERLAY_HOOKS) or "built-in" (the variable unset: the
upstream table). ``resolvable`` is about the source only: the fp8 head also needs a GPU of
SM >= 8.9 at boot, which a probe without ``--gpus`` cannot see. ``reason`` is the same
sentence register() would log. Exit 0 whatever the overlays' state; 1 only when the
plugin itself is broken (then the line carries ``error``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from . import __version__, hooks
from .flags import OVERLAYS, flag_enabled


def report() -> dict[str, Any]:
    """The check's result as a dict (the JSON line's content)."""
    table = hooks.load_table()
    version = hooks.vllm_version(import_it=True)
    overlays: dict[str, dict[str, Any]] = {}
    for overlay in OVERLAYS:
        res = hooks.resolve(overlay.name, table)
        overlays[overlay.name] = {
            "flag": overlay.flag,
            "enabled": flag_enabled(overlay.flag),
            "resolvable": res.ok,
            "reason": res.reason or None,
        }
    return {
        "plugin": "dsv4-flash-overlays",
        "version": __version__,
        "stack": table.stack,
        "table": table.origin,
        "vllm": version,
        "overlays": overlays,
    }


def main() -> int:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__.strip())
        return 0
    # Whatever importing vLLM prints (its logger writes to stdout) goes to stderr, so
    # stdout carries exactly the one line.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        out = report()
        code = 0
    except Exception as exc:  # the plugin's own bug: say so on the same one line
        out = {"plugin": "dsv4-flash-overlays", "error": f"{type(exc).__name__}: {exc}"}
        code = 1
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(out, separators=(",", ":"), sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
