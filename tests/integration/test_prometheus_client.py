"""The operator's Prometheus client against the real server: range queries evaluate exactly where asked.

Reports line their steps up with the times they asked for, so a client that
moved the range (prometheus-api-client rounds start and end to whole
seconds) would pair every value with the wrong step.
"""

from __future__ import annotations

import time

import pytest

from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def test_a_range_query_is_evaluated_at_the_exact_times_asked(prometheus: localenv.Prometheus) -> None:
    client = PrometheusClient(Connection(url=prometheus.url))
    start = round(time.time(), 0) - 100.375
    (series,) = client.query_range("time()", start, start + 3 * 2.5, 2.5)
    expected = [start + 2.5 * k for k in range(4)]
    assert series.times == pytest.approx(expected, abs=1e-6)
    assert series.values == pytest.approx(expected, abs=1e-6)  # time() is the evaluation time itself
