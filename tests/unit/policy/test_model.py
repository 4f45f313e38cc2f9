"""The online performance model: its fit, its attainment estimate and the direction of its predictions."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_autotuner.api import SLO, LatencyTarget, Measurement
from vllm_autotuner.observe.queries import PodMatch
from vllm_autotuner.observe.window import WindowData, observe_target
from vllm_autotuner.policy import model
from vllm_autotuner.policy.model import StepModel, Traffic, fit_step_model, share_within

from .helpers import knobs


def measurement(regime="r", tokens=8192, seqs=1024, **fields):
    base = dict(
        regime=regime,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        measured_at="2024-05-01T12:00:00Z",
        request_rate=3.0,
        generation_tokens_per_second=3 * 128,
        prompt_tokens_per_second=3 * 4000,
        mean_prompt_tokens=4000,
        mean_generation_tokens=128,
        attainment=0.6,
        ttft_within_slo=0.99,
        itl_within_slo=0.8,
        ttft_seconds=0.9,
        itl_seconds=0.19,
        queue_seconds=0.1,
        itl_mean_seconds=0.09,
        step_tokens_mean=3200,
        step_tokens_quantile=7800,
        running=20,
        waiting=0.5,
        kv_cache_usage=0.2,
        preemptions_per_second=0.0,
    )
    return Measurement(**{**base, **fields})


def on_line(regime, intercept, slope, x_mean, x_q):
    return measurement(
        regime,
        step_tokens_mean=x_mean,
        itl_mean_seconds=intercept + slope * x_mean,
        step_tokens_quantile=x_q,
        itl_seconds=intercept + slope * x_q,
    )


def test_slope_is_recovered_across_regimes_with_their_own_intercepts():
    slope = 26e-6
    points = [
        on_line("a", 0.008, slope, 500, 4000),
        on_line("a", 0.008, slope, 900, 2000),
        on_line("b", 0.030, slope, 300, 1000),
    ]
    assert fit_step_model(points).slope == pytest.approx(slope, rel=0.01)


def test_slope_without_spread_falls_back_to_a_ridge_point_intercept():
    flat = on_line("a", 0.01, 20e-6, 1000, 1000)
    assert fit_step_model([flat]).slope == pytest.approx(0.03 / (1000 + model.RIDGE_TOKENS))
    # decode-bound: fifty decodes a step take 80 ms, nearly all of it weight reads, not 1.6 ms a token
    decodes = on_line("a", 0.075, 100e-6, 50, 40)
    assert fit_step_model([decodes]).slope < 0.5 * decodes.itl_mean_seconds / 50
    assert fit_step_model([]) is None


TARGET = LatencyTarget(quantile=0.95, seconds=0.1)


def test_share_within_reproduces_the_measurement_and_falls_as_latency_rises():
    assert share_within(TARGET, 0.19, 0.62, 0.19, "itl") == pytest.approx(0.62)
    assert share_within(TARGET, 0.1, None, 0.1, "itl") == pytest.approx(0.95)


@given(st.floats(0.01, 1.0), st.floats(0.01, 0.99), st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_share_within_is_a_probability_that_falls_with_latency(measured, share, a, b):
    low, high = sorted((a, b))
    s_low = share_within(TARGET, measured, share, low, "itl")
    s_high = share_within(TARGET, measured, share, high, "itl")
    assert 0 <= s_high <= s_low <= 1


def test_request_itl_share_is_the_binomial_share_of_streams_with_few_enough_slow_gaps():
    # 21 tokens: 20 gaps, at p95 one of them may be slow
    exact = sum(math.comb(20, k) * 0.05**k * 0.95 ** (20 - k) for k in range(2))
    assert model.request_itl_share(0.95, 0.95, 21) == pytest.approx(exact, rel=1e-9)
    assert model.request_itl_share(0.95, 1.0, 500) == 1.0 and model.request_itl_share(0.95, 0.0, 500) == 0.0
    assert model.request_itl_share(0.95, 0.5, 1) == 1.0  # one token: no gap to judge
    # a steady 8 % of slow gaps fails nearly every long stream, though 92 % of all gaps are within target
    assert model.request_itl_share(0.95, 0.92, 1000) < 0.01
    assert model.request_itl_share(0.95, 0.99, 1000) > 0.99


def test_request_itl_share_matches_streams_counted_one_by_one():
    """What the benchmark counts per request (its slow gaps against slow_gaps_allowed), drawn at random."""
    rng = np.random.default_rng(7)
    for slow, tokens in ((0.03, 200), (0.05, 101), (0.1, 40)):
        counts = rng.binomial(tokens - 1, slow, 200_000)
        counted = float(np.mean(counts <= model.slow_gaps_allowed(0.95, np.full(counts.size, tokens - 1))))
        assert model.request_itl_share(0.95, 1 - slow, tokens) == pytest.approx(counted, abs=0.005)


def test_request_itl_share_of_an_absurd_mean_length_sums_only_the_terms_that_count(monkeypatch):
    """A counter reset can make a window's mean output ten million tokens: the binomial's terms near its mean are
    summed (a few thousand), not one per gap, and the sum is still the normal law's at that size."""
    terms = []

    class Counting:
        def __getattr__(self, name):
            return getattr(math, name)

        def exp(self, x):
            terms.append(x)
            return math.exp(x)

    monkeypatch.setattr(model, "math", Counting())
    share = model.request_itl_share(0.95, 1 - 0.0499, 1e7 + 1)  # 1e7 gaps, 499,999 of them may be slow
    mean, sd = 1e7 * 0.0499, math.sqrt(1e7 * 0.0499 * 0.9501)
    assert share == pytest.approx(NormalDist(mean, sd).cdf(499_999.5), rel=1e-3)
    assert len(terms) < 20_000


@given(st.floats(0.5, 0.999), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(1.0, 4000.0))
def test_request_itl_share_is_a_probability_that_rises_with_the_token_share(quantile, a, b, tokens):
    """Up to the sum's rounding: it stops where the terms left are below its float resolution, which moves it by
    about 1e-11 at most (8e-12 the most it fell in 300,000 random pairs)."""
    low, high = sorted((a, b))
    s_low = model.request_itl_share(quantile, low, tokens)
    s_high = model.request_itl_share(quantile, high, tokens)
    assert 0 <= s_low <= s_high + 1e-10 <= 1 + 1e-10


SLO_CHAT = SLO(ttft=LatencyTarget(quantile=0.95, seconds=2.0), itl=LatencyTarget(quantile=0.95, seconds=0.1))


def traffic(m):
    return Traffic.of(m, SLO_CHAT, fit_step_model([m]))


def test_smaller_budget_cuts_itl_when_quantile_steps_are_full():
    t = traffic(measurement())
    now, smaller = t.predict(knobs(8192, 1024)), t.predict(knobs(4096, 1024))
    assert now.itl_seconds == pytest.approx(0.19)
    assert smaller.itl_seconds < 0.12 and smaller.attainment > now.attainment


#: One A100 pod of Llama-3-8B under RAG traffic (4k-token prompts, 130 generated) at 1.8 requests per second, a
#: 5-minute window of each budget as ``decide`` measured it in the simulator (``bench.tuning.calibration``'s case):
#: (ITL p95, share of gaps within 50 ms, SLO attainment). Under 2048 tokens the p95 steps are full, 2048 tokens of
#: prompt chunks, each attending to the prompt before it; most steps are decodes alone, 226 tokens on average.
RAG_A100 = {2048: (0.1807, 0.853, 0.0002), 512: (0.0470, 0.9986, 0.931), 256: (0.0243, 1.0, 0.913)}


def test_full_steps_take_time_in_proportion_to_their_tokens_and_move_together():
    """A full step is compute-bound: its GEMMs and its chunk's attention over the prompt grow with its tokens. The
    slope fitted from the window's mean and p95 steps (decodes' attention in the intercept) is a tenth short of it,
    and the log-normal through the p95 (a full step) and the share within 50 ms (the decodes alone) is as wide as
    the gap between the two: a smaller budget looked too slow to meet the target."""
    slo = SLO(ttft=LatencyTarget(quantile=0.95, seconds=2.0), itl=LatencyTarget(quantile=0.95, seconds=0.05))
    itl, within, attainment = RAG_A100[2048]
    window = measurement(
        tokens=2048, seqs=256, request_rate=1.8, generation_tokens_per_second=234.75,
        prompt_tokens_per_second=7479.4, mean_prompt_tokens=4110.7, mean_generation_tokens=130.0,
        attainment=attainment, ttft_within_slo=0.937, itl_within_slo=within, ttft_seconds=2.103, itl_seconds=itl,
        queue_seconds=1.021, itl_mean_seconds=0.0353, step_tokens_mean=225.8, step_tokens_quantile=2048.0,
        running=8.81, waiting=0.52, kv_cache_usage=0.0796,
    )
    t = Traffic.of(window, slo, fit_step_model([window]))
    for budget in (512, 256):
        predicted = t.predict(knobs(budget, 256))
        measured_itl, _, measured_attainment = RAG_A100[budget]
        assert predicted.itl_seconds == pytest.approx(measured_itl, rel=0.1)
        assert predicted.attainment == pytest.approx(measured_attainment, abs=0.15)
    assert t.predict(knobs(1024, 256)).attainment < 0.1  # measured: none (p95 95 ms)


def test_small_full_steps_move_along_the_slope_not_in_proportion():
    """Below the ridge point a step's time is mostly the weights' read, which its tokens do not change: on the
    line of 15 ms and 25 us a token, full 256-token steps of 100 decodes and a prompt chunk take 21.4 ms, and
    512-token ones 27.8 ms, not twice as long, 192-token ones 19.8 ms, not 16 (two reviewers' cases, after the
    proportional law was applied to them). Fewer sequences alone take decodes out of the steps, along the line
    too, and move no full step: the measured share of gaps within target stands."""
    slo = SLO(ttft=LatencyTarget(quantile=0.95, seconds=1.0), itl=LatencyTarget(quantile=0.95, seconds=0.035))
    window = measurement(
        tokens=256, seqs=256, request_rate=4.0, generation_tokens_per_second=4 * 200,
        prompt_tokens_per_second=4 * 1500, mean_prompt_tokens=1500, mean_generation_tokens=200, attainment=0.5,
        ttft_within_slo=0.55, itl_within_slo=0.99, ttft_seconds=1.6, itl_seconds=0.015 + 25e-6 * 256,
        queue_seconds=0.3, itl_mean_seconds=0.015 + 25e-6 * 140, step_tokens_mean=140, step_tokens_quantile=256,
        running=100, waiting=2, kv_cache_usage=0.3,
    )
    t = Traffic.of(window, slo, fit_step_model([window]))
    for budget in (192, 384, 512, 1024):
        assert t.predict(knobs(budget, 256)).itl_seconds == pytest.approx(0.015 + 25e-6 * budget, rel=0.02)
    fewer = t.predict(knobs(256, 64))  # 36 decodes fewer than run: smaller steps, the same population of gaps
    assert fewer.itl_seconds == pytest.approx(0.015 + 25e-6 * (256 - 36), rel=0.02)
    assert fewer.attainment >= t.predict(knobs(256, 256)).attainment


def test_larger_budget_does_not_change_itl_when_steps_are_not_full():
    t = traffic(measurement(step_tokens_quantile=900, tokens=2048))
    assert t.predict(knobs(4096, 1024)).itl_seconds == pytest.approx(t.predict(knobs(2048, 1024)).itl_seconds)


def test_larger_budget_cuts_queueing_when_a_small_one_cannot_hide_the_step_overhead():
    # 10 ms of fixed cost per step and 19 us per token: a 512-token step is overhead-bound, 1024 is not
    busy = measurement(
        tokens=512,
        seqs=256,
        prompt_tokens_per_second=40_000,
        queue_seconds=3.0,
        ttft_seconds=3.5,
        ttft_within_slo=0.8,
        itl_seconds=0.02,
        itl_mean_seconds=0.016,
        step_tokens_mean=300,
        step_tokens_quantile=512,
        itl_within_slo=1.0,
    )
    t = traffic(busy)
    assert t.utilisation(knobs(512, 256)) > t.utilisation(knobs(1024, 256))
    assert t.utilisation(knobs(2048, 256)) == t.utilisation(knobs(1024, 256))  # compute-bound: no more capacity
    assert t.predict(knobs(1024, 256)).ttft_seconds < 3.5


def test_prompt_tokens_the_prefix_cache_served_are_no_work_for_the_pod():
    """Prompts behind a cached system prompt (three quarters of their tokens served from the cache): the pod
    computes the rest alone, so it has room where the whole prompts would overload it, and a prompt's prefill takes
    the steps of its computed part."""
    fields = dict(tokens=512, seqs=256, request_rate=10.0, prompt_tokens_per_second=40_000, mean_prompt_tokens=4000,
                  ttft_seconds=3.5, itl_mean_seconds=0.016, step_tokens_mean=300, step_tokens_quantile=512)
    whole = traffic(measurement(**fields))
    cached = traffic(measurement(**fields, cached_prompt_tokens_per_second=30_000))
    k = knobs(512, 256)
    assert cached.token_demand(k) == pytest.approx(whole.token_demand(k) - 30_000)
    assert cached.utilisation(k) < 1 < whole.utilisation(k)
    assert cached.prefill_seconds(k) < whole.prefill_seconds(k) / 3  # a quarter of the chunks, rounded up
    assert cached.predict(knobs(1024, 256)).ttft_seconds < whole.predict(knobs(1024, 256)).ttft_seconds
    every = traffic(measurement(**fields, cached_prompt_tokens_per_second=40_000))  # all but a token a prompt
    assert every.computed_prompt_share == pytest.approx(1 / 4000) and every.prefill_seconds(k) > 0


def test_a_preempted_request_recomputes_only_what_the_prefix_cache_did_not_serve():
    # 0.4 preemptions a second at 4 rps, 3000 of each 4000-token prompt's tokens served by the cache
    fields = dict(request_rate=4.0, generation_tokens_per_second=4 * 256, prompt_tokens_per_second=4 * 4000,
                  mean_prompt_tokens=4000, mean_generation_tokens=256, itl_mean_seconds=0.1, running=150,
                  kv_cache_usage=0.99, preemptions_per_second=0.4, step_tokens_mean=400, step_tokens_quantile=1500)
    whole = traffic(measurement(**fields))
    cached = traffic(measurement(**fields, cached_prompt_tokens_per_second=4 * 3000))
    fewer, more = knobs(8192, 112), knobs(8192, 1024)
    assert whole.preempted_share(more) - whole.preempted_share(fewer) == pytest.approx(0.1)
    # the 0.4 recomputations a second that fewer seqs stop: 4000 + 128 tokens each, or 1000 + 128 behind the cache
    assert whole.token_demand(more) - whole.token_demand(fewer) == pytest.approx(0.4 * 4128)
    assert cached.token_demand(more) - cached.token_demand(fewer) == pytest.approx(0.4 * 1128)


def test_fewer_seqs_stop_preemptions_when_the_kv_cache_is_full():
    # 4 rps x 256 tokens x 0.1 s per step needs ~102 decoding at once; 150 run, the recomputed ones included
    full = measurement(
        request_rate=4.0,
        generation_tokens_per_second=4 * 256,
        prompt_tokens_per_second=4 * 1000,
        mean_prompt_tokens=1000,
        mean_generation_tokens=256,
        itl_mean_seconds=0.1,
        running=150,
        kv_cache_usage=0.99,
        preemptions_per_second=0.4,
        attainment=0.5,
        step_tokens_mean=400,
        step_tokens_quantile=1500,
    )
    t = traffic(full)
    # stopping the recomputation of preempted requests frees capacity
    assert t.token_demand(knobs(8192, 112)) < t.token_demand(knobs(8192, 1024))
    assert t.utilisation(knobs(8192, 128)) < 1
    # ~122 requests fit at full length; 150 ran with 0.5 waiting
    assert t.preempted_share(knobs(8192, 1024)) == pytest.approx(0.1)
    assert 0 < t.preempted_share(knobs(8192, 128)) < 0.05
    assert t.preempted_share(knobs(8192, 112)) == 0.0
    assert t.predict(knobs(8192, 112)).attainment > t.predict(knobs(8192, 1024)).attainment
    assert t.utilisation(knobs(8192, 64)) > 1  # too few for the ~100 decoding at once: the queue grows


def test_smaller_knobs_free_kv_cache_and_cut_preemptions_where_neither_binds():
    # a memory-tight GPU: ~11 long requests fill the cache; max_num_seqs 256 is far above them
    tight = measurement(
        tokens=2048,
        seqs=256,
        request_rate=0.25,
        generation_tokens_per_second=0.25 * 512,
        prompt_tokens_per_second=0.25 * 2048,
        mean_prompt_tokens=2048,
        mean_generation_tokens=512,
        running=11,
        waiting=1.2,
        kv_cache_usage=0.68,
        preemptions_per_second=0.1,
    )
    t = traffic(tight)
    measured = 0.1 / 0.25
    assert t.preempted_share(knobs(2048, 256)) == pytest.approx(measured)
    # the profiling pass of a smaller budget and the sampler pass over fewer sequences leave more to the KV cache
    assert t.freed_kv_tokens(knobs(512, 64)) > t.freed_kv_tokens(knobs(1024, 128)) > 0
    assert t.preempted_share(knobs(512, 64)) < t.preempted_share(knobs(1024, 128)) < measured
    # a larger budget takes KV cache: more preemptions, and their recomputation is demand
    assert t.freed_kv_tokens(knobs(8192, 256)) < 0
    assert t.preempted_share(knobs(8192, 256)) > measured
    assert t.token_demand(knobs(8192, 256)) > t.token_demand(knobs(2048, 256)) > t.token_demand(knobs(512, 64))
    # requests wait for KV blocks as for a slot: the cache, not max_num_seqs 256, holds the ~16 at once
    assert t.utilisation(knobs(2048, 256)) > 0.5 > 10 / 256
    assert t.utilisation(knobs(512, 64)) < t.utilisation(knobs(2048, 256)) < t.utilisation(knobs(8192, 256))


def test_a_window_of_requests_without_length_predicts_without_the_kv_cache():
    # counters that saw requests but no tokens (a window of aborted requests) while the cache held others
    empty = measurement(
        mean_prompt_tokens=0, mean_generation_tokens=0, kv_cache_usage=0.5, preemptions_per_second=0.1, running=5
    )
    t = traffic(empty)
    assert t.kv_cache_tokens() is None
    assert t.preempted_share(knobs(4096, 64)) == pytest.approx(0.1 / 3.0)
    assert math.isfinite(t.utilisation(knobs(4096, 64)))
    assert math.isfinite(t.predict(knobs(4096, 64)).attainment)


def test_saturation_predicts_a_breach():
    t = Traffic.of(measurement(), SLO_CHAT, StepModel(slope=1e-3, points=1))
    assert t.predict(knobs(256, 256)).utilisation > 1 and t.predict(knobs(256, 256)).attainment < 0.05
    assert not math.isnan(t.predict(knobs(256, 256)).ttft_seconds)


def test_full_steps_past_vllms_last_step_bucket_are_full_to_the_model():
    # vLLM's step-token buckets end at 16384; under a 32768 budget two steps in five are full, 32768 tokens (the
    # others decode about 6000). Prometheus's p95 is 16384, half full: a smaller budget would seem to gain no ITL.
    data = WindowData(at=1000.0, window_seconds=300.0)
    pod = ("llm", "llama-abc-1")
    data.values["last_seen"] = {pod: 1000.0}
    bounds = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, math.inf)
    data.buckets["step_tokens"] = {pod: {float(b): 0.0 if b <= 4096 else 3.0 if b < math.inf else 5.0 for b in bounds}}
    big = knobs(32768, 1024)
    observation, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 1, big, SLO_CHAT, False)
    assert observation is not None
    measured = measurement(tokens=32768, step_tokens_mean=16700, step_tokens_quantile=observation.step_tokens_quantile)
    t = traffic(measured)
    assert t.quantile_step_tokens(big) == 32768
    assert t.predict(knobs(16384, 1024)).itl_seconds < t.predict(big).itl_seconds
