"""Schedule windows: midnight, DST in two zones, pre-roll, precedence, unreadable entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from vllm_autotuner.api import Schedule, VllmTuningStatus
from vllm_autotuner.api.status import Rollout, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy.schedule import pre_roll_seconds, scheduled_rollouts, window_at, window_in_force

from .helpers import knobs


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
    found, _ = window_in_force([window], state, utc(2024, 5, 1, 21, 50))
    assert found is not None and not found.is_open(utc(2024, 5, 1, 21, 50)) and found.start == utc(2024, 5, 1, 22)
    assert window_in_force([window], state, utc(2024, 5, 1, 21, 49))[0] is None


def test_default_pre_roll_follows_the_last_measured_rollout():
    window = Schedule(name="w", start="0 22 * * *", end="0 6 * * *", knobs=knobs(4096, 256))
    assert pre_roll_seconds(window, VllmTuningStatus()) == 300
    rollout = Rollout(
        from_knobs=knobs(8192, 256),
        to_knobs=knobs(4096, 256),
        source="Traffic",
        reason="r",
        started_at=utc_timestamp(utc(2024, 5, 1)),
        finished_at=utc_timestamp(utc(2024, 5, 1, 0, 8)),
        phase=RolloutPhase.SUCCEEDED,
    )
    assert pre_roll_seconds(window, VllmTuningStatus(last_rollout=rollout)) == 600  # 8m * 1.25
    short = rollout.model_copy(update={"finished_at": utc_timestamp(utc(2024, 5, 1, 0, 2))})
    assert pre_roll_seconds(window, VllmTuningStatus(last_rollout=short)) == 180  # 2m + 1m
    failed = rollout.model_copy(update={"phase": RolloutPhase.FAILED})
    assert pre_roll_seconds(window, VllmTuningStatus(last_rollout=failed)) == 300


def test_overlaps_go_to_priority_then_list_order():
    wide = sched("0 20 * * *", "0 8 * * *", name="wide")
    narrow = sched("0 22 * * *", "0 6 * * *", name="narrow", priority=5)
    twin = sched("0 22 * * *", "0 6 * * *", name="twin", priority=5)
    state = VllmTuningStatus()
    at = utc(2024, 5, 1, 23)
    assert window_in_force([wide, narrow, twin], state, at)[0].schedule.name == "narrow"
    assert window_in_force([wide, twin, narrow], state, at)[0].schedule.name == "twin"
    assert window_in_force([wide, narrow], state, utc(2024, 5, 1, 21))[0].schedule.name == "wide"


def test_unreadable_schedules_are_reported_and_skipped():
    bad_cron = sched("0 25 * * *", "0 6 * * *", name="badcron")
    bad_zone = sched("0 22 * * *", "0 6 * * *", "Mars/Olympus_Mons", name="badzone")
    good = sched("0 22 * * *", "0 6 * * *", name="good")
    found, errors = window_in_force([bad_cron, bad_zone, good], VllmTuningStatus(), utc(2024, 5, 1, 23))
    assert found.schedule.name == "good"
    assert len(errors) == 2 and "badcron" in errors[0] and "Bad hour" in errors[0] and "IANA" in errors[1]


def test_scheduled_rollouts_count_openings_and_closings_within_the_horizon():
    night = sched("0 22 * * *", "0 6 * * *")
    overrides = Schedule(name="o", start="0 12 * * *", end="0 13 * * *", slo={"ttft": {"seconds": 5}})
    assert scheduled_rollouts([night, overrides], utc(2024, 5, 1, 12), 24 * 3600) == 2
    assert scheduled_rollouts([night], utc(2024, 5, 1, 12), 11 * 3600) == 1
    assert scheduled_rollouts([night], utc(2024, 5, 1, 12), 3 * 24 * 3600) == 6


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
    rollout = Rollout(
        from_knobs=knobs(8192, 1024),
        to_knobs=knobs(16384, 512),
        source="Schedule",
        reason="r",
        started_at=utc_timestamp(utc(2024, 5, 1, 21, 55)),
        finished_at=utc_timestamp(utc(2024, 5, 1, 21, 56, 20)),
        phase=RolloutPhase.SUCCEEDED,
    )
    moment = utc(2024, 5, 1, 21, 56, 30)
    fresh = VllmTuningStatus(last_rollout=rollout)
    assert window_in_force([window], fresh, moment)[0] is None
    entered = fresh.model_copy(update={"active_schedule": "w", "active_schedule_start": "2024-05-01T22:00:00Z"})
    found, _ = window_in_force([window], entered, moment)
    assert found is not None and found.start == utc(2024, 5, 1, 22) and found.end == utc(2024, 5, 2, 6)
    # an opening already past (the window closed since) extends nothing
    stale = entered.model_copy(update={"active_schedule_start": "2024-04-30T22:00:00Z"})
    assert window_in_force([window], stale, moment)[0] is None


def test_a_window_with_bounds_keeps_budget_for_its_opening_and_one_with_an_slo_none():
    bounds = Schedule(name="b", start="0 22 * * *", end="0 6 * * *", bounds={"maxNumBatchedTokens": {"max": 4096}})
    slo = Schedule(name="s", start="0 12 * * *", end="0 13 * * *", slo={"ttft": {"seconds": 5}})
    assert scheduled_rollouts([bounds], utc(2024, 5, 1, 12), 24 * 3600) == 1
    assert scheduled_rollouts([bounds, slo], utc(2024, 5, 1, 12), 3 * 24 * 3600) == 3
