"""Time-of-day policy: which schedule window is in force at a moment.

A window opens at each occurrence of its ``start`` cron and closes at the
next occurrence of ``end``, both read as wall-clock times in its IANA time
zone; cronsim follows Debian cron across daylight-saving changes (a time
skipped by spring-forward fires right after the gap, a time repeated by
fall-back fires once). All comparisons are made in UTC, because Python
compares two datetimes of one zone by wall clock and would misorder the
repeated hour. A window is also in force during its *pre-roll*, the time
before it opens, so that a preset's rolling restart is complete when the
window starts; once in force, it stays in force until that opening closes,
even when the pre-roll, recomputed from the last rollout (the preset's own),
shrinks. Overlaps go to the highest ``priority``, then the earlier entry.

Change freezes (``spec.rollout.freezes``) are windows of the same kind, read
the same way; one is in force from the rollout lead before it opens (a
change started then would still be rolling in it) until it closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim

from vllm_autotuner.api import Schedule, TimeWindow, VllmTuningStatus
from vllm_autotuner.api.types import duration_seconds, parse_cron, time_zone
from vllm_autotuner.policy.guardrails import rollout_seconds

#: Pre-roll before any rollout was measured; then the last rollout's duration plus a margin.
DEFAULT_PRE_ROLL_SECONDS = 300.0
PRE_ROLL_MARGIN = 1.25
PRE_ROLL_MIN_EXTRA_SECONDS = 60.0


@dataclass(frozen=True)
class ActiveWindow:
    """A schedule window in force: open, or about to open and within its pre-roll."""

    schedule: Schedule
    index: int
    """Position of the schedule in spec.schedules."""
    start: datetime
    """When the window opens (UTC)."""
    end: datetime
    """When it closes (UTC)."""

    def is_open(self, now: datetime) -> bool:
        return self.start <= now


def _previous(expr: str, zone_name: str, moment: datetime) -> datetime | None:
    """The last occurrence at or before ``moment`` (UTC), or None within cronsim's 50-year horizon."""
    local = moment.astimezone(time_zone(zone_name)).replace(microsecond=0) + timedelta(seconds=1)
    try:
        found = next(CronSim(expr, local, reverse=True)).astimezone(UTC)
    except StopIteration:
        return None
    # in the second pass of a repeated hour the wall clock lies behind an occurrence already past: step up to it
    while (later := _following(expr, zone_name, found)) is not None and later <= moment:
        found = later
    return found


def _following(expr: str, zone_name: str, moment: datetime) -> datetime | None:
    """The first occurrence strictly after ``moment`` (UTC)."""
    local = moment.astimezone(time_zone(zone_name)).replace(microsecond=0)
    try:
        # in the second pass of a repeated hour, cronsim yields the occurrence of its first pass: not after moment
        return next(found for found in (x.astimezone(UTC) for x in CronSim(expr, local)) if found > moment)
    except StopIteration:
        return None


def window_at(window: TimeWindow, now: datetime, pre_roll_seconds: float) -> tuple[datetime, datetime] | None:
    """The (start, end) of this window in force at ``now`` (open, or opening within ``pre_roll_seconds``), or None.

    Raises ValueError for a cron expression or time zone that cannot be read.
    """
    parse_cron(window.start)
    parse_cron(window.end)
    zone = window.time_zone
    last_start = _previous(window.start, zone, now)
    last_end = _previous(window.end, zone, now)
    if last_start is not None and (last_end is None or last_start > last_end):
        end = _following(window.end, zone, last_start)
        return (last_start, end) if end is not None else None
    next_start = _following(window.start, zone, now)
    if next_start is None or (next_start - now).total_seconds() > pre_roll_seconds:
        return None
    end = _following(window.end, zone, next_start)
    return (next_start, end) if end is not None else None


def rollout_lead_seconds(state: VllmTuningStatus) -> float:
    """How long before a moment a rollout must start to be complete by then: the last measured rollout's duration
    plus a margin, or 5 minutes."""
    took = rollout_seconds(state)
    if took is None:
        return DEFAULT_PRE_ROLL_SECONDS
    return max(took * PRE_ROLL_MARGIN, took + PRE_ROLL_MIN_EXTRA_SECONDS)


def pre_roll_seconds(schedule: Schedule, state: VllmTuningStatus) -> float:
    """The schedule's pre-roll, or the rollout lead."""
    if schedule.pre_roll is not None:
        return duration_seconds(schedule.pre_roll)
    return rollout_lead_seconds(state)


def freeze_in_force(
    freezes: Sequence[TimeWindow], state: VllmTuningStatus, now: datetime
) -> tuple[TimeWindow, tuple[datetime, datetime] | None] | None:
    """The first change freeze in force at ``now`` (open, or opening within the rollout lead), with its (start, end);
    None for its times when it cannot be read: it is in force all the same, since no one can say when it ends."""
    lead = rollout_lead_seconds(state)
    for freeze in freezes:
        try:
            found = window_at(freeze, now, lead)
        except ValueError:
            return freeze, None
        if found is not None:
            return freeze, found
    return None


def window_in_force(
    schedules: Sequence[Schedule], state: VllmTuningStatus, now: datetime
) -> tuple[ActiveWindow | None, list[str]]:
    """The window in force at ``now`` (highest priority, then list order), and one error per unreadable schedule.

    The window in force at the last evaluation (``state.active_schedule``)
    keeps its pre-roll up to the opening it was in force for
    (``state.active_schedule_start``): otherwise the preset's own rollout,
    shorter than the pre-roll it was started in, would take the window out
    of force before it opens, and the preset would be undone and redone.
    """
    best: ActiveWindow | None = None
    errors = []
    for index, schedule in enumerate(schedules):
        pre_roll = pre_roll_seconds(schedule, state)
        if schedule.name == state.active_schedule and state.active_schedule_start is not None:
            pre_roll = max(pre_roll, (datetime.fromisoformat(state.active_schedule_start) - now).total_seconds())
        try:
            found = window_at(schedule, now, pre_roll)
        except ValueError as exc:
            errors.append(f"schedule {schedule.name} ignored: {exc}")
            continue
        if found is not None and (best is None or schedule.priority > best.schedule.priority):
            best = ActiveWindow(schedule=schedule, index=index, start=found[0], end=found[1])
    return best, errors


def scheduled_rollouts(schedules: Sequence[Schedule], now: datetime, horizon_seconds: float) -> int:
    """How many times a window may force a rollout within the horizon: rollouts to keep in the budget.

    A preset window forces one when it opens and one when it closes; a window
    with bounds one when it opens (the knobs may lie outside them); a window
    that only overrides the SLO none.
    """
    until = now + timedelta(seconds=horizon_seconds)
    count = 0
    for schedule in schedules:
        if schedule.knobs is not None:
            boundaries = (schedule.start, schedule.end)
        elif schedule.bounds is not None:
            boundaries = (schedule.start,)
        else:
            continue
        for expr in boundaries:
            try:
                parse_cron(expr)
                moment = _following(expr, schedule.time_zone, now)
            except ValueError:
                continue
            while moment is not None and moment <= until:
                count += 1
                moment = _following(expr, schedule.time_zone, moment)
    return count
