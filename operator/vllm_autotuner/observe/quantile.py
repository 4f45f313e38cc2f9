"""Prometheus's ``histogram_quantile`` exactly, and its inverse, in pure Python.

The operator fetches per-pod bucket rates in one query for all tunings and
computes each tuning's quantile itself (a PromQL ``histogram_quantile`` per
tuning would be one query per tuning). The benchmark and the simulator compute
quantiles from simulated buckets. Both must get the number Prometheus would
return for the same buckets, so this follows Prometheus's algorithm
(promql/quantile.go, classic buckets): linear interpolation inside the bucket
that holds the rank, the +Inf bucket answered with the highest finite bound,
non-monotonic cumulative counts repaired by carrying the maximum forward.
That bound is only the least the quantile can be: a caller that knows more
(an engine step never computes more tokens than its budget, which may lie
past vLLM's last bucket) passes a ``cap``. One histogram does not observe
what its name says: ``step_tokens_quantile`` reads vLLM's tokens per step.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence


def histogram_quantile(q: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float],
                       cap: float | None = None) -> float:
    """The q-quantile of a classic histogram given as cumulative counts per upper bound.

    ``upper_bounds`` must be sorted ascending and end with ``math.inf``, like
    the ``le`` labels of a Prometheus histogram. Returns NaN where Prometheus
    does (no observations, no +Inf bucket, fewer than two buckets). With a
    ``cap``, an upper bound the caller knows on what is measured, the answer
    for 0 <= q <= 1 is at most ``cap``, and ``cap`` itself where the rank
    falls in the +Inf bucket; without one, exactly Prometheus's.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if len(upper_bounds) < 2 or upper_bounds[-1] != math.inf or len(upper_bounds) != len(cumulative_counts):
        return math.nan
    counts = []
    running = -math.inf
    for count in cumulative_counts:
        if math.isnan(count):
            return math.nan
        running = max(running, count)
        counts.append(running)
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = bisect.bisect_left(counts, rank)
    if b == len(counts) - 1:
        return upper_bounds[-2] if cap is None else cap
    if b == 0 and upper_bounds[0] <= 0:
        return upper_bounds[0]
    start, end, count = 0.0, upper_bounds[b], counts[b]
    if b > 0:
        start = upper_bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # q = 0 with empty leading buckets: Go's 0/0 gives NaN here
        return math.nan
    value = start + (end - start) * (rank / count)
    return value if cap is None else min(value, cap)


def histogram_fraction_below(value: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float]) -> float:
    """Share of observations at or below ``value``: the inverse of ``histogram_quantile``.

    Interpolates linearly inside the bucket holding ``value`` (the same
    assumption histogram_quantile makes), so for any q,
    ``histogram_fraction_below(histogram_quantile(q, b, c), b, c) == q`` up to
    rounding. NaN when there are no observations.
    """
    total = cumulative_counts[-1] if cumulative_counts else 0.0
    if not total or math.isnan(total):
        return math.nan
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in zip(upper_bounds, cumulative_counts, strict=True):
        if value <= bound:
            if math.isinf(bound):
                return previous_count / total
            span = bound - previous_bound
            fraction = (value - previous_bound) / span if span > 0 else 1.0
            return (previous_count + (count - previous_count) * max(0.0, fraction)) / total
        previous_bound, previous_count = bound, count
    return 1.0


def step_tokens_quantile(q: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float],
                         budget: float | None, cached: float = 0.0) -> float:
    """The q-quantile of the tokens engine steps compute, at most ``budget``, from ``vllm:iteration_tokens_total``.

    vLLM observes that histogram once per step that outputs a token, with the
    whole prompt of each request whose first token it is plus the tokens
    sampled (its sum is the prompt tokens plus the generation tokens), not
    the tokens the step computed. A prompt longer than a step has room for is
    computed in chunks: the steps before its last show only the decodes
    beside them (or nothing), the last shows the whole prompt. So an
    observation of ``v`` past the budget stands for about ``v / budget`` full
    steps, all but one of them counted among the observations below the
    budget. Those are moved, in proportion from the observations below the
    budget, to full steps (the +Inf bucket, which answers ``budget``) before
    the quantile is taken. ``cached`` is the share of the prompt tokens that
    were not computed, served from the prefix cache or sent by another
    instance (``vllm:prompt_tokens_cached_total`` over
    ``vllm:prompt_tokens_total``): an observation past the budget computed
    about ``v * (1 - cached)``, so it stands for that over the budget full
    steps, or, where that falls short of the budget, for one step of that
    many tokens (a long prompt behind a cached system prompt). With no
    observation past the budget (prompts that fit a step), this is
    ``histogram_quantile`` capped at the budget (the cached share of a
    prompt that fits a step is not told apart from the decodes beside it:
    those steps read high, at most the budget). Values in a bucket are taken at its middle (at its
    lower bound in +Inf). Only buckets wholly past the budget count: a
    budget within a bucket (768 in vLLM's (512, 1024]) cannot tell the
    prompts just past it from the steps that fit, so those few are read as
    steps that fit. Without a budget (a window across configs),
    ``histogram_quantile`` as it is.
    """
    shape_ok = len(upper_bounds) >= 2 and upper_bounds[-1] == math.inf and len(upper_bounds) == len(cumulative_counts)
    if budget is None or budget <= 0 or not shape_ok or any(math.isnan(c) for c in cumulative_counts):
        return histogram_quantile(q, upper_bounds, cumulative_counts, budget)
    counts = list(itertools.accumulate(cumulative_counts, max))
    lower = [0.0, *upper_bounds[:-1]]
    added = [count - before for count, before in zip(counts, [0.0, *counts[:-1]], strict=True)]
    full = hidden = 0.0
    for i, (lo, hi) in enumerate(zip(lower, upper_bounds, strict=True)):
        if lo < budget or not added[i]:
            continue
        computed = (lo if math.isinf(hi) else (lo + hi) / 2) * (1.0 - cached)
        if computed >= budget:
            full += added[i]
            hidden += added[i] * (computed / budget - 1)
        else:  # one step computed what the cache left of the prompt, beside the decodes
            added[bisect.bisect_left(upper_bounds, computed)] += added[i]
            added[i] = 0.0
    counts = list(itertools.accumulate(added))
    small = counts[-1] - full
    if not hidden or not small:
        return histogram_quantile(q, upper_bounds, counts, budget)
    scale = max(small - hidden, 0.0) / small
    rebuilt = [c * scale if lo < budget else small * scale for lo, c in zip(lower, counts[:-1], strict=False)]
    return histogram_quantile(q, upper_bounds, [*rebuilt, counts[-1]], budget)
