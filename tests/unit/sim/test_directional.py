"""The trade-offs the autotuner exploits, as the simulator must show them.

Metrics are read the way the operator reads them: from the engine's
histograms through histogram_quantile, over a window.
"""

from __future__ import annotations

import pytest

from vllm_autotuner.sim.engine import Engine, EngineConfig, FinishedRequest
from vllm_autotuner.sim.metricstate import MetricsSnapshot
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.workload import CHAT, RAG, steady


def _run(profile: str, config: EngineConfig, rate: float, mix_seconds: float, *, mix=RAG, seed: int = 0
         ) -> tuple[MetricsSnapshot, list[FinishedRequest]]:  # fmt: skip
    engine = Engine(get_profile(profile), config, seed=seed)
    for request in steady(rate, mix, hours=1).generate(seed).requests(0, mix_seconds):
        engine.submit(request)
    finished = engine.advance(mix_seconds)
    return engine.snapshot(), finished


def _quantile(snap: MetricsSnapshot, name: str, q: float) -> float:
    return snap.histograms[name].quantile(q)


@pytest.mark.parametrize(("small", "large"), [(1024, 8192), (2048, 16384)])
def test_smaller_budget_trades_ttft_for_itl_on_long_prompts(small: int, large: int) -> None:
    """4k-token RAG prompts at 5 req/s on an H100 (~60 % of its capacity):
    a small budget chunks each prompt over several short steps, so decodes
    wait less (ITL p95 down) while the prompt takes longer (TTFT up)."""
    runs = {
        budget: _run("llama3-8b-h100", EngineConfig(max_num_batched_tokens=budget), 5, 1800)[0]
        for budget in (small, large)
    }
    itl = {b: _quantile(s, "vllm:inter_token_latency_seconds", 0.95) for b, s in runs.items()}
    ttft = {b: _quantile(s, "vllm:time_to_first_token_seconds", 0.5) for b, s in runs.items()}
    assert itl[small] < 0.75 * itl[large]
    assert ttft[small] > ttft[large]
    assert all(s.counters["num_preemptions"] == 0 for s in runs.values())


def test_more_sequences_raise_throughput_until_the_kv_cache_saturates() -> None:
    """Chat overload on the 24 GB L4 (~29k tokens of KV cache): throughput
    grows with max_num_seqs while the running requests' context fits, then
    the cache fills, preemptions start, and more sequences buy nothing."""
    throughput, preemptions, usage = {}, {}, {}
    for seqs in (4, 8, 16, 32, 64, 128, 256):
        snap, _ = _run("llama3-8b-l4", EngineConfig(max_num_seqs=seqs), 20, 600, mix=CHAT)
        throughput[seqs] = snap.counters["generation_tokens"] / 600
        preemptions[seqs] = snap.counters["num_preemptions"]
        usage[seqs] = snap.gauges.kv_cache_usage_perc
    below = [4, 8, 16, 32]
    assert all(throughput[a] < throughput[b] for a, b in zip(below, below[1:]))
    assert all(preemptions[s] == 0 for s in below)
    assert all(preemptions[s] > 0 and usage[s] > 0.95 for s in (64, 128, 256))
    assert throughput[256] < 1.05 * throughput[64]
    assert throughput[64] > throughput[32]


def test_same_seed_same_results_other_seed_differs() -> None:
    config = EngineConfig(max_num_batched_tokens=2048)
    a_snap, a = _run("llama3-8b-a100", config, 5, 600, seed=1)
    b_snap, b = _run("llama3-8b-a100", config, 5, 600, seed=1)
    c_snap, c = _run("llama3-8b-a100", config, 5, 600, seed=2)
    assert a == b
    assert a_snap == b_snap
    assert [(r.first_token_time, r.finish_time) for r in a] != [(r.first_token_time, r.finish_time) for r in c]
    assert a_snap.counters != c_snap.counters


def test_window_diffs_behave_like_prometheus_increase() -> None:
    engine = Engine(get_profile("llama3-8b-h100"), EngineConfig(), seed=0)
    for request in steady(10, CHAT, hours=1).generate(3).requests(0, 600):
        engine.submit(request)
    engine.advance(300)
    first = engine.snapshot()
    engine.advance(600)
    second = engine.snapshot()
    window = second - first
    assert window.time == pytest.approx(second.time - first.time)
    e2e = window.histograms["vllm:e2e_request_latency_seconds"]
    assert e2e.count == second.histograms["vllm:e2e_request_latency_seconds"].count - first.histograms[
        "vllm:e2e_request_latency_seconds"].count  # fmt: skip
    assert 0 < e2e.count == window.counters["request_success"]
    assert all(x <= y for x, y in zip(e2e.cumulative, e2e.cumulative[1:]))
    rate = window.counters["generation_tokens"] / window.time
    assert rate == pytest.approx(10 * 256, rel=0.15)
