"""The engine's histograms: vLLM's ``le`` binning, bulk and linear-run
observations, window diffs, and quantiles read through the operator's
Prometheus-exact histogram_quantile."""

from __future__ import annotations

import math

import pytest

from vllm_autotuner.observe.quantile import histogram_quantile
from vllm_autotuner.sim.metricstate import Histogram, HistogramSnapshot, build_1_2_5_buckets

INF = math.inf


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


def test_snapshot_quantile_is_the_operators() -> None:
    hist = Histogram([0.1, 0.5, 1.0])
    for value in (0.05, 0.2, 0.3, 0.4, 0.9, 3.0):
        hist.observe(value)
    snap = hist.snapshot()
    for q in (0.1, 0.5, 0.9, 0.99):
        assert snap.quantile(q) == histogram_quantile(q, snap.bounds, snap.cumulative)
    assert snap.quantile(0.5) == pytest.approx(0.1 + 0.4 * (3 - 1) / 3)


def test_token_buckets_follow_max_model_len() -> None:
    assert build_1_2_5_buckets(256) == (1, 2, 5, 10, 20, 50, 100, 200)
    assert build_1_2_5_buckets(8192)[-2:] == (2000, 5000)
