"""Cumulative metric state of one simulated engine, and PromQL's arithmetic
over it.

The engine counts exactly what a vLLM server exports (counters, histograms
with vLLM's bucket bounds, gauges). Histograms buffer observations and bin
them in bulk when read; a snapshot gives Prometheus's cumulative form. A
caller diffs two snapshots to get a window's increase (``increase()`` /
``rate()`` without counter resets) and reads quantiles with the operator's
Prometheus-exact ``histogram_quantile``, so the benchmark sees the numbers the
operator sees.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_autotuner.observe.quantile import histogram_quantile

# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py), as served in
# vllm-metrics.txt.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to
    ``max_value`` (its ``max_model_len``)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


class Histogram:
    """A Prometheus histogram: per-bucket counts (last = +Inf), sum, count.

    Observations are buffered and binned in bulk (``numpy.searchsorted``) when
    the histogram is read: a simulated engine makes millions of them, and a
    list append is the cheapest thing Python can do per observation.
    """

    __slots__ = ("bounds", "_edges", "_counts", "_sum", "values", "weighted_values", "weights")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds: tuple[float, ...] = tuple(float(b) for b in bounds)
        self._edges = np.asarray(self.bounds)
        self._counts: list[float] = [0.0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self.values: list[float] = []
        """Unbinned observations: append to observe."""
        self.weighted_values: list[float] = []
        """Unbinned observations that count ``weights[i]`` times each."""
        self.weights: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)

    def observe_weighted(self, value: float, weight: float) -> None:
        """Record ``weight`` observations of ``value``."""
        self.weighted_values.append(value)
        self.weights.append(weight)

    def observe_linear(self, first: float, step: float, n: int, weight: float) -> None:
        """Record ``weight`` observations of each of ``first + step*i`` for
        ``i`` in ``range(n)``, in O(buckets) instead of O(n) (plain Python:
        called once per fast-forwarded span, where numpy's call overhead would
        cost more than the loop)."""
        if n <= 0:
            return
        counts = self._counts
        placed = 0
        for i, bound in enumerate(self.bounds):
            if step > 0.0:
                upto = min(n, max(0, math.floor((bound - first) / step) + 1))  # values <= bound
            else:
                upto = n if first <= bound else 0
            if upto > placed:
                counts[i] += weight * (upto - placed)
                placed = upto
                if placed == n:
                    break
        if placed < n:
            counts[-1] += weight * (n - placed)
        self._sum += weight * (n * first + step * n * (n - 1) / 2)

    def observe_array(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Bin many observations at once."""
        binned = np.bincount(
            np.searchsorted(self._edges, values, side="left"), weights=weights, minlength=len(self._counts)
        )
        self._counts = [a + b for a, b in zip(self._counts, binned.tolist(), strict=True)]
        self._sum += float(values.sum() if weights is None else values @ weights)

    def flush(self) -> None:
        """Bin the buffered observations."""
        if self.values:
            self.observe_array(np.asarray(self.values))
            self.values.clear()
        if self.weights:
            self.observe_array(np.asarray(self.weighted_values), np.asarray(self.weights))
            self.weighted_values.clear()
            self.weights.clear()

    def snapshot(self) -> HistogramSnapshot:
        self.flush()
        return HistogramSnapshot(
            self.bounds + (math.inf,), tuple(itertools.accumulate(self._counts)), self._sum
        )


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative bucket counts, as Prometheus stores them (``le`` = bounds,
    the last bound ``+Inf``)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def __sub__(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        return HistogramSnapshot(
            self.bounds,
            tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)),
            self.sum - earlier.sum,
        )

    def quantile(self, q: float) -> float:
        """``histogram_quantile(q, ...)`` as Prometheus (and the operator,
        :mod:`vllm_autotuner.observe.quantile`) computes it."""
        return histogram_quantile(q, self.bounds, self.cumulative)

    def mean(self) -> float:
        """``rate(x_sum) / rate(x_count)``: NaN without observations."""
        return self.sum / self.count if self.count else math.nan


COUNTERS = (
    "prompt_tokens",
    "prompt_tokens_cached",
    "generation_tokens",
    "num_preemptions",
    "request_success",
    "prefix_cache_queries",
    "prefix_cache_hits",
)


REQUEST_FIELDS = (
    "e2e",
    "queue_time",
    "prefill_time",
    "decode_time",
    "inference_time",
    "tpot_request",
    "prompt_tokens",
    "generation_tokens",
    "num_preemptions",
    "prefill_kv_computed",
)
"""What :attr:`MetricState.finished` records per finished request, in order."""


class MetricState:
    """Everything an engine has counted since it started.

    The engine's hot loop appends to the attributes directly: counters are a
    dict, histograms buffer (:class:`Histogram`), and a finished request is
    one tuple of :data:`REQUEST_FIELDS` in :attr:`finished`, spread over its
    ten histograms (and ``request_success``) when the state is read.
    """

    def __init__(self, max_model_len: int) -> None:
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.finished: list[tuple[float, ...]] = []
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot_request = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = Histogram(token_buckets)
        self.generation_tokens = Histogram(token_buckets)
        self.max_num_generation_tokens = Histogram(token_buckets)
        self.params_max_tokens = Histogram(token_buckets)
        self.prefill_kv_computed = Histogram(token_buckets)
        self.params_n = Histogram(PARAMS_N_BUCKETS)
        self.num_preemptions = Histogram(NUM_PREEMPTIONS_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKENS_BUCKETS)

    def flush_finished(self) -> None:
        """Spread the buffered finished requests over their histograms."""
        if not self.finished:
            return
        columns = dict(zip(REQUEST_FIELDS, np.asarray(self.finished).T, strict=True))
        for name, values in columns.items():
            getattr(self, name).observe_array(values)
        # vLLM observes max_tokens twice more; every request has n = 1.
        self.max_num_generation_tokens.observe_array(columns["generation_tokens"])
        self.params_max_tokens.observe_array(columns["generation_tokens"])
        self.params_n.observe_array(np.ones(len(self.finished)))
        self.counters["request_success"] += len(self.finished)
        self.finished.clear()

    def buffered(self) -> int:
        """Observations waiting to be binned (bounds the buffers' memory)."""
        return len(self.finished) + sum(len(h.values) + len(h.weights) for h in self.histograms().values())

    def flush(self) -> None:
        """Bin everything buffered."""
        self.flush_finished()
        for hist in self.histograms().values():
            hist.flush()

    def histograms(self) -> dict[str, Histogram]:
        """Histograms by their vLLM metric name."""
        return {
            "vllm:time_to_first_token_seconds": self.ttft,
            "vllm:inter_token_latency_seconds": self.itl,
            "vllm:request_time_per_output_token_seconds": self.tpot_request,
            "vllm:e2e_request_latency_seconds": self.e2e,
            "vllm:request_queue_time_seconds": self.queue_time,
            "vllm:request_inference_time_seconds": self.inference_time,
            "vllm:request_prefill_time_seconds": self.prefill_time,
            "vllm:request_decode_time_seconds": self.decode_time,
            "vllm:request_prompt_tokens": self.prompt_tokens,
            "vllm:request_generation_tokens": self.generation_tokens,
            "vllm:request_max_num_generation_tokens": self.max_num_generation_tokens,
            "vllm:request_params_max_tokens": self.params_max_tokens,
            "vllm:request_params_n": self.params_n,
            "vllm:request_num_preemptions": self.num_preemptions,
            "vllm:request_prefill_kv_computed_tokens": self.prefill_kv_computed,
            "vllm:iteration_tokens_total": self.iteration_tokens,
        }


@dataclass(frozen=True, slots=True)
class Gauges:
    """The engine's instantaneous state, as vLLM's gauges report it."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    num_requests_deferred: int = 0
    """Of the waiting, those deferred for a LoRA adapter's place in the batch."""
    running_lora_adapters: tuple[str, ...] = ()
    """The LoRA adapters of the requests in the batch, in the order they came into it (with ``--enable-lora``)."""
    waiting_lora_adapters: tuple[str, ...] = ()
    """The LoRA adapters the waiting requests name, in queue order, each once."""


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """All metrics of one engine at simulated time ``time``.

    ``later - earlier`` gives the increase of every counter and histogram over
    the window and the gauges at its end, like ``increase(x[w])`` in PromQL;
    divide by :attr:`time` difference for ``rate``.
    """

    time: float
    counters: dict[str, float]
    histograms: dict[str, HistogramSnapshot]
    gauges: Gauges

    def __sub__(self, earlier: MetricsSnapshot) -> MetricsSnapshot:
        return MetricsSnapshot(
            self.time - earlier.time,
            {k: v - earlier.counters[k] for k, v in self.counters.items()},
            {k: h - earlier.histograms[k] for k, h in self.histograms.items()},
            self.gauges,
        )


def snapshot(state: MetricState, time: float, gauges: Gauges) -> MetricsSnapshot:
    """Freeze ``state``: a few hundred numbers, cheap to take every scrape."""
    state.flush_finished()
    return MetricsSnapshot(
        time,
        dict(state.counters),
        {name: h.snapshot() for name, h in state.histograms().items()},
        gauges,
    )
