"""A performance model fitted online from observations, to price a config before restarting for it.

Every probe of a new config is a rolling restart, so blind hill-climbing
pays for each step with capacity. This model predicts what a candidate
would do under the traffic just measured, from vLLM's scheduling physics
and numbers Prometheus gives:

* **Step time is linear in the tokens of the step**: ``t = a + b * T``.
  Every decoding request gets one token per step, so the inter-token
  latency *is* the step time; ``b`` (seconds per batched token) is fitted
  by least squares from (mean tokens per step, mean ITL) and (tokens per
  step, ITL) at the SLO quantile across windows, with one intercept per
  regime (attention and overhead depend on context length and
  concurrency), shrunk toward the tightest upper bound ``min(ITL/T)`` when
  the points do not spread. The ITL quantile of a candidate token budget
  then moves by ``b`` times the change of the step tokens at that quantile:
  when the quantile steps are full (prefill backlog), they are as big as the
  budget; when not, a larger budget does not change them.
* **Queueing follows utilisation**: a step of ``B`` tokens takes
  ``a + b * B``, so a pod serves at most ``B / (a + b * B)`` tokens per
  second, and at most ``max_num_seqs`` requests at once. The measured queue
  time is scaled by ``rho / (1 - rho)``, the M/M/1 shape, from the measured
  utilisation to the candidate's; prefill time by the number of chunks.
* **KV cache**: usage is proportional to running requests times context,
  which gives the pod's KV capacity in tokens; a candidate whose
  concurrency would fill it is charged the preemptions measured now.
* **SLO attainment**: a latency distribution is taken as log-normal through
  the measured quantile and the measured share within the target, and
  shifted to the predicted quantile.

The model is deliberately simple: it only has to rank candidates and
estimate the gain; every change is measured afterwards, measured configs
are preferred to predicted ones, and a measured regression is rolled back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist

from vllm_autotuner.api import SLO, Knobs, LatencyTarget, Measurement

_NORMAL = NormalDist()
#: Log-normal spread assumed when the measured share within target cannot fix it.
DEFAULT_SPREAD = {"ttft": 0.8, "itl": 0.5}
#: Shrinkage of the step-time slope toward its upper bound, in tokens squared.
SLOPE_PRIOR_WEIGHT = 1.0e4
#: Utilisation at and above which the queue is taken to grow without bound.
SATURATED = 0.98
#: KV-cache usage above which vLLM starts to preempt.
KV_FULL = 0.92
#: Quantile steps count as full when they use this share of the budget.
FULL_STEP = 0.8
#: Ratio of a quantile prompt to the mean prompt, for prefill time at the TTFT quantile.
PROMPT_TAIL = 2.0


@dataclass(frozen=True)
class StepModel:
    """Seconds per batched token in an engine step, fitted across windows."""

    slope: float
    points: int


def fit_step_model(measurements: Iterable[Measurement]) -> StepModel | None:
    """Least-squares slope of step time against step tokens with one intercept per regime; None without data."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for m in measurements:
        pairs = [(m.step_tokens_mean, m.itl_mean_seconds), (m.step_tokens_quantile, m.itl_seconds)]
        points = [(x, y) for x, y in pairs if x is not None and y is not None and x >= 1 and y > 0]
        groups.setdefault(m.regime, []).extend(points)
    everything = [p for points in groups.values() for p in points]
    if not everything:
        return None
    bound = min(y / x for x, y in everything)
    sxx = sxy = 0.0
    for points in filter(None, groups.values()):
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        sxx += sum((x - mx) ** 2 for x, _ in points)
        sxy += sum((x - mx) * (y - my) for x, y in points)
    slope = (sxy + SLOPE_PRIOR_WEIGHT * bound) / (sxx + SLOPE_PRIOR_WEIGHT)
    return StepModel(slope=min(max(slope, 0.05 * bound), bound), points=len(everything))


def share_within(target: LatencyTarget, measured: float, share: float | None, predicted: float, kind: str) -> float:
    """Share of samples within the target if a quantile measured at ``measured`` moved to ``predicted``.

    The distribution is log-normal through (quantile, measured value); its
    spread is fixed by the measured share within target where the two points
    allow, else taken from DEFAULT_SPREAD. At ``predicted == measured`` this
    returns the measured share.
    """
    z_q = _NORMAL.inv_cdf(target.quantile)
    spread = DEFAULT_SPREAD[kind]
    log_ratio = math.log(target.seconds / max(measured, 1e-6))
    if share is not None and 0.002 < share < 0.998 and abs(log_ratio) >= 0.02:
        dz = _NORMAL.inv_cdf(share) - z_q
        if dz * log_ratio > 0:
            spread = min(max(log_ratio / dz, 0.15), 2.0)
    return _NORMAL.cdf(z_q + math.log(target.seconds / max(predicted, 1e-6)) / spread)


def attainment(slo: SLO, ttft: float, itl: float, ttft_share: float | None, itl_share: float | None) -> float:
    """Estimated share of requests within both targets, from the quantiles and measured shares of one window."""
    ttft_ok = ttft_share if ttft_share is not None else share_within(slo.ttft, ttft, None, ttft, "ttft")
    itl_ok = itl_share if itl_share is not None else share_within(slo.itl, itl, None, itl, "itl")
    return ttft_ok * itl_ok


@dataclass(frozen=True)
class Prediction:
    """What a config is expected to do under the measured traffic."""

    knobs: Knobs
    attainment: float
    ttft_seconds: float
    itl_seconds: float
    utilisation: float
    measured: bool
    """True when the numbers are a measurement of this config in this regime, not the model's."""

    def slack(self, slo: SLO) -> float:
        """Smallest relative headroom to the TTFT target, the ITL target and full utilisation."""
        return min(
            1 - self.ttft_seconds / slo.ttft.seconds, 1 - self.itl_seconds / slo.itl.seconds, 1 - self.utilisation
        )


@dataclass(frozen=True)
class Traffic:
    """The measured window the model extrapolates from, per pod, with the intercept of its regime."""

    base: Measurement
    slo: SLO
    slope: float
    intercept: float
    running: float
    """Mean running requests measured (preempted ones that are recomputed included)."""
    concurrency_demand: float
    """Requests decoding at once that the measured rate needs at the measured step time (Little's law)."""
    context: float

    @classmethod
    def of(cls, base: Measurement, slo: SLO, model: StepModel) -> Traffic:
        itl_mean = base.itl_mean_seconds if base.itl_mean_seconds is not None else base.itl_seconds
        tokens_mean = base.step_tokens_mean if base.step_tokens_mean is not None else 1.0
        intercept = max(itl_mean - model.slope * tokens_mean, 1e-4)
        demand = base.request_rate * base.mean_generation_tokens * itl_mean
        running = base.running if base.running is not None else demand
        return cls(
            base=base,
            slo=slo,
            slope=model.slope,
            intercept=intercept,
            running=running,
            concurrency_demand=demand,
            context=base.mean_prompt_tokens + base.mean_generation_tokens / 2,
        )

    def step_seconds(self, tokens: float) -> float:
        return self.intercept + self.slope * tokens

    def utilisation(self, knobs: Knobs) -> float:
        """Demand over capacity: tokens per second against full steps, requests against max_num_seqs."""
        tokens = self.base.prompt_tokens_per_second + self.base.generation_tokens_per_second
        capacity = knobs.max_num_batched_tokens / self.step_seconds(knobs.max_num_batched_tokens)
        return max(tokens / capacity, self.concurrency_demand / knobs.max_num_seqs)

    def quantile_step_tokens(self, knobs: Knobs) -> float:
        """Tokens of a step at the ITL quantile under these knobs."""
        base = self.base
        budget = base.max_num_batched_tokens
        measured = base.step_tokens_quantile
        if measured is None:
            measured = (
                float(budget) if (base.step_tokens_mean or 0) > 0.5 * budget else 2 * (base.step_tokens_mean or 0)
            )
        full = measured >= FULL_STEP * budget
        tokens = float(knobs.max_num_batched_tokens) if full else min(float(knobs.max_num_batched_tokens), measured)
        fewer_decodes = max(0.0, self.running - knobs.max_num_seqs)
        return max(tokens - fewer_decodes, 1.0)

    def prefill_seconds(self, knobs: Knobs) -> float:
        """Time to prefill a prompt at the TTFT quantile in chunks of what the decodes leave of the budget."""
        prompt = PROMPT_TAIL * self.base.mean_prompt_tokens
        decodes = min(self.running, knobs.max_num_seqs)
        chunk = max(knobs.max_num_batched_tokens - decodes, 16.0)
        steps = math.ceil(prompt / chunk)
        return steps * self.step_seconds(min(knobs.max_num_batched_tokens, decodes + prompt))

    def preempted_share(self, knobs: Knobs) -> float:
        """Share of requests preempted under these knobs: the measured share while the KV cache stays full."""
        base = self.base
        if not base.preemptions_per_second or base.request_rate <= 0:
            return 0.0
        measured = min(base.preemptions_per_second / base.request_rate, 0.9)
        usage = base.kv_cache_usage
        if usage is None or usage < 0.05 or self.running <= 0:
            return measured
        capacity = self.running * self.context / usage
        usage_then = min(self.running, knobs.max_num_seqs) * self.context / capacity
        return measured if usage_then >= KV_FULL else 0.0

    def predict(self, knobs: Knobs) -> Prediction:
        base = self.base
        old = base.knobs
        itl = max(
            base.itl_seconds + self.slope * (self.quantile_step_tokens(knobs) - self.quantile_step_tokens(old)),
            self.intercept,
        )
        rho_old, rho_new = min(self.utilisation(old), SATURATED), self.utilisation(knobs)
        queue = base.queue_seconds if base.queue_seconds is not None else 0.0
        saturated = rho_new >= SATURATED
        if saturated:
            queue_new = max(queue, 1.0) * 10 + 10 * self.slo.ttft.seconds
        else:
            queue_new = queue * (rho_new / (1 - rho_new)) / (rho_old / (1 - rho_old))
        ttft = max(
            base.ttft_seconds + self.prefill_seconds(knobs) - self.prefill_seconds(old) + queue_new - queue, 1e-3
        )
        share_ttft = share_within(self.slo.ttft, base.ttft_seconds, base.ttft_within_slo, ttft, "ttft")
        if saturated:  # the queue grows without bound: over the regime's life, no request meets TTFT
            share_ttft = 0.0
        share_itl = share_within(self.slo.itl, base.itl_seconds, base.itl_within_slo, itl, "itl")
        preempted = self.preempted_share(old)
        kept = (1 - self.preempted_share(knobs)) / (1 - preempted)
        return Prediction(
            knobs=knobs,
            attainment=min(share_ttft * share_itl * kept, 1.0),
            ttft_seconds=ttft,
            itl_seconds=itl,
            utilisation=rho_new,
            measured=False,
        )


def measured_prediction(m: Measurement, traffic: Traffic) -> Prediction:
    """A measurement of a config in this regime, as a prediction for it."""
    return Prediction(
        knobs=m.knobs,
        attainment=m.attainment,
        ttft_seconds=m.ttft_seconds,
        itl_seconds=m.itl_seconds,
        utilisation=traffic.utilisation(m.knobs),
        measured=True,
    )
