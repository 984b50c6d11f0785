"""The serving-figure maths of `status` (pairctl/status/metrics.py) on hand-made scrapes.

Expected values are worked out here from the definitions (PromQL's histogram_quantile
interpolation, vLLM's acceptance formulas on SpecDecodingProm), not read back from the code.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from pairctl.status import metrics as sm
from sim.twin.metrics import Metrics

INF = math.inf


def expo(
    gen: float = 0,
    drafts: float = 0,
    accepted: float = 0,
    per_pos: tuple[float, ...] = (),
    queries: float = 0,
    hits: float = 0,
    ttft: dict[str, float] | None = None,
    running: float = 1,
    waiting: float = 0,
    kv: float = 0.25,
) -> str:
    """A /metrics body in vLLM 0.33's names, two engines' worth of label sets for gauges."""
    lbl = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lbl}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lbl}}} {waiting}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{lbl}}} {kv}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{lbl}}} {gen}",
        "# TYPE vllm:spec_decode_num_drafts counter",
        f"vllm:spec_decode_num_drafts_total{{{lbl}}} {drafts}",
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lbl}}} {accepted}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{k}"}} {v}'
        for k, v in enumerate(per_pos)
    ]
    lines += [
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{lbl}}} {queries}",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{lbl}}} {hits}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    ttft = ttft or {"0.1": 0, "0.5": 0, "1.0": 0, "+Inf": 0}
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{{lbl},le="{le}"}} {c}' for le, c in ttft.items()
    ]
    count = list(ttft.values())[-1]
    lines += [
        f"vllm:time_to_first_token_seconds_count{{{lbl}}} {count}",
        f"vllm:time_to_first_token_seconds_sum{{{lbl}}} 0",
    ]
    return "\n".join(lines) + "\n"


def test_quantile_interpolates_inside_the_bucket() -> None:
    b = [(0.1, 10), (0.5, 30), (1.0, 40), (INF, 40)]
    assert sm.histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.4 * 10 / 20)  # rank 20
    assert sm.histogram_quantile(0.95, b) == pytest.approx(0.5 + 0.5 * 8 / 10)  # rank 38
    assert sm.histogram_quantile(0.25, b) == pytest.approx(0.1)  # rank 10: top of bucket 1


def test_quantile_edges() -> None:
    assert sm.histogram_quantile(0.5, [(1.0, 10), (INF, 10)]) == pytest.approx(0.5)  # from 0
    assert sm.histogram_quantile(0.9, [(0.1, 1), (INF, 10)]) == 0.1  # in +Inf: last bound
    assert sm.histogram_quantile(0.5, [(0.1, 0), (INF, 0)]) is None
    assert sm.histogram_quantile(0.5, []) is None
    with pytest.raises(ValueError):
        sm.histogram_quantile(1.5, [(1.0, 1)])


def test_counter_increase_survives_a_restart() -> None:
    assert sm.increase(100, 160) == 60
    assert sm.increase(100, 30) == 30  # went down: the server restarted
    assert sm.increase(None, 5) == 5 and sm.increase(5, None) is None
    before, after = [(0.1, 5), (INF, 8)], [(0.1, 6), (INF, 12)]
    assert sm.bucket_increase(before, after) == [(0.1, 1), (INF, 4)]
    assert sm.bucket_increase(after, before) == before  # reset: all of it is new


def test_rates_between_two_scrapes() -> None:
    prev = sm.parse(
        expo(
            gen=1000,
            drafts=100,
            accepted=250,
            per_pos=(80, 60, 50, 40, 20),
            queries=1000,
            hits=100,
            ttft={"0.1": 0, "0.5": 0, "1.0": 50, "+Inf": 50},  # 50 slow requests earlier
        )
    )
    cur = sm.parse(
        expo(
            gen=1110,  # 110 tokens in 2 s
            drafts=140,  # 40 verify steps
            accepted=350,  # 100 accepted drafts
            per_pos=(116, 86, 70, 52, 26),  # +36 +26 +20 +12 +6 = 100
            queries=3000,
            hits=1600,  # 1500 of 2000 new prompt tokens hit
            ttft={"0.1": 10, "0.5": 20, "1.0": 70, "+Inf": 70},  # 20 new, all fast
            running=3,
            waiting=2,
        )
    )
    f = sm.figures(cur, prev, dt=2.0)
    assert f.window == "interval" and f.window_s == 2.0
    assert f.decode_tok_s == pytest.approx(55.0)
    assert f.acceptance_per_pos == pytest.approx([36 / 40, 26 / 40, 20 / 40, 12 / 40, 6 / 40])
    assert f.mean_acceptance_length == pytest.approx(1 + 100 / 40)
    assert f.prefix_cache_hit_rate == pytest.approx(1500 / 2000)
    # Only this interval's 20 requests: 10 in (0, 0.1], 10 in (0.1, 0.5].
    assert f.ttft_p50_s == pytest.approx(0.1)
    assert f.ttft_p95_s == pytest.approx(0.1 + 0.4 * (19 - 10) / 10)
    assert (f.running, f.waiting, f.kv_cache_usage) == (3, 2, 0.25)


def test_idle_interval_falls_back_to_lifetime_ratios() -> None:
    text = expo(gen=500, drafts=100, accepted=200, per_pos=(90, 70, 40), queries=10, hits=5)
    f = sm.figures(sm.parse(text), sm.parse(text), dt=1.0)
    assert f.decode_tok_s == 0.0  # a true zero: nothing was generated
    assert f.mean_acceptance_length == pytest.approx(3.0)
    assert f.acceptance_per_pos == pytest.approx([0.9, 0.7, 0.4])
    assert f.prefix_cache_hit_rate == pytest.approx(0.5)
    assert f.ttft_p50_s is None  # no request ever


def test_one_scrape_gives_lifetime_figures_and_no_rate() -> None:
    f = sm.figures(sm.parse(expo(gen=500, drafts=10, accepted=20)))
    assert f.window == "lifetime" and f.decode_tok_s is None
    assert f.mean_acceptance_length == pytest.approx(3.0)


def test_gauges_over_engines_add_up_but_usage_does_not() -> None:
    two = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0"} 2',
            'vllm:num_requests_running{engine="1"} 3',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0"} 0.5',
            'vllm:kv_cache_usage_perc{engine="1"} 0.75',
        ]
    )
    f = sm.figures(sm.parse(two + "\n"))
    assert f.running == 5 and f.kv_cache_usage == 0.75
    assert f.acceptance_per_pos == [] and f.mean_acceptance_length is None


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(sm.MetricsParseError):
        sm.parse("<html>404 not found</html>\n")


def test_the_twins_exposition_reads_back() -> None:
    """The simulator exports these names through prometheus_client: the figures must find
    every one of them (a renamed metric on either side fails here)."""
    m = Metrics("m", gamma=3)
    before = sm.parse(m.render().decode())
    m.running.set(4)
    m.kv_usage.set(0.5)
    m.generation_tokens.inc(300)
    m.drafts.inc(100)
    m.accepted.inc(150)
    for pos, n in enumerate((80, 50, 20)):
        m.accepted_pos[pos].inc(n)
    m.prefix_queries.inc(400)
    m.prefix_hits.inc(100)
    for _ in range(4):
        m.ttft.observe(0.3)
    f = sm.figures(sm.parse(m.render().decode()), before, dt=3.0)
    assert f.running == 4 and f.kv_cache_usage == 0.5
    assert f.decode_tok_s == pytest.approx(100.0)
    assert f.acceptance_per_pos == pytest.approx([0.8, 0.5, 0.2])
    assert f.mean_acceptance_length == pytest.approx(2.5)
    assert f.prefix_cache_hit_rate == pytest.approx(0.25)
    assert 0.25 < f.ttft_p50_s <= 0.5  # all four in the (0.25, 0.5] bucket


@pytest.mark.needs_vllm
def test_metric_names_are_vllm_033s() -> None:
    """Every name status reads is defined in the installed vLLM 0.33's metrics code."""
    import vllm

    root = Path(vllm.__file__).parent
    source = (root / "v1/metrics/loggers.py").read_text() + (
        root / "v1/spec_decode/metrics.py"
    ).read_text()
    names = [
        sm.RUNNING,
        sm.WAITING,
        sm.KV_USAGE,
        sm.GENERATION,
        sm.PREFIX_QUERIES,
        sm.PREFIX_HITS,
        sm.DRAFTS,
        sm.ACCEPTED,
        sm.ACCEPTED_PER_POS,
        sm.TTFT_BUCKET,
    ]
    for name in names:
        base = re.sub(r"_(total|bucket)$", "", name)
        assert f'"{base}"' in source, f"{base} is not a vLLM 0.33 metric name"


def test_family_shapes_is_diffchecks_view_of_the_same_parser() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 2\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3\n'
        'vllm:e2e_request_latency_seconds_count{model_name="m"} 3\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.5\n'
        "# TYPE process_cpu_seconds counter\n"
        "process_cpu_seconds_total 4\n"
    )
    assert sm.family_shapes(text) == {
        "vllm:num_requests_running": {"type": "gauge", "labels": [["engine", "model_name"]]},
        "vllm:e2e_request_latency_seconds": {"type": "histogram", "labels": [["model_name"]]},
    }
    from sim.diffcheck import probe

    assert probe.family_shapes is sm.family_shapes
