"""One observation window: fetch every family once, then slice it per tuning.

``fetch_window`` runs the family queries for one (Prometheus, selector,
window, time) key and keeps the answers per pod; ``observe_target`` sums a
tuning's pods out of that (its current ReplicaSet's; during its own
rollout, every ReplicaSet's; by name prefix, or by exact name where a
long name leaves the prefix ambiguous: ``queries.PodMatch``) and turns
them into the decision core's ``Observation``. The live operator calls
``fetch_window`` once per key for all its tunings (optionally with a
tuning's own pod matchers, the naive baseline), so what reaches ``decide``
does not depend on how it was asked.

Missing data stays missing: a family that one of the target's pods has no
rows of is None in the Observation, never zero nor the sum of the pods that
answered (a histogram too: the quantiles and shares of the others would
hide a pod that breaches the SLO), and ``observe_target`` refuses partial
windows (fewer pods with data than Ready replicas, counting only pods whose
newest sample is within the decision core's staleness limit) outright. A
pod whose scrapes fail is still one of the window, with its newest real
sample, while its scrape target is there (``queries``), so the staleness
limit, not the first failed scrape, decides when it stops counting. The
sample count is the completed requests (``finished_reason`` other than
abort and error: ``queries.completed_requests``); the request rate, the
load, counts every finished request, and those vLLM's API server refused at
admission (a queue limit), which no latency histogram has: their rate goes
to the decision core as such, which counts them as misses. The newest
server start among the target's pods (their ``_created`` gauges or, without
them, the newest reset of their counters or the first sample of a series
that began, either at most the settle time, and at least a window, before
the window: ``queries.reach``) goes into the Observation as is; whether a
restart in or just before the window makes it unfit is the decision core's
call. So does the number of pods whose engine slept in some of the window
(vLLM's sleep mode: the awake state of ``vllm:engine_sleep_state`` below 1
on average), which no change may wake; a window where some pods have that
gauge and others none is refused, as whether those slept is unknown. A
step's tokens at the ITL quantile are read as the tokens steps compute
(``quantile.step_tokens_quantile``: vLLM counts a chunked prompt whole in
the step that finishes it, and the steps of its earlier chunks as decodes
alone; it counts the tokens the prefix cache served with the prompt, which
the window's share of cached prompt tokens takes out, as it does from the
mean step), capped at the token budget, which no step computes more than, and
are the budget where the quantile lies past the last bucket: vLLM's end at
16384, below budgets that go to 32768, and there Prometheus answers 16384,
which would make full steps look half full.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vllm_autotuner.api import SLO, Knobs
from vllm_autotuner.observe.client import PrometheusClient
from vllm_autotuner.observe.quantile import histogram_fraction_below, histogram_quantile, step_tokens_quantile
from vllm_autotuner.observe.queries import FAMILIES, Kind, Matcher, PodMatch, Selector, family_query
from vllm_autotuner.policy import Observation

PodKey = tuple[str, str]  # (namespace, pod)


@dataclass
class WindowData:
    """Per-pod answers of every family for one window ending at ``at`` (Unix seconds)."""

    at: float
    window_seconds: float
    values: dict[str, dict[PodKey, float]] = field(default_factory=dict)
    buckets: dict[str, dict[PodKey, dict[float, float]]] = field(default_factory=dict)


def fetch_window(client: PrometheusClient, selector: Selector, window_seconds: float, at: float,
                 extra: tuple[Matcher, ...] = (), reach_seconds: int | None = None) -> WindowData:
    """Run one query per family (``family_query``). Raises ``PrometheusError`` if any query fails (no half
    windows)."""
    data = WindowData(at=at, window_seconds=window_seconds)

    def pod(labels: dict[str, str]) -> PodKey:
        return labels.get(selector.namespace_label, ""), labels.get(selector.pod_label, "")

    for family in FAMILIES:
        rows = client.query(family_query(family, selector, window_seconds, extra, reach_seconds), at)
        if family.kind is Kind.BUCKETS:
            per_pod: dict[PodKey, dict[float, float]] = defaultdict(dict)
            # one bound spelled two ways ("1.0", and "1" since a Prometheus 3 upgrade) is one bucket of both,
            # as in Prometheus' own histogram_quantile
            for row in rows:
                bound, buckets = float(row.labels.get("le", "nan")), per_pod[pod(row.labels)]
                buckets[bound] = buckets.get(bound, 0.0) + row.value
            data.buckets[family.key] = dict(per_pod)
        elif family.part_label is not None:  # grouped by the parts' label too: the family is the sum over it
            by_value: dict[PodKey, dict[str, float]] = defaultdict(dict)
            for row in rows:
                by_value[pod(row.labels)][row.labels.get(family.part_label, "")] = row.value
            data.values[family.key] = {key: math.fsum(rates.values()) for key, rates in by_value.items()}
            for part in family.parts:
                data.values[part.key] = {key: part.of(rates) for key, rates in by_value.items()}
        else:
            data.values[family.key] = {pod(row.labels): row.value for row in rows}
    return data


@dataclass(frozen=True)
class _Histogram:
    bounds: list[float]
    counts: list[float]

    def quantile(self, q: float) -> float | None:
        value = histogram_quantile(q, self.bounds, self.counts)
        return None if math.isnan(value) else value

    def step_tokens_quantile(self, q: float, budget: float | None, cached: float) -> float | None:
        """``vllm:iteration_tokens_total``'s quantile as the tokens steps compute (``step_tokens_quantile``)."""
        value = step_tokens_quantile(q, self.bounds, self.counts, budget, cached)
        return None if math.isnan(value) else value

    def within(self, target: float) -> float | None:
        value = histogram_fraction_below(target, self.bounds, self.counts)
        return None if math.isnan(value) else value


def _summed_histogram(per_pod: dict[PodKey, dict[float, float]], pods: list[PodKey]) -> _Histogram | None:
    """The pods' histograms summed, or None unless every pod has one (its +Inf bucket among its rows), as ``_sum``
    is None unless every pod has a value: the buckets of the pods that answered alone are another population's, and
    a pod that breaches the SLO left out of the quantiles and shares makes the window look healthy."""
    if not all(math.inf in per_pod.get(pod, {}) for pod in pods):
        return None
    summed: dict[float, float] = defaultdict(float)
    for pod in pods:
        for bound, rate in per_pod[pod].items():
            summed[bound] += rate
    if not summed[math.inf]:
        return None
    bounds = sorted(summed)
    return _Histogram(bounds, [summed[b] for b in bounds])


def _sum(values: dict[PodKey, float], pods: list[PodKey]) -> float | None:
    present = [values[p] for p in pods if p in values]
    return math.fsum(present) if len(present) == len(pods) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cached_prompt_tokens(prompt: float | None, cached: float | None,
                         step_tokens: float | None) -> tuple[float | None, float, float | None]:
    """The rate of prompt tokens served from the prefix cache (``vllm:prompt_tokens_cached_total``) as a window
    reads it, at most the rate of the prompt tokens it is counted with (``prompt``; series that disagree), None where
    either is unknown or not a number; its share of the prompt tokens (0 where unknown); and the rate of
    ``vllm:iteration_tokens_total``'s sum (``step_tokens``) less it: the tokens steps computed."""
    if cached is None or prompt is None or not math.isfinite(cached) or not math.isfinite(prompt):
        cached, share = None, 0.0
    else:
        cached = min(max(cached, 0.0), prompt)
        share = cached / prompt if prompt else 0.0
    computed = None if step_tokens is None else max(step_tokens - (cached or 0.0), 0.0)
    return cached, share, computed


def _partial(fresh: int, ready_pods: int, stale: dict[PodKey, float], limit: float) -> str:
    """Why a window with fewer pods reporting than are Ready is refused, and what to look at."""
    if not stale:
        return (f"only {fresh} of {ready_pods} Ready pods are scraped by Prometheus and have series in the window: "
                "partial data")
    last = ", ".join(f"{pod} {age:.0f}s ago" for (_, pod), age in sorted(stale.items()))
    return (f"only {fresh} of {ready_pods} Ready pods reported in the last {limit:.0f}s: partial data; last sample "
            f"from {last}: for each of those pods that still runs, check its scrape target in Prometheus (up, "
            f"scrape errors) and the pod itself (its vLLM server's /metrics)")


def _sleep_unknown(awake: dict[PodKey, float], pods: list[PodKey]) -> str | None:
    """Why the window cannot tell whether every engine was awake, or None when it can: some of its pods have series
    of vLLM's sleep gauge and others none. Counted awake, a sleeping one among those would be restarted by a change,
    which takes back the GPU memory someone freed; nor is the count None, which the decision core reads as a vLLM
    without the gauge (no pod has it) and does not hold for."""
    missing = [pod for pod in pods if pod not in awake]
    if not missing or len(missing) == len(pods):
        return None
    names = ", ".join(pod for _, pod in missing)
    return (f"no vllm:engine_sleep_state series for pods {names} while the window's other pods have them: whether "
            "their engines slept is unknown, and a restart would wake them; check that Prometheus keeps that metric "
            "of every pod (metric relabelling, the scrape of those pods)")


def target_pods(data: WindowData, namespace: str, match: PodMatch) -> list[PodKey]:
    """The pods of one tuning (those of its ReplicaSets, by their names' prefixes or exact names) that have data
    in the window."""
    seen = data.values.get("last_seen", {})
    return sorted(k for k in seen if k[0] == namespace and match.matches(k[1]))


def observe_target(
    data: WindowData,
    namespace: str,
    match: PodMatch,
    ready_pods: int,
    config: Knobs | None,
    slo: SLO,
    rollout_in_progress: bool,
    *,
    stale_after_seconds: float = math.inf,
) -> tuple[Observation | None, str | None]:
    """The Observation of one tuning's pods, or (None, why) when there is nothing usable.

    A pod counts against the ``ready_pods`` only while its newest sample is at most ``stale_after_seconds``
    old at the window's end (the decision core's limit, ``policy.stale_after``): one whose scrapes stopped
    minutes ago still has series in the window, and would pass a window without its latest part for complete.
    A pod deleted in the window (a scale-down, an old revision's in a restart, whose windows pass 0 Ready pods)
    is no Ready pod any more, so it misses nothing; Prometheus marks its series stale once its target is gone,
    so it is usually no pod of the window either (``last_seen`` is an instant query, which answers a pod with
    stale-marked series only while its scrape target is there and failing). Without a limit (the default)
    every pod with series counts, as before the limit was passed in.
    """
    pods = target_pods(data, namespace, match)
    if not pods:
        return None, f"no vLLM series for pods {match} in namespace {namespace}: is Prometheus scraping them?"
    ages = {p: max(0.0, data.at - data.values["last_seen"][p]) for p in pods}
    stale = {p: age for p, age in ages.items() if not age <= stale_after_seconds}
    if len(pods) - len(stale) < ready_pods:
        return None, _partial(len(pods) - len(stale), ready_pods, stale, stale_after_seconds)
    n = len(pods)
    v = data.values
    awake = v.get("awake", {})
    if (why := _sleep_unknown(awake, pods)) is not None:
        return None, why
    rates = {key: _sum(v.get(key, {}), pods) for key in (
        "requests", "completed", "refused", "prompt_tokens", "cached_prompt_tokens", "generation_tokens", "preemptions",
        "prompt_len_sum", "prompt_len_count", "output_len_sum", "output_len_count", "step_tokens_sum", "steps",
        "itl_sum", "itl_count", "running", "waiting", "kv_usage")}
    hist = {key: _summed_histogram(data.buckets.get(key, {}), pods)
            for key in ("ttft", "itl", "e2e", "queue", "step_tokens")}
    # the data's age: the ready_pods-th freshest pod's (the freshest's where no pod is counted Ready), by when
    # as many pods as are Ready had all reported; the decision core's staleness rule judges it by the same limit
    age = sorted(ages.values())[max(ready_pods, 1) - 1]
    started = v.get("started", {})
    starts = [started[p] for p in pods if p in started and math.isfinite(started[p])]
    ttft, itl, steps = hist["ttft"], hist["itl"], hist["step_tokens"]
    budget = None if config is None else float(config.max_num_batched_tokens)
    prompt = rates["prompt_tokens"]
    cached, cached_share, computed = cached_prompt_tokens(prompt, rates["cached_prompt_tokens"],
                                                          rates["step_tokens_sum"])
    end = datetime.fromtimestamp(data.at, UTC)
    observation = Observation(
        window_start=datetime.fromtimestamp(data.at - data.window_seconds, UTC),
        window_end=end,
        config=config,
        pods=n,
        rollout_in_progress=rollout_in_progress,
        data_age_seconds=age,
        started_at=datetime.fromtimestamp(max(starts), UTC) if starts else None,
        asleep_pods=sum(awake[p] < 1.0 for p in pods) if awake.keys() >= set(pods) else None,
        slo=slo,
        requests=None if rates["completed"] is None else rates["completed"] * data.window_seconds,
        request_rate=rates["requests"],
        refused_rate=rates["refused"],
        prompt_tokens_rate=prompt,
        cached_prompt_tokens_rate=cached,
        generation_tokens_rate=rates["generation_tokens"],
        ttft_seconds=ttft.quantile(slo.ttft.quantile) if ttft else None,
        itl_seconds=itl.quantile(slo.itl.quantile) if itl else None,
        e2e_seconds=hist["e2e"].quantile(slo.ttft.quantile) if hist["e2e"] else None,
        queue_seconds=hist["queue"].quantile(slo.ttft.quantile) if hist["queue"] else None,
        itl_mean_seconds=_ratio(rates["itl_sum"], rates["itl_count"]),
        ttft_within_slo=ttft.within(slo.ttft.seconds) if ttft else None,
        itl_within_slo=itl.within(slo.itl.seconds) if itl else None,
        running=_ratio(rates["running"], n),
        waiting=_ratio(rates["waiting"], n),
        kv_cache_usage=_ratio(rates["kv_usage"], n),
        preemption_rate=rates["preemptions"],
        mean_prompt_tokens=_ratio(rates["prompt_len_sum"], rates["prompt_len_count"]),
        mean_generation_tokens=_ratio(rates["output_len_sum"], rates["output_len_count"]),
        step_tokens_mean=_ratio(computed, rates["steps"]),
        step_tokens_quantile=steps.step_tokens_quantile(slo.itl.quantile, budget, cached_share) if steps else None,
        steps_per_second=rates["steps"],
    )
    return observation, None
