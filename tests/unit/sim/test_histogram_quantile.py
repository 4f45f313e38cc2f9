"""histogram_quantile against Prometheus's documented semantics
(promql/quantile.go BucketQuantile, and the PromQL docs' examples)."""

from __future__ import annotations

import math

import pytest

from vllm_autotuner.sim.metricstate import Histogram, HistogramSnapshot, histogram_quantile

INF = math.inf


def test_interpolates_linearly_inside_the_bucket() -> None:
    # 100 observations: 10 <= 0.1, 50 <= 0.5, 90 <= 1, all <= +Inf
    bounds, counts = [0.1, 0.5, 1.0, INF], [10, 50, 90, 100]
    assert histogram_quantile(bounds, counts, 0.5) == pytest.approx(0.5)
    assert histogram_quantile(bounds, counts, 0.3) == pytest.approx(0.1 + 0.4 * (30 - 10) / 40)
    assert histogram_quantile(bounds, counts, 0.05) == pytest.approx(0.1 * 5 / 10)  # lower edge 0
    assert histogram_quantile(bounds, counts, 0.9) == pytest.approx(1.0)


def test_rank_in_the_inf_bucket_returns_the_highest_finite_bound() -> None:
    assert histogram_quantile([0.1, 0.5, 1.0, INF], [10, 50, 90, 100], 0.99) == 1.0


def test_first_bucket_with_non_positive_bound_returns_the_bound() -> None:
    assert histogram_quantile([-1.0, 0.0, 1.0, INF], [5, 5, 10, 10], 0.2) == -1.0


def test_special_cases() -> None:
    bounds, counts = [0.1, 1.0, INF], [1, 2, 3]
    assert histogram_quantile(bounds, counts, -0.1) == -INF
    assert histogram_quantile(bounds, counts, 1.1) == INF
    assert math.isnan(histogram_quantile(bounds, counts, math.nan))
    assert math.isnan(histogram_quantile(bounds, [0, 0, 0], 0.5))  # no observations
    assert math.isnan(histogram_quantile([0.1, 1.0], [1, 2], 0.5))  # no +Inf bucket
    assert math.isnan(histogram_quantile([INF], [3], 0.5))  # fewer than two buckets


def test_unsorted_duplicate_and_non_monotonic_buckets_are_repaired() -> None:
    # Duplicated bounds are summed; a count lower than its predecessor is raised.
    assert histogram_quantile([1.0, 0.5, INF, 0.5], [6, 2, 10, 2], 0.5) == pytest.approx(0.5 + 0.5 * (5 - 4) / 2)
    # 1.0 has 3 < 4: raised to 4, so the 0.75 rank (6) interpolates over 1.0..2.0 with 4 in the bucket
    assert histogram_quantile([0.5, 1.0, 2.0, INF], [4, 3, 8, 8], 0.75) == pytest.approx(1.0 + 1.0 * (6 - 4) / 4)


def test_histogram_bins_le_inclusively_and_diffs() -> None:
    hist = Histogram([0.1, 0.5, 1.0])
    for value in (0.1, 0.2, 0.5, 0.7, 5.0):
        hist.observe(value)
    hist.observe_weighted(0.05, 3)
    snap = hist.snapshot()
    assert snap.cumulative == (4, 6, 7, 8)
    assert snap.sum == pytest.approx(0.1 + 0.2 + 0.5 + 0.7 + 5.0 + 0.15)
    hist.observe(0.3)
    window = hist.snapshot() - snap
    assert window == HistogramSnapshot((0.1, 0.5, 1.0, INF), (0, 1, 1, 1), pytest.approx(0.3))


def test_linear_runs_bin_like_single_observations() -> None:
    one_by_one, at_once = Histogram([0.01, 0.025, 0.05, 0.1]), Histogram([0.01, 0.025, 0.05, 0.1])
    first, step, n = 0.004, 0.0015, 80
    for i in range(n):
        one_by_one.observe_weighted(first + step * i, 7)
    at_once.observe_linear(first, step, n, 7)
    a, b = one_by_one.snapshot(), at_once.snapshot()
    assert a.cumulative == b.cumulative
    assert a.sum == pytest.approx(b.sum)
