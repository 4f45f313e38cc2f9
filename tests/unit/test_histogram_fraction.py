"""histogram_fraction: the share of a classic histogram at or below a target, inverse of histogram_quantile."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from vllm_autotuner.observe.quantile import histogram_fraction, histogram_quantile

BOUNDS = [0.1, 0.5, 1.0, math.inf]


@pytest.mark.parametrize(
    ("upper", "counts", "expected"),
    [
        (0.5, [10, 20, 30, 40], 0.5),  # a bucket bound: exact
        (0.3, [10, 20, 30, 40], (10 + 10 * 0.5) / 40),  # halfway into (0.1, 0.5]
        (0.05, [10, 20, 30, 40], 5 / 40),  # the first bucket starts at 0
        (2.0, [10, 20, 30, 40], 30 / 40),  # past the highest finite bound: what was counted up to it
        (0.0, [10, 20, 30, 40], 0.0),
        (0.5, [0, 0, 0, 0], math.nan),
        (0.5, [10, 5, 30, 40], 10 / 40),  # non-monotonic repaired as histogram_quantile does
    ],
)
def test_cases(upper, counts, expected):
    got = histogram_fraction(upper, BOUNDS, counts)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


@given(st.lists(st.integers(0, 50), min_size=4, max_size=4), st.floats(0.01, 0.99))
def test_inverse_of_histogram_quantile_inside_finite_buckets(increments, q):
    counts = [sum(increments[: i + 1]) for i in range(4)]
    assume(counts[-1] > 0)
    value = histogram_quantile(q, BOUNDS, counts)
    assume(not math.isnan(value) and value < BOUNDS[-2])
    assert histogram_fraction(value, BOUNDS, counts) == pytest.approx(q, abs=1e-9)


@given(st.lists(st.integers(0, 50), min_size=4, max_size=4), st.floats(0, 3), st.floats(0, 3))
def test_monotone_and_a_share(increments, a, b):
    counts = [sum(increments[: i + 1]) for i in range(4)]
    assume(counts[-1] > 0)
    low, high = sorted((a, b))
    assert 0 <= histogram_fraction(low, BOUNDS, counts) <= histogram_fraction(high, BOUNDS, counts) <= 1
