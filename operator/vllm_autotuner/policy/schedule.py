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
even when the pre-roll, recomputed from the preset's own rollout, shrinks
(and so does a preset window in force beneath another window).
A window whose end fires at the very instant it starts (both in the hour a
spring-forward skips) is empty: never in force. Overlaps go to the highest
``priority``, then the earlier entry; but a window that only overrides the
SLO or bounds says nothing of the knobs, so a preset window beneath it
(open, or in its pre-roll) keeps its preset. Windows that do not overlap are not ranked: one that
closes as (or before) a preset window opens gives way to that one's pre-roll.

Change freezes (``spec.rollout.freezes``) are windows of the same kind, read
the same way; one is in force from the rollout lead before it opens (a
change started then would still be rolling in it) until it closes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim

from vllm_autotuner.api import Schedule, TimeWindow, VllmTuningStatus
from vllm_autotuner.api.types import duration_seconds, parse_cron, time_zone

#: Pre-roll before any rolling restart was timed; then its duration plus a margin.
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
    if _previous(window.end, zone, next_start) == next_start:
        return None  # it closes as it opens: nothing to pre-roll for
    end = _following(window.end, zone, next_start)
    return (next_start, end) if end is not None else None


#: Where ``never_opens`` looks (the answer is the spec's, whatever the day): a year of the start's occurrences (a
#: leap one), or as many as it takes time to look at, whichever is fewer.
_FIRST_LOOK = datetime(2024, 1, 1, tzinfo=UTC)
_LOOKED_AT = timedelta(days=366)
_MOST_OCCURRENCES = 2000


@functools.lru_cache(maxsize=256)
def never_opens(start: str, end: str, zone: str) -> bool:
    """Whether a window's end fires whenever its start does (``0 22 * * *`` to ``00 22 * * 0-6``) through a year:
    it is then never in force, however its text differs. False where that year holds more occurrences of the
    start than are looked at (an hourly start): it is not known. Raises ValueError for a cron expression or time
    zone that cannot be read."""
    parse_cron(start)
    parse_cron(end)
    moment: datetime | None = _FIRST_LOOK
    for _ in range(_MOST_OCCURRENCES):
        moment = _following(start, zone, moment)
        if moment is None or moment > _FIRST_LOOK + _LOOKED_AT:
            return True
        if _previous(end, zone, moment) != moment:
            return False
    return False


def rollout_lead_seconds(state: VllmTuningStatus) -> float:
    """How long before a moment a rollout must start to be complete by then: the last timed rolling restart's
    duration (``status.rolloutSeconds``) plus a margin, or 5 minutes."""
    took = state.rollout_seconds
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


def next_pre_roll(
    schedules: Sequence[Schedule], state: VllmTuningStatus, now: datetime, moves: Callable[[Schedule], bool]
) -> tuple[Schedule, datetime] | None:
    """The schedule window whose pre-roll begins first after ``now``, and when it begins; only windows whose
    opening may force a rollout count (a preset's, a window's bounds: the knobs may lie outside them), as in
    ``scheduled_rollouts``, and of those the ones ``moves`` says would replace the config in question (a preset of
    another config, bounds that leave it out). An unreadable schedule is left out (``windows_in_force`` reports
    it). A traffic change started within the rollout lead before it would still be rolling, or its config barely
    live, when the window's change must start: held, as before a freeze (``freeze_in_force``); and one started
    earlier serves only until then. However far ahead: each caller compares it with its own horizon."""
    found = []
    for schedule in schedules:
        if schedule.knobs is None and schedule.bounds is None or not moves(schedule):
            continue
        pre_roll = pre_roll_seconds(schedule, state)
        try:
            times = window_at(schedule, now, math.inf)
        except ValueError:
            continue
        begins = times[0] - timedelta(seconds=pre_roll) if times is not None else now
        if begins > now:  # not open, nor in its pre-roll: then its change is the schedule's to make now
            found.append((begins, schedule))
    if not found:
        return None
    begins, schedule = min(found, key=lambda pair: pair[0])
    return schedule, begins


def windows_in_force(
    schedules: Sequence[Schedule], state: VllmTuningStatus, now: datetime
) -> tuple[list[ActiveWindow], list[str]]:
    """The windows in force at ``now``, the one in force first (highest priority, then list order; but an open
    window that closes before a preset window in its pre-roll opens comes after it), and one error per unreadable
    schedule.

    The window in force at the last evaluation (``state.active_schedule``)
    keeps its pre-roll up to the opening it was in force for
    (``state.active_schedule_start``), and so does the preset window in
    force beneath it (``state.preset_schedule``, ``preset_schedule_start``):
    otherwise the preset's own rollout, shorter than the pre-roll it was
    started in, would take the window out of force before it opens, and the
    preset would be undone and redone.
    """
    kept = {name: datetime.fromisoformat(start) for name, start in (
        (state.active_schedule, state.active_schedule_start), (state.preset_schedule, state.preset_schedule_start))
        if name is not None and start is not None}
    found: list[ActiveWindow] = []
    errors = []
    for index, schedule in enumerate(schedules):
        pre_roll = pre_roll_seconds(schedule, state)
        if schedule.name in kept:
            pre_roll = max(pre_roll, (kept[schedule.name] - now).total_seconds())
        try:
            times = window_at(schedule, now, pre_roll)
        except ValueError as exc:
            errors.append(f"schedule {schedule.name} ignored: {exc}")
            continue
        if times is not None:
            found.append(ActiveWindow(schedule=schedule, index=index, start=times[0], end=times[1]))
    ranked = sorted(found, key=lambda window: -window.schedule.priority)  # stable: list order on a tie
    # an open window that closes by the time a preset window in its pre-roll opens does not overlap it: the
    # pre-roll, there to have the preset live when that window opens, goes first (both sorts are stable)
    pre_rolling = [w for w in found if w.schedule.knobs is not None and not w.is_open(now)]
    return sorted(ranked, key=lambda w: w.is_open(now) and any(o.start >= w.end for o in pre_rolling)), errors


def preset_in_force(windows: Sequence[ActiveWindow]) -> ActiveWindow | None:
    """The window whose preset is in force, of ``windows_in_force``'s: the window in force when it has one; under
    one that only overrides the SLO or bounds, the first preset window beneath it (open, or in its pre-roll).

    Such a window says nothing of the knobs, so it does not end a preset:
    an SLO for a report run nested in the night's preset window leaves the
    preset live, where going back to the day's knobs when it opens and to
    the preset when it closes would cost two rolling restarts for nothing.
    Nor does one whose own pre-roll begins while the preset's runs: a
    weekend SLO from Friday 22:00 over a nightly preset pre-rolled from
    21:30 would otherwise undo the preset, and the night redo it. Nor does
    one open over a preset window's pre-roll keep that preset from rolling
    out ahead of its opening (the preset window keeps that pre-roll once in
    force: ``state.preset_schedule``).
    """
    if not windows:
        return None
    if windows[0].schedule.knobs is not None:
        return windows[0]
    return next((w for w in windows[1:] if w.schedule.knobs is not None), None)


def scheduled_rollouts(
    schedules: Sequence[Schedule], state: VllmTuningStatus, now: datetime, horizon_seconds: float,
    limit: int | None = None,
) -> int:
    """How many times a window may force a rollout within the horizon: rollouts to keep in the budget; at most
    ``limit`` (counting stops there: more than the budget is all the budget).

    A preset window forces one when it opens and one when it closes; a window
    with bounds one when it opens (the knobs may lie outside them); a window
    that only overrides the SLO none. An opening forces its rollout a
    pre-roll early, so it counts once its pre-roll starts within the horizon:
    a change made the day before must leave the budget the preset needs then.
    Only a start that opens the window and an end that closes it count: a
    Friday window closed by a daily ``end`` closes once a week, not daily,
    and a start its end fires with opens nothing.
    """
    until = now + timedelta(seconds=horizon_seconds)
    count = 0
    for schedule in schedules:
        opens = (schedule.start, timedelta(seconds=pre_roll_seconds(schedule, state)), True)
        if schedule.knobs is not None:
            boundaries = (opens, (schedule.end, timedelta(0), False))
        elif schedule.bounds is not None:
            boundaries = (opens,)
        else:
            continue
        for expr, early, opening in boundaries:
            try:
                parse_cron(expr)
                moment = _following(expr, schedule.time_zone, now)
            except ValueError:
                continue
            while moment is not None and moment - early <= until:
                if limit is not None and count >= limit:
                    return count
                was = window_at(schedule, moment - timedelta(seconds=1), 0.0) is not None
                if was != opening:  # a start when closed may open it; an end when open closes it
                    count += (window_at(schedule, moment, 0.0) is not None) == opening
                moment = _following(expr, schedule.time_zone, moment)
    return count
