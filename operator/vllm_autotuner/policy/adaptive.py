"""The Adaptive strategy: find the knee of the throughput/latency curve online, under the SLOs.

Each usable window becomes a ``Measurement`` of (regime, config). The strategy
predicts, for every config on a grid of values people would pick (powers of
two and their midpoints for the budget, powers of two for ``max_num_seqs``,
and the farthest one step of ``maxStepFactor`` goes from the current value;
within the bounds, accepted by vLLM, never one that failed), what it would do
under the traffic just measured (``model``), and makes the one with the
highest expected SLO attainment (headroom to the targets weighing a little)
its goal; configs within RESOLUTION of it are equals, and the smallest move
among them wins. Configs already measured in this regime, under traffic at
least about as heavy as now (COMPARABLE_LOAD), count at their measured value
and are reached in one jump, so a returning regime goes straight back to what
it liked; one measured under lighter traffic (a calm spell between bursts, the
morning before the peak) would over-promise, and only the model prices it, so
bursts do not send the policy back to what served the calm. A config the
policy left in this regime counts only at a prediction's discount, and one it
left twice not at all, so traffic that drifts while configs are compared
cannot make it oscillate. A predicted
goal is reached in one rollout when it lies within the step limit
(``guardrails.step_range``): a knob may fall as far as the requests the window
ran at once still fit (the model then predicts from steps of sizes it
measured) and go ``maxStepFactor`` past that or past its current value, where
the model extrapolates. A goal farther out is approached through the config
within the limit closest to it, measured before the next step, and each step
re-plans from fresh data; every restart at the knee leaves a queue, so the
fewer the better. A step predicted as good as now (within RESOLUTION) is
taken: a budget far above the steps the traffic fills is a plateau, where
halving it changes nothing until it binds, and the goal lies beyond. The
physics the search follows: a smaller budget when ITL breaches (big prefill
chunks stall decodes), a larger one when TTFT or queueing breaches and steps
are full, more sequences when requests wait for a slot, fewer when the KV
cache fills and requests are preempted. The proposal is a change only when the
goal's expected gain, discounted while it is only predicted, pays for the
restarts on the way over the regime's expected life.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from vllm_autotuner.api import SLO, Bounds, CurrentKnobs, Knobs, Measurement
from vllm_autotuner.policy.guardrails import acceptable, steps_beyond, within_step
from vllm_autotuner.policy.model import Prediction, StepModel, Traffic, fit_step_model, measured_prediction

#: Share of a predicted (not yet measured) gain the policy counts on.
MODEL_TRUST = 0.7
#: Weight of headroom to the targets in the choice between configs of about equal attainment.
SLACK_WEIGHT = 0.02
#: Attainment below which relative gains are measured against this floor.
ATTAINMENT_FLOOR = 0.1
#: Utility within which configs count as equals (the smallest move among them wins): the model ranks, it does not
#: resolve a thousandth of attainment.
RESOLUTION = 0.002
#: Requests per pod the window now may exceed a measurement's by with the measurement still counting as what its
#: config would do now: near capacity a few percent more traffic costs attainment whatever the config, so a config
#: measured under lighter traffic (a calm window between bursts, the morning before the peak) would over-promise.
COMPARABLE_LOAD = 1.05

_TOKEN_GRID = tuple(sorted({int(2**e * m) for e in range(4, 20) for m in (1, 1.5)}))
_SEQ_GRID = tuple(2**e for e in range(0, 15))


@dataclass(frozen=True)
class Proposal:
    """Where the strategy wants to go, the step it takes now, and what it expects of them."""

    goal: Prediction
    """The best config in the bounds: measured in this regime, or predicted."""
    step: Prediction | None
    """The config to roll out now: the goal, or the config within the step limit closest to it; None when every
    such config is predicted worse than the current one."""
    now: Prediction
    model: StepModel
    gain_percent: float
    """Expected relative SLO-goodput gain of the goal over the current config, after the trust discount."""
    rollouts: int
    """Rollouts to reach the goal (one when it is within a step, or measured)."""


def _values(grid: tuple[int, ...], low: int, high: int, current: int, step_factor: float) -> list[int]:
    """The grid's values within ``low`` to ``high``, the bounds themselves, the current value, and the farthest one
    step of ``step_factor`` takes it either way: below a factor of 2 no step reaches the next power of two."""
    steps = {int(current * step_factor), math.ceil(current / step_factor)}
    return sorted({v for v in (*grid, *steps) if low <= v <= high} | {low, high, current})


def candidates(bounds: Bounds, current: CurrentKnobs, excluded: set[Knobs], step_factor: float) -> list[Knobs]:
    """Grid configs within the bounds that vLLM accepts, minus ``excluded``, with one step of ``step_factor`` from
    the current value of each knob (``_values``)."""
    here = current.knobs
    tokens_range, seqs_range = bounds.max_num_batched_tokens, bounds.max_num_seqs
    return [
        knobs
        for tokens in _values(_TOKEN_GRID, tokens_range.min, tokens_range.max, here.max_num_batched_tokens,
                              step_factor)
        for seqs in _values(_SEQ_GRID, seqs_range.min, seqs_range.max, here.max_num_seqs, step_factor)
        if seqs <= tokens
        and (knobs := Knobs(max_num_batched_tokens=tokens, max_num_seqs=seqs)) not in excluded
        and acceptable(knobs, bounds, current)
    ]


def _distance(a: Knobs, b: Knobs) -> float:
    """How far apart two configs are, in factors of two: among equals the smallest move wins."""
    return abs(math.log2(a.max_num_batched_tokens / b.max_num_batched_tokens)) + abs(
        math.log2(a.max_num_seqs / b.max_num_seqs)
    )


def _expected(p: Prediction, now: Prediction) -> float:
    """Attainment counted on: a measurement as measured, a prediction only in part."""
    return p.attainment if p.measured else now.attainment + MODEL_TRUST * (p.attainment - now.attainment)


def _utility(p: Prediction, now: Prediction, slo: SLO) -> float:
    return _expected(p, now) + SLACK_WEIGHT * max(-1.0, min(1.0, p.slack(slo)))


def _rollouts(goal: Knobs, here: Knobs, step_factor: float, running: float | None) -> int:
    """Rollouts from ``here`` to ``goal``: one into ``step_range``, then ``step_factor`` each."""
    return 1 + math.ceil(steps_beyond(goal, here, step_factor, running) - 1e-9)


def propose(
    base: Measurement,
    measurements: Iterable[Measurement],
    slo: SLO,
    bounds: Bounds,
    current: CurrentKnobs,
    step_factor: float,
    excluded: set[Knobs],
) -> Proposal | None:
    """The goal for the regime of ``base`` (the window just measured) and the step toward it.

    ``measurements`` are what the status remembers (``base`` may not be among
    them yet); ``excluded`` are configs that must not be proposed (failed to
    start).
    A goal measured in this regime is reached in one step; a predicted one
    through the configs within ``step_factor`` closest to it, each measured
    before the next. None without a model.
    """
    measurements = list(measurements)
    model = fit_step_model([base, *(m for m in measurements if (m.regime, m.knobs) != (base.regime, base.knobs))])
    if model is None:
        return None
    traffic = Traffic.of(base, slo, model)
    here = current.knobs
    now = measured_prediction(base, traffic)
    options = {k: traffic.predict(k) for k in candidates(bounds, current, excluded, step_factor)}
    for m in measurements:
        if m.regime != base.regime or m.knobs in excluded or not acceptable(m.knobs, bounds, current):
            continue
        if m.abandoned < 2 and base.request_rate > COMPARABLE_LOAD * m.request_rate:
            options[m.knobs] = traffic.predict(m.knobs)  # measured under lighter traffic: the model's word instead
        elif m.abandoned == 0:
            options[m.knobs] = measured_prediction(m, traffic)
        elif m.abandoned == 1:
            options[m.knobs] = replace(measured_prediction(m, traffic), measured=False)
        else:
            options.pop(m.knobs, None)
    if acceptable(base.knobs, bounds, current):
        options[base.knobs] = now
    if not options:
        return None
    best = max(_utility(p, now, slo) for p in options.values())
    equals = [p for p in options.values() if _utility(p, now, slo) >= best - RESOLUTION]
    goal = min(equals, key=lambda p: (_distance(p.knobs, here), -_utility(p, now, slo)))
    step: Prediction | None = goal
    if not goal.measured and not within_step(goal.knobs, here, step_factor, base.running):
        near = [
            p for p in options.values() if within_step(p.knobs, here, step_factor, base.running) and p.knobs != here
        ]
        step = min(near, key=lambda p: (_distance(p.knobs, goal.knobs), -_utility(p, now, slo)), default=None)
        if step is not None and _utility(step, now, slo) < _utility(now, now, slo) - RESOLUTION:
            step = None
    gain = 100.0 * (_expected(goal, now) - now.attainment) / max(now.attainment, ATTAINMENT_FLOOR)
    rollouts = 1 if step is goal else _rollouts(goal.knobs, here, step_factor, base.running)
    return Proposal(goal=goal, step=step, now=now, model=model, gain_percent=gain, rollouts=rollouts)
