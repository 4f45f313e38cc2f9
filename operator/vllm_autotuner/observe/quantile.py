"""Prometheus's ``histogram_quantile``, exactly, in pure Python.

The operator fetches per-pod bucket rates in one query for all tunings and
computes each tuning's quantile itself (a PromQL ``histogram_quantile`` per
tuning would be one query per tuning). The benchmark and the simulator compute
quantiles from simulated buckets. Both must get the number Prometheus would
return for the same buckets, so this follows Prometheus's algorithm
(promql/quantile.go, classic buckets): linear interpolation inside the bucket
that holds the rank, the +Inf bucket answered with the highest finite bound,
non-monotonic cumulative counts repaired by carrying the maximum forward.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def histogram_quantile(q: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float]) -> float:
    """The q-quantile of a classic histogram given as cumulative counts per upper bound.

    ``upper_bounds`` must be sorted ascending and end with ``math.inf``, like
    the ``le`` labels of a Prometheus histogram. Returns NaN where Prometheus
    does (no observations, no +Inf bucket, fewer than two buckets).
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
        return upper_bounds[-2]
    if b == 0 and upper_bounds[0] <= 0:
        return upper_bounds[0]
    start, end, count = 0.0, upper_bounds[b], counts[b]
    if b > 0:
        start = upper_bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def histogram_fraction(upper: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float]) -> float:
    """The share of observations at or below ``upper``: how many requests met a latency target.

    The inverse of ``histogram_quantile`` on the same buckets, with the same
    assumption (observations spread evenly inside a bucket, the first bucket
    starting at 0), so ``histogram_fraction(histogram_quantile(q, ...))`` is
    ``q`` wherever the quantile falls inside a finite bucket. Past the
    highest finite bound nothing can be interpolated: the share counted up to
    that bound is returned. NaN without observations.
    """
    counts = []
    running = -math.inf
    for count in cumulative_counts:
        if math.isnan(count):
            return math.nan
        running = max(running, count)
        counts.append(running)
    if not counts or counts[-1] <= 0 or len(upper_bounds) != len(counts) or math.isnan(upper):
        return math.nan
    total = counts[-1]
    b = bisect.bisect_left(upper_bounds, upper)
    if b >= len(counts) - 1:
        return counts[-2] / total if len(counts) > 1 else 1.0
    start = upper_bounds[b - 1] if b > 0 else 0.0
    below = counts[b - 1] if b > 0 else 0.0
    end = upper_bounds[b]
    if upper <= start:
        return below / total
    return (below + (counts[b] - below) * (upper - start) / (end - start)) / total
