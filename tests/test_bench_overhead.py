"""Client overhead at 64 concurrent streams, against a server that stamps in the kernel.

The simulator's /twin/requests times are taken in Python (do_POST start, the modelled step end),
so on a shared 2-core box its own GIL queueing of 64 arrivals shows up as tens of ms that are not
the client's. To measure the *client's* error, the fake server (tests/fakes/mock_openai.py with
kernel_stamps) stamps where the network does: SO_TIMESTAMPING gives it the kernel arrival time of
each request head and the kernel departure time of its first token event. Truth TTFT = departure
- arrival; the client's TTFT may differ from it only by two loopback hops (microseconds) plus its
own error. The same comparison against the simulator is printed by
test_bench_twin.py::test_client_ttft_overhead_at_64_streams.
"""

from __future__ import annotations

import statistics
import sys

import pytest

from bench.benchlib.cli import base_parser
from bench.benchlib.runner import Bench
from tests.fakes.mock_openai import MockConfig, MockServer

# 80 ms to the first token, then three more one-token steps (max_tokens 4).
KERNEL_TRUTH = MockConfig(ttft_s=0.08, step_s=0.01, tokens_per_step=(1,), kernel_stamps=True)


@pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPING is Linux-only")
def test_client_ttft_within_1ms_of_kernel_truth_at_64_streams(capsys):
    old = sys.getswitchinterval()
    try:
        with MockServer(KERNEL_TRUTH) as srv:
            args = base_parser("t").parse_args(["--url", srv.url, "--settle-ms", "200"])
            b = Bench("t", args)
            b.model = "m"
            msgs = [[{"role": "user", "content": f"s{i}"}] for i in range(64)]
            res = b.stream_wave([b.chat_payload(m, 4) for m in msgs], None)
            truth = {r["id"]: r["kernel_ttft_ms"] for r in srv.records()}
    finally:
        sys.setswitchinterval(old)
    assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
    assert len(truth) == 64 and None not in truth.values(), "the fake took no kernel stamps"
    diff = [(r.t_first_token_ns - r.t_request_ns) / 1e6 - truth[r.request_id] for r in res]
    lag = [r.wake_lag_max_ms for r in res if r.wake_lag_max_ms is not None]
    with capsys.disabled():
        print(
            f"\n64 streams vs kernel truth: |client - server| TTFT median "
            f"{statistics.median(map(abs, diff)) * 1000:.0f} us, max "
            f"{max(map(abs, diff)) * 1000:.0f} us; the kernel stamps hid thread wake-up lags up "
            f"to {max(lag):.1f} ms"
        )
    # Median and p95 within 1 ms; the max is printed (a rare outlier reaches ~1 ms on a loaded
    # box: loopback delivery itself is then delayed between the two kernels' stamps).
    err = sorted(abs(d) for d in diff)
    assert statistics.median(err) <= 1.0
    assert err[int(0.95 * len(err)) - 1] <= 1.0, err[-5:]
