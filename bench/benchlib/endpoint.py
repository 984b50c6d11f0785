"""The endpoint a bench talks to: pairctl's Endpoint, under the name the benches know.

The object, the URL rules (``HOST:8000`` and ``http://HOST:8000/v1`` both mean the server's
base URL), the ``--url`` argparse type, readiness and the simulator marks live in
``pairctl.endpoint``, the lowest layer, because the quality gate (pairctl.gate) needs them
too and pairctl imports nothing of bench. A bench gets its Endpoint from ``--url`` once
(bench.benchlib.cli) and hands that object down; nothing below parses the URL again.
"""

from __future__ import annotations

from pairctl.endpoint import (
    FINAL_STATUSES,
    SIM_HEADER,
    SIM_OWNER,
    Endpoint,
    Identity,
    NotReady,
    add_endpoint_args,
    cause,
    endpoint_arg,
    endpoint_of,
    identify,
    normalize,
    wait_ready,
)

__all__ = [
    "FINAL_STATUSES",
    "SIM_HEADER",
    "SIM_OWNER",
    "Endpoint",
    "Identity",
    "NotReady",
    "add_endpoint_args",
    "cause",
    "endpoint_arg",
    "endpoint_of",
    "identify",
    "normalize",
    "wait_ready",
]
