"""``decide``: one evaluation of one VllmTuning, from spec, status, a window of metrics and the clock.

The order of the questions is the order of precedence:

1. While a rollout is unjudged, add what this window fell short of the
   window before it to the rollout's cost. Is the config known, and is a
   rollout (ours or anyone's) in progress? Then hold.
2. Is the window usable? Then note the regime, and remember the window as
   the config's measurement when it shows a steady state.
3. Has the last rollout settled? Judge it: record what it cost, and roll
   back a traffic-driven change that left things measurably worse.
4. Does a schedule window want a preset, or did a preset window just close?
   Clock-driven: this needs no traffic (a nightly batch window starts on
   time even when the night is quiet), only rollout budget, the cooldown
   after a person's change of the knobs, and a window that shows the pods
   as they are (``observation.blind``): with Prometheus unreachable, or its
   data stale or NaN, it waits, as every change does. At a close it goes to
   what the traffic policy would choose for the traffic now (the tier the
   window matches, Adaptive's config measured best in the regime) when a
   usable window of a regime one window old tells it, else back to the
   config before the window (``_closed``); but while a window that
   replaces that config begins its pre-roll within the rollout lead, and
   its change will go out then, the preset stays until then.
5. Otherwise the traffic policy (Tiers or Adaptive), which needs a usable
   window, a regime that has lasted one window, the last change judged,
   the cooldown, rollout budget beyond what the day's schedule windows
   and a rollback of the change will need, a rollout that ends before the
   next schedule window's pre-roll begins, and, for Adaptive, an expected
   gain that pays for the restarts before the regime or that pre-roll ends.

``Paused`` stops after learning; ``Recommend`` reports the change it would
make and holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from vllm_autotuner.api import (
    SLO,
    Bounds,
    DecisionAction,
    Knobs,
    KnobSource,
    LearnedOptimum,
    Measurement,
    Mode,
    ObservedTraffic,
    Recommendation,
    Schedule,
    Strategy,
    Tier,
    VllmTuningSpec,
    VllmTuningStatus,
)
from vllm_autotuner.api.status import FAILED_LIMIT, LEARNED_LIMIT, MEASUREMENT_LIMIT, RolloutPhase
from vllm_autotuner.api.types import duration_seconds, utc_timestamp
from vllm_autotuner.policy import adaptive
from vllm_autotuner.policy.adaptive import ATTAINMENT_FLOOR, COMPARABLE_LOAD
from vllm_autotuner.policy.decision import Decision, with_history, with_rollout
from vllm_autotuner.policy.guardrails import (
    DAY_SECONDS,
    SHORTEST_DAY_SECONDS,
    acceptable,
    budget_left,
    changes_reverted,
    clamp,
    blocked_left,
    cooldown_left,
    cut_seconds,
    failed_configs,
    in_flight_seconds,
    regime_life_seconds,
    restart_cost_percent,
    rollback_room,
)
from vllm_autotuner.policy.lifecycle import regression_measured
from vllm_autotuner.policy.model import attainment
from vllm_autotuner.policy.observation import (
    HoldReason,
    Observation,
    blind,
    engines_asleep,
    hold_reason,
    rollout_active,
)
from vllm_autotuner.policy.regime import classify, matching_tier, mix_moved
from vllm_autotuner.policy.schedule import (
    ActiveWindow,
    freeze_in_force,
    next_pre_roll,
    preset_in_force,
    rollout_lead_seconds,
    scheduled_rollouts,
    windows_in_force,
)

#: Adaptive's proposal for an evaluation's window, worked out when first asked for (``_proposer``).
_Propose = Callable[[], adaptive.Proposal | None]
#: Windows a rollout's first settled window may stay short of its baseline before the change counts as a regression.
REGRESSION_PATIENCE = 6
#: Further windows (times REGRESSION_PATIENCE) a change is given while the restart's queue is still shrinking.
DRAIN_PATIENCE = 3
#: Attainment two windows of the same traffic may differ by without either config being worse: sampling noise.
#: A regression must fall this far below the tolerance too (a change from 0.4% to 0.1% is no evidence).
ATTAINMENT_NOISE = 0.02
#: Regime name of traffic no tier matches (not a valid tier name, so it never collides with one).
NO_TIER = "(no tier)"
#: Holders of the rollout slots a RolloutSlots hold names; more are counted.
SLOT_HOLDERS_NAMED = 5
#: Holds that keep a change's place in the queue for a rollout slot (``slotWaitSince``): they say nothing of
#: whether the change is still wanted (the window is missing, stale, mixed or short; a rollout runs).
SLOT_WAIT_KEPT_BY = frozenset({
    HoldReason.NO_DATA,
    HoldReason.STALE,
    HoldReason.INVALID,
    HoldReason.TOO_FEW_SAMPLES,
    HoldReason.MIXED_CONFIG,
    HoldReason.NOT_SETTLED,
    HoldReason.OTHER_SLO,
    HoldReason.ROLLOUT_IN_PROGRESS,
    HoldReason.UNKNOWN_CONFIG,
    HoldReason.NO_PODS,
})


@dataclass(frozen=True)
class Settings:
    """What is in force at a moment: the schedule window, the preset, and the SLO and bounds the window implies."""

    window: ActiveWindow | None
    preset_window: ActiveWindow | None
    """The window whose preset is in force (``schedule.preset_in_force``): ``window``, or a preset window beneath
    it, open or in its pre-roll, when it only overrides the SLO or bounds."""
    slo: SLO
    bounds: Bounds
    warnings: tuple[str, ...]
    no_slot: str | None = None
    """Why no rollout may start now for reasons outside this tuning (the operator's limit of rollouts at once)."""
    controlled_by: str | None = None
    """The object that controls the target and would put its args back (see ``decide``)."""
    blind: tuple[HoldReason, str] | None = None
    """Why the window shows nothing of the pods now (``blind``): no change starts then, a schedule's neither."""

    @property
    def preset(self) -> Knobs | None:
        return self.preset_window.schedule.knobs if self.preset_window else None

    @property
    def override(self) -> str | None:
        """Name of the window in force when it overrides bounds or SLO (the traffic policy runs inside it, unless
        a preset window is open beneath it)."""
        return self.window.schedule.name if self.window and self.window.schedule.knobs is None else None


def settings_at(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime) -> Settings:
    """The schedule window in force at ``now`` (pre-roll included), the preset in force, and the SLO and bounds
    the window implies."""
    windows, errors = windows_in_force(spec.schedules, state, now)
    window = windows[0] if windows else None
    schedule = window.schedule if window else None
    slo = spec.slo.overlaid(schedule.slo if schedule else None)
    bounds = spec.bounds.overlaid(schedule.bounds if schedule else None)
    return Settings(
        window=window, preset_window=preset_in_force(windows),
        slo=slo, bounds=bounds, warnings=tuple(errors),
    )


def effective_slo(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime) -> SLO:
    """The SLO whose quantiles and targets the observation for ``now`` must be computed for."""
    return settings_at(spec, state, now).slo


def _measurement(observation: Observation, regime: str, slo: SLO) -> Measurement:
    assert observation.config is not None and observation.pods
    pods = observation.pods

    def per_pod(value: float | None) -> float:
        return (value or 0.0) / pods

    ttft, itl = observation.ttft_seconds or 0.0, observation.itl_seconds or 0.0
    share = attainment(
        slo, ttft, itl, observation.ttft_within_slo, observation.itl_within_slo, observation.mean_generation_tokens or 0
    )
    refused = None  # the latency histograms have only the answered requests: the refused ones are misses
    if observation.refused_rate is not None and observation.request_rate:
        refused = min(observation.refused_rate / observation.request_rate, 1.0)
        share *= 1 - refused
    return Measurement(
        regime=regime,
        max_num_batched_tokens=observation.config.max_num_batched_tokens,
        max_num_seqs=observation.config.max_num_seqs,
        measured_at=utc_timestamp(observation.window_end),
        request_rate=per_pod(observation.request_rate),
        refused_share=refused,
        generation_tokens_per_second=per_pod(observation.generation_tokens_rate),
        prompt_tokens_per_second=per_pod(observation.prompt_tokens_rate),
        cached_prompt_tokens_per_second=(
            None if observation.cached_prompt_tokens_rate is None else per_pod(observation.cached_prompt_tokens_rate)
        ),
        mean_prompt_tokens=observation.mean_prompt_tokens or 0.0,
        mean_generation_tokens=observation.mean_generation_tokens or 0.0,
        attainment=min(max(share, 0.0), 1.0),
        ttft_within_slo=observation.ttft_within_slo,
        itl_within_slo=observation.itl_within_slo,
        ttft_seconds=ttft,
        itl_seconds=itl,
        queue_seconds=observation.queue_seconds,
        itl_mean_seconds=observation.itl_mean_seconds,
        step_tokens_mean=observation.step_tokens_mean,
        step_tokens_quantile=observation.step_tokens_quantile,
        running=observation.running,
        waiting=observation.waiting,
        kv_cache_usage=observation.kv_cache_usage,
        preemptions_per_second=None if observation.preemption_rate is None else per_pod(observation.preemption_rate),
    )


def _observed(observation: Observation) -> ObservedTraffic:
    o = observation
    return ObservedTraffic(
        window_start=utc_timestamp(o.window_start),
        window_end=utc_timestamp(o.window_end),
        pods=o.pods or 0,
        request_rate=o.request_rate or 0.0,
        refused_requests_per_second=o.refused_rate,
        prompt_tokens_per_second=o.prompt_tokens_rate or 0.0,
        generation_tokens_per_second=o.generation_tokens_rate or 0.0,
        ttft_seconds=o.ttft_seconds,
        itl_seconds=o.itl_seconds,
        e2e_seconds=o.e2e_seconds,
        queue_seconds=o.queue_seconds,
        running=o.running,
        waiting=o.waiting,
        kv_cache_usage=o.kv_cache_usage,
        preemptions_per_second=o.preemption_rate,
        mean_prompt_tokens=o.mean_prompt_tokens,
        mean_generation_tokens=o.mean_generation_tokens,
        step_tokens_mean=o.step_tokens_mean,
    )


def _regime_name(spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, observation: Observation) -> str:
    if spec.traffic.strategy == Strategy.TIERS:
        current = state.current  # every tier whose knobs run is in force (``matching_tier``)
        in_force = {t.name for t in spec.traffic.tiers
                    if current is not None and clamp(t.knobs, settings.bounds, current) == current.knobs}
        tier = matching_tier(spec.traffic.tiers, observation, in_force)
        return tier.name if tier else NO_TIER
    pods = observation.pods or 1
    return classify(
        (observation.request_rate or 0.0) / pods,
        observation.mean_prompt_tokens or 0.0,
        observation.mean_generation_tokens or 0.0,
        state.regime,
        settings.override,
    ).name


def _observe(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, observation: Observation, now: datetime
) -> tuple[VllmTuningStatus, Measurement]:
    """The status after a usable window (observed numbers, regime and since when), and the window as a measurement.

    The regime starts afresh when its name changes and when its length mix
    moved since the last window (``mix_moved``): then the window is not
    remembered and the traffic policy waits one window more, as for a new
    regime.
    """
    regime = _regime_name(spec, settings, state, observation)
    same = regime == state.regime and state.regime_since and not mix_moved(state.observed, observation)
    since = state.regime_since if same else utc_timestamp(now)
    state = state.model_copy(update={"observed": _observed(observation), "regime": regime, "regime_since": since})
    return state, _measurement(observation, regime, settings.slo)


def _unjudged(state: VllmTuningStatus) -> bool:
    """The last rollout succeeded and its settled window was not compared with the baseline yet.

    Only a succeeded rollout is ever judged: one that failed or was superseded
    by a person's change is not waited for.
    """
    last = state.last_rollout
    return last is not None and last.phase == RolloutPhase.SUCCEEDED and last.verified_at is None


def _in_place_of_known(
    state: VllmTuningStatus, m: Measurement, carried: Callable[[Measurement], dict[str, int]]
) -> tuple[Measurement, list[Measurement]]:
    """``m``, with what it carries over (``carried``) from the measurement of its regime and config already known,
    and the measurements with it first in that one's place (the newest MEASUREMENT_LIMIT)."""
    known = next((x for x in state.measurements if (x.regime, x.knobs) == (m.regime, m.knobs)), None)
    if known is not None:
        m = m.model_copy(update=carried(known))
    return m, [m, *(x for x in state.measurements if x is not known)][:MEASUREMENT_LIMIT]


def _remember(state: VllmTuningStatus, observation: Observation, m: Measurement) -> VllmTuningStatus:
    """The status with the measurement remembered, and the regime's learned optimum updated.

    Only a window that shows the config in a steady state counts: the regime
    was already in force when the window opened (a window across a change of
    traffic mixes two regimes) and the last rollout, if it succeeded, was
    judged (until then the queue the restart built is still draining).
    Otherwise a config measured in calm would look better than one measured
    in a storm.
    """
    assert state.regime_since is not None
    if observation.window_start < datetime.fromisoformat(state.regime_since) or _unjudged(state):
        return state
    regime = m.regime
    m, measurements = _in_place_of_known(state, m, lambda before: {"windows": before.windows + 1,
                                                                    "abandoned": before.abandoned})
    learned = list(state.learned)
    best = next((x for x in learned if x.regime == regime), None)
    same = best is not None and (best.max_num_batched_tokens, best.max_num_seqs) == (
        m.max_num_batched_tokens,
        m.max_num_seqs,
    )
    if best is None or same or (best.attainment or 0.0) < m.attainment:
        optimum = LearnedOptimum(
            regime=regime,
            max_num_batched_tokens=m.max_num_batched_tokens,
            max_num_seqs=m.max_num_seqs,
            goodput=m.generation_tokens_per_second * m.attainment,
            attainment=m.attainment,
            measured_at=m.measured_at,
        )
        learned = [optimum, *(x for x in learned if x is not best)][:LEARNED_LIMIT]
    return state.model_copy(update={"measurements": measurements, "learned": learned})


def _recommendation(knobs: Knobs, reason: str, gain: float | None, now: datetime) -> Recommendation:
    return Recommendation(
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        max_num_seqs=knobs.max_num_seqs,
        reason=reason,
        expected_gain_percent=gain,
        time=utc_timestamp(now),
    )


def _hold(
    state: VllmTuningStatus,
    now: datetime,
    hold: HoldReason,
    reason: str,
    settings: Settings,
    recommendation: Knobs | None = None,
    gain: float | None = None,
) -> Decision:
    knobs = state.current.knobs if state.current else None
    state = with_history(state, now, DecisionAction.HOLD, knobs, reason, hold)
    if recommendation is not None:
        state = state.model_copy(update={"recommendation": _recommendation(recommendation, reason, gain, now)})
    return Decision(
        action=DecisionAction.HOLD,
        knobs=knobs,
        reason=reason,
        state=state,
        hold=hold,
        recommendation=recommendation,
        expected_gain_percent=gain,
        warnings=settings.warnings,
    )


@dataclass(frozen=True)
class _Change:
    """A change a policy wants, before the mode and the rollout guardrails have their say."""

    knobs: Knobs
    source: KnobSource
    reason: str
    gain: float | None = None
    regime: str | None = None
    baseline: Measurement | None = None
    """The window before the change: what the regression check and the restart's cost compare with."""
    resume: Knobs | None = None
    """resume_knobs to persist with the change (schedule presets remember what to go back to)."""
    following: tuple[Schedule, datetime] | None = None
    """A traffic change's next schedule window that replaces its config, and when its pre-roll begins
    (``_following``): worked out once for the change's price (``_config_life``) and its guardrail (``_apply``)."""


def reverted_advice(reverted_by: str | None) -> str:
    """What to do when our changes keep being put back (``changes_reverted``), naming who put them back last
    (``status.reverted_by``) where the Kubernetes API recorded it: said in the hold and in the Degraded condition."""
    who = reverted_by or "another writer of the Deployment (a GitOps sync? a person?)"
    return (
        f"{who} put back what the operator changed twice within a day, so it changes nothing more: have that tool "
        "leave the vLLM container's args alone (Argo CD ignoreDifferences with managedFieldsManagers: "
        "[vllm-autotuner] and RespectIgnoreDifferences=true, a Flux drift ignore rule) or set the knobs there, then "
        "edit this VllmTuning's spec to let it tune again"
    )


def controlled_advice(controlled_by: str) -> str:
    """What to do when another object controls the target: said in the hold and in the Degraded condition."""
    return (
        f"the Deployment is controlled by {controlled_by}, whose controller renders it and would put the args back "
        f"after every change (two rolling restarts each), so the operator only recommends: set the knobs in "
        f"{controlled_by}, or set spec.targetRef.ignoreController if its controller leaves the vLLM args alone"
    )


def _apply(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, now: datetime, change: _Change
) -> Decision:
    """Guardrails every change passes, then the mode: Auto applies, Recommend reports, Paused holds.

    A config that failed to start is not retried, nor, once as many have
    failed as the status keeps (``FAILED_LIMIT``), is any other but a
    window's return to the config that ran before it: the next failure would
    push the oldest out of memory. Once another writer
    has put our changes back twice in a day (``changes_reverted``) every
    change is only recommended. The cooldown holds traffic changes, and
    every change while the knobs are a person's (schedules respect them
    too) or after a rollout that could not start its pods. In Auto, no
    change starts in a change freeze or so shortly before one that it would
    still be rolling then (``schedule.freeze_in_force``), no traffic change
    so shortly before a schedule window's pre-roll that it would still be
    rolling when the window's change must start (``_Change.following``:
    the preset would be late for the opening), nor while the
    operator's limit of rollouts at once is reached (``Settings.no_slot``),
    and a change that passed all of these is only recommended while another
    object controls the target (``Settings.controlled_by``).
    A traffic
    change also leaves in the day's budget the rollouts the schedule
    windows will need and room for its own rollback (``rollback_room``); a
    schedule change needs one rollout left, the traffic policy having kept
    it, in the last 23 hours (``SHORTEST_DAY_SECONDS``: a day's change at the
    wall-clock time of the last day's, across a daylight-saving change).
    """
    assert state.current is not None
    if _refused(state, change.knobs, change.source):
        failed = failed_configs(state)
        if change.knobs in failed:
            reason = f"{change.knobs} failed to start before: not retried"
            return _hold(state, now, HoldReason.NO_BETTER_CONFIG, reason, settings)
        reason = (f"{len(failed)} configs failed to start under this spec, as many as the status remembers: no "
                  f"other is tried, or the oldest could be again. Find why in status.failedConfigs, fix it, then "
                  f"edit the spec to start over ({change.knobs} recommended)")
        return _hold(state, now, HoldReason.NO_BETTER_CONFIG, reason, settings, change.knobs, change.gain)
    if changes_reverted(state):
        reason = f"{change.knobs} only recommended ({change.reason}): {reverted_advice(state.reverted_by)}"
        return _hold(state, now, HoldReason.REVERTED, reason, settings, change.knobs, change.gain)
    manual = state.current.source == KnobSource.MANUAL
    wait = cooldown_left(spec, state, now) if change.source == KnobSource.TRAFFIC or manual else 0.0
    blocked = blocked_left(spec, state, now)
    if max(wait, blocked) > 0:
        after = (" after a rollout that could not start its pods" if blocked > wait
                 else " after a person's change" if manual else "")
        reason = (f"cooldown{after}: {max(wait, blocked):.0f}s left before a {change.source.lower()} change "
                  f"({change.reason})")
        return _hold(state, now, HoldReason.COOLDOWN, reason, settings, change.knobs, change.gain)
    windows = rollback = 0
    day = SHORTEST_DAY_SECONDS if change.source == KnobSource.SCHEDULE else DAY_SECONDS
    if change.source == KnobSource.TRAFFIC:
        windows = scheduled_rollouts(spec.schedules, state, now, DAY_SECONDS, spec.rollout.max_rollouts_per_day)
        rollback = rollback_room(spec)
    if budget_left(spec, state, now, windows + rollback, day) < 1:
        kept = "".join(
            f", {n} kept for {what}" for n, what in ((windows, "schedule windows"), (rollback, "its rollback")) if n
        )
        reason = f"rollout budget spent: {spec.rollout.max_rollouts_per_day} per day{kept} ({change.reason})"
        return _hold(state, now, HoldReason.BUDGET, reason, settings, change.knobs, change.gain)
    if spec.mode == Mode.PAUSED:
        return _hold(
            state, now, HoldReason.PAUSED, f"Paused: would change to {change.knobs} ({change.reason})", settings
        )
    if spec.mode == Mode.RECOMMEND:
        reason = f"Recommend mode: change to {change.knobs} recommended ({change.reason})"
        return _hold(state, now, HoldReason.RECOMMEND_ONLY, reason, settings, change.knobs, change.gain)
    frozen = freeze_in_force(spec.rollout.freezes, state, now)
    if frozen is not None:
        freeze, times = frozen
        if times is None:
            when = "cannot be read: no change until it is fixed"
        elif times[0] <= now:
            when = f"until {utc_timestamp(times[1])}"
        else:
            when = (f"opens at {utc_timestamp(times[0])}, before a rollout started now would finish; until "
                    f"{utc_timestamp(times[1])}")
        reason = f"change freeze {freeze.name} {when}: {change.knobs} waits ({change.reason})"
        return _hold(state, now, HoldReason.FREEZE, reason, settings, change.knobs, change.gain)
    traffic = change.source == KnobSource.TRAFFIC
    following = change.following
    if traffic and following and _still_rolling(state, following, now):
        schedule, begins = following
        reason = (f"schedule {schedule.name}'s pre-roll begins at {utc_timestamp(begins)}, before a rollout started "
                  f"now would finish: {change.knobs} waits for the schedule's change ({change.reason})")
        return _hold(state, now, HoldReason.SCHEDULE, reason, settings, change.knobs, change.gain)
    if settings.blind is not None:
        hold, why = settings.blind
        reason = (f"{why}: {change.knobs} waits for a fresh window, since blind neither a regression nor a sleeping "
                  f"engine could be seen ({change.reason})")
        return _hold(state, now, hold, reason, settings, change.knobs, change.gain)
    if settings.no_slot is not None:
        reason = f"waiting for a rollout slot, {settings.no_slot}: {change.knobs} waits ({change.reason})"
        return _hold(state, now, HoldReason.NO_SLOT, reason, settings, change.knobs, change.gain)
    if settings.controlled_by is not None:
        reason = f"{change.knobs} only recommended ({change.reason}): {controlled_advice(settings.controlled_by)}"
        return _hold(state, now, HoldReason.CONTROLLED, reason, settings, change.knobs, change.gain)
    if traffic:
        state = _abandon(state, change.regime, state.current.knobs)
    base = change.baseline
    state = with_rollout(
        state,
        now,
        change.knobs,
        change.source,
        change.reason,
        change.regime,
        baseline_attainment=base.attainment if base else None,
        baseline_request_rate=base.request_rate if base else None,
    )
    state = with_history(state, now, DecisionAction.CHANGE, change.knobs, change.reason)
    recommendation = _recommendation(change.knobs, change.reason, change.gain, now)
    state = state.model_copy(update={"resume_knobs": change.resume, "recommendation": recommendation})
    return Decision(
        action=DecisionAction.CHANGE,
        knobs=change.knobs,
        reason=change.reason,
        state=state,
        source=change.source,
        expected_gain_percent=change.gain,
        recommendation=change.knobs,
        warnings=settings.warnings,
    )


def _refused(state: VllmTuningStatus, knobs: Knobs, source: KnobSource) -> bool:
    """Whether ``_apply`` refuses a change to ``knobs`` for the configs that failed to start: it is one of them, or
    as many failed as the status keeps (``FAILED_LIMIT``: one more would forget the oldest, which could then be tried
    again) and it is not a window's return to the config that ran before it (``resume_knobs``), which goes on. Asked
    too where a change is chosen (``_closed``) or waited for (``_takes_over``), so that neither counts on one that
    ``_apply`` would hold for good."""
    failed = failed_configs(state)
    going_back = source == KnobSource.SCHEDULE and knobs == state.resume_knobs
    return knobs in failed or len(failed) >= FAILED_LIMIT and not going_back


def _abandon(state: VllmTuningStatus, regime: str | None, knobs: Knobs) -> VllmTuningStatus:
    """Count a traffic change away from ``knobs`` in ``regime`` on its measurement."""
    measurements = [
        m.model_copy(update={"abandoned": m.abandoned + 1}) if (m.regime, m.knobs) == (regime, knobs) else m
        for m in state.measurements
    ]
    return state.model_copy(update={"measurements": measurements})


def _proposer(spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, base: Measurement | None) -> _Propose:
    """``adaptive.propose`` for this evaluation's window ``base``, worked out on the first call and kept: a preset
    window's close asks what the traffic policy would choose (``_choice``), and when that keeps the config running
    the traffic policy asks again, of the same window, memory and bounds (``_traffic_change``). Only asked of a
    usable window (``base`` a measurement)."""
    current = state.current
    assert current is not None

    @functools.cache
    def propose() -> adaptive.Proposal | None:
        assert base is not None
        return adaptive.propose(base, state.measurements, settings.slo, settings.bounds, current,
                                spec.rollout.max_step_factor, failed_configs(state))

    return propose


def _schedule_change(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, read: Measurement | str, propose: _Propose,
    now: datetime,
) -> _Change | str | None:
    """What the clock asks for: a window's preset, the traffic policy's config when a preset window closed
    (``_closed``), or the window's bounds.

    A string is a reason to hold without looking at traffic (the preset is in force, or stays a little after its
    window closed). ``read`` is this evaluation's window as a measurement, or why it is not usable
    (``hold_reason``'s words); ``propose`` gives Adaptive's proposal for it (``_proposer``).
    """
    current = state.current
    assert current is not None
    window = settings.preset_window
    if window is not None and settings.preset is not None:
        target = clamp(settings.preset, spec.bounds, current)
        name = window.schedule.name
        if target is None:
            return f"preset of schedule {name} cannot be made to fit spec.bounds and vLLM's rules: kept {current.knobs}"
        if target == current.knobs:
            return f"schedule {name} in force until {window.end.isoformat()}: preset {target}"
        when = "opens" if window.is_open(now) else f"opens at {window.start.isoformat()} (pre-roll)"
        note = "" if target == settings.preset else f" (preset {settings.preset} clamped to bounds)"
        resume = state.resume_knobs or current.knobs
        return _Change(target, KnobSource.SCHEDULE, f"schedule {name} {when}: preset {target}{note}", resume=resume)
    if state.resume_knobs is not None:
        return _closed(spec, settings, state, read, propose, now)
    override = settings.override
    if override is not None and not acceptable(current.knobs, settings.bounds, current):
        target = clamp(current.knobs, settings.bounds, current)
        if target is not None:
            return _Change(target, KnobSource.SCHEDULE, f"schedule {override}: {current.knobs} is outside its bounds")
    return None


def _closed(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, read: Measurement | str, propose: _Propose,
    now: datetime,
) -> _Change | str | None:
    """The change when a preset window closed: to the config the traffic policy would choose for the traffic now
    (``_choice``), where it can tell, else back to the config before the window (``resume_knobs``); or why the
    preset stays a little longer.

    A night window exists because the traffic at its close differs from the
    traffic at its open: going back to the evening's config, and a cooldown
    later to the morning's, restarts the pods twice where once would do.
    None when the config chosen is the preset's: it stays, the traffic
    policy's now. A config that failed to start, or any but the way back
    once FAILED_LIMIT have (``_apply`` would hold it, and the preset stay
    for good), is not chosen. Nor does the change start when a window that
    replaces that config (another preset, bounds that leave it out, the
    same window again) begins its pre-roll within the rollout lead: the
    change would still be rolling, or barely live, when that window's must
    start, two restarts for nothing and that window's preset late; the
    preset stays until then, as a traffic change waits (``_apply``), but
    only when that window's change will go out then (``_takes_over``).
    """
    current, resume = state.current, state.resume_knobs
    assert current is not None and resume is not None
    choice = _choice(spec, settings, state, read, propose, now)
    if isinstance(choice, tuple) and _refused(state, choice[0], KnobSource.SCHEDULE):
        failed = len(failed_configs(state))
        choice = f"{choice[1]}, but {failed} configs failed to start under this spec: it is not tried"
    if isinstance(choice, tuple):
        target, why = choice
        reason = f"preset window closed: {why}"
    else:
        target = clamp(resume, settings.bounds, current)
        reason = f"preset window closed: back to {target}, the traffic policy resumes ({choice})"
    if target is None or target == current.knobs:
        return None
    following = _following(spec, state, target, now)
    if following is not None and _still_rolling(state, following, now) and _takes_over(spec, state, target, following):
        schedule, begins = following
        return (f"preset window closed, but schedule {schedule.name}'s pre-roll begins at {utc_timestamp(begins)}, "
                f"before a rollout started now would finish: {current.knobs} stays until then rather than "
                f"{target}, which would be replaced as soon as it is live")
    return _Change(target, KnobSource.SCHEDULE, reason)


def _takes_over(
    spec: VllmTuningSpec, state: VllmTuningStatus, knobs: Knobs, following: tuple[Schedule, datetime]
) -> bool:
    """Whether the change of the window ``following`` in place of ``knobs`` goes out when its pre-roll begins: no
    change freeze is in force then (``freeze_in_force``, as ``_apply`` asks it), and the config its opening goes to
    (``_opening``) fits and may be tried (``_refused``). Otherwise a preset window's close that waited for it would
    keep the closed window's preset for as long as that change is held: through a whole freeze, or for good. A
    window whose opening keeps the config that runs (the same preset again) sends nothing out, so nothing there can
    be held: it takes over whatever the freezes and failed configs."""
    schedule, begins = following
    opening = _opening(spec, state, schedule, knobs)
    if state.current is not None and opening == state.current.knobs:
        return True
    if freeze_in_force(spec.rollout.freezes, state, begins) is not None:
        return False
    return opening is not None and not _refused(state, opening, KnobSource.SCHEDULE)


def _choice(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, read: Measurement | str, propose: _Propose,
    now: datetime,
) -> tuple[Knobs, str] | str:
    """The config the traffic policy would choose for the traffic now and why, or why it cannot tell.

    Only from a window it would act on: usable (``read`` a measurement, not
    why the window is missing, stale, NaN, short, of mixed configs), of a
    regime that has lasted one window (a window across a change of traffic
    mixes two). Tiers: the tier the window matches, unless a tier's
    concurrency condition took part in the match (its own or one tried
    before it): the requests running and waiting follow the knobs, and the
    window measured the preset's. Adaptive: the config ``adaptive.propose``
    goes to when it is measured in this regime (what a returning regime goes
    straight back to); a predicted one is left to the traffic policy's steps,
    each measured before the next.
    """
    current = state.current
    assert current is not None
    if isinstance(read, str):
        return f"no usable window to choose from: {read}"
    base = read
    if _regime_wait_seconds(spec, state, now) > 0:
        return f"regime {base.regime} (or its length mix) is new: not yet one window old"
    if spec.traffic.strategy == Strategy.TIERS:
        tier = _tier(spec, base.regime)
        if tier is None:
            return "no tier matches the traffic"
        tiers = spec.traffic.tiers
        if any(t.match.min_concurrency is not None or t.match.max_concurrency is not None
               for t in tiers[: tiers.index(tier) + 1]):
            return f"a concurrency condition took part in matching tier {tier.name}, and the preset's knobs set it"
        target = clamp(tier.knobs, settings.bounds, current)
        if target is None:
            return f"tier {tier.name}'s knobs cannot be made to fit the bounds and vLLM's rules"
        return target, f"tier {tier.name} matches the traffic now: {target}"
    proposal = propose()
    if proposal is None or not proposal.goal.measured:
        return f"no config measured best in regime {base.regime} yet"
    goal = proposal.goal
    return goal.knobs, f"{goal.knobs}, measured best in regime {base.regime} (attainment {goal.attainment:.0%})"


def _tier(spec: VllmTuningSpec, regime: str) -> Tier | None:
    """The tier the traffic's regime names (``_regime_name``); None for NO_TIER."""
    return next((t for t in spec.traffic.tiers if t.name == regime), None)


def _regime_wait_seconds(spec: VllmTuningSpec, state: VllmTuningStatus, now: datetime) -> float:
    """Seconds the regime must still last before the traffic policy acts on it (one full window)."""
    since = datetime.fromisoformat(state.regime_since) if state.regime_since else now
    return max(0.0, (since + timedelta(seconds=duration_seconds(spec.traffic.window)) - now).total_seconds())


def _traffic_change(
    spec: VllmTuningSpec,
    settings: Settings,
    state: VllmTuningStatus,
    base: Measurement,
    waiting_before: float | None,
    propose: _Propose,
    now: datetime,
) -> _Change | tuple[HoldReason, str]:
    current = state.current
    assert current is not None
    if not acceptable(current.knobs, settings.bounds, current):
        target = clamp(current.knobs, settings.bounds, current)
        if target is None:
            return HoldReason.NO_BETTER_CONFIG, "the bounds hold no config vLLM accepts"
        return _Change(target, KnobSource.TRAFFIC, f"{current.knobs} is outside spec.bounds", regime=base.regime,
                       following=_following(spec, state, target, now))
    young = _regime_wait_seconds(spec, state, now)
    if spec.traffic.strategy == Strategy.TIERS:
        tier = _tier(spec, base.regime)
        if tier is None:
            return HoldReason.NO_TIER, "no tier matches the traffic"
        target = clamp(tier.knobs, settings.bounds, current)
        if target is None or target == current.knobs:
            return HoldReason.NO_BETTER_CONFIG, f"tier {tier.name} in force: {current.knobs}"
        if young > 0:
            return HoldReason.DWELL, f"tier {tier.name} matched (or its length mix moved) {young:.0f}s too recently"
        return _Change(target, KnobSource.TRAFFIC, f"traffic matches tier {tier.name}: {target}", regime=base.regime,
                       following=_following(spec, state, target, now))
    proposal = propose()
    if proposal is None:
        return HoldReason.NO_DATA, "no window with step tokens and ITL to fit the step-time model yet"
    goal, step, here = proposal.goal, proposal.step, proposal.now
    summary = (
        f"regime {base.regime}: now TTFT p{_pct(settings.slo.ttft.quantile)} {here.ttft_seconds:.2f}s, "
        f"ITL p{_pct(settings.slo.itl.quantile)} {here.itl_seconds * 1000:.0f}ms, attainment {here.attainment:.0%}"
    )
    if base.refused_share:
        summary += (f" ({base.refused_share:.0%} of requests refused at admission by vLLM's queue limits: these knobs "
                    "are not expected to change that, more replicas or higher limits would)")
    if goal.knobs == current.knobs:
        return HoldReason.NO_BETTER_CONFIG, f"{summary}; no config expected to do better than {current.knobs}"
    basis = "measured" if goal.measured else f"predicted ({proposal.model.slope * 1e6:.1f}us per batched token)"
    in_flight = in_flight_seconds(state.observed)
    following = _following(spec, state, (step or goal).knobs, now)
    life, until = _config_life(state, following, now)
    cost = proposal.rollouts * restart_cost_percent(
        state, _pods(state), here.utilisation, settings.slo.ttft.seconds, life, in_flight
    )
    cut = 100.0 * proposal.rollouts * cut_seconds(state, in_flight) / life
    net = proposal.gain_percent - cost
    way = "" if step is goal else f", {proposal.rollouts} rollouts away: first {step.knobs if step else 'nothing'}"
    reason = (
        f"{summary}; {goal.knobs} {basis}: TTFT {goal.ttft_seconds:.2f}s, ITL {goal.itl_seconds * 1000:.0f}ms, "
        f"attainment {goal.attainment:.0%}{way}; gain {proposal.gain_percent:+.1f}% minus restarts {cost:.1f}%{until}"
    )
    if cut >= 0.005:
        reason += (f" ({cut:.2f}% of it the requests in flight that stopping pods cut: "
                   f"drainSeconds {state.drain_seconds:g})")
    if net < spec.rollout.min_improvement_percent:
        return (
            HoldReason.SMALL_GAIN,
            f"{reason} is below minImprovementPercent {spec.rollout.min_improvement_percent:g}",
        )
    if step is None:
        return HoldReason.NO_BETTER_CONFIG, f"{reason}, but every step toward it is predicted worse than now"
    if _unjudged(state):
        return HoldReason.NOT_SETTLED, f"{reason}; the last change is not judged yet"
    if _draining(settings.slo, base, waiting_before):
        # a restart now would add its own backlog to one the current config is already clearing
        return HoldReason.NOT_SETTLED, f"{reason}; the queue is still draining ({base.waiting:.1f} waiting per pod)"
    if young > 0:
        return HoldReason.DWELL, f"{reason}; regime and length mix must hold {young:.0f}s more"
    return _Change(step.knobs, KnobSource.TRAFFIC, reason, gain=net, regime=base.regime, baseline=base,
                   following=following)


def _config_life(
    state: VllmTuningStatus, following: tuple[Schedule, datetime] | None, now: datetime
) -> tuple[float, str]:
    """Seconds a traffic change is expected to serve, and a note for the reason when a schedule cuts it.

    The regime's expected life (``regime_life_seconds``), but no longer than
    until the pre-roll of the next schedule window that replaces the config
    begins (``following``, see ``_following``): its change replaces the
    config then, however long the traffic lasts, and the restart must pay for
    itself before; at its close the traffic policy chooses again.
    """
    life = regime_life_seconds(state, now)
    if following is None or (left := (following[1] - now).total_seconds()) > life:
        return life, ""
    return left, f" over the {left:.0f}s until schedule {following[0].name}'s pre-roll"


def _following(
    spec: VllmTuningSpec, state: VllmTuningStatus, knobs: Knobs, now: datetime
) -> tuple[Schedule, datetime] | None:
    """The next schedule window whose opening replaces the config ``knobs`` (``_replaces``), and when its pre-roll
    begins (``next_pre_roll``): a change to ``knobs`` must not still be rolling then (``_still_rolling``: a traffic
    change in ``_apply``, a preset window's close in ``_closed``), and a traffic change pays for its restarts
    before then (``_config_life``)."""
    return next_pre_roll(spec.schedules, state, now, _replaces(spec, state, knobs))


def _still_rolling(state: VllmTuningStatus, following: tuple[Schedule, datetime], now: datetime) -> bool:
    """Whether a rollout started now would still be rolling, or its config barely live, when the pre-roll of the
    window ``following`` begins (within the rollout lead): that window's change would be late, and the rollout a
    restart for a config it replaces at once."""
    return (following[1] - now).total_seconds() <= rollout_lead_seconds(state)


def _replaces(spec: VllmTuningSpec, state: VllmTuningStatus, knobs: Knobs) -> Callable[[Schedule], bool]:
    """Whether a schedule window's opening replaces the config ``knobs`` (``_opening``): its preset, fitted to
    spec.bounds, is another config, or its bounds leave the config out. A window that keeps the config
    neither delays a traffic change nor cuts its life."""
    return lambda schedule: _opening(spec, state, schedule, knobs) != knobs


def _opening(spec: VllmTuningSpec, state: VllmTuningStatus, schedule: Schedule, knobs: Knobs) -> Knobs | None:
    """The config a schedule window's opening puts in place of ``knobs``: its preset fitted to spec.bounds (as
    ``_schedule_change`` fits it), else ``knobs`` fitted to its bounds (``knobs`` itself when inside them); None when
    no config fits: the window's change cannot go out (``_takes_over``)."""
    assert state.current is not None
    if schedule.knobs is not None:
        return clamp(schedule.knobs, spec.bounds, state.current)
    return clamp(knobs, spec.bounds.overlaid(schedule.bounds), state.current)


def _pct(quantile: float) -> str:
    return f"{quantile * 100:g}"


def _pods(state: VllmTuningStatus) -> int:
    return state.observed.pods if state.observed else 1


def _restart_loss(
    spec: VllmTuningSpec, slo: SLO, state: VllmTuningStatus, observation: Observation | None
) -> VllmTuningStatus:
    """Add what this window fell short of the rollout's baseline to the rollout's lost seconds.

    Counted from the start of a rollout until it is verified, on whatever the
    windows show (they are not usable for decisions meanwhile), each
    evaluation adding its window's shortfall times the evaluation interval;
    at most for as long as ``_verify`` waits for the restart's queue to drain
    (windows too few to judge, a quiet night, would otherwise add their
    noise to the price of every later change for as long as they last).
    """
    rollout = state.last_rollout
    if rollout is None or rollout.baseline_attainment is None or rollout.verified_at is not None:
        return state
    if rollout.phase not in (RolloutPhase.IN_PROGRESS, RolloutPhase.SUCCEEDED) or observation is None:
        return state
    if rollout.phase == RolloutPhase.SUCCEEDED and state.current is not None and observation.window_start >= (
            datetime.fromisoformat(state.current.since) + timedelta(seconds=_patience_seconds(spec))):
        return state
    ttft, itl, tokens = observation.ttft_seconds, observation.itl_seconds, observation.mean_generation_tokens
    shares = (observation.ttft_within_slo, observation.itl_within_slo)
    numbers = [ttft, itl, tokens, *(x for x in shares if x is not None)]
    if not all(x is not None and math.isfinite(x) and x >= 0 for x in numbers):
        return state
    assert ttft is not None and itl is not None and tokens is not None
    shortfall = max(0.0, rollout.baseline_attainment - attainment(slo, ttft, itl, *shares, tokens))
    lost = rollout.lost_seconds + shortfall * duration_seconds(spec.traffic.evaluation_interval)
    return state.model_copy(update={"last_rollout": rollout.model_copy(update={"lost_seconds": lost})})


def _patience_seconds(spec: VllmTuningSpec) -> float:
    """The longest ``_verify`` waits, after a rollout's config went live, to judge it: the settle time, a window,
    and the windows a restart's draining queue is given."""
    window = duration_seconds(spec.traffic.window)
    return duration_seconds(spec.rollout.settle_time) + window * (1 + DRAIN_PATIENCE * REGRESSION_PATIENCE)


def _drained(slo: SLO, base: Measurement) -> bool:
    """No queue to speak of: queue time p95 within half the TTFT target."""
    return base.queue_seconds is not None and base.queue_seconds <= slo.ttft.seconds / 2


def _draining(slo: SLO, base: Measurement, waiting_before: float | None) -> bool:
    """A queue is draining: requests wait (queue time p95 over half the TTFT target) and 5 % fewer of them per pod
    than at the last evaluation (``waiting_before``). The config serves more than arrives; what the window shows is
    the queue's, not the config's steady state."""
    if base.queue_seconds is None or _drained(slo, base):
        return False
    return waiting_before is not None and base.waiting is not None and base.waiting < 0.95 * waiting_before


def _verify(
    spec: VllmTuningSpec,
    slo: SLO,
    state: VllmTuningStatus,
    base: Measurement,
    waiting_before: float | None,
    window_start: datetime,
    now: datetime,
) -> Decision | VllmTuningStatus:
    """Judge the last rollout once its restart has settled: record its cost, roll back a regression.

    The window judged starts one full window after the settle time, when
    the queue that built up while pods restarted has usually drained. A
    window still short of the baseline counts as a regression only once the
    queue has drained (queue time p95 within half the TTFT target) for a
    further window, or when REGRESSION_PATIENCE windows have passed: a busy
    fleet drains slowly, and rolling back a config for its restart's queue
    builds another. Past that patience a queue that is still draining
    (``_draining``) is the restart's, not the config's: the judgement waits
    up to DRAIN_PATIENCE times longer. A window judged under more than
    COMPARABLE_LOAD times the baseline's requests per pod is no evidence
    against the config (near capacity a morning ramp costs attainment
    whatever the config), so it rolls nothing back. Only traffic-driven
    changes are rolled back; schedule presets are the user's.
    """
    rollout = state.last_rollout
    if rollout is None or rollout.phase != RolloutPhase.SUCCEEDED or rollout.verified_at is not None:
        return state
    assert state.current is not None
    grace = duration_seconds(spec.rollout.settle_time) + duration_seconds(spec.traffic.window)
    since = datetime.fromisoformat(state.current.since)
    if window_start < since + timedelta(seconds=grace):
        return state
    floor = (rollout.baseline_attainment or 0.0) * (1 - spec.rollout.regression_tolerance_percent / 100) - (
        ATTAINMENT_NOISE
    )
    window = duration_seconds(spec.traffic.window)
    if base.attainment < floor and window_start < since + timedelta(seconds=grace + REGRESSION_PATIENCE * window):
        if not _drained(slo, base) or window_start < since + timedelta(seconds=grace + window):
            return state
    if base.attainment < floor and _draining(slo, base, waiting_before) and window_start < since + timedelta(
        seconds=_patience_seconds(spec)
    ):
        return state
    update: dict[str, object] = {"last_rollout": rollout.model_copy(update={"verified_at": utc_timestamp(now)})}
    if rollout.baseline_attainment is not None:
        # lost attainment-seconds over the attainment there was to lose: seconds of the target's whole goodput
        cost = rollout.lost_seconds / max(rollout.baseline_attainment, ATTAINMENT_FLOOR)
        before = state.restart_cost_seconds
        update["restart_cost_seconds"] = cost if before is None else (before + cost) / 2
    state = state.model_copy(update=update)
    if rollout.source != KnobSource.TRAFFIC or rollout.baseline_attainment is None or rollout.regime != base.regime:
        return state
    if not spec.rollout.rollback_on_regression or base.attainment >= floor or spec.mode != Mode.AUTO:
        return state
    before = rollout.baseline_request_rate
    if before is not None and base.request_rate > COMPARABLE_LOAD * before:
        return state  # more traffic than before the change: attainment lost to it is no evidence against the config
    # the judged window is what the config does now: it takes the place of the memory that chose it (an older,
    # better window, or one of another SLO), which would choose it again after the cooldown, and again roll back
    judged = base.model_copy(update={"abandoned": 1})
    _, measurements = _in_place_of_known(state, judged, lambda known: {"abandoned": known.abandoned + 1})
    state = state.model_copy(update={"measurements": measurements})
    reason = (
        f"regression: attainment {base.attainment:.0%} under {rollout.to_knobs} against "
        f"{rollout.baseline_attainment:.0%} under {rollout.from_knobs} before the change "
        f"(tolerance {spec.rollout.regression_tolerance_percent:g}%)"
    )
    return regression_measured(state, now, reason)


def decide(
    spec: VllmTuningSpec,
    state: VllmTuningStatus,
    observation: Observation | None,
    now: datetime,
    *,
    slot_holders: Sequence[str] = (),
    max_concurrent_rollouts: int = 0,
    controlled_by: str | None = None,
) -> Decision:
    """Hold or change: one evaluation of the policy. Pure: the same arguments give the same Decision.

    ``state`` is the VllmTuning's status (``observed_generation`` set to the
    spec's generation, see ``adopt_generation``); ``now`` must be
    timezone-aware. ``slot_holders`` says, one string each, what holds the
    operator's rollout slots outside this tuning (a rollout in progress, a
    change that has waited longer for a slot: compare with the state's
    ``slot_wait_since``); when they are ``max_concurrent_rollouts`` or more
    (0: no limit), no change starts, but a rollback does, and the state
    keeps since when the change waits (``slot_wait_since``, kept through the
    holds of SLOT_WAIT_KEPT_BY, cleared by any other decision). The two turn
    a decision that is a Change without them into a RolloutSlots hold and
    change no other: a caller may look for the holders only then.
    ``controlled_by`` names the object that controls the target (its
    controller ownerReference, e.g. ``InferenceService ns/name``) when the
    spec does not say to ignore it: its controller would put every change
    back, so changes are only recommended (hold TargetControlled).
    """
    settings = replace(settings_at(spec, state, now), controlled_by=controlled_by)
    if max_concurrent_rollouts and len(slot_holders) >= max_concurrent_rollouts:
        named = ", ".join(slot_holders[:SLOT_HOLDERS_NAMED])
        if len(slot_holders) > SLOT_HOLDERS_NAMED:
            named += f" and {len(slot_holders) - SLOT_HOLDERS_NAMED} more"
        held = f"all {max_concurrent_rollouts} of --max-concurrent-rollouts held by {named}"
        settings = replace(settings, no_slot=held)
    decision = _decide(spec, settings, state, observation, now)
    if decision.hold == HoldReason.NO_SLOT:
        since = state.slot_wait_since or utc_timestamp(now)
    elif decision.hold in SLOT_WAIT_KEPT_BY:
        since = state.slot_wait_since
    else:
        since = None
    if since == decision.state.slot_wait_since:
        return decision
    return replace(decision, state=decision.state.model_copy(update={"slot_wait_since": since}))


def _decide(
    spec: VllmTuningSpec, settings: Settings, state: VllmTuningStatus, observation: Observation | None, now: datetime
) -> Decision:
    window = settings.window
    beneath = settings.preset_window if settings.preset_window is not window else None
    state = state.model_copy(
        update={
            "active_schedule": window.schedule.name if window else None,
            "active_schedule_start": utc_timestamp(window.start) if window else None,
            "preset_schedule": beneath.schedule.name if beneath else None,
            "preset_schedule_start": utc_timestamp(beneath.start) if beneath else None,
        }
    )
    state = _restart_loss(spec, settings.slo, state, observation)
    if state.current is None:
        return _hold(state, now, HoldReason.UNKNOWN_CONFIG, "the target's current knobs are not known yet", settings)
    if (rollout := rollout_active(state, observation)) is not None:
        return _hold(state, now, HoldReason.ROLLOUT_IN_PROGRESS, rollout, settings)
    if (asleep := engines_asleep(observation)) is not None:
        return _hold(state, now, HoldReason.ASLEEP, asleep, settings)
    problem = hold_reason(spec, settings.slo, state, observation, now)
    settings = replace(settings, blind=blind(observation, problem))
    base = None
    waiting_before = state.observed.waiting if state.observed else None
    if problem is None:
        assert observation is not None
        state, base = _observe(spec, settings, state, observation, now)
        checked = _verify(spec, settings.slo, state, base, waiting_before, observation.window_start, now)
        if isinstance(checked, Decision):
            return checked
        state = _remember(checked, observation, base)
    read = problem[1] if problem else base
    assert read is not None
    propose = _proposer(spec, settings, state, base)
    scheduled = _schedule_change(spec, settings, state, read, propose, now)
    if isinstance(scheduled, _Change):
        return _apply(spec, settings, state, now, replace(scheduled, baseline=base))  # to measure what it costs
    if isinstance(scheduled, str):
        return _hold(state, now, HoldReason.SCHEDULE, scheduled, settings)
    if state.resume_knobs is not None:
        state = state.model_copy(update={"resume_knobs": None})
    if problem is not None:
        return _hold(state, now, problem[0], problem[1], settings)
    assert base is not None
    wanted = _traffic_change(spec, settings, state, base, waiting_before, propose, now)
    if isinstance(wanted, _Change):
        return _apply(spec, settings, state, now, wanted)
    return _hold(state, now, wanted[0], wanted[1], settings)
