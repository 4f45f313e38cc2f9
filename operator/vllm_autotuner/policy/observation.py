"""What the decision core may know about the traffic: one Prometheus window.

The operator's observe step (and the benchmark, from simulator snapshots)
fills an ``Observation`` with what PromQL over the window returns for the
target's current pods, nothing else: no engine internals, no ground truth.
Any number may be missing (``None``) or ``NaN`` when Prometheus had no data;
``hold_reason`` says whether the window is fit to act on, so every
"not enough data" case is decided in one place and always holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from enum import StrEnum

from vllm_autotuner.api import SLO, Knobs, VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.api.status import RolloutPhase
from vllm_autotuner.api.types import duration_seconds, utc_timestamp


@dataclass(frozen=True)
class Observation:
    """Aggregates of one window of vLLM metrics, all pods of the target together.

    Rates are per second over the window, summed over pods; gauges (running,
    waiting, KV usage) are means per pod. Latency quantiles are taken at the
    quantiles of ``slo`` (TTFT, e2e and queue time at the TTFT quantile, ITL
    at the ITL quantile) with ``histogram_quantile`` over the rate of the vLLM
    histograms; ``*_within_slo`` are the shares of samples (requests' TTFTs,
    inter-token gaps) at or under the targets, read from the same buckets
    (``histogram_fraction_below``).
    """

    window_start: datetime
    """Start of the window (timezone-aware)."""
    window_end: datetime
    """End of the window: the query's evaluation time."""
    config: Knobs | None = None
    """Knobs every pod in the window ran with (from the pod template); None when pods disagreed."""
    pods: int | None = None
    """Pods whose series were in the window."""
    rollout_in_progress: bool = False
    """Whether the target Deployment was rolling out (by anyone) during the window."""
    data_age_seconds: float | None = None
    """Age at window_end of the newest sample of the N-th freshest pod, N the Ready pods (of the freshest pod where
    none counts as Ready, as in a restart's windows): by when as many pods as are Ready had all reported. Scrape
    lag, or targets that stopped being scraped; judged by ``stale_after``, the limit by which the observe step
    counts the pods that report."""
    started_at: datetime | None = None
    """Latest start of a target pod's vLLM server (timezone-aware), from the ``_created`` gauges of its
    counters or, where those are not exported (prometheus-client's multiprocess mode, which vLLM uses with
    ``--api-server-count`` above 1, or PROMETHEUS_DISABLE_CREATED_SERIES), the newest reset of its counters (a
    container restarted in place) or the first sample of a pod whose series began, either at most the settle time
    (and at least a window) before the window; None when none tells."""
    asleep_pods: int | None = None
    """Pods whose vLLM engine slept in some of the window (sleep mode, after a ``/sleep`` call: the awake state of
    ``vllm:engine_sleep_state`` 0); None where no pod exports the gauge."""
    slo: SLO | None = None
    """The quantiles and targets the latency fields were computed for."""

    requests: float | None = None
    """Completed requests in the window (increase of vllm:request_success_total, finished_reason stop, length or
    repetition: not abort or error, which end without a whole request's latencies, nor those refused at admission):
    the sample count."""
    request_rate: float | None = None
    """Requests per second that ended, finished whatever their finished_reason or refused at admission: the load
    the pods were sent (aborted ones included, as in vLLM's request histograms the means of prompt and output
    lengths come from)."""
    refused_rate: float | None = None
    """Requests per second vLLM's API server refused at admission with 503, past a queue limit
    (``vllm:admission_rejections_total``: ``--max-num-queued-reqs``, ``--max-num-queued-tokens``); part of
    ``request_rate``, in no latency field. The decision core counts them as misses of both targets."""
    prompt_tokens_rate: float | None = None
    """Prefill tokens per second (vllm:prompt_tokens_total)."""
    cached_prompt_tokens_rate: float | None = None
    """Of those, the tokens per second not computed: served from the prefix cache or sent by another instance
    (vllm:prompt_tokens_cached_total). None: unknown (a vLLM before that counter), taken as none."""
    generation_tokens_rate: float | None = None
    """Generated tokens per second (vllm:generation_tokens_total)."""

    ttft_seconds: float | None = None
    """Time to first token at the SLO's TTFT quantile."""
    itl_seconds: float | None = None
    """Inter-token latency at the SLO's ITL quantile."""
    e2e_seconds: float | None = None
    """End-to-end request latency at the TTFT quantile."""
    queue_seconds: float | None = None
    """Queue time (vllm:request_queue_time_seconds) at the TTFT quantile."""
    itl_mean_seconds: float | None = None
    """Mean inter-token latency (histogram sum over count): about the mean engine step time."""
    ttft_within_slo: float | None = None
    """Share of requests whose TTFT is at or under the TTFT target, 0 to 1."""
    itl_within_slo: float | None = None
    """Share of inter-token gaps (vllm:inter_token_latency_seconds) at or under the ITL target, 0 to 1."""

    running: float | None = None
    """Mean running requests per pod (vllm:num_requests_running)."""
    waiting: float | None = None
    """Mean requests per pod waiting for room in the batch (vllm:num_requests_waiting_by_reason{reason="capacity"};
    from a vLLM without it, every waiting request: vllm:num_requests_waiting)."""
    kv_cache_usage: float | None = None
    """Mean KV-cache usage per pod, 0 to 1 (vllm:kv_cache_usage_perc)."""
    preemption_rate: float | None = None
    """Preemptions per second (vllm:num_preemptions_total)."""
    mean_prompt_tokens: float | None = None
    """Mean prompt length of completed requests (vllm:request_prompt_tokens sum over count)."""
    mean_generation_tokens: float | None = None
    """Mean output length of completed requests (vllm:request_generation_tokens sum over count)."""
    step_tokens_mean: float | None = None
    """Mean tokens per engine step computed (vllm:iteration_tokens_total sum, less the cached prompt tokens, over
    count)."""
    step_tokens_quantile: float | None = None
    """Tokens per engine step at the SLO's ITL quantile (vllm:iteration_tokens_total), at most the token budget;
    the budget (full steps) where the quantile lies past the histogram's last bucket (16384 in vLLM). As the tokens
    steps compute: a chunked prompt's earlier chunks, which vLLM shows as decodes, and its cached share, which it
    counts with the prompt, taken into account (``observe.quantile.step_tokens_quantile``)."""
    steps_per_second: float | None = None
    """Engine steps per second, all pods (vllm:iteration_tokens_total count rate)."""

    @property
    def duration_seconds(self) -> float:
        return (self.window_end - self.window_start).total_seconds()


#: Fields without which no traffic decision is made.
REQUIRED = (
    "pods",
    "requests",
    "request_rate",
    "prompt_tokens_rate",
    "generation_tokens_rate",
    "ttft_seconds",
    "itl_seconds",
    "mean_prompt_tokens",
    "mean_generation_tokens",
)
#: Fields that are shares, 0 to 1: above 1 they measure nothing (a pod's series summed twice, buckets that disagree)
#: and are held as invalid, never acted on.
SHARES = ("kv_cache_usage", "ttft_within_slo", "itl_within_slo")
_NUMBERS = tuple(
    f.name
    for f in fields(Observation)
    if f.name not in ("window_start", "window_end", "config", "slo", "rollout_in_progress", "started_at")
)


class HoldReason(StrEnum):
    """Why a decision is Hold, as a CamelCase word for conditions, events and metrics."""

    NO_DATA = "NoData"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    STALE = "StaleData"
    MIXED_CONFIG = "MixedConfig"
    NOT_SETTLED = "NotSettled"
    OTHER_SLO = "OtherSLO"
    TOO_FEW_SAMPLES = "TooFewSamples"
    INVALID = "InvalidData"
    PAUSED = "Paused"
    RECOMMEND_ONLY = "RecommendOnly"
    UNKNOWN_CONFIG = "UnknownConfig"
    COOLDOWN = "Cooldown"
    BUDGET = "RolloutBudget"
    NO_BETTER_CONFIG = "NoBetterConfig"
    REVERTED = "ChangesReverted"
    CONTROLLED = "TargetControlled"
    SMALL_GAIN = "GainBelowCost"
    NO_TIER = "NoTierMatches"
    DWELL = "RegimeTooYoung"
    SCHEDULE = "SchedulePreset"
    FREEZE = "ChangeFreeze"
    NO_SLOT = "RolloutSlots"
    ASLEEP = "EngineAsleep"
    NO_PODS = "NoPods"


def stale_after(spec: VllmTuningSpec) -> float:
    """Seconds after which a window's newest sample is too old to act on: three evaluation intervals, at least 90 s.
    A pod whose newest sample is older does not count as reporting (``observe.window.observe_target``)."""
    return max(3 * duration_seconds(spec.traffic.evaluation_interval), 90.0)


def rolling_out(state: VllmTuningStatus) -> bool:
    """Whether our last rollout is in progress by the status: pods restarting (an Unverified one restarts none)."""
    return state.last_rollout is not None and state.last_rollout.phase == RolloutPhase.IN_PROGRESS


def rollout_active(state: VllmTuningStatus, observation: Observation | None) -> str | None:
    """Why no change may start while a rollout is under way, naming whose (ours, by the status, or anyone's, by the
    Deployment), or None when none is."""
    if rolling_out(state):
        rollout = state.last_rollout
        assert rollout is not None
        return (f"the operator's rollout to {rollout.to_knobs} ({rollout.source.lower()} change at "
                f"{rollout.started_at}) is in progress: it is judged before any other change")
    if observation is not None and observation.rollout_in_progress:
        return ("a rollout of the Deployment the operator did not start is in progress (a person's change, an image "
                "update, a restart): no change until it completes")
    return None


def engines_asleep(observation: Observation | None) -> str | None:
    """Why no change, scheduled or not, may start while target pods' engines sleep, or None when none did in the
    window. Someone put them to sleep (vLLM's sleep mode frees their GPU memory for other work, as in RL training
    loops and GPU sharing): a rolling restart would start new pods awake, taking that memory back, and a start-up
    that fails for want of it would be blamed on the config. Their window is no measure of the traffic either."""
    if observation is None or not observation.asleep_pods:
        return None
    return (f"{observation.asleep_pods} of {observation.pods} pods' vLLM engines slept in the window (sleep mode): "
            "a restart would wake them, so no change starts until a whole window finds every engine awake "
            "(POST /wake_up)")


def hold_reason(
    spec: VllmTuningSpec, slo: SLO, state: VllmTuningStatus, observation: Observation | None, now: datetime
) -> tuple[HoldReason, str] | None:
    """Why this window must not drive a traffic decision, or None when it may.

    ``slo`` is the SLO in force (a schedule window may override the spec's).
    Checked in order: no data, a rollout, staleness, no pods (a Deployment
    scaled to zero: ``NoPods``), samples under another config, samples from
    before the config settled, from pods whose vLLM server (re)started less
    than the settle time before the window (a restart that is not a knob
    change: ``kubectl rollout restart``, an image bump, a crashed container,
    a scale-up), or a short window, quantiles for another SLO, NaN,
    negative or missing numbers, shares above 1, too few requests. An unknown start
    (``started_at`` None: no ``_created`` series, no counter reset, and
    every pod's series reaching back further than the settle time, or a
    window, before the window) does not hold.
    """
    if observation is None:
        return HoldReason.NO_DATA, ("no window: Prometheus did not answer, or had no fresh series of the target's "
                                    "pods (the MetricsAvailable condition says which)")
    if (rollout := rollout_active(state, observation)) is not None:
        return HoldReason.ROLLOUT_IN_PROGRESS, rollout
    age = (now - observation.window_end).total_seconds() + (observation.data_age_seconds or 0.0)
    if math.isnan(age) or age > stale_after(spec):
        return HoldReason.STALE, f"the pods' newest samples are {age:.0f}s old (limit {stale_after(spec):.0f}s)"
    if observation.pods == 0:
        return HoldReason.NO_PODS, "the Deployment has no pods (scaled to zero): nothing to measure"
    current = state.current
    if current is None:
        return HoldReason.UNKNOWN_CONFIG, "the target's current knobs are not known yet"
    if observation.config != current.knobs:
        taken = "several configs" if observation.config is None else str(observation.config)
        return HoldReason.MIXED_CONFIG, f"samples were taken under {taken}, not the current {current.knobs}"
    settled = datetime.fromisoformat(current.since) + timedelta(seconds=duration_seconds(spec.rollout.settle_time))
    if observation.window_start < settled:
        return HoldReason.NOT_SETTLED, f"the window starts before the current config settled ({utc_timestamp(settled)})"
    if observation.started_at is not None:
        pod_settled = observation.started_at + timedelta(seconds=duration_seconds(spec.rollout.settle_time))
        if observation.window_start < pod_settled:
            return HoldReason.NOT_SETTLED, (
                f"a target pod's vLLM server started at {utc_timestamp(observation.started_at)}: the window starts"
                f" before it settled ({utc_timestamp(pod_settled)})"
            )
    window = duration_seconds(spec.traffic.window)
    if observation.duration_seconds < 0.9 * window:
        return HoldReason.NOT_SETTLED, (
            f"only {observation.duration_seconds:.0f}s of the {window:.0f}s window under the current config"
        )
    if observation.slo != slo:
        return HoldReason.OTHER_SLO, "the latency quantiles were computed for another SLO than the one in force"
    for name in _NUMBERS:
        value = getattr(observation, name)
        if isinstance(value, float) and not math.isfinite(value):
            return HoldReason.INVALID, f"{name} is {value}"
        if value is not None and value < 0:
            return HoldReason.INVALID, f"{name} is negative ({value})"
        if name in SHARES and value is not None and value > 1:
            return HoldReason.INVALID, (
                f"{name} is {value}, above 1, which a share cannot be: a pod's series counted more than once (two "
                "scrape jobs whose copies differ in more than job and instance: select one with "
                "spec.prometheus.labelMatchers, such as job) or histogram buckets that disagree"
            )
    missing = [name for name in REQUIRED if getattr(observation, name) is None]
    if missing:
        return HoldReason.NO_DATA, f"no data for {', '.join(missing)}"
    assert observation.requests is not None and observation.pods is not None
    if observation.requests < spec.traffic.min_requests:
        return HoldReason.TOO_FEW_SAMPLES, (
            f"{observation.requests:.0f} requests in the window, fewer than minRequests {spec.traffic.min_requests}"
        )
    return None


def blind(observation: Observation | None, problem: tuple[HoldReason, str] | None) -> tuple[HoldReason, str] | None:
    """``problem`` (``hold_reason``'s) when it means the window shows nothing of the pods as they are now:
    Prometheus did not answer or had no fresh series of them (no observation), their newest samples are stale,
    or its numbers are NaN, negative or shares above 1. Then no change starts, not even a schedule's, which
    needs no traffic data: a rolling restart made blind could not be judged (no regression measured, no engine
    seen asleep), so it waits for a fresh window. A quiet window (too few requests, none at all, a Deployment
    scaled to zero) is not blind: a nightly batch window still opens on time."""
    if problem is None or not (observation is None or problem[0] in (HoldReason.STALE, HoldReason.INVALID)):
        return None
    return problem
