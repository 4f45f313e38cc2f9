"""A performance model fitted online from observations, to price a config before restarting for it.

Every probe of a new config is a rolling restart, so blind hill-climbing
pays for each step with capacity. This model predicts what a candidate
would do under the traffic just measured, from vLLM's scheduling physics
and numbers Prometheus gives:

* **Step time is linear in the tokens of the step**: ``t = a + b * T``.
  Every decoding request gets one token per step, so the inter-token
  latency *is* the step time; ``b`` (seconds per batched token) comes from
  the two points each window gives, (mean tokens per step, mean ITL) and
  (tokens per step, ITL) at the SLO quantile, so each regime's intercept
  (attention and overhead depend on context length and concurrency)
  cancels; the median over windows resists windows that mix two
  regimes. The ITL quantile of a candidate token budget
  then moves by ``b`` times the change of the step tokens at that quantile:
  when the quantile steps are full (prefill backlog), they are as big as the
  budget; when not, a larger budget does not change them. A smaller budget
  may take full steps that are compute-bound (their tokens' compute, ``b``
  times them, at least the intercept) down in proportion to their tokens,
  to the intercept: their chunks' attention over the prompts before them
  shrinks with them, which ``b``, fitted against the decodes beside them,
  does not see (on long prompts it comes out a tenth short, and a smaller
  budget looked too slow to pay). Not so for a larger budget, nor for small
  full steps: most of their time is the weights' read, which does not
  change with their tokens.
* **Queueing follows utilisation**: a pod serves at most ``min(B / a,
  1 / b)`` tokens per second (the roofline: a budget too small to hide the
  step's fixed cost loses capacity, a larger one gains none), and at most
  ``max_num_seqs`` requests at once; recomputing preempted requests is
  demand too. The measured queue
  time is scaled by ``rho / (1 - rho)``, the M/M/1 shape, from the measured
  utilisation to the candidate's; prefill time by the number of chunks.
* **KV cache**: usage is proportional to running requests times context,
  which gives the pod's KV capacity in tokens; a candidate whose
  concurrency would fill it is charged the preemptions measured now. The
  cache gets what vLLM's start-up profiling run leaves: the activations of
  a forward pass over ``max_num_batched_tokens`` tokens and a sampler pass
  over ``max_num_seqs`` sequences come out of it, so smaller knobs buy KV
  capacity (and larger ones cost it), which is what stops preemptions on
  a GPU whose memory is tight even where neither knob binds.
* **SLO attainment**: the share of requests within the TTFT target and
  within the ITL target at its quantile. The shares of TTFT samples and of
  inter-token gaps within target are each a log-normal through the measured
  quantile and the measured share, shifted to the predicted quantile (where
  the quantile steps are full and another budget moves them, the gaps above
  the target are those steps and the ones below decodes alone: two
  populations, whose spread is not the full steps'; those are taken at the
  assumed spread); a
  request is within the ITL target when few enough of its own gaps are
  slow, taken as binomial at the gaps' share (``request_itl_share``).
  Requests vLLM refused at admission (a queue limit) are misses, and their
  measured share is kept in every prediction: whether a config lets more
  in depends on the limit, which no window measures.

The model is deliberately simple: it only has to rank candidates and
estimate the gain; every change is measured afterwards, measured configs
are preferred to predicted ones, and a measured regression is rolled back.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from statistics import NormalDist

from vllm_autotuner.api import SLO, Knobs, LatencyTarget, Measurement

_NORMAL = NormalDist()
#: Log-normal spread assumed when the measured share within target cannot fix it.
DEFAULT_SPREAD = {"ttft": 0.8, "itl": 0.5}
#: Least spread of step tokens within a window (quantile over mean) that gives a usable slope.
MIN_SPREAD_TOKENS = 100.0
#: Preemptions per completed request above which a window's ITL says nothing about step times.
PREEMPTED_WINDOW = 0.01
#: Utilisation at and above which the queue is taken to grow without bound.
SATURATED = 0.98
#: Quantile steps count as full when they use this share of the budget.
FULL_STEP = 0.8
#: Reach of ``request_itl_share``'s sum around the mean count of slow gaps: standard deviations, plus gaps (a small
#: mean's long right tail).
BINOMIAL_SPAN, BINOMIAL_SLACK = 12.0, 40.0
#: Ratio of a quantile prompt to the mean prompt, for prefill time at the TTFT quantile.
PROMPT_TAIL = 2.0
#: Tokens whose compute takes a step as long as reading the weights: a GPU's ridge point (peak bf16 FLOP/s over
#: memory bandwidth, a token being 2 FLOP per 2-byte weight) is 150 on an A100, 300 on an H100, 400 on an L4 or
#: L40S; taken low, so that a slope guessed from it errs high. Only used when no window shows a slope.
RIDGE_TOKENS = 128.0
#: KV-cache tokens one token of ``max_num_batched_tokens`` displaces at start-up: the profiling pass holds the
#: MLP activations of every batched token (2 x 14336 x 2 bytes on Llama-3-8B, 56 KiB, with attention and residual
#: buffers about half of a KV token's 2 x 32 layers x 8 heads x 128 x 2 bytes = 128 KiB; 70B on four GPUs, alike).
ACTIVATION_KV_TOKENS = 0.5
#: KV-cache tokens one of ``max_num_seqs`` displaces at start-up: the dummy sampler pass holds fp32 logits over
#: the vocabulary for every sequence (8 KV tokens on Llama-3's 128k vocabulary, 2 on a 32k one).
SAMPLER_KV_TOKENS = 4.0


@dataclass(frozen=True)
class StepModel:
    """Seconds per batched token in an engine step, fitted across windows."""

    slope: float
    points: int


def fit_step_model(measurements: Iterable[Measurement]) -> StepModel | None:
    """Seconds per batched token, from the spread of step tokens and ITL within each measured window.

    Each window gives a slope from two points of the same step-time line,
    (mean tokens per step, mean ITL) and (tokens per step, ITL) at the SLO
    quantile, so each regime's own intercept (attention, overhead) cancels;
    it is capped by ITL over tokens at either point (the intercept is not
    negative). The estimate is the median of those slopes weighted by how
    many windows and how wide a spread of tokens stand behind each: a window
    that mixes two traffic regimes pairs quantiles of different populations
    and is an outlier a median ignores. Windows with preemptions are left
    out of the median: there the slowest inter-token gaps are recomputations,
    not steps. Without any usable spread (decode-bound traffic whose step
    tokens hardly vary, or preemptions in every window), the line through
    each point and an intercept of RIDGE_TOKENS tokens' compute, the
    smallest over the windows: the zero-intercept cap would make a step of
    fifty decodes all compute, and the pod look saturated by traffic it
    serves with room to spare. None without data.
    """
    slopes, priors = [], []
    for m in measurements:
        x_mean, y_mean, x_q, y_q = m.step_tokens_mean, m.itl_mean_seconds, m.step_tokens_quantile, m.itl_seconds
        if x_mean is None or y_mean is None or x_q is None or min(x_mean, x_q) < 1 or min(y_mean, y_q) <= 0:
            continue
        cap = min(y_mean / x_mean, y_q / x_q)
        priors.append(min(y_mean / (x_mean + RIDGE_TOKENS), y_q / (x_q + RIDGE_TOKENS)))
        spread = x_q - x_mean
        # a preempted request's next token waits for its recomputation, not for one step: no slope from there
        preempted = (m.preemptions_per_second or 0.0) > PREEMPTED_WINDOW * m.request_rate
        if spread >= MIN_SPREAD_TOKENS and not preempted:
            slopes.append((min(max((y_q - y_mean) / spread, 0.05 * cap), cap), m.windows * spread))
    if not slopes:
        return StepModel(slope=min(priors), points=len(priors)) if priors else None
    slopes.sort()
    cumulative = list(accumulate(weight for _, weight in slopes))
    median = slopes[bisect_left(cumulative, cumulative[-1] / 2)][0]
    return StepModel(slope=median, points=len(priors))


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


def slow_gaps_allowed(quantile: float, gaps: float) -> float:
    """How many of a request's ``gaps`` inter-token gaps may be longer than the ITL target with the request
    still within it: its own latency at ``quantile`` is within the target while at most ``1 - quantile`` of
    its gaps are longer. Either argument may be a numpy array (one value per request)."""
    return ((1 - quantile) * gaps + 1e-9) // 1


def request_itl_share(quantile: float, token_share: float, generation_tokens: float) -> float:
    """Share of requests within the ITL target when ``token_share`` of all inter-token gaps are.

    A request of ``n`` output tokens has ``n - 1`` gaps; it is within the
    target at ``quantile`` when at most ``slow_gaps_allowed`` of them are
    longer. A long prefill chunk stalls every request decoding in its step,
    so each gap is taken to be slow with the token-level probability,
    independently: the binomial distribution at the mean output length. A
    few stalls per stream are tolerated, a steady share above ``1 - quantile``
    fails almost every stream, which the share of gaps within target alone
    (or a request's mean gap) would hide.

    The sum runs over the counts of slow gaps within BINOMIAL_SPAN standard
    deviations and BINOMIAL_SLACK gaps of the mean (Bennett's inequality
    puts the terms beyond below 1e-18 of it, a float's resolution of the
    sum): a window's absurd mean length (a counter reset) costs a few
    thousand terms a candidate, not one per gap.
    """
    gaps = max(round(generation_tokens) - 1, 0)
    slow = min(max(1.0 - token_share, 0.0), 1.0)
    if gaps == 0 or slow == 0.0:
        return 1.0
    if slow == 1.0:
        return 0.0
    mean, spread = gaps * slow, BINOMIAL_SPAN * math.sqrt(gaps * slow * (1 - slow)) + BINOMIAL_SLACK
    first = max(0, math.floor(mean - spread))
    last = min(int(slow_gaps_allowed(quantile, gaps)), math.ceil(mean + spread))  # allowed < gaps
    if first > last:
        return 0.0
    # the log of the binomial term at ``first`` slow gaps (at none: gaps * log(1 - slow))
    log_term = (math.lgamma(gaps + 1) - math.lgamma(first + 1) - math.lgamma(gaps - first + 1)
                + first * math.log(slow) + (gaps - first) * math.log1p(-slow))
    ratio = math.log(slow) - math.log1p(-slow)
    total = 0.0
    for k in range(first, last + 1):
        total += math.exp(log_term)
        log_term += math.log(gaps - k) - math.log(k + 1) + ratio
    return min(total, 1.0)


def attainment(
    slo: SLO, ttft: float, itl: float, ttft_share: float | None, itl_share: float | None, generation_tokens: float
) -> float:
    """Estimated share of requests within both targets, from the quantiles and measured shares of one window.

    ``ttft_share`` is the share of TTFT samples within the TTFT target,
    ``itl_share`` the share of inter-token gaps within the ITL target (the
    buckets of ``vllm:inter_token_latency_seconds``); without them, what a
    log-normal through the quantile gives. A request is within the ITL
    target when its own gaps are at the ITL quantile (``request_itl_share``
    at the mean output length ``generation_tokens``).
    """
    ttft_ok = ttft_share if ttft_share is not None else share_within(slo.ttft, ttft, None, ttft, "ttft")
    gaps_ok = itl_share if itl_share is not None else share_within(slo.itl, itl, None, itl, "itl")
    return ttft_ok * request_itl_share(slo.itl.quantile, gaps_ok, generation_tokens)


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
    context: float

    @classmethod
    def of(cls, base: Measurement, slo: SLO, model: StepModel) -> Traffic:
        itl_mean = base.itl_mean_seconds if base.itl_mean_seconds is not None else base.itl_seconds
        tokens_mean = base.step_tokens_mean if base.step_tokens_mean is not None else 1.0
        intercept = max(itl_mean - model.slope * tokens_mean, 1e-4)
        running = (
            base.running if base.running is not None else base.request_rate * base.mean_generation_tokens * itl_mean
        )
        return cls(
            base=base,
            slo=slo,
            slope=model.slope,
            intercept=intercept,
            running=running,
            context=base.mean_prompt_tokens + base.mean_generation_tokens / 2,
        )

    @cached_property
    def old(self) -> Knobs:
        """The knobs the window was measured under, built once: every prediction compares with them."""
        return self.base.knobs

    def step_seconds(self, tokens: float) -> float:
        return self.intercept + self.slope * tokens

    @cached_property
    def computed_prompt_share(self) -> float:
        """Share of the prompt tokens the pod computes: those the prefix cache (or another instance) did not
        serve, and at least a token a prompt (vLLM computes a prompt's last token whatever is cached)."""
        base = self.base
        if not base.cached_prompt_tokens_per_second or base.prompt_tokens_per_second <= 0:
            return 1.0
        served = base.cached_prompt_tokens_per_second / base.prompt_tokens_per_second
        return min(max(1.0 - served, 1.0 / max(base.mean_prompt_tokens, 1.0)), 1.0)

    def token_demand(self, knobs: Knobs) -> float:
        """Tokens per second the pod must compute: the measured rate, less the recomputation of preempted
        requests that these knobs avoid (or plus what they add). A preempted request computes again what it
        had computed, half its output on average, but not the prefix the cache served it: other running
        requests still hold those shared blocks, and vLLM finds them there when it is admitted again. That
        holds for prefixes many requests share (system prompts, templates); a cached part only the request
        uses (a conversation's earlier turns) is freed with it, under the memory pressure that preempted it,
        and may be recomputed too: there the price is a lower bound."""
        base = self.base
        prompt = base.mean_prompt_tokens * self.computed_prompt_share
        measured = base.prompt_tokens_per_second * self.computed_prompt_share + base.generation_tokens_per_second
        per_preemption = (prompt + base.mean_generation_tokens / 2) * base.request_rate
        return max(measured + per_preemption * (self.preempted_share(knobs) - self.preempted_share(self.old)), 1.0)

    def utilisation(self, knobs: Knobs) -> float:
        """Demand over capacity: tokens per second against full steps, decoding requests against the slots.

        A step reads the weights once and computes its tokens, whichever is
        slower (the roofline): a budget too small to hide the weight reads
        (``intercept``) loses capacity, a larger one gains none past
        ``1 / slope`` tokens per second.
        Requests decoding at once follow Little's law at the mean step time,
        which shrinks with the tokens a step must carry (less recomputation);
        they are held to ``max_num_seqs``, and to as many as the KV cache
        holds at their mean context (a request waits for blocks as it waits
        for a slot).
        """
        base = self.base
        tokens = self.token_demand(knobs)
        capacity = min(knobs.max_num_batched_tokens / self.intercept, 1 / self.slope)
        mean_tokens = (base.step_tokens_mean or 0.0) * tokens / self.token_demand(self.old)
        decoding = base.request_rate * base.mean_generation_tokens * self.step_seconds(mean_tokens)
        cache = self.kv_cache_tokens()
        slots = float(knobs.max_num_seqs)
        if cache is not None:
            slots = min(slots, max(cache + self.freed_kv_tokens(knobs), self.context) / self.context)
        return max(tokens / capacity, decoding / slots)

    @cached_property
    def quantile_tokens(self) -> float:
        """Tokens of a step at the ITL quantile measured (without the histogram: from the mean step's)."""
        base = self.base
        if base.step_tokens_quantile is not None:
            return base.step_tokens_quantile
        mean = base.step_tokens_mean or 0.0
        return float(base.max_num_batched_tokens) if mean > 0.5 * base.max_num_batched_tokens else 2 * mean

    @cached_property
    def full_steps(self) -> bool:
        """Whether the steps at the ITL quantile fill the budget (a prefill backlog): they grow with it."""
        return self.quantile_tokens >= FULL_STEP * self.base.max_num_batched_tokens

    def quantile_step_tokens(self, knobs: Knobs) -> float:
        """Tokens of a step at the ITL quantile under these knobs."""
        budget = float(knobs.max_num_batched_tokens)
        tokens = budget if self.full_steps else min(budget, self.quantile_tokens)
        fewer_decodes = max(0.0, self.running - knobs.max_num_seqs)
        return max(tokens - fewer_decodes, 1.0)

    def prefill_seconds(self, knobs: Knobs) -> float:
        """Time to prefill a prompt at the TTFT quantile in chunks of what the decodes leave of the budget (its
        share the cache served not computed)."""
        prompt = PROMPT_TAIL * self.base.mean_prompt_tokens * self.computed_prompt_share
        decodes = min(self.running, knobs.max_num_seqs)
        chunk = max(knobs.max_num_batched_tokens - decodes, 16.0)
        steps = math.ceil(prompt / chunk)
        return steps * self.step_seconds(min(knobs.max_num_batched_tokens, decodes + prompt))

    def preempted_share(self, knobs: Knobs) -> float:
        """Share of requests preempted under these knobs.

        The KV cache holds ``running * context / usage`` tokens
        (``kv_cache_tokens``), so about that over a request's full length of
        requests fit at once. With
        ``max_num_seqs`` at nine tenths of that, no request is preempted; at the
        concurrency the pods reached (running plus waiting), as many as
        measured; in between, in proportion. What the knobs free at start-up
        raises the number that fits (and what they take lowers it).
        """
        base = self.base
        if not base.preemptions_per_second or base.request_rate <= 0:
            return 0.0
        measured = min(base.preemptions_per_second / base.request_rate, 0.9)
        capacity = self.kv_cache_tokens()
        if capacity is None:
            return measured
        length = base.mean_prompt_tokens + base.mean_generation_tokens
        fits = 0.9 * capacity / length
        fits_then = 0.9 * max(capacity + self.freed_kv_tokens(knobs), 0.0) / length
        peak = max(self.running + (base.waiting or 0.0), fits + 1)
        return min(measured * max((min(knobs.max_num_seqs, peak) - fits_then) / (peak - fits), 0.0), 0.9)

    def kv_cache_tokens(self) -> float | None:
        """Tokens the KV cache of a pod holds under the measured knobs: running requests' context over the usage.

        None where the window cannot tell: too little usage, nothing running, or requests of no length.
        """
        usage = self.base.kv_cache_usage
        if usage is None or usage < 0.05 or self.running <= 0 or self.context <= 0:
            return None
        return self.running * self.context / usage

    def freed_kv_tokens(self, knobs: Knobs) -> float:
        """KV-cache tokens these knobs leave free at start-up compared with the measured ones (negative: taken)."""
        base = self.base
        return ACTIVATION_KV_TOKENS * (base.max_num_batched_tokens - knobs.max_num_batched_tokens) + (
            SAMPLER_KV_TOKENS * (base.max_num_seqs - knobs.max_num_seqs)
        )

    def predict(self, knobs: Knobs) -> Prediction:
        base, old = self.base, self.old
        tokens, tokens_old = self.quantile_step_tokens(knobs), self.quantile_step_tokens(old)
        itl = base.itl_seconds + self.slope * (tokens - tokens_old)
        shrunk = self.full_steps and knobs.max_num_batched_tokens < old.max_num_batched_tokens
        if shrunk and self.slope * tokens_old >= self.intercept:  # compute-bound: their chunks' attention shrinks too
            itl = min(itl, base.itl_seconds * tokens / tokens_old)
        itl = max(itl, self.intercept)
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
        # full quantile steps another budget moves: the share within target is the decodes', not their spread
        moved = self.full_steps and knobs.max_num_batched_tokens != old.max_num_batched_tokens
        gaps_within = None if moved else base.itl_within_slo
        share_gaps = share_within(self.slo.itl, base.itl_seconds, gaps_within, itl, "itl")
        within = share_ttft * request_itl_share(self.slo.itl.quantile, share_gaps, base.mean_generation_tokens)
        # requests no longer preempted are no longer stalled by their recomputation
        within += max(self.preempted_share(old) - self.preempted_share(knobs), 0.0) * (1 - within)
        if saturated:  # the queue grows without bound: over the regime's life, no request meets TTFT
            within = 0.0
        # requests refused at admission stay refused: nothing measured says how many a change would let in
        within *= 1 - (base.refused_share or 0.0)
        return Prediction(
            knobs=knobs,
            attainment=min(within, 1.0),
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
