"""The Adaptive strategy: find the knee of the throughput/latency curve online, under the SLOs.

Each usable window becomes a ``Measurement`` of (regime, config). The
strategy predicts, for every config on a grid of values people would pick
(powers of two and their midpoints, within the bounds, one vLLM accepts,
never one that failed, within ``maxStepFactor`` of the current config),
what it would do under the traffic just measured (``model``), and picks
the one with the highest expected SLO attainment; ties go to the one with
the most headroom to the targets. Configs already measured in this regime
are taken at their measured value and may be reached in one jump, so a
returning regime goes straight back to what it liked. The physics the
grid search follows: a smaller budget when ITL breaches (big prefill
chunks stall decodes), a larger one when TTFT or queueing breaches and
steps are full, more sequences when requests wait for a slot, fewer when
the KV cache fills and requests are preempted. The proposal is a change
only when its expected gain, discounted while it is only predicted, pays
for the restart over the regime's expected life.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from vllm_autotuner.api import SLO, Bounds, CurrentKnobs, Knobs, Measurement
from vllm_autotuner.policy.guardrails import acceptable, within_step
from vllm_autotuner.policy.model import Prediction, StepModel, Traffic, fit_step_model, measured_prediction

#: Share of a predicted (not yet measured) gain the policy counts on.
MODEL_TRUST = 0.7
#: Weight of headroom to the targets in the choice between configs of about equal attainment.
SLACK_WEIGHT = 0.02
#: Attainment below which relative gains are measured against this floor.
ATTAINMENT_FLOOR = 0.1

_TOKEN_GRID = tuple(sorted({int(2**e * m) for e in range(4, 20) for m in (1, 1.5)}))
_SEQ_GRID = tuple(sorted({int(2**e * m) for e in range(0, 15) for m in (1, 1.5)}))


@dataclass(frozen=True)
class Proposal:
    """The config the strategy prefers, with what it expects of it."""

    best: Prediction
    now: Prediction
    model: StepModel
    gain_percent: float
    """Expected relative SLO-goodput gain over the current config, after the trust discount."""


def _values(grid: tuple[int, ...], low: int, high: int, current: int) -> list[int]:
    return sorted({v for v in grid if low <= v <= high} | {low, high, current})


def candidates(bounds: Bounds, current: CurrentKnobs, step_factor: float, excluded: set[Knobs]) -> list[Knobs]:
    """Grid configs within the bounds and the step limit that vLLM accepts, minus ``excluded``."""
    here = current.knobs
    out = []
    for tokens in _values(
        _TOKEN_GRID, bounds.max_num_batched_tokens.min, bounds.max_num_batched_tokens.max, here.max_num_batched_tokens
    ):
        for seqs in _values(_SEQ_GRID, bounds.max_num_seqs.min, bounds.max_num_seqs.max, here.max_num_seqs):
            if seqs > tokens:
                continue
            knobs = Knobs(max_num_batched_tokens=tokens, max_num_seqs=seqs)
            if knobs not in excluded and within_step(knobs, here, step_factor) and acceptable(knobs, bounds, current):
                out.append(knobs)
    return out


def _distance(a: Knobs, b: Knobs) -> float:
    """How far apart two configs are, in factors of two: among equals the smallest move wins."""
    return abs(math.log2(a.max_num_batched_tokens / b.max_num_batched_tokens)) + abs(
        math.log2(a.max_num_seqs / b.max_num_seqs)
    )


def _utility(p: Prediction, now: Prediction, slo: SLO) -> float:
    expected = p.attainment if p.measured else now.attainment + MODEL_TRUST * (p.attainment - now.attainment)
    return expected + SLACK_WEIGHT * max(-1.0, min(1.0, p.slack(slo)))


def propose(
    base: Measurement,
    measurements: Iterable[Measurement],
    slo: SLO,
    bounds: Bounds,
    current: CurrentKnobs,
    step_factor: float,
    excluded: set[Knobs],
) -> Proposal | None:
    """The best config for the regime of ``base`` (the window just measured), or None without a model or a choice.

    ``measurements`` are all the status remembers, ``base`` among them;
    ``excluded`` are configs that must not be proposed (failed to start).
    """
    measurements = list(measurements)
    model = fit_step_model(measurements)
    if model is None:
        return None
    traffic = Traffic.of(base, slo, model)
    measured = {m.knobs: m for m in measurements if m.regime == base.regime}
    now = measured_prediction(base, traffic)
    options = {k: traffic.predict(k) for k in candidates(bounds, current, step_factor, excluded)}
    for knobs, m in measured.items():
        if knobs not in excluded and acceptable(knobs, bounds, current):
            options[knobs] = measured_prediction(m, traffic)
    if acceptable(base.knobs, bounds, current):
        options[base.knobs] = now
    if not options:
        return None
    best = max(options.values(), key=lambda p: (_utility(p, now, slo), -_distance(p.knobs, base.knobs)))
    expected = best.attainment if best.measured else now.attainment + MODEL_TRUST * (best.attainment - now.attainment)
    gain = 100.0 * (expected - now.attainment) / max(now.attainment, ATTAINMENT_FLOOR)
    return Proposal(best=best, now=now, model=model, gain_percent=gain)
