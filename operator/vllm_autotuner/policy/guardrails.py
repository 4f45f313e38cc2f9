"""Guardrails every change passes, whoever proposed it.

Each function answers one question a change must get right: is the config
inside the bounds and one vLLM accepts, did it fail before, is the step
too big, is the cooldown over, is there rollout budget left, does the
gain pay for the restart. The decision core asks them; none of them knows
which policy proposed the change.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from vllm_autotuner.api import (
    Bounds,
    CurrentKnobs,
    Knobs,
    KnobSource,
    ObservedTraffic,
    VllmTuningSpec,
    VllmTuningStatus,
)
from vllm_autotuner.api.types import duration_seconds
from vllm_autotuner.knobs import startup_errors

DAY_SECONDS = 24 * 3600.0
#: The shortest day a daylight-saving change makes: a schedule's change at the wall-clock time of its last one a day
#: before is this long after it the day clocks go forward, and counts its budget over it (else it would run an
#: hour late, and push the next day's with it).
SHORTEST_DAY_SECONDS = DAY_SECONDS - 3600.0
#: Per-pod restart time assumed before a rollout was measured (model load, compile, graph capture).
DEFAULT_RESTART_SECONDS = 180.0
#: Least expected life of a regime, and the horizon past which a change's gain is not counted.
MIN_REGIME_LIFE_SECONDS = 1800.0
MAX_REGIME_LIFE_SECONDS = 6 * 3600.0
#: Share of the requests in flight a drain may cut before the operator warns that it is too short for them
#: (``rollout.drain.drain_advice``; the chart's alert VllmTuningDrainTooShort). A drain three times the mean request
#: cuts 5% of them.
CUT_SHARE_WARNED = 0.1
#: Utilisation a fleet is assumed to run at, at least, before a rollout's cost was measured.
ASSUMED_UTILISATION = 0.85


def in_bounds(knobs: Knobs, bounds: Bounds) -> bool:
    tokens, seqs = bounds.max_num_batched_tokens, bounds.max_num_seqs
    return tokens.min <= knobs.max_num_batched_tokens <= tokens.max and seqs.min <= knobs.max_num_seqs <= seqs.max


def clamp(knobs: Knobs, bounds: Bounds, current: CurrentKnobs) -> Knobs | None:
    """The nearest config inside the bounds that vLLM accepts, or None when the bounds hold none."""
    tokens_range, seqs_range = bounds.max_num_batched_tokens, bounds.max_num_seqs
    tokens = min(max(knobs.max_num_batched_tokens, tokens_range.min), tokens_range.max)
    if not current.chunked_prefill and current.max_model_len is not None:
        tokens = min(max(tokens, current.max_model_len), tokens_range.max)
    seqs = min(max(knobs.max_num_seqs, seqs_range.min), seqs_range.max, tokens)
    clamped = Knobs(max_num_batched_tokens=tokens, max_num_seqs=max(seqs, seqs_range.min))
    return clamped if acceptable(clamped, bounds, current) else None


def acceptable(knobs: Knobs, bounds: Bounds, current: CurrentKnobs) -> bool:
    """Inside the bounds and accepted by vLLM's start-up checks."""
    return in_bounds(knobs, bounds) and not startup_errors(knobs, current.max_model_len, current.chunked_prefill)


def changes_reverted(state: VllmTuningStatus) -> bool:
    """Whether another writer put back what our changes replaced twice within 24 hours under this spec
    (``status.reverts``): a GitOps tool that owns the args, or a person who does not want them changed. Each
    further change would cost two rolling restarts, ours and its revert, for nothing."""
    if len(state.reverts) < 2:
        return False
    newest, previous = (_time(t) for t in state.reverts[:2])
    return (newest - previous).total_seconds() < DAY_SECONDS


def failed_configs(state: VllmTuningStatus) -> set[Knobs]:
    """Configs that failed to start under the spec generation in force (all of them when it is unknown)."""
    return {
        Knobs(max_num_batched_tokens=f.max_num_batched_tokens, max_num_seqs=f.max_num_seqs)
        for f in state.failed_configs
        if state.observed_generation is None or f.generation == state.observed_generation
    }


def step_range(value: int, running: float | None, factor: float) -> tuple[float, float]:
    """How far one rollout may take a knob now at ``value``: up to ``factor`` above it, and down to ``factor``
    below the requests the measured window ran at once (or below ``value``, whichever is lower).

    The limit bounds extrapolation. A knob above what the traffic uses of it
    (a budget above the decodes running, a ``max_num_seqs`` above the requests
    running) can be lowered to that use and the model still predicts from
    steps it measured: smaller steps, of sizes the window ran, with the same
    requests running. Below it, or above the current value, the model
    extrapolates (fewer requests at once, steps larger than any it saw), and
    one rollout goes at most ``factor`` into it before the next is measured.
    Without ``running`` (nothing measured) the range is ``factor`` either
    way of ``value``.
    """
    floor = value if running is None else min(value, max(running, 1.0))
    return floor / factor, value * factor


def steps_beyond(knobs: Knobs, current: Knobs, factor: float, running: float | None = None) -> float:
    """How many ``factor`` steps the farther knob of ``knobs`` lies outside ``step_range`` of ``current``'s
    (0 inside it): the rollouts still needed after one into the range, before rounding up."""
    pairs = ((knobs.max_num_batched_tokens, current.max_num_batched_tokens), (knobs.max_num_seqs, current.max_num_seqs))
    beyond = 0.0
    for new, old in pairs:
        low, high = step_range(old, running, factor)
        beyond = max(beyond, math.log(low / new, factor), math.log(new / high, factor))
    return beyond


def within_step(knobs: Knobs, current: Knobs, factor: float, running: float | None = None) -> bool:
    """Both knobs of ``knobs`` lie within ``step_range`` of ``current``'s."""
    return steps_beyond(knobs, current, factor, running) <= 1e-9


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def cooldown_left(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime) -> float:
    """Seconds until a traffic-driven change may start: the cooldown after the last rollout or a person's change."""
    ends = []
    if state.last_rollout is not None and state.last_rollout.finished_at is not None:
        ends.append(_time(state.last_rollout.finished_at))
    if state.current is not None and state.current.source == KnobSource.MANUAL:
        ends.append(_time(state.current.since))
    return _cooldown_after(spec, ends, now)


def blocked_left(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime) -> float:
    """Seconds until any change may start after a rollout that could not start its new pods (``blocked_at``):
    the cooldown, which a schedule window respects too, or it would stall at once again."""
    return _cooldown_after(spec, [_time(state.blocked_at)] if state.blocked_at else [], now)


def _cooldown_after(spec: VllmTuningSpec, ends: list[datetime], now: datetime) -> float:
    """Seconds left of the cooldown that follows the latest of ``ends`` (0 when there is none)."""
    if not ends:
        return 0.0
    until = max(ends) + timedelta(seconds=duration_seconds(spec.rollout.cooldown))
    return max(0.0, (until - now).total_seconds())


def rollouts_last_day(state: VllmTuningStatus, now: datetime, day_seconds: float = DAY_SECONDS) -> list[str]:
    """Start times of the rollouts in the day (24 hours unless ``day_seconds`` says otherwise) before ``now``."""
    return [t for t in state.rollout_times if (now - _time(t)).total_seconds() < day_seconds]


def budget_left(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime, reserved: int = 0,
                day_seconds: float = DAY_SECONDS) -> int:
    """Rollouts still allowed in the rolling day (``rollouts_last_day``), keeping ``reserved`` for scheduled
    windows."""
    return spec.rollout.max_rollouts_per_day - len(rollouts_last_day(state, now, day_seconds)) - reserved


def rollback_room(spec: VllmTuningSpec) -> int:
    """Rollouts a traffic change keeps in the daily budget for its own rollback: one, unless the limit is 1.

    A failed start is always rolled back, and the rollback is a rollout of
    the budget too; keeping room for it holds the day within the limit.
    Under a limit of 1 that would forbid every change: there the one change
    a day is made, and its rollback, if one is needed, is the one rollout
    past the limit.
    """
    return 1 if spec.rollout.max_rollouts_per_day > 1 else 0


def restart_seconds(state: VllmTuningStatus, waves: int) -> float:
    """Seconds one wave of a rolling restart lasts (the pods it stops are out of service meanwhile): the last
    timed rolling restart's duration (``status.rolloutSeconds``) over its ``waves``."""
    took = state.rollout_seconds
    if took is None or took <= 0 or waves < 1:
        return DEFAULT_RESTART_SECONDS
    return max(took / waves, 1.0)


def restart_waves(state: VllmTuningStatus, pods: int) -> int:
    """How many waves a rolling restart of ``pods`` takes: its Deployment's strategy stops
    ``status.rolloutUnavailable`` pods at a time (one when not known; a surge-only update replaces one at a time)."""
    return math.ceil(pods / max(1, _unavailable(state, pods)))


def _unavailable(state: VllmTuningStatus, pods: int) -> int:
    return min(pods, 1 if state.rollout_unavailable is None else state.rollout_unavailable)


def regime_life_seconds(state: VllmTuningStatus, now: datetime) -> float:
    """Expected remaining life of the current regime, up to the horizon, from how long it has lasted.

    Nothing but its age is known of a regime, so the moment is taken to be
    anywhere in its life alike (the Copernican argument): having lasted
    ``t``, it lasts ``r`` more with probability ``t / (t + r)``. The
    median of that is ``t`` (as long again), but a change earns its gain
    for as long as the regime actually lasts, so what it is worth is the
    gain times the mean remaining life within the horizon ``H``:
    ``t * ln(1 + H / t)``, more than ``t`` for a young regime (it may well
    last hours) and less than ``H`` for an old one. At least
    MIN_REGIME_LIFE_SECONDS.

    The regime in force when the operator first looked (no other regime
    measured yet) began before that, by an unknown time: its age is the
    time observed plus an earlier part taken alike anywhere within the
    horizon, and the expected life the mean over it (half the horizon for
    a regime just seen), not that of a regime that has just begun.
    """
    lasted = (now - _time(state.regime_since)).total_seconds() if state.regime_since else 0.0
    horizon = MAX_REGIME_LIFE_SECONDS
    if _first_regime(state):
        expected = (_life_integral(lasted + horizon) - _life_integral(lasted)) / horizon
    elif lasted > 0:
        expected = lasted * math.log1p(horizon / lasted)
    else:
        expected = 0.0
    return min(max(expected, MIN_REGIME_LIFE_SECONDS), horizon)


def _first_regime(state: VllmTuningStatus) -> bool:
    """Whether the current regime is the only one measured: in force since the operator first looked."""
    seen = {m.regime for m in state.measurements} | {x.regime for x in state.learned}
    return state.regime is not None and seen <= {state.regime}


def _life_integral(age: float) -> float:
    """An antiderivative in ``age`` of the mean remaining life ``age * ln(1 + H / age)`` within the horizon H."""
    h = MAX_REGIME_LIFE_SECONDS
    tail = age * age / 2 * math.log(age) if age > 0 else 0.0
    return (age * age - h * h) / 2 * math.log(age + h) + h * age / 2 - tail


def restart_cost_seconds(
    state: VllmTuningStatus, pods: int, utilisation: float, ttft_target: float, in_flight: float = 0.0
) -> float:
    """What one rolling restart costs, in seconds of the target's whole SLO goodput.

    Measured on the rollouts so far (``status.restartCostSeconds``) once there
    are any, but never below the estimate at the current load: the
    measurement averages rollouts made at their own loads, and a restart at
    the daily peak costs more than the morning's did (a measured minute at
    half load must not price a restart at 95 % load, whose queue takes an
    hour to drain). The estimate: the pods restart in waves of ``k``, what
    the Deployment's strategy takes out of service at once
    (``status.rolloutUnavailable``: one at a time when not known, all of
    them under Recreate, none when it only surges), each wave out for the
    restart time ``d``; at ``utilisation`` of the fleet's capacity, the
    ``(pods - k) / pods`` left carry what they can and the rest queues, to
    drain with the spare capacity once the wave is back. Requests that
    arrive while the queue holds more than the TTFT target's worth of work
    miss it. A fleet that absorbs the missing pods still answers slower
    while each carries a stopped pod's share: a tenth of that share of
    ``d``. The model's utilisation misses attention and half-full steps,
    so until a rollout was measured the fleet is taken to be at least
    ASSUMED_UTILISATION busy: guessing high costs a change not made,
    guessing low a fleet that queues for half an hour.

    On top of that come the requests each stopped pod cuts (``cut_seconds``),
    which no measurement holds: they die with the process, in no histogram.
    """
    measured = state.restart_cost_seconds
    if measured is None:
        utilisation = max(utilisation, ASSUMED_UTILISATION)
    waves = restart_waves(state, pods)
    d = restart_seconds(state, waves)
    out = _unavailable(state, pods)
    estimate = 0.1 * d  # every pod stopped once, each losing a tenth of its share of d
    excess = utilisation - (pods - out) / pods
    if out > 0 and utilisation >= 1:
        estimate += waves * 4 * d
    elif out > 0 and excess > 0:
        peak = excess * d
        estimate += waves * (max(0.0, d - ttft_target / excess) + max(0.0, peak - ttft_target) / (1 - utilisation))
    return (estimate if measured is None else max(measured, estimate)) + cut_seconds(state, in_flight)


def in_flight_seconds(observed: ObservedTraffic | None) -> float:
    """Mean seconds a request runs in a pod, by Little's law (running per pod over requests per second per pod
    that ran: those refused at admission never did), in the last usable window (``status.observed``); 0 when not
    measured. Its time queued is left out: a request queued long enough to matter has missed its TTFT target
    already, so cutting it costs no goodput."""
    if observed is None or observed.running is None or not observed.pods:
        return 0.0
    admitted = observed.request_rate - (observed.refused_requests_per_second or 0.0)
    return observed.running * observed.pods / admitted if admitted > 0 else 0.0


def cut_share(drain: float | None, in_flight: float) -> float | None:
    """The share of its requests in flight a pod cuts as a rolling restart stops it, taking the time a request
    has left as exponential with mean ``in_flight`` (a guess on the safe side for long drains, which real request
    lengths end sooner): ``exp(-T / in_flight)`` for a drain of ``T`` seconds (``status.drainSeconds``), all of
    them for a vLLM that aborts on SIGTERM, almost none for a drain several times the mean request. None when the
    drain is not known or no request was measured running."""
    if drain is None or in_flight <= 0:
        return None
    return math.exp(-drain / in_flight)


def cut_seconds(state: VllmTuningStatus, in_flight: float) -> float:
    """The requests a rolling restart cuts, in seconds of the target's whole SLO goodput.

    Each pod is stopped once. Its running requests hold, by Little's law,
    ``in_flight`` seconds of its goodput, where ``in_flight`` is the mean
    time a request runs in it (``in_flight_seconds``); so the pods together
    hold ``in_flight`` seconds of the whole, and the drain cuts
    ``cut_share`` of it, all of the output of a cut request lost, the part
    sent too. 0 when the drain is not known (``drainSeconds`` absent).
    """
    share = cut_share(state.drain_seconds, in_flight)
    return 0.0 if share is None else in_flight * share


def restart_cost_percent(
    state: VllmTuningStatus, pods: int, utilisation: float, ttft_target: float, life_seconds: float,
    in_flight: float = 0.0,
) -> float:
    """One rolling restart's cost in percent of the SLO goodput the config is expected to bring in the
    ``life_seconds`` it serves."""
    cost = restart_cost_seconds(state, pods, utilisation, ttft_target, in_flight)
    return 100.0 * cost / life_seconds
