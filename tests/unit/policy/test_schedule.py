"""Schedule windows: midnight, DST in two zones, pre-roll, precedence, unreadable entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from vllm_autotuner.api import KnobSource, Schedule, VllmTuningStatus
from vllm_autotuner.policy import (
    manual_change_detected,
    rollout_blocked,
    rollout_progressed,
    rollout_succeeded,
    rollout_unverified,
    with_timed_restart,
)
from vllm_autotuner.policy.decision import with_rollout
from vllm_autotuner.policy.guardrails import DAY_SECONDS, restart_seconds
from vllm_autotuner.policy.schedule import (
    next_pre_roll,
    pre_roll_seconds,
    preset_in_force,
    rollout_lead_seconds,
    scheduled_rollouts,
    window_at,
    windows_in_force,
)

from vllm_autotuner.policy.decide import settings_at

from .helpers import knobs, spec, status


def sched(start, end, zone="UTC", name="w", priority=0, pre_roll="0s"):
    return Schedule(
        name=name, time_zone=zone, start=start, end=end, priority=priority, pre_roll=pre_roll, knobs=knobs(16384, 512)
    )


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def in_force(schedule, moment):
    return window_at(schedule, moment, 0.0)


NIGHT_BERLIN = sched("0 22 * * *", "0 6 * * *", "Europe/Berlin")  # CEST in May: UTC+2


@pytest.mark.parametrize(
    ("moment", "open_"),
    [
        (utc(2024, 5, 1, 19, 59), False),  # 21:59 local
        (utc(2024, 5, 1, 20, 0), True),  # 22:00 local: opens
        (utc(2024, 5, 1, 22, 30), True),  # 00:30 local, across midnight
        (utc(2024, 5, 2, 3, 59), True),  # 05:59 local
        (utc(2024, 5, 2, 4, 0), False),  # 06:00 local: closed
        (utc(2024, 5, 2, 12, 0), False),
    ],
)
def test_window_across_midnight_in_local_time(moment, open_):
    assert (in_force(NIGHT_BERLIN, moment) is not None) == open_


def test_open_window_reports_its_start_and_end():
    assert in_force(NIGHT_BERLIN, utc(2024, 5, 2, 1, 0)) == (utc(2024, 5, 1, 20, 0), utc(2024, 5, 2, 4, 0))


def test_berlin_spring_forward_skipped_start_opens_after_the_gap():
    # 2024-03-31 02:00 CET -> 03:00 CEST; a 02:30 start fires at 03:00 CEST = 01:00 UTC (Debian cron)
    window = sched("30 2 * * *", "0 4 * * *", "Europe/Berlin")
    assert in_force(window, utc(2024, 3, 31, 0, 59)) is None
    assert in_force(window, utc(2024, 3, 31, 1, 0)) == (utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 2, 0))
    assert in_force(window, utc(2024, 3, 31, 2, 0)) is None


def test_berlin_fall_back_window_spans_the_repeated_hour_once():
    # 2024-10-27 03:00 CEST -> 02:00 CET: 01:00 CEST = 23:00 UTC, 03:00 CET = 02:00 UTC: four real hours
    window = sched("0 1 * * *", "0 3 * * *", "Europe/Berlin")
    assert in_force(window, utc(2024, 10, 26, 22, 59)) is None
    for moment in (utc(2024, 10, 26, 23, 0), utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 1, 30)):
        assert in_force(window, moment) == (utc(2024, 10, 26, 23, 0), utc(2024, 10, 27, 2, 0)), moment
    assert in_force(window, utc(2024, 10, 27, 2, 0)) is None


def test_new_york_spring_forward_night_is_an_hour_shorter():
    # 22:00 EST (03:00 UTC) on 2024-03-09 to 06:00 EDT (10:00 UTC) on 2024-03-10: seven hours
    window = sched("0 22 * * *", "0 6 * * *", "America/New_York")
    assert in_force(window, utc(2024, 3, 10, 9, 59)) == (utc(2024, 3, 10, 3, 0), utc(2024, 3, 10, 10, 0))
    assert in_force(window, utc(2024, 3, 10, 10, 0)) is None


def test_new_york_fall_back_ambiguous_start_fires_once():
    # 01:30 happens twice on 2024-11-03 (EDT 05:30 UTC, then EST 06:30 UTC); the window opens at the first
    window = sched("30 1 * * *", "0 5 * * *", "America/New_York")
    assert in_force(window, utc(2024, 11, 3, 5, 29)) is None
    assert in_force(window, utc(2024, 11, 3, 5, 30)) == (utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 10, 0))
    assert in_force(window, utc(2024, 11, 3, 6, 45))[0] == utc(2024, 11, 3, 5, 30)
    assert in_force(window, utc(2024, 11, 3, 10, 0)) is None


def test_pre_roll_puts_the_window_in_force_before_it_opens():
    window = sched("0 22 * * *", "0 6 * * *", "UTC", pre_roll="10m")
    state = VllmTuningStatus()
    (found,), _ = windows_in_force([window], state, utc(2024, 5, 1, 21, 50))
    assert not found.is_open(utc(2024, 5, 1, 21, 50)) and found.start == utc(2024, 5, 1, 22)
    assert windows_in_force([window], state, utc(2024, 5, 1, 21, 49))[0] == []


def rolled(state, start, minutes, source=KnobSource.TRAFFIC):
    """``state`` after a rollout of ``source`` patched at ``start`` whose pods were all Ready ``minutes`` later."""
    state = with_rollout(state, start, knobs(4096, 256), source, "r")
    return rollout_succeeded(state, start + timedelta(minutes=minutes))


def test_default_pre_roll_follows_the_last_timed_rolling_restart():
    window = Schedule(name="w", start="0 22 * * *", end="0 6 * * *", knobs=knobs(4096, 256))
    assert pre_roll_seconds(window, status()) == 300
    assert pre_roll_seconds(window, rolled(status(), utc(2024, 5, 1), 8)) == 600  # 8m * 1.25
    assert pre_roll_seconds(window, rolled(status(), utc(2024, 5, 1), 2)) == 180  # 2m + 1m
    # written at zero replicas, it waited three hours for a scale-up: no restart's duration
    written = with_rollout(status(), utc(2024, 5, 1), knobs(4096, 256), KnobSource.TRAFFIC, "r")
    at_zero = rollout_unverified(written, utc(2024, 5, 1, 0, 0, 5))
    assert pre_roll_seconds(window, rollout_succeeded(at_zero, utc(2024, 5, 1, 3))) == 300
    # the wall clock stepped back 8 minutes during a 2-minute restart: no duration, the last one stands
    timed = rolled(status(), utc(2024, 5, 1), 2)
    clock_back = rolled(timed, utc(2024, 5, 2), -6)
    assert clock_back.rollout_seconds == 120 and VllmTuningStatus.model_validate(clock_back.model_dump())


def test_a_rollback_or_a_superseded_rollout_leaves_the_lead_to_the_last_rolling_restart():
    restarted = rolled(status(rollout_unavailable=1), utc(2024, 5, 1, 8), 20)
    assert rollout_lead_seconds(restarted) == 1500  # 20m * 1.25
    # the next change's surge pod found no GPU; its rollback only removed that pod, in 30 s
    blocked = rollout_blocked(
        with_rollout(restarted, utc(2024, 5, 1, 10), knobs(8192, 512), KnobSource.TRAFFIC, "r"),
        utc(2024, 5, 1, 10, 10),
        "0/6 nodes are available: Insufficient nvidia.com/gpu",
    )
    rolled_back = rollout_succeeded(blocked.state, utc(2024, 5, 1, 10, 10, 30))
    assert rolled_back.last_rollout.source == KnobSource.ROLLBACK
    assert rollout_lead_seconds(rolled_back) == 1500
    assert restart_seconds(rolled_back, 4) == restart_seconds(restarted, 4) == 300  # the restart's price too
    # a rollout a person's change superseded timed nothing either
    superseded = manual_change_detected(
        with_rollout(restarted, utc(2024, 5, 1, 10), knobs(8192, 512), KnobSource.SCHEDULE, "r"),
        knobs(2048, 128),
        utc(2024, 5, 1, 10, 5),
    )
    assert rollout_lead_seconds(superseded) == 1500


def test_a_rollout_seen_paused_or_at_zero_replicas_leaves_the_lead_to_the_last_rolling_restart():
    restarted = rolled(status(rollout_unavailable=1), utc(2024, 5, 1, 8), 20)
    assert rollout_lead_seconds(restarted) == 1500  # 20m * 1.25
    for replicas in (1, 0):  # `kubectl rollout pause` half way, or scaled to zero, for three hours
        started = with_rollout(restarted, utc(2024, 5, 1, 10), knobs(8192, 512), KnobSource.TRAFFIC, "r")
        halfway = rollout_progressed(started, utc(2024, 5, 1, 10, 10), 3)
        halted = rollout_progressed(halfway, utc(2024, 5, 1, 10, 11), replicas, halted=True)
        halted = rollout_progressed(halted, utc(2024, 5, 1, 12), replicas, halted=True)
        assert halted.last_rollout.halted_at == "2024-05-01T10:11:00Z"  # when first seen
        resumed = rollout_progressed(halted, utc(2024, 5, 1, 13, 5), 5)
        done = rollout_succeeded(resumed, utc(2024, 5, 1, 13, 15))
        assert done.last_rollout.phase == "Succeeded"
        assert done.rollout_seconds == 1200  # not the 3h15m it took
        assert rollout_lead_seconds(done) == 1500 and restart_seconds(done, 4) == restart_seconds(restarted, 4)
        assert with_timed_restart(done.model_copy(update={"rollout_seconds": None})).rollout_seconds is None
        assert VllmTuningStatus.model_validate(done.model_dump(by_alias=True)).last_rollout.halted_at


def test_a_status_from_before_rollout_seconds_takes_it_from_its_last_rollout():
    # as an older version wrote it: the timed rollout, without rolloutSeconds
    older = rolled(status(), utc(2024, 5, 1, 8), 20).model_copy(update={"rollout_seconds": None})
    assert rollout_lead_seconds(older) == 300  # read as it is, the lead would fall to its default
    assert rollout_lead_seconds(with_timed_restart(older)) == 1500
    blocked = rollout_blocked(
        with_rollout(older, utc(2024, 5, 1, 10), knobs(8192, 512), KnobSource.TRAFFIC, "r"),
        utc(2024, 5, 1, 10, 10), "0/6 nodes are available: Insufficient nvidia.com/gpu")
    rolled_back = rollout_succeeded(blocked.state, utc(2024, 5, 1, 10, 10, 30))
    assert with_timed_restart(rolled_back).rollout_seconds is None  # a rollback timed no restart


def test_overlaps_go_to_priority_then_list_order():
    wide = sched("0 20 * * *", "0 8 * * *", name="wide")
    narrow = sched("0 22 * * *", "0 6 * * *", name="narrow", priority=5)
    twin = sched("0 22 * * *", "0 6 * * *", name="twin", priority=5)
    state = VllmTuningStatus()
    at = utc(2024, 5, 1, 23)
    assert windows_in_force([wide, narrow, twin], state, at)[0][0].schedule.name == "narrow"
    assert windows_in_force([wide, twin, narrow], state, at)[0][0].schedule.name == "twin"
    assert windows_in_force([wide, narrow], state, utc(2024, 5, 1, 21))[0][0].schedule.name == "wide"


def test_unreadable_schedules_are_reported_and_skipped():
    bad_cron = sched("0 25 * * *", "0 6 * * *", name="badcron")
    bad_zone = sched("0 22 * * *", "0 6 * * *", "Mars/Olympus_Mons", name="badzone")
    good = sched("0 22 * * *", "0 6 * * *", name="good")
    (found,), errors = windows_in_force([bad_cron, bad_zone, good], VllmTuningStatus(), utc(2024, 5, 1, 23))
    assert found.schedule.name == "good"
    assert len(errors) == 2 and "badcron" in errors[0] and "Bad hour" in errors[0] and "IANA" in errors[1]


def test_scheduled_rollouts_count_openings_and_closings_within_the_horizon():
    night = sched("0 22 * * *", "0 6 * * *")
    overrides = Schedule(name="o", start="0 12 * * *", end="0 13 * * *", slo={"ttft": {"seconds": 5}})
    state = VllmTuningStatus()
    assert scheduled_rollouts([night, overrides], state, utc(2024, 5, 1, 12), 24 * 3600) == 2
    assert scheduled_rollouts([night], state, utc(2024, 5, 1, 12), 11 * 3600) == 1
    assert scheduled_rollouts([night], state, utc(2024, 5, 1, 12), 3 * 24 * 3600) == 6


def test_the_next_pre_roll_is_the_first_to_begin_of_windows_whose_opening_may_force_a_rollout():
    night = sched("0 22 * * *", "0 6 * * *", name="night", pre_roll="1h")
    noon = sched("30 12 * * *", "0 13 * * *", name="noon", pre_roll="10m")
    report = Schedule(name="report", start="0 12 * * *", end="0 14 * * *", slo={"ttft": {"seconds": 5}})
    capped = Schedule(name="capped", start="0 20 * * *", end="0 21 * * *", bounds={"maxNumSeqs": {"max": 128}})
    state = VllmTuningStatus()
    at = utc(2024, 5, 1, 11)
    assert next_pre_roll([night, noon, report], state, at, ALL) == (noon, utc(2024, 5, 1, 12, 20))
    assert next_pre_roll([night, report], state, at, ALL) == (night, utc(2024, 5, 1, 21))  # however far ahead
    assert next_pre_roll([report], state, at, ALL) is None
    assert next_pre_roll([night, capped], state, at, ALL) == (capped, utc(2024, 5, 1, 19, 55))  # 5m default
    # in its pre-roll or open, a window's change is the schedule's to make now, not one to wait for
    assert next_pre_roll([noon], state, utc(2024, 5, 1, 12, 20), ALL) is None
    assert next_pre_roll([noon], state, utc(2024, 5, 1, 12, 40), ALL) is None
    # only a window that would replace the config in question counts
    assert next_pre_roll([night, capped], state, at, lambda s: s.name != "capped") == (night, utc(2024, 5, 1, 21))


def ALL(schedule: Schedule) -> bool:  # noqa: N802 (a constant's name, as the tests read it)
    """``next_pre_roll``'s ``moves`` for a config every window's opening replaces."""
    return True


def test_an_opening_counts_once_its_pre_roll_starts_within_the_horizon():
    # Monday to Friday 09:00-18:00, pre-rolled an hour: Monday's preset rolls out at 08:00
    business = sched("0 9 * * 1-5", "0 18 * * 1-5", pre_roll="1h")
    state = VllmTuningStatus()
    sunday = utc(2024, 5, 5, 8)
    assert scheduled_rollouts([business], state, sunday, DAY_SECONDS) == 1
    assert scheduled_rollouts([business], state, sunday - timedelta(seconds=1), DAY_SECONDS) == 0
    # the default pre-roll follows the last rolling restart: 20 minutes, so 25 minutes ahead
    default = Schedule(name="b", start="0 9 * * 1-5", end="0 18 * * 1-5", knobs=knobs(16384, 512))
    slow = rolled(status(), utc(2024, 5, 4), 20)
    assert scheduled_rollouts([default], slow, utc(2024, 5, 5, 8, 35), DAY_SECONDS) == 1
    assert scheduled_rollouts([default], status(), utc(2024, 5, 5, 8, 35), DAY_SECONDS) == 0


def test_every_moment_of_a_dst_year_is_in_force_exactly_when_local_time_says_so():
    """Hourly through a year in Berlin: in force iff the local wall clock is 22:00-06:00 (DST days included)."""
    moment = utc(2024, 1, 1, 0, 30)
    while moment < utc(2025, 1, 1):
        local = moment.astimezone(ZoneInfo("Europe/Berlin"))
        expected = local.hour >= 22 or local.hour < 6
        assert (in_force(NIGHT_BERLIN, moment) is not None) == expected, moment
        moment += timedelta(hours=1)


def test_new_york_fall_back_window_ending_in_the_repeated_hour_closes_once():
    # 22:00 EDT (02:00 UTC) to 01:30 EDT (05:30 UTC); 01:30 EST (06:30 UTC) repeats the end, not the window
    window = sched("0 22 * * *", "30 1 * * *", "America/New_York")
    assert in_force(window, utc(2024, 11, 3, 5, 29)) == (utc(2024, 11, 3, 2, 0), utc(2024, 11, 3, 5, 30))
    for moment in (utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 6, 0), utc(2024, 11, 3, 6, 45), utc(2024, 11, 4, 2, 59)):
        assert in_force(window, moment) is None, moment
    # the next night opens at 22:00 EST (03:00 UTC)
    assert in_force(window, utc(2024, 11, 4, 3, 0)) == (utc(2024, 11, 4, 3, 0), utc(2024, 11, 4, 6, 30))


def test_a_window_in_force_in_its_pre_roll_stays_in_force_when_the_pre_roll_shrinks():
    window = Schedule(name="w", start="0 22 * * *", end="0 6 * * *", knobs=knobs(16384, 512))
    # the preset's own rollout took 80 s: the pre-roll is now 140 s, not the 300 s it was entered in
    moment = utc(2024, 5, 1, 21, 56, 30)
    fresh = rolled(status(), utc(2024, 5, 1, 21, 55), 80 / 60, KnobSource.SCHEDULE)
    assert windows_in_force([window], fresh, moment)[0] == []
    entered = fresh.model_copy(update={"active_schedule": "w", "active_schedule_start": "2024-05-01T22:00:00Z"})
    (found,), _ = windows_in_force([window], entered, moment)
    assert found.start == utc(2024, 5, 1, 22) and found.end == utc(2024, 5, 2, 6)
    # an opening already past (the window closed since) extends nothing
    stale = entered.model_copy(update={"active_schedule_start": "2024-04-30T22:00:00Z"})
    assert windows_in_force([window], stale, moment)[0] == []


def test_a_preset_window_in_force_beneath_another_stays_in_force_when_the_pre_roll_shrinks():
    """Beneath a window that only overrides the SLO, the preset window in force is not the window in force: the
    status names it apart (``preset_schedule``), and it keeps its pre-roll up to that opening as the window in force
    does, and no other window of the same preset does."""
    window = Schedule(name="w", start="0 22 * * *", end="0 6 * * *", knobs=knobs(16384, 512))
    twin = window.model_copy(update={"name": "twin", "start": "0 23 * * *"})
    moment = utc(2024, 5, 1, 21, 56, 30)  # the preset written at 21:55 took 80 s: the pre-roll is now 140 s
    fresh = rolled(status(), utc(2024, 5, 1, 21, 55), 80 / 60, KnobSource.SCHEDULE)
    entered = fresh.model_copy(update={"preset_schedule": "w", "preset_schedule_start": "2024-05-01T22:00:00Z"})
    (found,), _ = windows_in_force([window, twin], entered, moment)
    assert (found.schedule.name, found.start, found.end) == ("w", utc(2024, 5, 1, 22), utc(2024, 5, 2, 6))
    stale = entered.model_copy(update={"preset_schedule_start": "2024-04-30T22:00:00Z"})
    assert windows_in_force([window, twin], stale, moment)[0] == []


def test_a_window_with_bounds_keeps_budget_for_its_opening_and_one_with_an_slo_none():
    bounds = Schedule(name="b", start="0 22 * * *", end="0 6 * * *", bounds={"maxNumBatchedTokens": {"max": 4096}})
    slo = Schedule(name="s", start="0 12 * * *", end="0 13 * * *", slo={"ttft": {"seconds": 5}})
    state = VllmTuningStatus()
    assert scheduled_rollouts([bounds], state, utc(2024, 5, 1, 12), 24 * 3600) == 1
    assert scheduled_rollouts([bounds, slo], state, utc(2024, 5, 1, 12), 3 * 24 * 3600) == 3


@pytest.mark.parametrize(
    ("zone", "skipped"),
    [
        ("Europe/Berlin", utc(2024, 3, 31, 1)),  # 02:00 CET -> 03:00 CEST = 01:00 UTC
        ("America/New_York", utc(2024, 3, 10, 7)),  # 02:00 EST -> 03:00 EDT = 07:00 UTC
    ],
)
def test_a_window_whose_start_and_end_the_spring_forward_skips_is_empty(zone, skipped):
    # 02:00-03:00 does not exist that night: both fire at 03:00 (Debian cron), the window closes as it opens
    window = sched("0 2 * * *", "0 3 * * *", zone)
    for moment in (skipped - timedelta(minutes=8), skipped, skipped + timedelta(minutes=30)):
        assert window_at(window, moment, 600) is None, moment
    # the night before and the night after, an hour each
    before = window_at(window, skipped - timedelta(days=1), 0)
    after = window_at(window, skipped + timedelta(days=1, minutes=-30), 0)
    assert before is not None and before[0] < skipped and before[1] - before[0] == timedelta(hours=1)
    assert after is not None and after[0] > skipped and after[1] - after[0] == timedelta(hours=1)


def test_a_window_that_only_overrides_the_slo_or_bounds_keeps_an_open_preset_window_beneath_it():
    night = sched("0 22 * * *", "0 6 * * *", name="night")
    report = Schedule(name="report", priority=5, start="0 2 * * *", end="0 3 * * *", pre_roll="0s",
                      slo={"ttft": {"seconds": 10}})  # fmt: skip
    state = VllmTuningStatus()
    windows, _ = windows_in_force([night, report], state, utc(2024, 5, 2, 2, 30))
    assert [w.schedule.name for w in windows] == ["report", "night"]
    assert preset_in_force(windows) is windows[1]
    # a preset window outranking the override is the one in force, as before
    first = night.model_copy(update={"priority": 9})
    windows, _ = windows_in_force([report, first], state, utc(2024, 5, 2, 2, 30))
    assert preset_in_force(windows) is windows[0] and windows[0].schedule.name == "night"
    # a preset window only in its pre-roll beneath an override open past its opening rolls its preset out ahead
    early = sched("0 3 * * *", "0 6 * * *", name="early", pre_roll="1h")
    longer = report.model_copy(update={"end": "30 3 * * *"})
    windows, _ = windows_in_force([early, longer], state, utc(2024, 5, 2, 2, 30))
    assert [w.schedule.name for w in windows] == ["report", "early"]
    assert preset_in_force(windows) is windows[1]


def test_a_window_overrides_only_the_bounds_and_slo_fields_it_gives():
    # as the apiserver stores it: the CRD defaults nothing within a schedule's bounds or slo
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *",
             "bounds": {"maxNumSeqs": {"max": 64}}, "slo": {"ttft": {"seconds": 10}}}
    tuning = spec(bounds={"maxNumBatchedTokens": {"min": 1024, "max": 8192}, "maxNumSeqs": {"min": 16, "max": 512}},
                  slo={"ttft": {"seconds": 1.5, "quantile": 0.9}, "itl": {"seconds": 0.05}}, schedules=[night])

    settings = settings_at(tuning, VllmTuningStatus(), utc(2024, 5, 1, 23))

    tokens, seqs = settings.bounds.max_num_batched_tokens, settings.bounds.max_num_seqs
    assert (tokens.min, tokens.max, seqs.min, seqs.max) == (1024, 8192, 16, 64)  # the budget's cap still holds
    assert (settings.slo.ttft.seconds, settings.slo.ttft.quantile, settings.slo.itl.seconds) == (10, 0.9, 0.05)
    day = settings_at(tuning, VllmTuningStatus(), utc(2024, 5, 1, 12))
    assert (day.bounds, day.slo) == (tuning.bounds, tuning.slo)


@pytest.mark.parametrize("evening_priority", [0, 10])
@pytest.mark.parametrize("evening_first", [True, False])
def test_a_window_that_closes_as_the_next_opens_gives_way_to_its_pre_roll(evening_first, evening_priority):
    evening = Schedule(name="evening", start="0 18 * * *", end="0 22 * * *", priority=evening_priority,
                       knobs=knobs(4096, 256))
    night = Schedule(name="night", start="0 22 * * *", end="0 6 * * *", pre_roll="30m", knobs=knobs(16384, 512))
    schedules = [evening, night] if evening_first else [night, evening]

    at = utc(2024, 5, 1, 21, 40)
    windows, _ = windows_in_force(schedules, VllmTuningStatus(), at)

    preset = preset_in_force(windows)
    assert preset is not None and preset.schedule.name == "night"  # live by 22:00, not rolling out from 22:00
    at = utc(2024, 5, 1, 21, 20)  # before the pre-roll, the evening's preset
    assert preset_in_force(windows_in_force(schedules, VllmTuningStatus(), at)[0]).schedule.name == "evening"


def test_only_the_boundaries_that_open_or_close_the_window_are_kept_in_the_budget():
    friday = sched("0 22 * * 5", "0 6 * * *", name="friday")  # Friday 22:00 to Saturday 06:00
    tuesday = utc(2024, 4, 30, 12)
    assert scheduled_rollouts([friday], VllmTuningStatus(), tuesday, 24 * 3600) == 0  # no daily 06:00 closing
    friday_noon = utc(2024, 5, 3, 12)
    assert scheduled_rollouts([friday], VllmTuningStatus(), friday_noon, 24 * 3600) == 2
    assert scheduled_rollouts([friday], VllmTuningStatus(), tuesday, 7 * 24 * 3600) == 2
    # a start firing while the window is open opens nothing: hourly starts of a night window
    hourly = sched("0 22-23 * * *", "0 6 * * *", name="hourly")
    assert scheduled_rollouts([hourly], VllmTuningStatus(), tuesday, 24 * 3600) == 2
    # counting stops at the limit (the budget: more is all of it)
    every_ten_minutes = sched("*/10 * * * *", "5-59/10 * * * *", name="short")
    assert scheduled_rollouts([every_ten_minutes], VllmTuningStatus(), tuesday, 24 * 3600) == 288
    assert scheduled_rollouts([every_ten_minutes], VllmTuningStatus(), tuesday, 24 * 3600, limit=8) == 8
    # nor one its end fires with: a window never open keeps nothing
    never = sched("0 22 * * *", "00 22 * * 0-6", name="never")
    assert scheduled_rollouts([never], VllmTuningStatus(), tuesday, 7 * 24 * 3600) == 0
