"""histogram_quantile must return what Prometheus returns for the same buckets."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import accumulate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.sim.helpers import noiseless, random_requests
from tests.unit.sim.reference import run_reference
from vllm_autotuner.observe.quantile import histogram_fraction_below, histogram_quantile, step_tokens_quantile
from vllm_autotuner.sim.engine import Engine, EngineConfig

BOUNDS = [0.1, 0.5, 1.0, math.inf]


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        (0.5, [10, 20, 30, 40], 0.5),  # rank 20 is the top of the 0.5 bucket
        (0.25, [10, 20, 30, 40], 0.1),
        (0.3, [10, 20, 30, 40], 0.1 + 0.4 * (2 / 10)),
        (0.05, [10, 20, 30, 40], 0.1 * (2 / 10)),  # first bucket interpolates from 0
        (0.99, [10, 20, 30, 40], 1.0),  # rank in +Inf bucket -> highest finite bound
        (0.5, [0, 0, 0, 0], math.nan),
        (0.5, [10, 5, 30, 40], 0.75),  # non-monotonic repaired to [10, 10, 30, 40]: rank 20 halfway into (0.5, 1.0]
        (-0.1, [1, 2, 3, 4], -math.inf),
        (1.1, [1, 2, 3, 4], math.inf),
    ],
)
def test_prometheus_cases(q, counts, expected):
    got = histogram_quantile(q, BOUNDS, counts)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def test_q_zero_over_empty_leading_buckets_is_nan_like_prometheus():
    assert math.isnan(histogram_quantile(0.0, BOUNDS, [0, 0, 0, 1]))


def test_needs_an_inf_bucket():
    assert math.isnan(histogram_quantile(0.5, [0.1, 0.5], [1, 2]))


@given(st.lists(st.integers(0, 1000), min_size=4, max_size=4), st.floats(0.001, 1))
def test_monotone_in_q_and_within_bounds(increments, q):
    counts = []
    total = 0
    for inc in increments:
        total += inc
        counts.append(total)
    value = histogram_quantile(q, BOUNDS, counts)
    if total == 0:
        assert math.isnan(value)
        return
    assert 0 <= value <= 1.0
    assert value <= histogram_quantile(min(1.0, q + 0.1), BOUNDS, counts) + 1e-12


@given(st.lists(st.integers(1, 1000), min_size=4, max_size=4), st.floats(0.01, 0.99))
def test_fraction_below_inverts_quantile_inside_finite_buckets(increments, q):
    counts, total = [], 0
    for inc in increments:
        total += inc
        counts.append(total)
    value = histogram_quantile(q, BOUNDS, counts)
    if q * total > counts[-2]:  # rank in the +Inf bucket: quantile is clamped, no inverse
        return
    assert histogram_fraction_below(value, BOUNDS, counts) == pytest.approx(q, abs=1e-9)


@pytest.mark.parametrize(
    ("q", "counts", "cap", "expected"),
    [
        (0.99, [10, 20, 30, 40], 4.0, 4.0),  # rank in +Inf: the cap, not Prometheus's 1.0
        (0.99, [10, 20, 30, 40], 0.8, 0.8),  # ... even below the highest finite bound: nothing is above the cap
        (0.7, [10, 20, 30, 40], 0.8, 0.8),  # interpolated 0.9 in (0.5, 1.0], over the cap
        (0.3, [10, 20, 30, 40], 0.8, 0.1 + 0.4 * (2 / 10)),  # under the cap: Prometheus's answer
        (0.5, [0, 0, 0, 0], 4.0, math.nan),
    ],
)
def test_a_cap_answers_for_the_inf_bucket_and_bounds_the_rest(q, counts, cap, expected):
    got = histogram_quantile(q, BOUNDS, counts, cap)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def test_fraction_below_edges():
    assert histogram_fraction_below(0.05, BOUNDS, [10, 20, 30, 40]) == pytest.approx(0.125)
    assert histogram_fraction_below(5.0, BOUNDS, [10, 20, 30, 40]) == pytest.approx(0.75)
    assert math.isnan(histogram_fraction_below(1.0, BOUNDS, [0, 0, 0, 0]))


#: vLLM's vllm:iteration_tokens_total buckets.
STEP_BOUNDS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, math.inf]


@given(st.lists(st.integers(0, 50), min_size=14, max_size=14), st.floats(0, 1),
       st.sampled_from([512.0, 1000.0, 2048.0, 8192.0, 32768.0]))
def test_step_tokens_without_observations_past_the_budget_is_the_capped_quantile(increments, q, budget):
    """Where no step shows more than its budget (prompts that fit a step), nothing is hidden to put back."""
    below = [lower < budget for lower in [0.0, *STEP_BOUNDS[:-1]]]
    counts = list(accumulate(float(n) if ok else 0.0 for n, ok in zip(increments, below, strict=True)))
    expected = histogram_quantile(q, STEP_BOUNDS, counts, budget)
    got = step_tokens_quantile(q, STEP_BOUNDS, counts, budget)
    assert got == expected or math.isnan(got) and math.isnan(expected)


def _vllm_steps(decodes: int, steps: int, prompts: int, prompt: int, budget: int) -> tuple[list[float], int]:
    """vllm:iteration_tokens_total's cumulative buckets as vLLM fills them, and the steps that computed the whole
    budget: ``steps`` steps of ``decodes`` decodes each (one token apiece), among them ``prompts`` prompts of
    ``prompt`` tokens, each in chunks of what the decodes leave of the budget. vLLM observes every step that samples
    a token: a chunk's step shows its decodes alone, the step of a prompt's last chunk shows its whole prompt."""
    chunks = math.ceil(prompt / (budget - decodes))
    observed = [float(decodes)] * (steps - prompts) + [float(decodes + prompt + 1)] * prompts
    return [float(sum(v <= b for v in observed)) for b in STEP_BOUNDS], prompts * (chunks - 1)


@pytest.mark.parametrize(("prompt", "budget", "prompts"), [(6000, 2048, 3), (3000, 512, 2), (20000, 8192, 1)])
def test_step_tokens_quantile_counts_the_chunk_steps_vllm_shows_as_decodes(prompt, budget, prompts):
    """At the ITL quantile the steps are full (the budget) where vLLM's histogram shows decodes alone: each chunked
    prompt is one observation of its whole length, and its earlier chunks' steps look like decode-only ones."""
    counts, full = _vllm_steps(40, 100, prompts, prompt, budget)
    assert full >= 2 * prompts  # each prompt took three chunks or more: two full steps or more, and its last
    q = 1 - 2 * prompts / 100 + 0.005  # within two full steps a prompt (the estimate reads them from bucket middles)
    assert histogram_quantile(q, STEP_BOUNDS, counts, budget) < 64  # read as it is: decode-only steps
    assert step_tokens_quantile(q, STEP_BOUNDS, counts, budget) == budget
    assert step_tokens_quantile(1 - (full + prompts + 3) / 100, STEP_BOUNDS, counts, budget) < 64  # the decodes


def test_step_tokens_quantile_without_a_budget_to_read_by_is_the_plain_quantile():
    counts, _ = _vllm_steps(40, 100, 2, 6000, 2048)
    assert step_tokens_quantile(0.99, STEP_BOUNDS, counts, None) == histogram_quantile(0.99, STEP_BOUNDS, counts)
    assert step_tokens_quantile(0.99, STEP_BOUNDS, counts, 0) == histogram_quantile(0.99, STEP_BOUNDS, counts, 0)


@pytest.mark.parametrize(
    ("profile", "budget", "rate", "prompt", "q"),
    [
        ("llama3-8b-a100", 512, 2, 3000, 0.9),  # prompts in six chunks
        ("llama3-8b-a100", 1024, 3, 6000, 0.9),
        ("llama3-8b-a100", 2048, 20, 500, 0.95),  # chat: prompts that fit a step, a few in two chunks
    ],
)
def test_step_tokens_quantile_reads_vllms_histogram_as_the_steps_computed(profile, budget, rate, prompt, q):
    """vLLM's histogram shows a chunked prompt once, whole, and the steps of its earlier chunks as their decodes: at
    the ITL quantile the steps are full where it shows decodes alone. The quantile read from it is the steps' own
    (the literal scheduler's), within 15%."""
    config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=64 if budget < 1024 else 256)
    engine = Engine(noiseless(profile), config, seed=0)
    requests = random_requests(400, rate, 1, prompt=prompt, output=200 if prompt < 6000 else 100)
    for request in requests:
        engine.submit(request)
    engine.advance(math.inf)
    tokens = engine.snapshot().histograms["vllm:iteration_tokens_total"]
    ref = run_reference(engine.cost, requests, budget=budget, max_seqs=config.max_num_seqs,
                        num_blocks=engine.num_gpu_blocks, chunked=True)
    computed = sorted(ref.step_tokens)[math.ceil(q * len(ref.step_tokens)) - 1]
    got = step_tokens_quantile(q, tokens.bounds, tokens.cumulative, budget)
    assert got == pytest.approx(computed, rel=0.15)


@pytest.mark.parametrize(
    ("budget", "rate", "prompt", "q"),
    [(1024, 4, 400, 0.97), (2048, 8, 400, 0.95), (512, 3, 300, 0.97), (1024, 3, 700, 0.98), (2048, 6, 1200, 0.97),
     (1024, 6, 600, 0.97)],
)
def test_step_tokens_quantile_reads_prompts_behind_a_cached_prefix_as_the_tokens_computed(budget, rate, prompt, q):
    """A prompt behind a cached 2560-token system prompt shows whole in vLLM's histogram, past the budget, but its
    step computes only what follows the prefix: with the cached share of the prompt tokens (vLLM's
    ``prompt_tokens_cached`` over ``prompt_tokens``), the quantile is that step's (the literal scheduler's on the
    prompts without their prefix), not a full one. Within half: vLLM's buckets double, and a value is interpolated
    inside one."""
    config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=64)
    engine = Engine(noiseless("llama3-8b-a100"), config, seed=0)
    computed = [replace(r, prompt_tokens=prompt) for r in random_requests(400, rate, 1, output=200)]
    for request in computed:
        engine.submit(replace(request, prompt_tokens=prompt + 2560, prefix_id=1, prefix_tokens=2560))
    engine.advance(math.inf)
    snapshot = engine.snapshot()
    tokens = snapshot.histograms["vllm:iteration_tokens_total"]
    cached = snapshot.counters["prompt_tokens_cached"] / snapshot.counters["prompt_tokens"]
    ref = run_reference(engine.cost, computed, budget=budget, max_seqs=64, num_blocks=engine.num_gpu_blocks,
                        chunked=True)
    steps = sorted(ref.step_tokens)
    expected = steps[math.ceil(q * len(steps)) - 1]
    assert expected < 0.7 * budget  # the steps do not fill the budget
    assert step_tokens_quantile(q, tokens.bounds, tokens.cumulative, budget) == budget  # read as whole prompts
    assert step_tokens_quantile(q, tokens.bounds, tokens.cumulative, budget, cached) == pytest.approx(expected, rel=0.5)
