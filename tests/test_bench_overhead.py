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

import sys

import pytest

from bench.benchlib.cli import base_parser
from bench.benchlib.runner import Bench
from bench.benchlib.stats import summarize
from tests.fakes.mock_openai import MockConfig, MockServer

# 80 ms to the first token, then three more one-token steps (max_tokens 4).
KERNEL_TRUTH = MockConfig(ttft_s=0.08, step_s=0.01, tokens_per_step=(1,), kernel_stamps=True)


# What separates kernel stamps from user-space ones (measured on this 2-core box, 2026-12-01,
# 64-stream waves): p90 of |client - truth| 0.022-0.077 ms with kernel stamps in 9 waves of 10
# (the tenth, disturbed, 1.15 ms), 0.76-32 ms in all 15 with kstamp's user-space fallback forced.
# The bound sits between them.
P90_BOUND_MS = 0.25


def _wave() -> tuple[dict, list[float]]:
    """One 64-stream wave: `summarize` of |client TTFT - kernel truth| (ms), the wake lags."""
    with MockServer(KERNEL_TRUTH) as srv:
        args = base_parser("t").parse_args(["--url", srv.url, "--settle-ms", "200"])
        b = Bench("t", args)
        b.model = "m"
        msgs = [[{"role": "user", "content": f"s{i}"}] for i in range(64)]
        res = b.stream_wave([b.chat_payload(m, 4) for m in msgs], None)
        truth = {r["id"]: r["kernel_ttft_ms"] for r in srv.records()}
    assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
    assert len(truth) == 64 and None not in truth.values(), "the fake took no kernel stamps"
    diff = [(r.t_first_token_ns - r.t_request_ns) / 1e6 - truth[r.request_id] for r in res]
    lag = [r.wake_lag_max_ms for r in res if r.wake_lag_max_ms is not None]
    return summarize(abs(d) for d in diff), lag


@pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPING is Linux-only")
def test_client_ttft_matches_kernel_truth_at_64_streams(capsys):
    """Median within 1 ms and p90 within P90_BOUND_MS of the server's kernel-stamped TTFT.

    A busy box can defer loopback delivery itself (softirq work waits for a CPU) between the
    server's departure stamp and the client's arrival stamp: in a full CI run on 2026-12-01 five
    of 64 streams arrived 94-226 ms after their departure stamp. That is not the client's error,
    so a disturbed wave is run once more; a client that fell back to user-space stamps misses the
    bound in every wave (its error is its own threads' wake-up lag, present in each).
    """
    old = sys.getswitchinterval()
    waves = []
    try:
        for _ in range(2):
            err, lag = _wave()
            waves.append((err["median"], err["p90"]))
            with capsys.disabled():
                print(
                    f"\n64 streams vs kernel truth: |client - server| TTFT median "
                    f"{err['median'] * 1000:.0f} us, p90 {err['p90'] * 1000:.0f} us, max "
                    f"{err['max'] * 1000:.0f} us; the kernel stamps hid thread wake-up lags up "
                    f"to {max(lag, default=0.0):.1f} ms"
                )
            if err["median"] <= 1.0 and err["p90"] <= P90_BOUND_MS:
                break
    finally:
        sys.setswitchinterval(old)
    median, p90 = waves[-1]
    assert median <= 1.0, waves
    assert p90 <= P90_BOUND_MS, waves
