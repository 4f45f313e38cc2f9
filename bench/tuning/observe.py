"""The ``Observation`` the operator builds from PromQL, over a window of the benchmark's fleet.

Quantiles with Prometheus's own ``histogram_quantile`` (the step tokens' as
the operator reads them, ``step_tokens_quantile``), shares within target
with ``histogram_fraction_below``, gauges averaged over the scrapes in the
window, rates over its length. It is a module of its own because static
runs never build an Observation (their timelines take three numbers of a
``fleet.Window``): the static runs' cache is not keyed on this code, so a new
field for the decision core costs a rerun of the adaptive runs, not of the
grid.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np

from vllm_autotuner.api import SLO
from vllm_autotuner.observe.quantile import histogram_fraction_below, step_tokens_quantile
from vllm_autotuner.observe.queries import completed_requests
from vllm_autotuner.observe.window import cached_prompt_tokens
from vllm_autotuner.policy import Observation
from vllm_autotuner.sim.metricstate import HistogramSnapshot
from vllm_autotuner.sim.metrics import finished_by_reason

from bench.tuning.fleet import SCRAPE_LAG_SECONDS, Fleet


def _mean(h: HistogramSnapshot) -> float | None:
    return h.sum / h.count if h.count else None


def observe(fleet: Fleet, start: float, end: float, slo: SLO, t0: datetime) -> Observation | None:
    """The Observation for ``[start, end]`` over the pods running now, or None without scrapes."""
    window = fleet.window(start, end)
    if window is None:
        return None
    histograms, counters, scrapes, seconds = window.histograms, window.counters, window.scrapes, window.seconds
    ttft, itl = histograms["vllm:time_to_first_token_seconds"], histograms["vllm:inter_token_latency_seconds"]
    steps = histograms["vllm:iteration_tokens_total"]

    def share(h: HistogramSnapshot, target: float) -> float | None:
        return histogram_fraction_below(target, h.bounds, h.cumulative) if h.count else None

    config = next(iter(window.knobs)) if len(window.knobs) == 1 else None
    finished = finished_by_reason(counters)  # as the fleet exports vllm:request_success_total
    budget = None if config is None else float(config.max_num_batched_tokens)  # capped as ``observe_target`` does
    prompt = counters["prompt_tokens"] / seconds
    cached, cached_share, computed = cached_prompt_tokens(prompt, counters["prompt_tokens_cached"] / seconds,
                                                          steps.sum / seconds)
    return Observation(
        window_start=t0 + timedelta(seconds=start),
        window_end=t0 + timedelta(seconds=end),
        config=config,
        pods=window.pods,
        rollout_in_progress=fleet.rollout_started is not None,
        data_age_seconds=SCRAPE_LAG_SECONDS,
        slo=slo,
        requests=completed_requests(finished),  # the operator's sample count: not aborted or failed
        request_rate=math.fsum(finished.values()) / seconds,
        prompt_tokens_rate=prompt,
        cached_prompt_tokens_rate=cached,
        generation_tokens_rate=counters["generation_tokens"] / seconds,
        ttft_seconds=window.quantile("vllm:time_to_first_token_seconds", slo.ttft.quantile),
        itl_seconds=window.quantile("vllm:inter_token_latency_seconds", slo.itl.quantile),
        e2e_seconds=window.quantile("vllm:e2e_request_latency_seconds", slo.ttft.quantile),
        queue_seconds=window.quantile("vllm:request_queue_time_seconds", slo.ttft.quantile),
        itl_mean_seconds=_mean(itl),
        ttft_within_slo=share(ttft, slo.ttft.seconds),
        itl_within_slo=share(itl, slo.itl.seconds),
        running=float(np.mean([s.gauges.num_requests_running for s in scrapes])),
        waiting=float(np.mean([s.gauges.num_requests_waiting for s in scrapes])),
        kv_cache_usage=float(np.mean([s.gauges.kv_cache_usage_perc for s in scrapes])),
        preemption_rate=counters["num_preemptions"] / seconds,
        mean_prompt_tokens=_mean(histograms["vllm:request_prompt_tokens"]),
        mean_generation_tokens=_mean(histograms["vllm:request_generation_tokens"]),
        step_tokens_mean=computed * seconds / steps.count if steps.count else None,
        step_tokens_quantile=step_tokens_quantile(slo.itl.quantile, steps.bounds, steps.cumulative, budget,
                                                  cached_share) if steps.count else None,
        steps_per_second=steps.count / seconds,
    )
