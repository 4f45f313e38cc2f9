"""decide() end to end: traffic changes, schedules, modes, regression, lifecycle and the regime memory."""

from __future__ import annotations

import dataclasses
import importlib
import re
from datetime import datetime, timedelta

import pytest

from vllm_autotuner.api import (
    SLO,
    Bounds,
    CurrentKnobs,
    DecisionAction,
    KnobSource,
    Measurement,
    Tier,
    TierMatch,
    VllmTuningStatus,
)
from vllm_autotuner.api.status import FAILED_LIMIT, FailedConfig, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy import (
    HoldReason,
    Observation,
    adaptive,
    adopt_generation,
    decide,
    defaults_resolved,
    effective_slo,
    manual_change_detected,
    rollout_blocked,
    rollout_failed,
    rollout_succeeded,
    rollout_unverified,
    strategy_seen,
)
from vllm_autotuner.policy.decision import with_rollout
from vllm_autotuner.policy.guardrails import DAY_SECONDS, budget_left
from vllm_autotuner.policy.schedule import scheduled_rollouts

from .helpers import T0, knobs, long_prompt_window, quiet, shifted, spec, status

SPEC = spec()
DECIDE = importlib.import_module("vllm_autotuner.policy.decide")  # the module, which the package's decide hides
MINUTE = 60.0
NIGHT = {
    "name": "night",
    "timeZone": "Europe/Berlin",
    "start": "0 22 * * *",
    "end": "0 6 * * *",
    "knobs": {"maxNumBatchedTokens": 16384, "maxNumSeqs": 512},
}


def quietly(the_spec, state, now, **keywords):
    """``decide`` on a fresh window in which the pods served no request: what the clock asks for, not the traffic."""
    return decide(the_spec, state, quiet(now), now, **keywords)


def warmed(the_spec=SPEC, state=None, minutes=10):
    """A status that has seen the long-prompt traffic for ``minutes``, so its regime is old enough to act on."""
    state = state or status()
    start = T0 - timedelta(minutes=minutes)
    return decide(the_spec, state, long_prompt_window(state, the_spec, now=start), start).state


def test_itl_breach_on_long_prompts_lowers_the_budget_to_the_goal_in_one_rollout():
    state = warmed()
    decision = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    assert decision.action == DecisionAction.CHANGE and decision.source == KnobSource.TRAFFIC
    # 20 requests run at once: every budget down to 10 tokens is within maxStepFactor 2 of what the window ran
    assert decision.knobs == knobs(2048, 1024)
    assert decision.expected_gain_percent >= SPEC.rollout.min_improvement_percent
    assert "ITL p95 190ms" in decision.reason and "tokens=2048" in decision.reason
    rollout = decision.state.last_rollout
    assert rollout.phase == RolloutPhase.IN_PROGRESS and rollout.to_knobs == knobs(2048, 1024)
    assert rollout.baseline_attainment is not None and decision.state.rollout_times == ["2024-05-01T12:00:00Z"]
    assert decision.state.history[0].action == DecisionAction.CHANGE


def test_a_new_regime_must_last_one_window():
    decision = decide(SPEC, status(), long_prompt_window(status(), SPEC), T0)
    assert decision.hold == HoldReason.DWELL and "tokens=2048" in decision.reason


def test_a_window_whose_length_mix_moved_within_its_regime_neither_decides_nor_is_remembered():
    state = warmed()  # 4,000-token prompts for 10 minutes, regime r4/p4k/o128
    longer = {"mean_prompt_tokens": 5200.0, "prompt_tokens_rate": 13.0 * 5200}  # +30%: still the p4k bin
    moving = decide(SPEC, state, long_prompt_window(state, SPEC, **longer), T0)
    assert moving.hold == HoldReason.DWELL and "length mix must hold 300s more" in moving.reason
    assert moving.state.regime == state.regime and moving.state.measurements == []
    later = T0 + timedelta(minutes=5)  # one window of the new mix: it is acted on
    settled = decide(SPEC, moving.state, long_prompt_window(state, SPEC, now=later, **longer), later)
    assert settled.action == DecisionAction.CHANGE
    # a move within the sampling noise of 3,900 requests (allowance 16%) is no change of the mix
    noise = {"mean_prompt_tokens": 4400.0, "prompt_tokens_rate": 13.0 * 4400}
    assert decide(SPEC, state, long_prompt_window(state, SPEC, **noise), T0).action == DecisionAction.CHANGE


def test_the_first_window_of_longer_prompts_holds_before_the_finished_requests_show_them():
    state = warmed()
    # prefills of 6,000-token prompts: the requests that finished in the window still averaged 4,000
    arriving = long_prompt_window(state, SPEC, prompt_tokens_rate=13.0 * 6000)
    decision = decide(SPEC, state, arriving, T0)
    assert decision.hold == HoldReason.DWELL and decision.state.measurements == []


def test_healthy_traffic_holds_with_the_numbers_in_the_reason():
    state = status(tokens=2048)
    fine = long_prompt_window(
        state,
        SPEC,
        itl_seconds=0.06,
        itl_within_slo=0.99,
        step_tokens_quantile=2048.0,
        step_tokens_mean=1500.0,
        itl_mean_seconds=0.04,
    )
    state = decide(SPEC, state, shifted(fine, -10 * MINUTE), T0 - timedelta(minutes=10)).state
    decision = decide(SPEC, state, fine, T0)
    assert not decision.changes and decision.hold in (HoldReason.NO_BETTER_CONFIG, HoldReason.SMALL_GAIN)
    assert "ITL p95 60ms" in decision.reason


def test_recommend_mode_reports_without_a_rollout():
    the_spec = spec(mode="Recommend")
    state = warmed(the_spec)
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.hold == HoldReason.RECOMMEND_ONLY and decision.recommendation == knobs(2048, 1024)
    assert decision.state.last_rollout is None and decision.state.recommendation.max_num_batched_tokens == 2048


def test_a_target_another_object_controls_gets_recommendations_and_no_change():
    state = warmed()
    window = long_prompt_window(state, SPEC)
    held = decide(SPEC, state, window, T0, controlled_by="InferenceService llm/llama")
    assert held.hold == HoldReason.CONTROLLED and held.recommendation == knobs(2048, 1024)
    assert "controlled by InferenceService llm/llama" in held.reason and "ignoreController" in held.reason
    assert held.state.last_rollout is None and not held.changes
    assert decide(SPEC, state, window, T0).action == DecisionAction.CHANGE  # the same window, not controlled


def test_paused_mode_learns_but_holds():
    the_spec = spec(mode="Paused")
    state = warmed(the_spec)
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.hold == HoldReason.PAUSED and decision.state.measurements and decision.state.last_rollout is None


def succeed(decision, at):
    return rollout_succeeded(decision.state, at)


def test_cooldown_after_a_rollout():
    state = warmed()
    first = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    done = T0 + timedelta(minutes=4)
    state = succeed(first, done)
    # at 4096 tokens ITL still breaches: p95 steps are full at the new budget
    still = {"itl_seconds": 0.107, "itl_mean_seconds": 0.063, "itl_within_slo": 0.945, "step_tokens_quantile": 4000.0,
             "step_tokens_mean": 2000.0}  # fmt: skip
    at = done + timedelta(minutes=8)  # the change is not judged yet: settle 2m + one window 5m + a window
    decision = decide(SPEC, state, long_prompt_window(state, SPEC, now=at, **still), at)
    assert decision.hold == HoldReason.NOT_SETTLED and "not judged yet" in decision.reason
    at = done + timedelta(minutes=13)  # judged (no regression), but inside the 15m cooldown
    decision = decide(SPEC, decision.state, long_prompt_window(state, SPEC, now=at, **still), at)
    assert decision.hold == HoldReason.COOLDOWN and "120s left" in decision.reason
    later = done + timedelta(minutes=15)
    decision = decide(SPEC, decision.state, long_prompt_window(state, SPEC, now=later, **still), later)
    assert decision.action == DecisionAction.CHANGE and decision.knobs.max_num_batched_tokens < 4096


def test_daily_budget_counts_the_last_24_hours():
    the_spec = spec(rollout={"maxRolloutsPerDay": 3})  # two used: the last one is kept for a rollback
    times = ["2024-04-30T12:30:00Z", "2024-05-01T06:00:00Z"]
    state = warmed(the_spec, status(rollout_times=times))
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.hold == HoldReason.BUDGET
    later = T0 + timedelta(minutes=31)  # the first one left the 24-hour window
    decision = decide(the_spec, decision.state, long_prompt_window(state, the_spec, now=later), later)
    assert decision.action == DecisionAction.CHANGE


def test_budget_keeps_room_for_the_days_schedule_windows():
    the_spec = spec(rollout={"maxRolloutsPerDay": 3}, schedules=[NIGHT])
    state = warmed(the_spec, status(rollout_times=["2024-05-01T06:00:00Z"]))
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.hold == HoldReason.BUDGET and "2 kept for schedule windows" in decision.reason


def test_budget_keeps_room_for_a_preset_whose_pre_roll_starts_within_the_day():
    # Thursday 12:30 UTC, pre-rolled an hour: its preset rolls out at 11:30, within 24 hours of Wednesday noon
    thursday = {"name": "thursday", "start": "30 12 * * 4", "end": "0 18 * * 4", "preRoll": "1h", "knobs": PRESET}
    the_spec = spec(rollout={"maxRolloutsPerDay": 3}, schedules=[thursday])
    state = warmed(the_spec, status(rollout_times=["2024-05-01T06:00:00Z"]))
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.hold == HoldReason.BUDGET and "1 kept for schedule windows" in decision.reason


def test_a_schedule_that_needs_the_whole_budget_keeps_its_time_the_day_clocks_go_forward():
    night = {**NIGHT, "timeZone": "America/New_York", "preRoll": "5m"}
    the_spec = spec(rollout={"maxRolloutsPerDay": 2}, schedules=[night])
    # Saturday's opening at 21:55 EST and Sunday's closing at 06:00 EDT: 23 hours before Sunday's opening
    state = status(rollout_times=["2026-03-08T02:55:00Z", "2026-03-08T10:00:00Z"])
    sunday = datetime.fromisoformat("2026-03-09T01:55:00+00:00")  # 21:55 EDT

    decision = quietly(the_spec, state, sunday)

    assert decision.action == DecisionAction.CHANGE and decision.source == KnobSource.SCHEDULE
    assert decision.knobs == knobs(16384, 512)
    # a traffic change still counts 24 hours
    assert budget_left(the_spec, state, sunday) == 0


def test_schedule_preset_is_pre_rolled_without_traffic_data_and_restored_at_the_end():
    the_spec = spec(schedules=[NIGHT])
    state = status()
    opens = T0.replace(hour=20)  # 22:00 in Berlin (CEST)
    early = quietly(the_spec, state, opens - timedelta(minutes=6))
    assert not early.changes and early.hold == HoldReason.MIXED_CONFIG
    pre = quietly(the_spec, state, opens - timedelta(minutes=5))
    assert pre.action == DecisionAction.CHANGE and pre.source == KnobSource.SCHEDULE
    assert pre.knobs == knobs(16384, 512) and "pre-roll" in pre.reason
    assert pre.state.resume_knobs == knobs(8192, 1024) and pre.state.active_schedule == "night"
    state = succeed(pre, opens - timedelta(minutes=1))
    during = decide(
        the_spec, state, long_prompt_window(state, the_spec, now=opens + timedelta(hours=2)), opens + timedelta(hours=2)
    )
    assert during.hold == HoldReason.SCHEDULE and during.state.observed is not None and during.state.regime
    closes = opens + timedelta(hours=8)
    after = quietly(the_spec, during.state, closes)
    assert after.action == DecisionAction.CHANGE and after.knobs == knobs(8192, 1024)
    assert after.source == KnobSource.SCHEDULE and after.state.resume_knobs is None
    assert after.state.active_schedule is None


TIERS = [
    {"name": "low", "match": {"maxRequestRate": 10}, "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 256}},
    {"name": "high", "match": {"minRequestRate": 10}, "knobs": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 512}},
]
CLOSES = T0.replace(day=2, hour=4)  # the night window's end, 06:00 in Berlin (CEST)


def at_rate(requests_per_second):
    """Long-prompt traffic at ``requests_per_second``: the token rates with it, so the length mix holds."""
    r = requests_per_second
    return {"request_rate": r, "prompt_tokens_rate": r * 4000, "generation_tokens_rate": r * 128}


def night_closes(the_spec, state, closing=None, **traffic):
    """The night preset live for 8 hours, with ``state``'s memory; half an hour of the long-prompt ``traffic``
    under it, then the window's close, its window that traffic changed by ``closing``."""
    state = state.model_copy(update={"current": status(16384, 512, since=CLOSES - timedelta(hours=8)).current})
    earlier = CLOSES - timedelta(minutes=30)
    during = decide(the_spec, state, long_prompt_window(state, the_spec, now=earlier, **traffic), earlier)
    assert during.hold == HoldReason.SCHEDULE, during.reason
    state = during.state
    window = long_prompt_window(state, the_spec, now=CLOSES, **{**traffic, **(closing or {})})
    return decide(the_spec, state, window, CLOSES)


def test_a_preset_window_closing_goes_to_the_tier_the_traffic_matches_now_not_back_to_the_evenings():
    """Evening traffic matched tier low; the morning's matches high. Back to low at 06:00 and to high a cooldown
    later would restart the pods twice where once does."""
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": TIERS}, schedules=[NIGHT])
    evening = status(resume_knobs=knobs(8192, 256))
    closed = night_closes(the_spec, evening, **at_rate(20.0))
    assert closed.action == DecisionAction.CHANGE and closed.source == KnobSource.SCHEDULE
    assert closed.knobs == knobs(4096, 512) and closed.state.resume_knobs is None
    assert closed.reason == "preset window closed: tier high matches the traffic now: tokens=4096 seqs=512"
    # the running and waiting requests a concurrency condition reads follow the knobs, here the preset's: a tier
    # matched where one took part is not trusted, and the way back is taken
    busy = {"name": "busy", "match": {"minConcurrency": 64}, "knobs": {"maxNumBatchedTokens": 2048,
                                                                        "maxNumSeqs": 128}}
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": [busy, *TIERS]}, schedules=[NIGHT])
    back = night_closes(the_spec, evening, **at_rate(20.0))
    assert back.knobs == knobs(8192, 256) and "concurrency" in back.reason
    assert back.reason.startswith("preset window closed: back to tokens=8192 seqs=256, the traffic policy resumes")


def test_a_preset_window_closing_goes_straight_to_the_config_measured_best_for_the_returning_regime():
    """2048 was measured best for long prompts; the night's preset ran them with ITL breaching. At the close the
    regime goes straight back to 2048, not to the 8192 of before the window and then, a cooldown later, on."""
    the_spec = spec(schedules=[NIGHT])
    state = learned_2048_for_long_prompts().model_copy(update={"resume_knobs": knobs(8192, 1024)})
    closed = night_closes(the_spec, state)
    assert closed.action == DecisionAction.CHANGE and closed.source == KnobSource.SCHEDULE
    assert closed.knobs == knobs(2048, 1024), closed.reason
    assert closed.reason.startswith(
        "preset window closed: tokens=2048 seqs=1024, measured best in regime r4/p4k/o128 (attainment"
    )


def test_a_preset_window_closing_on_the_config_it_keeps_works_out_adaptives_proposal_once(monkeypatch):
    """The close asks what the traffic policy would choose; when that keeps the config (here nothing measured best
    yet, and the config before the window was the preset's), the traffic policy goes on in the same evaluation
    with the proposal already worked out for the same window, memory and bounds."""
    calls = []
    propose = adaptive.propose
    monkeypatch.setattr(adaptive, "propose", lambda *args: calls.append(args) or propose(*args))
    closed = night_closes(spec(schedules=[NIGHT]), status(resume_knobs=knobs(16384, 512)))
    assert closed.state.resume_knobs is None and "regime r4/p4k/o128" in closed.reason, closed.reason
    assert len(calls) == 1


def test_a_preset_window_closing_goes_back_to_the_config_before_it_when_the_traffic_is_not_read_clearly():
    """A window the traffic policy would not act on (too few requests, a regime not yet one window old) tells
    nothing of what it would choose: the change goes back to the config before the window, as it always did."""
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": TIERS}, schedules=[NIGHT])
    evening = status(resume_knobs=knobs(8192, 256))
    few = night_closes(the_spec, evening, closing={"requests": 5.0}, **at_rate(20.0))
    assert few.action == DecisionAction.CHANGE and few.knobs == knobs(8192, 256)
    assert few.reason == ("preset window closed: back to tokens=8192 seqs=256, the traffic policy resumes (no usable "
                          "window to choose from: 5 requests in the window, fewer than minRequests 50)")
    new = night_closes(the_spec, evening, closing=at_rate(20.0), **at_rate(5.0))
    assert new.knobs == knobs(8192, 256) and "regime high (or its length mix) is new" in new.reason
    state = learned_2048_for_long_prompts().model_copy(update={"resume_knobs": knobs(8192, 1024)})
    stale = night_closes(spec(schedules=[NIGHT]), state, closing={"requests": 5.0})
    assert stale.knobs == knobs(8192, 1024) and "no usable window" in stale.reason


def test_a_preset_waits_while_prometheus_is_unreachable_at_either_end_of_its_window_and_a_scale_to_zero_does_not():
    the_spec = spec(schedules=[NIGHT])
    state = status()
    opens = T0.replace(hour=20)  # 22:00 in Berlin (CEST)
    blind = decide(the_spec, state, None, opens)
    assert blind.hold == HoldReason.NO_DATA and blind.recommendation == knobs(16384, 512)
    assert "Prometheus did not answer" in blind.reason and "waits for a fresh window" in blind.reason
    late = opens + timedelta(minutes=7)
    back = quietly(the_spec, blind.state, late)  # Prometheus answers again: the preset, late
    assert back.action == DecisionAction.CHANGE and back.knobs == knobs(16384, 512)
    state = succeed(back, late + timedelta(minutes=2))
    closes = opens + timedelta(hours=8)
    stale = dataclasses.replace(quiet(closes), data_age_seconds=600.0)
    held = decide(the_spec, state, stale, closes)
    assert held.hold == HoldReason.STALE and held.recommendation == knobs(8192, 1024)
    assert held.state.resume_knobs == knobs(8192, 1024)  # still known when the data comes back
    after = quietly(the_spec, held.state, closes + timedelta(minutes=1))
    assert after.action == DecisionAction.CHANGE and after.knobs == knobs(8192, 1024)
    # a Deployment scaled to zero shows no pod to the window, but the window is not blind: the preset is written
    none = Observation(window_start=opens - timedelta(minutes=5), window_end=opens, pods=0)
    scaled = decide(the_spec, status(), none, opens)
    assert scaled.action == DecisionAction.CHANGE and scaled.knobs == knobs(16384, 512)
    # nor is it missing data, which an alert is raised for after an hour: the hold says there are no pods
    idle = decide(spec(), status(), none, opens)
    assert idle.hold == HoldReason.NO_PODS and "scaled to zero" in idle.reason


def test_no_change_scheduled_or_not_starts_while_engines_sleep_and_both_do_once_a_window_finds_them_awake():
    # a traffic change the window calls for (the ITL breach above) and a preset whose window opens: while an
    # engine slept in the window, neither starts, since new pods would start awake
    state = warmed()
    asleep = long_prompt_window(state, SPEC, asleep_pods=1)
    held = decide(SPEC, state, asleep, T0)
    assert held.hold == HoldReason.ASLEEP and not held.changes
    assert held.reason.startswith("1 of 4 pods' vLLM engines slept in the window (sleep mode)")
    assert decide(SPEC, state, dataclasses.replace(asleep, asleep_pods=0), T0).action == DecisionAction.CHANGE
    the_spec = spec(schedules=[NIGHT])
    opens = T0.replace(hour=20)  # 22:00 in Berlin (CEST)
    window = long_prompt_window(status(), the_spec, now=opens, asleep_pods=4)
    assert decide(the_spec, status(), window, opens).hold == HoldReason.ASLEEP
    awake = decide(the_spec, status(), dataclasses.replace(window, asleep_pods=None), opens)
    assert awake.action == DecisionAction.CHANGE and awake.source == KnobSource.SCHEDULE


PEAK = {"name": "peak", "timeZone": "Europe/Berlin", "start": "0 13 * * 1-5", "end": "0 15 * * 1-5"}  # CEST: 11-13 UTC


def test_a_change_freeze_holds_traffic_changes_and_recommends_them_until_it_ends():
    the_spec = spec(rollout={"freezes": [PEAK]})
    state = warmed(the_spec)
    held = decide(the_spec, state, long_prompt_window(state, the_spec), T0)  # Wednesday 14:00 in Berlin
    assert held.hold == HoldReason.FREEZE and held.recommendation == knobs(2048, 1024)
    assert held.state.history[0].hold == "ChangeFreeze"
    assert "change freeze peak until 2024-05-01T13:00:00Z" in held.reason and "ITL p95 190ms" in held.reason
    assert held.state.last_rollout is None and held.state.recommendation.max_num_batched_tokens == 2048
    after = T0 + timedelta(hours=1)
    state = held.state
    done = decide(the_spec, state, long_prompt_window(state, the_spec, now=after), after)
    assert done.action == DecisionAction.CHANGE and done.knobs == knobs(2048, 1024), done.reason


def test_no_change_starts_so_shortly_before_a_freeze_that_it_would_still_be_rolling_then():
    state = warmed()
    # no rollout measured yet: a rollout is taken to need 5 minutes (after one, its time plus a margin, as a
    # schedule's pre-roll: schedule.rollout_lead_seconds)
    soon = spec(rollout={"freezes": [{"name": "release", "start": "4 12 * * *", "end": "0 13 * * *"}]})
    held = decide(soon, state, long_prompt_window(state, soon), T0)
    assert held.hold == HoldReason.FREEZE
    assert "opens at 2024-05-01T12:04:00Z, before a rollout started now would finish" in held.reason
    later = spec(rollout={"freezes": [{"name": "release", "start": "6 12 * * *", "end": "0 13 * * *"}]})
    assert decide(later, state, long_prompt_window(state, later), T0).action == DecisionAction.CHANGE


@pytest.mark.parametrize("strategy", ["Adaptive", "Tiers"])
def test_no_traffic_change_starts_so_shortly_before_a_preset_windows_pre_roll_that_it_would_still_be_rolling(
    strategy,
):
    """A traffic change at 12:00 would still be rolling (5 minutes, none measured yet) when the preset's pre-roll
    begins at 12:05: the preset would start late and be live after the window opens. It waits; the preset goes out
    on time."""
    tiers = [{"name": "long", "match": {"minPromptTokens": 2000}, "knobs": {"maxNumBatchedTokens": 2048,
                                                                           "maxNumSeqs": 256}}]
    traffic = {"strategy": "Tiers", "tiers": tiers} if strategy == "Tiers" else {}
    batch = {"name": "batch", "start": "10 12 * * *", "end": "0 18 * * *", "preRoll": "5m", "knobs": PRESET}
    the_spec = spec(traffic=traffic, schedules=[batch])
    state = warmed(the_spec)
    held = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert held.hold == HoldReason.SCHEDULE and held.recommendation is not None
    assert "batch's pre-roll begins at 2024-05-01T12:05:00Z, before a rollout started now would finish" in held.reason
    at = T0 + timedelta(minutes=5)
    preset = decide(the_spec, held.state, long_prompt_window(held.state, the_spec, now=at), at)
    assert preset.action == DecisionAction.CHANGE and preset.source == KnobSource.SCHEDULE
    assert preset.knobs == knobs(16384, 512)
    later = spec(traffic=traffic, schedules=[{**batch, "start": "11 12 * * *"}])
    assert decide(later, state, long_prompt_window(state, later), T0).source == KnobSource.TRAFFIC
    # a window whose opening keeps the config (its preset is the change's; bounds it fits) delays nothing
    target = held.recommendation
    kept = {"name": "kept", "start": "10 12 * * *", "end": "0 18 * * *", "preRoll": "5m"}
    for keeps in ({**kept, "knobs": target.model_dump(by_alias=True)},
                  {**kept, "bounds": {"maxNumBatchedTokens": {"max": target.max_num_batched_tokens}}}):
        fits = spec(traffic=traffic, schedules=[keeps])
        change = decide(fits, state, long_prompt_window(state, fits), T0)
        assert change.source == KnobSource.TRAFFIC and change.knobs == target, change.reason
        assert "until schedule" not in change.reason
    narrow = spec(traffic=traffic, schedules=[{**kept, "bounds": {"maxNumBatchedTokens": {"max": 1024}}}])
    assert decide(narrow, state, long_prompt_window(state, narrow), T0).hold == HoldReason.SCHEDULE


def test_a_traffic_changes_restarts_are_paid_for_by_the_time_until_the_next_preset_windows_pre_roll():
    """A config that serves 15 minutes before a preset replaces it must earn its restart in them, not over the
    regime's expected life (half an hour at least)."""
    batch = {"name": "batch", "start": "20 12 * * *", "end": "0 18 * * *", "preRoll": "5m", "knobs": PRESET}
    state = warmed()
    free = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    assert free.action == DecisionAction.CHANGE and "until schedule" not in free.reason
    the_spec = spec(schedules=[batch])
    soon = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert soon.action == DecisionAction.CHANGE and "over the 900s until schedule batch's pre-roll" in soon.reason
    cost = re.compile(r"minus restarts ([0-9.]+)%")
    assert float(cost.search(soon.reason)[1]) > 2 * float(cost.search(free.reason)[1])


def test_a_traffic_change_looks_for_the_next_preset_windows_pre_roll_once(monkeypatch):
    """The pre-roll that cuts the change's life (its price) is the one it must not still be rolling at (its
    guardrail): the same window for the same config, looked for once."""
    calls = []
    following = DECIDE.next_pre_roll
    monkeypatch.setattr(DECIDE, "next_pre_roll", lambda *args: calls.append(args) or following(*args))
    batch = {"name": "batch", "start": "20 12 * * *", "end": "0 18 * * *", "preRoll": "5m", "knobs": PRESET}
    the_spec = spec(schedules=[batch])
    state = warmed(the_spec)
    calls.clear()
    soon = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert soon.action == DecisionAction.CHANGE and "until schedule batch's pre-roll" in soon.reason
    assert len(calls) == 1


def test_a_rollback_that_only_removed_a_stuck_pod_does_not_shorten_the_lead_before_a_freeze():
    noon = {"name": "noon", "start": "40 12 * * *", "end": "0 18 * * *", "preRoll": "0s", "knobs": PRESET}
    release = {"name": "release", "start": "0 13 * * *", "end": "0 17 * * *"}
    the_spec = spec(schedules=[noon], rollout={"freezes": [release]})
    # a rolling restart of the fleet takes 20 minutes
    morning = T0.replace(hour=8)
    written = with_rollout(status(), morning, knobs(4096, 256), KnobSource.TRAFFIC, "r")
    state = rollout_succeeded(written, morning + timedelta(minutes=20))
    # the next change's surge pod found no GPU; its rollback removed the pending pod in 30 seconds
    later = T0.replace(hour=10)
    written = with_rollout(state, later, knobs(8192, 512), KnobSource.TRAFFIC, "r")
    blocked = rollout_blocked(written, later + timedelta(minutes=10), "0/6 nodes are available: Insufficient GPU")
    state = succeed(blocked, later + timedelta(minutes=10, seconds=30))
    # 20 minutes before the freeze: a restart started now would run in it
    held = quietly(the_spec, state, T0.replace(minute=40))
    assert held.hold == HoldReason.FREEZE and held.recommendation == knobs(16384, 512), held.reason
    assert "before a rollout started now would finish" in held.reason


def test_a_preset_window_opening_in_a_freeze_waits_for_its_end():
    freeze = {"name": "launch", "timeZone": "Europe/Berlin", "start": "0 21 * * *", "end": "0 23 * * *"}
    the_spec = spec(schedules=[NIGHT], rollout={"freezes": [freeze]})
    opens = T0.replace(hour=20)  # 22:00 in Berlin
    held = quietly(the_spec, status(), opens)
    assert held.hold == HoldReason.FREEZE and held.recommendation == knobs(16384, 512)
    assert "until 2024-05-01T21:00:00Z" in held.reason
    late = quietly(the_spec, held.state, opens + timedelta(hours=1))
    assert late.action == DecisionAction.CHANGE and late.source == KnobSource.SCHEDULE
    assert late.knobs == knobs(16384, 512)


def test_preset_window_waits_for_a_rollout_in_progress():
    the_spec = spec(schedules=[NIGHT])
    state = warmed()
    rolling = decide(SPEC, state, long_prompt_window(state, SPEC), T0).state
    decision = quietly(the_spec, rolling, T0.replace(hour=21))
    assert decision.hold == HoldReason.ROLLOUT_IN_PROGRESS


def test_override_window_runs_the_traffic_policy_inside_its_bounds():
    tight = {
        "name": "tight",
        "start": "0 11 * * *",
        "end": "0 13 * * *",
        "preRoll": "0s",
        "bounds": {"maxNumBatchedTokens": {"min": 256, "max": 2048}},
    }
    the_spec = spec(schedules=[tight])
    decision = quietly(the_spec, status(), T0)
    assert decision.action == DecisionAction.CHANGE and decision.knobs == knobs(2048, 1024)
    assert "outside its bounds" in decision.reason


def _judged_after(worse, minutes_held, minute_rolled_back, the_spec=SPEC, **slots):
    state = warmed(the_spec)
    change = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    done = T0 + timedelta(minutes=4)
    state = succeed(change, done)
    for minutes in minutes_held:
        at = done + timedelta(minutes=minutes, seconds=1)
        held = decide(the_spec, state, long_prompt_window(state, the_spec, now=at, **worse), at)
        assert held.action == DecisionAction.HOLD and held.state.last_rollout.verified_at is None, minutes
        state = held.state
    at = done + timedelta(minutes=minute_rolled_back, seconds=1)
    return decide(the_spec, state, long_prompt_window(state, the_spec, now=at, **worse), at, **slots)


def test_a_rollout_left_unjudged_by_windows_too_small_to_judge_stops_adding_to_its_price():
    """A quiet night after a change: no window has requests enough to judge it, each one's shortfall is noise. The
    restart's price (lostSeconds) takes them for as long as a judgement could wait, not all night."""
    state = warmed()
    done = T0 + timedelta(minutes=4)
    state = succeed(decide(SPEC, state, long_prompt_window(state, SPEC), T0), done)
    lost = []
    for minute in range(1, 8 * 60):
        at = done + timedelta(minutes=minute)
        window = long_prompt_window(state, SPEC, now=at, requests=20.0, ttft_within_slo=0.5)
        decision = decide(SPEC, state, window, at)
        assert decision.hold in (HoldReason.NOT_SETTLED, HoldReason.TOO_FEW_SAMPLES), decision.reason
        state = decision.state
        lost.append(state.last_rollout.lost_seconds)
    assert state.last_rollout.verified_at is None
    patience = 2 + 5 * (1 + 3 * 6)  # minutes: settle 2m, the window 5m, 18 more windows of a draining queue
    last = patience + 5 - 1  # the 5-minute window evaluated at minute patience + 5 starts at it: the one before adds
    assert lost[-1] == lost[last - 1] > lost[last - 2] > 0  # lost[i] is minute i + 1's


def test_a_regression_is_rolled_back_once_the_queue_has_drained_for_a_window():
    # settle 2m + one window 5m; then a drained queue (p95 0.1s) for one more window 5m
    decision = _judged_after({"itl_within_slo": 0.3, "itl_seconds": 0.3}, (7, 12), 17)
    assert decision.action == DecisionAction.ROLLBACK and decision.knobs == knobs(8192, 1024)
    assert decision.source == KnobSource.ROLLBACK and "regression" in decision.reason
    assert decision.state.last_rollout.to_knobs == knobs(8192, 1024)
    assert len(decision.state.rollout_times) == 2


def test_a_config_rolled_back_for_a_regression_is_remembered_by_the_window_that_judged_it():
    """Chosen by a prediction (or an older, better window), rolled back: the judged window takes the memory's place,
    or the same prediction would choose the config again after the cooldown, and roll it back again, all day."""
    rolled_back = _judged_after({"itl_within_slo": 0.3, "itl_seconds": 0.3}, (7, 12), 17)
    judged = next(m for m in rolled_back.state.measurements if m.knobs == knobs(2048, 1024))
    assert judged.abandoned == 1 and judged.itl_seconds == 0.3
    state = succeed(rolled_back, T0 + timedelta(minutes=25))
    for minute in range(26, 90):  # past the cooldown, the breach the first change answered
        at = T0 + timedelta(minutes=minute)
        decision = decide(SPEC, state, long_prompt_window(state, SPEC, now=at), at)
        state = decision.state
        if decision.action != DecisionAction.HOLD:
            break
    assert decision.action == DecisionAction.CHANGE and decision.knobs != knobs(2048, 1024), decision.reason


def test_a_regression_is_rolled_back_in_a_change_freeze():
    # the freeze opens at 12:10 UTC, after the change of 12:00 is complete; the regression is judged at 12:21
    freeze = {"name": "peak", "start": "10 12 * * *", "end": "0 18 * * *"}
    the_spec = spec(rollout={"freezes": [freeze]})
    decision = _judged_after({"itl_within_slo": 0.3, "itl_seconds": 0.3}, (7, 12), 17, the_spec)
    assert decision.action == DecisionAction.ROLLBACK and decision.knobs == knobs(8192, 1024)


def test_a_change_waits_for_a_rollout_slot_and_a_rollback_does_not():
    state = warmed()
    window = long_prompt_window(state, SPEC)
    holders = ("a/chat (rolling out)", "b/rag (waiting since 2024-05-01T11:50:00Z)")
    full = decide(SPEC, state, window, T0, slot_holders=holders, max_concurrent_rollouts=2)
    assert full.hold == HoldReason.NO_SLOT and full.recommendation == knobs(2048, 1024)
    assert ("waiting for a rollout slot, all 2 of --max-concurrent-rollouts held by a/chat (rolling out), b/rag "
            "(waiting since 2024-05-01T11:50:00Z): tokens=2048 seqs=1024 waits") in full.reason
    assert full.state.last_rollout is None
    many = decide(SPEC, state, window, T0, slot_holders=[f"n/t{i} (rolling out)" for i in range(8)],
                  max_concurrent_rollouts=8)
    assert "n/t4 (rolling out) and 3 more:" in many.reason and "n/t5" not in many.reason
    for free in ({"slot_holders": holders[:1], "max_concurrent_rollouts": 2}, {"slot_holders": holders * 3}):
        assert decide(SPEC, state, window, T0, **free).action == DecisionAction.CHANGE, free
    rollback = _judged_after({"itl_within_slo": 0.3, "itl_seconds": 0.3}, (7, 12), 17, slot_holders=holders[:1],
                             max_concurrent_rollouts=1)
    assert rollback.action == DecisionAction.ROLLBACK


def test_a_change_keeps_its_place_in_the_slot_queue_through_a_data_gap_and_leaves_it_with_any_other_decision():
    holders = {"slot_holders": ("a/chat (rolling out)",), "max_concurrent_rollouts": 1}
    state = warmed()
    assert state.slot_wait_since is None
    waits = decide(SPEC, state, long_prompt_window(state, SPEC), T0, **holders)
    assert waits.hold == HoldReason.NO_SLOT and waits.state.slot_wait_since == utc_timestamp(T0)
    at = T0 + timedelta(minutes=1)
    still = decide(SPEC, waits.state, long_prompt_window(waits.state, SPEC, now=at), at, **holders)
    assert still.hold == HoldReason.NO_SLOT and still.state.slot_wait_since == utc_timestamp(T0)  # its place kept
    gap = decide(SPEC, still.state, None, T0 + timedelta(minutes=2), **holders)
    assert gap.hold == HoldReason.NO_DATA and gap.state.slot_wait_since == utc_timestamp(T0)
    at = T0 + timedelta(minutes=3)
    back = decide(SPEC, gap.state, long_prompt_window(gap.state, SPEC, now=at), at, **holders)
    assert back.hold == HoldReason.NO_SLOT and back.state.slot_wait_since == utc_timestamp(T0)
    recommend = spec(mode="Recommend")
    for the_spec, slots, action in ((SPEC, {}, DecisionAction.CHANGE), (recommend, holders, DecisionAction.HOLD)):
        done = decide(the_spec, back.state, long_prompt_window(back.state, the_spec, now=at), at, **slots)
        assert done.action == action and done.hold != HoldReason.NO_SLOT and done.state.slot_wait_since is None


def test_a_drop_under_heavier_traffic_is_no_regression():
    # the same drop as above, judged under 10% more requests per pod than before the change (a diurnal ramp):
    # near capacity that costs attainment whatever the config, so it is no evidence against the change
    rate = 1.1 * 13.0
    heavier = {"itl_within_slo": 0.3, "itl_seconds": 0.3, "request_rate": rate, "requests": rate * 300}
    decision = _judged_after(heavier, (7, 12), 17)
    assert decision.action != DecisionAction.ROLLBACK and "regression" not in decision.reason


def test_a_regression_behind_a_standing_queue_is_judged_after_six_windows():
    backlog = {"itl_within_slo": 0.3, "itl_seconds": 0.3, "queue_seconds": 5.0}
    decision = _judged_after(backlog, (7, 12, 17, 41), 42)  # windows from settle 2m + 5m + six windows 30m
    assert decision.action == DecisionAction.ROLLBACK


def test_a_queue_still_shrinking_after_six_windows_is_the_restarts_not_a_regression():
    backlog = {"itl_within_slo": 0.3, "itl_seconds": 0.3, "queue_seconds": 5.0}
    state = warmed()
    state = succeed(decide(SPEC, state, long_prompt_window(state, SPEC), T0), T0 + timedelta(minutes=4))
    waiting = 40.0
    for minutes in (7, 12, 17, 41, 46, 70):  # past the six windows while the queue keeps shrinking: held
        waiting *= 0.8
        at = T0 + timedelta(minutes=4 + minutes, seconds=1)
        held = decide(SPEC, state, long_prompt_window(state, SPEC, now=at, waiting=waiting, **backlog), at)
        assert held.action == DecisionAction.HOLD and held.state.last_rollout.verified_at is None, minutes
        state = held.state
    at = T0 + timedelta(minutes=4 + 71, seconds=1)  # the queue stands still: now it is the config's
    decision = decide(SPEC, state, long_prompt_window(state, SPEC, now=at, waiting=waiting, **backlog), at)
    assert decision.action == DecisionAction.ROLLBACK


def test_no_change_while_the_queue_drains_and_one_once_it_stands():
    state = warmed()
    assert state.observed.waiting == 0.5
    queue = {"queue_seconds": 5.0}
    draining = decide(SPEC, state, long_prompt_window(state, SPEC, waiting=0.4, **queue), T0)
    assert draining.hold == HoldReason.NOT_SETTLED and "queue is still draining" in draining.reason
    standing = decide(SPEC, state, long_prompt_window(state, SPEC, waiting=0.5, **queue), T0)
    assert standing.action == DecisionAction.CHANGE


def test_a_budget_far_above_what_the_traffic_uses_goes_to_the_goal_in_one_rollout():
    # a window of the tuning benchmark (steady chat on four 70B TP4 replicas at vLLM's defaults): 170 requests run
    # at once, so 512 tokens and 512 sequences still run them all, in steps of sizes the window ran: the goal is
    # within the step limit, and one restart goes there instead of four halvings
    base = Measurement.model_validate({
        "regime": "r8/p512/o256", "maxNumBatchedTokens": 8192, "maxNumSeqs": 1024, "measuredAt": "2024-05-06T00:06:30Z",
        "requestRate": 11.22962962962963, "generationTokensPerSecond": 2876.7731481481483,
        "promptTokensPerSecond": 5767.441666666667, "meanPromptTokens": 508.7259234828496,
        "meanGenerationTokens": 255.20003298153034, "attainment": 7.305042407206068e-05, "ttftWithinSlo": 1.0,
        "itlWithinSlo": 0.881296733124374, "ttftSeconds": 0.24880345806882728, "itlSeconds": 0.1374549464642443,
        "queueSeconds": 0.285141065830721, "itlMeanSeconds": 0.058889380175974906,
        "stepTokensMean": 503.2676778581453, "stepTokensQuantile": 1608.0782222222226, "running": 170.02631578947367,
        "waiting": 0.3684210526315789, "kvCacheUsage": 0.26225566889876295, "preemptionsPerSecond": 0.0,
    })  # fmt: skip
    slo = SLO.model_validate({"ttft": {"seconds": 1.0}, "itl": {"seconds": 0.1}})
    bounds = Bounds.model_validate({"maxNumBatchedTokens": {"min": 256, "max": 32768}, "maxNumSeqs": {"max": 1024}})
    current = CurrentKnobs(
        max_num_batched_tokens=8192, max_num_seqs=1024, since="2024-05-06T00:00:00Z", source=KnobSource.INITIAL,
        from_defaults=True,
    )
    proposal = adaptive.propose(base, [], slo, bounds, current, 2.0, set())
    assert proposal.goal.knobs == knobs(512, 512)
    assert proposal.step is proposal.goal and proposal.rollouts == 1
    far = adaptive.propose(base.model_copy(update={"running": 2000.0}), [], slo, bounds, current, 2.0, set())
    assert far.step is not None and far.step.knobs.max_num_batched_tokens >= 1000 and far.rollouts > 1


def test_a_drop_within_window_noise_is_no_regression():
    # 0.2% of requests within target before, 0.02% after: no evidence either way, and nothing to roll back to
    state = warmed()
    change = decide(SPEC, state, long_prompt_window(state, SPEC, itl_within_slo=0.87), T0)
    assert change.action == DecisionAction.CHANGE and change.state.last_rollout.baseline_attainment < 0.01
    state = succeed(change, T0 + timedelta(minutes=4))
    at = T0 + timedelta(minutes=16)
    decision = decide(SPEC, state, long_prompt_window(state, SPEC, now=at, itl_within_slo=0.84), at)
    assert decision.state.last_rollout.verified_at is not None and decision.action != DecisionAction.ROLLBACK


def test_a_good_change_is_verified_and_not_rolled_back():
    state = warmed()
    change = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    state = succeed(change, T0 + timedelta(minutes=4))
    at = T0 + timedelta(minutes=16)
    better = long_prompt_window(
        state, SPEC, now=at, itl_within_slo=0.97, itl_seconds=0.09, step_tokens_quantile=4000.0
    )
    decision = decide(SPEC, state, better, at)
    assert decision.state.last_rollout.verified_at is not None and decision.action != DecisionAction.ROLLBACK


def test_failed_start_is_rolled_back_and_never_retried_under_this_generation():
    state = adopt_generation(warmed(), 3)
    change = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    failed = rollout_failed(change.state, T0 + timedelta(minutes=10), "CUDA out of memory", generation=3)
    assert failed.action == DecisionAction.ROLLBACK and failed.knobs == knobs(8192, 1024)
    assert failed.state.failed_configs[0].max_num_batched_tokens == 2048
    back = rollout_succeeded(failed.state, T0 + timedelta(minutes=14))
    assert back.current.knobs == knobs(8192, 1024) and back.current.source == KnobSource.ROLLBACK
    at = T0 + timedelta(minutes=40)
    again = decide(SPEC, back, long_prompt_window(back, SPEC, now=at), at)
    assert again.knobs != knobs(2048, 1024)
    assert adopt_generation(back, 4).failed_configs == []


def test_once_as_many_configs_failed_as_the_status_keeps_no_other_is_tried():
    """One more failure would push the oldest out of the status, and it could then be tried again: the changes are
    only recommended, with what to do, until the spec changes."""
    state = adopt_generation(warmed(), 3)
    failed = [FailedConfig(max_num_batched_tokens=16384 + 64 * i, max_num_seqs=8, reason="CUDA out of memory",
                           at="2024-05-01T11:00:00Z", generation=3) for i in range(FAILED_LIMIT)]
    for count, held in ((FAILED_LIMIT - 1, False), (FAILED_LIMIT, True)):
        tried = state.model_copy(update={"failed_configs": failed[:count]})
        decision = decide(SPEC, tried, long_prompt_window(tried, SPEC), T0)
        assert (decision.action == DecisionAction.HOLD) == held, decision.reason
        if held:
            assert decision.hold == HoldReason.NO_BETTER_CONFIG and "edit the spec" in decision.reason
            assert decision.recommendation is not None
    fresh = adopt_generation(state.model_copy(update={"failed_configs": failed}), 4)
    assert decide(SPEC, fresh, long_prompt_window(fresh, SPEC), T0).action == DecisionAction.CHANGE


def test_once_as_many_configs_failed_as_the_status_keeps_a_new_preset_waits_and_a_live_one_still_goes_back():
    """A preset never run could fail and push out the oldest failure (another window's preset, tried again at its
    next opening): it is only recommended. A window whose preset already runs still returns, when it closes, to the
    config that ran before it."""
    the_spec = spec(schedules=[NIGHT])
    failed = [FailedConfig(max_num_batched_tokens=2048 + 64 * i, max_num_seqs=8, reason="CUDA out of memory",
                           at="2024-05-01T11:00:00Z", generation=3) for i in range(FAILED_LIMIT)]
    opens = T0.replace(hour=20)  # 22:00 in Berlin (CEST)
    state = adopt_generation(status(), 3)
    held = quietly(the_spec, state.model_copy(update={"failed_configs": failed}), opens - timedelta(minutes=5))
    assert held.action == DecisionAction.HOLD and held.recommendation == knobs(16384, 512), held.reason
    pre = quietly(the_spec, state, opens - timedelta(minutes=5))
    assert pre.action == DecisionAction.CHANGE and pre.knobs == knobs(16384, 512)
    live = succeed(pre, opens - timedelta(minutes=1)).model_copy(update={"failed_configs": failed})
    after = quietly(the_spec, live, opens + timedelta(hours=8))
    assert after.action == DecisionAction.CHANGE and after.knobs == knobs(8192, 1024), after.reason

def test_a_rollback_that_fails_too_makes_its_config_current_and_is_not_retried():
    state = adopt_generation(warmed(), 3)
    change = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    back = rollout_failed(change.state, T0 + timedelta(minutes=10), "CUDA out of memory", generation=3)
    at = T0 + timedelta(minutes=20)
    stuck = rollout_failed(back.state, at, "pods not Ready (no GPU left)", generation=3)
    assert stuck.action == DecisionAction.HOLD and not stuck.changes
    # the template holds the rolled-back config and the Deployment keeps rolling it out: it is the current one
    assert stuck.state.current.knobs == knobs(8192, 1024) and stuck.state.current.source == KnobSource.ROLLBACK
    assert stuck.state.current.since == "2024-05-01T12:20:00Z"
    assert stuck.state.last_rollout.phase == "Failed" and len(stuck.state.failed_configs) == 1


def test_defaults_known_better_correct_the_current_knobs_without_a_cooldown():
    assumed = status().model_copy(update={"current": status().current.model_copy(
        update={"from_defaults": True, "defaults_table": "GPU memory unknown, >= 70 GiB assumed"})})
    state = defaults_resolved(warmed(state=assumed), knobs(2048, 256), "GPU with 48 GiB (< 70)")
    current = state.current
    assert current.knobs == knobs(2048, 256) and current.defaults_table == "GPU with 48 GiB (< 70)"
    assert current.source == KnobSource.INITIAL and current.since == assumed.current.since and current.from_defaults
    decision = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    assert decision.hold != HoldReason.COOLDOWN


def test_manual_change_is_adopted_and_respected_for_a_cooldown():
    state = manual_change_detected(warmed(), knobs(8192, 512), T0 - timedelta(minutes=8))
    assert state.current.source == KnobSource.MANUAL
    decision = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    assert decision.hold == HoldReason.COOLDOWN


def learned_2048_for_long_prompts():
    """A status that measured 2048 for long prompts three hours ago (13 requests/s) and learned it as the
    regime's optimum, with the knobs back at vLLM's defaults since (e.g. a person reset them)."""
    state = status(
        tokens=2048, since=T0 - timedelta(hours=5), regime="r4/p4k/o128", regime_since="2024-05-01T08:00:00Z"
    )
    good = long_prompt_window(
        state,
        SPEC,
        now=T0 - timedelta(hours=3),
        itl_seconds=0.06,
        itl_within_slo=0.99,
        step_tokens_quantile=2048.0,
        step_tokens_mean=1500.0,
        itl_mean_seconds=0.045,
    )
    state = decide(SPEC, state, good, T0 - timedelta(hours=3)).state
    assert state.learned[0].max_num_batched_tokens == 2048
    return state.model_copy(update={"current": status().current})


def test_a_returning_regime_goes_straight_back_to_its_learned_optimum():
    """Measured 2048 for long prompts earlier; back at 8192 with long prompts again, one jump past maxStepFactor."""
    state = learned_2048_for_long_prompts()
    decision = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    assert decision.knobs == knobs(2048, 1024) and "measured" in decision.reason


def test_a_config_measured_under_lighter_traffic_counts_only_as_the_models_prediction():
    """2048 measured for long prompts at 13 requests/s; now 20% more arrive (same regime): its numbers would
    over-promise (near capacity more traffic costs attainment whatever the config), so the model prices it."""
    state = learned_2048_for_long_prompts()
    rate = 13.0 * 1.2
    busier = long_prompt_window(
        state, SPEC, request_rate=rate, prompt_tokens_rate=rate * 4000, generation_tokens_rate=rate * 128
    )
    decision = decide(SPEC, state, busier, T0)
    assert decision.state.regime == "r4/p4k/o128"
    assert "tokens=2048 seqs=1024 measured" not in decision.reason and "predicted" in decision.reason
    assert decide(SPEC, state, long_prompt_window(state, SPEC), T0).knobs == knobs(2048, 1024)


def test_tiers_map_the_traffic_to_the_users_knobs():
    tiers = [
        Tier(name="long", match=TierMatch(min_prompt_tokens=2000), knobs=knobs(2048, 256)).model_dump(by_alias=True)
    ]
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": tiers})
    state = warmed(the_spec)
    assert state.regime == "long"
    decision = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert decision.knobs == knobs(2048, 256) and "tier long" in decision.reason
    short = dataclasses.replace(long_prompt_window(state, the_spec), mean_prompt_tokens=300.0)
    state = decide(the_spec, status(), short, T0 - timedelta(minutes=10)).state
    assert decide(the_spec, state, short, T0).hold == HoldReason.NO_TIER


def test_a_tier_in_force_holds_while_the_traffic_hovers_at_its_boundary():
    """Traffic at 10 requests per second, a little over or under, keeps the tier in force (its knobs run): a tier
    swap is a rolling restart, and swapping with every wobble spends the day's budget."""
    tiers = [
        Tier(name="low", match=TierMatch(max_request_rate=10), knobs=knobs(8192, 256)).model_dump(by_alias=True),
        Tier(name="high", match=TierMatch(min_request_rate=10), knobs=knobs(4096, 512)).model_dump(by_alias=True),
    ]
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": tiers})
    start = T0 - timedelta(minutes=10)
    state = status(8192, 256, since=start - timedelta(hours=2))  # low's knobs run
    state = decide(the_spec, state, long_prompt_window(state, the_spec, now=start, request_rate=9.8), start).state
    assert state.regime == "low"
    for minutes, rate in ((0, 10.2), (30, 9.9), (60, 10.3)):
        at = T0 + timedelta(minutes=minutes)
        decision = decide(the_spec, state, long_prompt_window(state, the_spec, now=at, request_rate=rate), at)
        assert decision.action == DecisionAction.HOLD and decision.state.regime == "low", decision.reason
        state = decision.state
    at = T0 + timedelta(minutes=90)
    clearly = decide(the_spec, state, long_prompt_window(state, the_spec, now=at, request_rate=12.0), at)
    assert clearly.state.regime == "high"
    # a tier matched while another's knobs run is not in force: a window of 10.5 after it is high's strictly
    held = decide(the_spec, status(4096, 512), long_prompt_window(status(4096, 512), the_spec, request_rate=10.5), T0)
    assert held.state.regime == "high"
    back = decide(the_spec, status(8192, 256, regime="high"),
                  long_prompt_window(status(8192, 256), the_spec, request_rate=9.5), T0)
    assert back.state.regime == "low" and back.action == DecisionAction.HOLD, back.reason


def test_every_tier_whose_knobs_run_holds_while_the_traffic_hovers_at_its_boundary():
    """Two tiers with the same knobs (long prompts, and quiet short-prompt traffic) both keep them running until
    the traffic is clearly out of the one it is in: the margin is the config's, whichever of the two the traffic
    matched, or traffic hovering at quiet's bound would swap the knobs with every wobble."""
    same = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256}
    tiers = [
        {"name": "long", "match": {"minPromptTokens": 2000}, "knobs": same},
        {"name": "quiet", "match": {"maxRequestRate": 10}, "knobs": same},
        {"name": "rest", "knobs": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 512}},
    ]
    the_spec = spec(traffic={"strategy": "Tiers", "tiers": tiers})

    def short(state, at, rate):
        return long_prompt_window(state, the_spec, now=at, request_rate=rate, prompt_tokens_rate=rate * 500,
                                  mean_prompt_tokens=500.0)

    start = T0 - timedelta(minutes=10)
    state = status(2048, 256, since=start - timedelta(hours=2))  # the shared knobs run
    state = decide(the_spec, state, short(state, start, 9.8), start).state
    assert state.regime == "quiet"
    for minutes, rate in ((0, 10.2), (30, 9.9), (60, 10.3)):
        at = T0 + timedelta(minutes=minutes)
        decision = decide(the_spec, state, short(state, at, rate), at)
        assert decision.action == DecisionAction.HOLD and decision.state.regime == "quiet", decision.reason
        state = decision.state
    at = T0 + timedelta(minutes=90)
    clearly = decide(the_spec, state, short(state, at, 12.0), at)
    assert clearly.state.regime == "rest"


def test_same_inputs_same_decision():
    state = warmed()
    window = long_prompt_window(state, SPEC)
    assert decide(SPEC, state, window, T0) == decide(SPEC, state, window, T0)


def test_a_rollouts_cost_is_measured_on_the_windows_while_it_runs():
    # no rollout measured yet: a regime six hours old pays for the estimated restart
    old = status(restart_cost_seconds=None, regime="r4/p4k/o128", regime_since="2024-05-01T06:00:00Z")
    state = warmed(state=old)
    change = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    baseline = change.state.last_rollout.baseline_attainment
    state = change.state
    for minute in (1, 2, 3):  # pods restarting: a queue builds, TTFT suffers
        at = T0 + timedelta(minutes=minute)
        window = long_prompt_window(state, SPEC, now=at, config=None, rollout_in_progress=True, ttft_within_slo=0.5)
        state = decide(SPEC, state, window, at).state
    lost = state.last_rollout.lost_seconds
    assert lost > 0 and lost <= 3 * 30 * baseline
    state = rollout_succeeded(state, T0 + timedelta(minutes=4))
    at = T0 + timedelta(minutes=16)
    state = decide(SPEC, state, long_prompt_window(state, SPEC, now=at, itl_within_slo=0.97), at).state
    assert state.last_rollout.verified_at is not None
    assert state.restart_cost_seconds == pytest.approx(lost / baseline)  # seconds of the whole goodput


def test_only_steady_windows_become_measurements():
    # a window that opened before its regime began mixes two kinds of traffic
    fresh = decide(SPEC, status(), long_prompt_window(status(), SPEC), T0)
    assert fresh.state.regime == "r4/p4k/o128" and fresh.state.measurements == []
    state = warmed()
    assert [m.knobs for m in state.measurements] == [] and state.regime_since is not None
    later = T0 + timedelta(minutes=6)
    change = decide(SPEC, state, long_prompt_window(state, SPEC, now=later), later)
    assert change.action == DecisionAction.CHANGE
    assert [m.knobs for m in change.state.measurements] == [knobs(8192, 1024)]
    # while a restart's queue drains (rollout done, not judged yet), windows are not the new config's measure
    state = succeed(change, later + timedelta(minutes=4))
    at = later + timedelta(minutes=11, seconds=1)
    draining = decide(SPEC, state, long_prompt_window(state, SPEC, now=at), at).state
    assert knobs(2048, 1024) not in [m.knobs for m in draining.measurements]
    at = later + timedelta(minutes=16)
    judged = decide(SPEC, draining, long_prompt_window(state, SPEC, now=at, itl_within_slo=0.96), at).state
    assert judged.last_rollout.verified_at is not None
    assert knobs(2048, 1024) in [m.knobs for m in judged.measurements]
    assert next(m for m in judged.measurements if m.knobs == knobs(8192, 1024)).abandoned == 1


PRESET = {"maxNumBatchedTokens": 16384, "maxNumSeqs": 512}


def _evaluated(the_spec, state, start, end, step, rollout=timedelta(seconds=80)):
    """Evaluate without traffic data every ``step`` from ``start`` until ``end``, each change taking ``rollout``:
    the changes made, and the status at the end."""
    changes, now = [], start
    while now < end:
        decision = quietly(the_spec, state, now)
        state = decision.state
        if decision.changes:
            changes.append(decision)
            state = rollout_succeeded(state, now + rollout)
        now += step
    return changes, state


def test_a_preset_stays_in_force_when_its_own_quick_rollout_shortens_the_pre_roll():
    # pre-rolled 5 minutes ahead (no rollout measured yet); the preset's 80 s rollout makes the pre-roll 140 s
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    start, minute = opens - timedelta(minutes=5), timedelta(minutes=1)
    changes, state = _evaluated(the_spec, status(), start, opens + timedelta(hours=1), minute)
    assert [c.knobs for c in changes] == [knobs(16384, 512)] and "pre-roll" in changes[0].reason
    assert state.rollout_times == ["2024-05-01T21:55:00Z"] and state.active_schedule == "night"


def test_a_preset_beneath_an_slo_window_rolls_out_in_its_pre_roll_once():
    # an SLO window of higher priority is open from 02:00 past the preset window's opening at 03:00: the preset
    # still rolls out in its pre-roll (5 minutes ahead), and its own 80 s rollout, which makes the pre-roll 140 s,
    # neither undoes nor redoes it before 03:00
    early = {"name": "early", "start": "0 3 * * *", "end": "0 6 * * *", "knobs": PRESET}
    report = {"name": "report", "priority": 5, "start": "0 2 * * *", "end": "30 3 * * *",
              "slo": {"ttft": {"seconds": 10}}}
    the_spec = spec(schedules=[early, report])
    start = T0.replace(hour=1, minute=50)
    changes, state = _evaluated(the_spec, status(), start, start + timedelta(hours=3), timedelta(minutes=1))
    assert [(c.knobs, c.state.rollout_times[-1]) for c in changes] == [
        (knobs(16384, 512), "2024-05-01T02:55:00Z")], [c.reason for c in changes]
    assert state.active_schedule == "early" and state.current.knobs == knobs(16384, 512)


def test_a_preset_kept_for_one_window_keeps_no_other_window_of_the_same_preset_in_force():
    # a morning preset window and a weekend one with the same preset: Wednesday's morning preset goes back at noon,
    # and comes again on Thursday morning (at 08:00: the 80 s rollouts make the pre-roll 140 s, less than the 5
    # minutes between evaluations), the weekend window in force only from Saturday
    morning = {"name": "morning", "start": "0 8 * * *", "end": "0 12 * * *", "knobs": PRESET}
    weekend = {"name": "weekend", "start": "0 0 * * 6", "end": "0 0 * * 1", "knobs": PRESET}
    the_spec = spec(schedules=[morning, weekend])
    start = T0.replace(hour=7)  # Wednesday 1 May 2024
    changes, state = _evaluated(the_spec, status(), start, start + timedelta(hours=30), timedelta(minutes=5))
    assert [(c.knobs, c.state.rollout_times[-1]) for c in changes] == [
        (knobs(16384, 512), "2024-05-01T07:55:00Z"), (knobs(8192, 1024), "2024-05-01T12:00:00Z"),
        (knobs(16384, 512), "2024-05-02T08:00:00Z"), (knobs(8192, 1024), "2024-05-02T12:00:00Z")], [
        c.reason for c in changes]
    assert state.active_schedule is None and state.preset_schedule is None


OTHER = {"maxNumBatchedTokens": 4096, "maxNumSeqs": 256}


@pytest.mark.parametrize("late_knobs", [PRESET, OTHER], ids=["same-preset", "other-preset"])
def test_a_preset_window_closing_within_the_rollout_lead_of_the_next_ones_pre_roll_keeps_its_preset_until_then(
    late_knobs,
):
    """The night closes at 02:00 and a late window opens at 02:04, its pre-roll (140 s, from the 80 s rollouts)
    beginning at 02:01:40: going back at 02:00 would still be rolling then, and the late preset go out right after,
    two restarts for a config live a minute. The night's preset stays until the late window takes over: nothing to
    do for the same preset, one rollout for another; the config before the night comes back at 06:00."""
    night = {"name": "night", "start": "0 22 * * *", "end": "0 2 * * *", "knobs": PRESET}
    late = {"name": "late", "start": "4 2 * * *", "end": "0 6 * * *", "knobs": late_knobs}
    the_spec = spec(schedules=[night, late])
    start = T0.replace(hour=21, minute=50)
    changes, state = _evaluated(the_spec, status(), start, start + timedelta(hours=9), timedelta(seconds=30))
    expected = [(knobs(16384, 512), "2024-05-01T21:55:00Z")]
    if late_knobs != PRESET:
        expected.append((knobs(4096, 256), "2024-05-02T02:02:00Z"))
    expected.append((knobs(8192, 1024), "2024-05-02T06:00:00Z"))
    assert [(c.knobs, c.state.rollout_times[-1]) for c in changes] == expected, [c.reason for c in changes]
    live = succeed(changes[0], T0.replace(hour=21, minute=56, second=20))  # an 80 s rollout: the lead is 140 s
    closed = quietly(the_spec, live, T0.replace(day=2, hour=2))
    assert closed.hold == HoldReason.SCHEDULE and closed.state.resume_knobs == knobs(8192, 1024)
    assert closed.reason == (
        "preset window closed, but schedule late's pre-roll begins at 2024-05-02T02:01:40Z, before a rollout started "
        "now would finish: tokens=16384 seqs=512 stays until then rather than tokens=8192 seqs=1024, which would be "
        "replaced as soon as it is live")


def test_a_preset_window_closing_goes_at_once_when_the_next_window_keeps_its_config_or_opens_past_the_lead():
    """The close waits only for a window that would replace the config it goes to, and only within the rollout
    lead (140 s): one whose preset is that config takes it over as it is, and one whose pre-roll begins at 02:07:40
    leaves it live for minutes."""
    night = {"name": "night", "start": "0 22 * * *", "end": "0 2 * * *", "knobs": PRESET}
    live = succeed(quietly(spec(schedules=[night]), status(), T0.replace(hour=21, minute=55)),
                   T0.replace(hour=21, minute=56, second=20))
    closes = T0.replace(day=2, hour=2)
    for late in ({"name": "late", "start": "4 2 * * *", "end": "0 6 * * *",
                  "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 1024}},
                 {"name": "late", "start": "10 2 * * *", "end": "0 6 * * *", "knobs": PRESET}):
        closed = quietly(spec(schedules=[night, late]), live, closes)
        assert closed.action == DecisionAction.CHANGE and closed.knobs == knobs(8192, 1024), closed.reason


def _night_live(the_spec, **fields):
    """The night preset live from 21:56:20 (an 80 s rollout: the lead is 140 s), then the status given ``fields``."""
    night = quietly(the_spec, status(), T0.replace(hour=21, minute=55))
    return succeed(night, T0.replace(hour=21, minute=56, second=20)).model_copy(update=fields)


_NIGHT = {"name": "night", "start": "0 22 * * *", "end": "0 2 * * *", "knobs": PRESET}
_LATE = {"name": "late", "start": "4 2 * * *", "end": "0 6 * * *", "knobs": OTHER}


def _failed(*configs):
    return [FailedConfig(max_num_batched_tokens=k.max_num_batched_tokens, max_num_seqs=k.max_num_seqs,
                         reason="CUDA out of memory", at="2024-05-01T12:00:00Z", generation=1) for k in configs]


@pytest.mark.parametrize("case", ["freeze", "failed", "failed-limit"])
def test_a_preset_window_closing_goes_at_once_when_the_next_windows_change_would_be_held(case):
    """The close waits for the late window (pre-roll from 02:01:40) only when that window's change goes out then:
    not in a change freeze from 02:03 (in force from 02:00:40, the lead before it) to 05:00, not for a preset that
    failed to start, nor for any other once FAILED_LIMIT configs have. Waiting kept the night's preset until the
    freeze ended, or until the late window closed at 06:00."""
    freezes = [{"name": "release", "start": "3 2 * * *", "end": "0 5 * * *"}] if case == "freeze" else []
    the_spec = spec(schedules=[_NIGHT, _LATE], rollout={"freezes": freezes})
    failed = {"freeze": [], "failed": _failed(knobs(4096, 256)),
              "failed-limit": _failed(*(knobs(1024 + 64 * i, 64) for i in range(FAILED_LIMIT)))}[case]
    live = _night_live(the_spec, failed_configs=failed)
    closed = quietly(the_spec, live, T0.replace(day=2, hour=2))
    assert closed.action == DecisionAction.CHANGE and closed.knobs == knobs(8192, 1024), closed.reason
    assert closed.state.resume_knobs is None


@pytest.mark.parametrize("case", ["freeze", "failed-limit"])
def test_a_preset_window_closing_keeps_its_preset_for_a_next_window_of_the_same_preset_whatever_would_hold_a_change(
        case):
    """The late window's preset is the night's: its opening sends nothing out, so neither a change freeze over its
    pre-roll nor FAILED_LIMIT failed configs can hold it, and the close keeps the preset through the gap. Going back
    at the close restarted the pods, then the freeze held the preset back until 05:00, or the failed configs for
    good."""
    freezes = [{"name": "release", "start": "3 2 * * *", "end": "0 5 * * *"}] if case == "freeze" else []
    the_spec = spec(schedules=[_NIGHT, {**_LATE, "knobs": PRESET}], rollout={"freezes": freezes})
    failed = _failed(*(knobs(1024 + 64 * i, 64) for i in range(FAILED_LIMIT))) if case == "failed-limit" else []
    closed = quietly(the_spec, _night_live(the_spec, failed_configs=failed), T0.replace(day=2, hour=2))
    assert closed.action == DecisionAction.HOLD and closed.hold == HoldReason.SCHEDULE, closed.reason
    assert closed.state.current.knobs == knobs(16384, 512) and closed.state.resume_knobs == knobs(8192, 1024)


def test_a_preset_window_closing_goes_at_once_when_the_next_windows_bounds_hold_no_config():
    """A window of bounds that hold no config vLLM starts (budgets up to 2048 with chunked prefill off and 4096-token
    sequences) replaces nothing when it opens: the config before the night comes back at its close, where waiting
    for that window kept the night's preset past it, for good."""
    cap = {"name": "cap", "start": "4 2 * * *", "end": "0 6 * * *", "bounds": {"maxNumBatchedTokens": {"max": 2048}}}
    the_spec = spec(schedules=[_NIGHT, cap])
    live = _night_live(the_spec)
    current = live.current.model_copy(update={"chunked_prefill": False, "max_model_len": 4096})
    closed = quietly(the_spec, live.model_copy(update={"current": current}), T0.replace(day=2, hour=2))
    assert closed.action == DecisionAction.CHANGE and closed.knobs == knobs(8192, 1024), closed.reason


def test_a_preset_window_reopening_within_the_rollout_lead_keeps_its_preset_through_the_gap():
    """An hourly window closed for two minutes (:00 to :02), without a pre-roll, and rollouts that take 80 s: the
    preset stays through each gap, where going back and forth would restart the pods twice an hour."""
    hourly = {"name": "hourly", "start": "2 * * * *", "end": "0 * * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[hourly])
    start = T0.replace(hour=21, minute=50)
    changes, state = _evaluated(the_spec, status(), start, start + timedelta(hours=3), timedelta(minutes=1))
    assert [c.knobs for c in changes] == [knobs(16384, 512)], [c.reason for c in changes]
    assert state.current.knobs == knobs(16384, 512) and state.resume_knobs == knobs(8192, 1024)


def test_a_window_ending_in_the_repeated_hour_of_fall_back_rolls_out_twice_that_night():
    # 22:00 EDT to 01:30 EDT on 2024-11-03; the clocks then show 01:00-02:00 again (EST), without the window
    night = {"name": "night", "timeZone": "America/New_York", "start": "0 22 * * *", "end": "30 1 * * *",
             "preRoll": "0s", "knobs": PRESET}  # fmt: skip
    the_spec = spec(schedules=[night])
    start = T0.replace(month=11, day=3, hour=1, minute=30)  # 21:30 EDT on 2 November
    changes, state = _evaluated(the_spec, status(), start, start + timedelta(hours=7), timedelta(minutes=5))
    assert [c.knobs for c in changes] == [knobs(16384, 512), knobs(8192, 1024)]
    assert state.rollout_times == ["2024-11-03T02:00:00Z", "2024-11-03T05:30:00Z"]


def test_a_persons_change_in_a_preset_window_is_respected_for_the_cooldown():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    state = succeed(quietly(the_spec, status(), opens), opens + timedelta(minutes=2))
    state = manual_change_detected(state, knobs(4096, 256), opens + timedelta(minutes=30))
    held = quietly(the_spec, state, opens + timedelta(minutes=31))
    assert held.hold == HoldReason.COOLDOWN and held.knobs == knobs(4096, 256)
    assert "person" in held.reason and "840s left" in held.reason
    # the 15m cooldown is over and the window still open: the preset again, and the person's knobs after it
    again = quietly(the_spec, held.state, opens + timedelta(minutes=45))
    assert again.action == DecisionAction.CHANGE and again.knobs == knobs(16384, 512)
    assert again.state.resume_knobs == knobs(4096, 256)


def test_a_preset_whose_pods_found_no_room_waits_the_cooldown_before_it_is_tried_again():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    written = quietly(the_spec, status(), opens)
    blocked = rollout_blocked(written.state, opens + timedelta(minutes=10), "pod x cannot be scheduled")
    assert blocked.action == DecisionAction.ROLLBACK and blocked.state.failed_configs == []
    rolled_back = succeed(blocked, opens + timedelta(minutes=10, seconds=5))

    held = quietly(the_spec, rolled_back, opens + timedelta(minutes=11))
    assert held.hold == HoldReason.COOLDOWN and "could not start its pods" in held.reason and "840s left" in held.reason
    again = quietly(the_spec, held.state, opens + timedelta(minutes=25))  # the window does not give up
    assert again.action == DecisionAction.CHANGE and again.knobs == knobs(16384, 512)


def test_a_change_is_priced_with_the_requests_in_flight_that_pods_stopping_without_a_drain_cut():
    def priced(drain):
        state = warmed(state=strategy_seen(status(), 1, drain))
        assert state.drain_seconds == drain
        decision = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
        assert decision.action == DecisionAction.CHANGE, decision.reason
        return decision.reason, float(decision.reason.split("minus restarts ")[1].split("%")[0])

    drained, drained_cost = priced(45.0)  # requests run 20 / (13 / 4) = 6.2 s in a pod: all finish in 45 s
    assert "cut" not in drained and drained_cost == priced(None)[1]
    aborted, aborted_cost = priced(0.0)
    assert aborted_cost > drained_cost and "of it the requests in flight that stopping pods cut: drainSeconds 0" in (
        aborted)


def test_a_strategy_seen_without_a_drain_keeps_the_drain_recorded_and_none_forgets_it():
    read = strategy_seen(status(), 1, 0.0)
    assert strategy_seen(read, 2).drain_seconds == 0.0 and strategy_seen(read, 2).rollout_unavailable == 2
    assert strategy_seen(read, 1, None).drain_seconds is None and strategy_seen(read, 1, 45.0).drain_seconds == 45.0


def test_a_strategy_that_stops_a_pod_first_ends_the_wait_after_a_blocked_rollout():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    surging = strategy_seen(status(), 0)  # one replica, Kubernetes' default strategy: it only surges
    written = quietly(the_spec, surging, opens)
    blocked = rollout_blocked(written.state, opens + timedelta(minutes=10), "pod x cannot be scheduled")
    rolled_back = succeed(blocked, opens + timedelta(minutes=10, seconds=5))

    same = strategy_seen(rolled_back, 0)  # nothing changed: the wait stands
    assert same.blocked_at == rolled_back.blocked_at is not None
    assert quietly(the_spec, same, opens + timedelta(minutes=11)).hold == HoldReason.COOLDOWN
    # maxSurge 0, maxUnavailable 1: the old pod stops first and leaves its GPU to the new one
    fixed = strategy_seen(same, 1)
    assert fixed.blocked_at is None and fixed.rollout_unavailable == 1
    again = quietly(the_spec, fixed, opens + timedelta(minutes=11))
    assert again.action == DecisionAction.CHANGE and again.knobs == knobs(16384, 512), again.reason
    # fewer pods stopped at once (scaled in) does not end the wait
    wider = rolled_back.model_copy(update={"rollout_unavailable": 2})
    assert strategy_seen(wider, 1).blocked_at == rolled_back.blocked_at


def test_a_preset_written_while_the_deployment_is_at_zero_does_not_hold_back_the_window_closing():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    written = quietly(the_spec, status(), opens)
    assert written.action == DecisionAction.CHANGE
    closes = opens + timedelta(hours=8)
    # written into a Deployment scaled to zero: no pod to wait for, the next write is not a rollout on a rollout
    back = quietly(the_spec, rollout_unverified(written.state, opens + timedelta(seconds=20)), closes)
    assert back.action == DecisionAction.CHANGE and back.knobs == knobs(8192, 1024), back.reason
    assert quietly(the_spec, written.state, closes).hold == HoldReason.ROLLOUT_IN_PROGRESS


def test_changes_put_back_twice_in_a_day_are_only_recommended_until_the_spec_changes():
    # a GitOps tool syncs the Deployment back to its manifest a minute after each change of ours
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    before, opens = knobs(8192, 1024), T0.replace(hour=22)
    state = succeed(quietly(the_spec, status(), opens), opens + timedelta(minutes=2))
    state = manual_change_detected(state, before, opens + timedelta(minutes=3))
    assert state.reverts == ["2024-05-01T22:03:00Z"] and "undoing the operator's change" in state.history[0].reason
    again = quietly(the_spec, state, opens + timedelta(minutes=20))  # one revert: a person's cooldown only
    assert again.action == DecisionAction.CHANGE and again.knobs == knobs(16384, 512)
    state = manual_change_detected(again.state, before, opens + timedelta(minutes=21))  # reverted mid-rollout

    held = quietly(the_spec, state, opens + timedelta(minutes=40))
    assert held.hold == HoldReason.REVERTED and held.recommendation == knobs(16384, 512)
    assert "GitOps" in held.reason and "edit this VllmTuning's spec" in held.reason
    # where the API recorded who put them back, the hold names it rather than guess
    named = manual_change_detected(again.state, before, opens + timedelta(minutes=21), "argocd-controller")
    assert named.reverted_by == "argocd-controller"
    named_hold = quietly(the_spec, named, opens + timedelta(minutes=40))
    assert "argocd-controller put back what the operator changed" in named_hold.reason, named_hold.reason
    assert "GitOps?" not in named_hold.reason
    assert quietly(the_spec, held.state, opens + timedelta(hours=7)).hold == HoldReason.REVERTED
    # a new spec generation: the user has made the tool leave the args alone
    resumed = quietly(the_spec, adopt_generation(named_hold.state, 2), opens + timedelta(hours=7))
    assert resumed.action == DecisionAction.CHANGE and resumed.knobs == knobs(16384, 512)
    assert resumed.state.reverts == [] and resumed.state.reverted_by is None


def test_a_person_changing_other_knobs_or_reverts_a_day_apart_do_not_stop_changes():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(schedules=[night])
    opens = T0.replace(hour=22)
    state = succeed(quietly(the_spec, status(), opens), opens + timedelta(minutes=2))
    assert manual_change_detected(state, knobs(4096, 256), opens + timedelta(minutes=3)).reverts == []
    reverted = manual_change_detected(state, knobs(8192, 1024), opens + timedelta(minutes=3))
    # the person's knobs put back again by a second edit are not our change being undone
    assert manual_change_detected(reverted, knobs(8192, 1024), opens + timedelta(minutes=4)).reverts == [
        "2024-05-01T22:03:00Z"]
    a_day_later = reverted.model_copy(update={"reverts": ["2024-05-02T22:04:00Z", *reverted.reverts]})
    assert quietly(the_spec, a_day_later, opens + timedelta(days=1, minutes=20)).action == DecisionAction.CHANGE


def test_windows_are_remembered_again_after_a_person_superseded_a_rollout():
    state = warmed()
    change = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    state = manual_change_detected(change.state, knobs(4096, 256), T0 + timedelta(minutes=1))
    assert state.last_rollout.phase == RolloutPhase.FAILED and state.last_rollout.verified_at is None
    at = T0 + timedelta(minutes=10)
    decision = decide(SPEC, state, long_prompt_window(state, SPEC, now=at), at)
    assert decision.hold == HoldReason.COOLDOWN
    assert [m.knobs for m in decision.state.measurements][:1] == [knobs(4096, 256)]


def test_a_traffic_change_keeps_room_in_the_budget_for_its_rollback():
    the_spec = spec(rollout={"maxRolloutsPerDay": 3})
    state = warmed(the_spec, status(rollout_times=["2024-05-01T06:00:00Z", "2024-05-01T07:00:00Z"]))
    held = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    assert held.hold == HoldReason.BUDGET and "1 kept for its rollback" in held.reason
    # one more left: the change and its rollback both fit in the day
    state = warmed(the_spec, status(rollout_times=["2024-05-01T06:00:00Z"]))
    change = decide(the_spec, state, long_prompt_window(state, the_spec), T0)
    back = rollout_failed(change.state, T0 + timedelta(minutes=5), "CUDA out of memory", generation=1)
    assert back.action == DecisionAction.ROLLBACK and len(back.state.rollout_times) == 3


def test_a_limit_of_one_rollout_a_day_still_allows_a_change():
    the_spec = spec(rollout={"maxRolloutsPerDay": 1})
    state = warmed(the_spec)
    assert decide(the_spec, state, long_prompt_window(state, the_spec), T0).action == DecisionAction.CHANGE


def test_rollout_times_stay_within_the_status_cap_at_the_highest_limit():
    # a schedule change needs one rollout left, and its rollback comes on top: at most 288 + 1 in a day
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    the_spec = spec(rollout={"maxRolloutsPerDay": 288}, schedules=[night])
    opens = T0.replace(hour=22)
    times = [utc_timestamp(opens - timedelta(minutes=4 * n)) for n in range(287, 0, -1)]
    change = quietly(the_spec, status(rollout_times=times), opens)
    back = rollout_failed(change.state, opens + timedelta(minutes=3), "CUDA out of memory", generation=1)
    assert len(back.state.rollout_times) == 289
    VllmTuningStatus.model_validate(back.state.model_dump(by_alias=True))  # within the CRD's maxItems


@pytest.mark.parametrize(
    "override", [{"slo": {"ttft": {"seconds": 10}}}, {"bounds": {"maxNumBatchedTokens": {"max": 4096}}}]
)
def test_a_window_that_only_overrides_the_slo_or_bounds_nested_in_a_preset_window_leaves_the_preset_live(override):
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "0s", "knobs": PRESET}
    report = {"name": "report-run", "priority": 5, "start": "0 2 * * *", "end": "0 3 * * *", "preRoll": "0s",
              **override}  # fmt: skip
    the_spec = spec(schedules=[night, report])
    start = T0.replace(hour=21)
    changes, _ = _evaluated(the_spec, status(), start, start + timedelta(hours=10), timedelta(minutes=30))
    # the preset at 22:00 and the day's knobs back at 06:00; not back at 02:00 and the preset again at 03:00
    assert [(c.knobs, c.state.rollout_times[-1]) for c in changes] == [
        (knobs(16384, 512), "2024-05-01T22:00:00Z"),
        (knobs(8192, 1024), "2024-05-02T06:00:00Z"),
    ]
    assert scheduled_rollouts(the_spec.schedules, status(), start, DAY_SECONDS) >= len(changes)
    # inside it the override is the window in force, the preset its knobs
    opened = succeed(quietly(the_spec, status(), T0.replace(hour=22)), T0.replace(hour=22, minute=2))
    inside = T0.replace(day=2, hour=2, minute=30)
    held = quietly(the_spec, opened, inside)
    assert held.hold == HoldReason.SCHEDULE and held.knobs == knobs(16384, 512)
    assert held.state.active_schedule == "report-run" and held.state.resume_knobs == knobs(8192, 1024)
    assert effective_slo(the_spec, held.state, inside) == (the_spec.schedules[1].slo or the_spec.slo)


def test_requests_refused_at_admission_are_misses_that_no_change_is_expected_to_let_in():
    # long prompts served within both targets at 4096 tokens, a fifth of them refused by vLLM's queue limit
    state = warmed(state=status(tokens=4096, seqs=256))
    served = {"itl_seconds": 0.04, "itl_within_slo": 0.999, "step_tokens_quantile": 3900.0}
    alone = decide(SPEC, state, long_prompt_window(state, SPEC, **served), T0)
    # vLLM prefills none of the refused fifth: the prompt tokens are the admitted requests'
    refused = decide(SPEC, state, long_prompt_window(state, SPEC, refused_rate=0.2 * 13.0,
                                                     prompt_tokens_rate=0.8 * 13.0 * 4000, **served), T0)
    measured, without = refused.state.measurements[-1], alone.state.measurements[-1]
    assert measured.refused_share == pytest.approx(0.2) and without.refused_share is None
    assert measured.attainment == pytest.approx(0.8 * without.attainment)
    assert refused.action == alone.action == DecisionAction.HOLD, refused.reason
    assert "20% of requests refused at admission by vLLM's queue limits" in refused.reason
    assert refused.state.observed.refused_requests_per_second == pytest.approx(2.6)


def test_a_change_after_which_vllm_refuses_most_requests_is_a_regression():
    decision = _judged_after({"refused_rate": 0.9 * 13.0}, (7, 12), 17)  # the same load, nine tenths refused
    assert decision.action == DecisionAction.ROLLBACK and "regression" in decision.reason


def test_a_window_with_refused_requests_still_gets_its_itl_fix_predicted_with_their_share_kept():
    state = warmed()
    alone = decide(SPEC, state, long_prompt_window(state, SPEC), T0)
    refused = decide(SPEC, state, long_prompt_window(state, SPEC, refused_rate=0.2 * 13.0,
                                                     prompt_tokens_rate=0.8 * 13.0 * 4000), T0)
    assert refused.action == alone.action == DecisionAction.CHANGE and refused.knobs == alone.knobs
    predicted = [int(re.search(r"ITL \d+ms, attainment (\d+)%", d.reason.split("predicted")[1])[1]) / 100
                 for d in (alone, refused)]
    assert predicted[1] == pytest.approx(0.8 * predicted[0], abs=0.01), (alone.reason, refused.reason)


@pytest.mark.parametrize("factor, seqs", [(2.0, 128), (1.9, 121), (1.5, 96)])
def test_a_step_factor_below_two_still_raises_max_num_seqs_as_far_as_one_step_goes(factor, seqs):
    """64 requests running and 30 waiting for a slot, TTFT breaching: the search raises max_num_seqs. Its grid holds
    powers of two, which a factor below 2 never reaches from 64 in one step: the step's own end is a candidate."""
    the_spec = spec(rollout={"maxStepFactor": factor, "minImprovementPercent": 0})
    state = status(tokens=8192, seqs=64)
    start = T0 - timedelta(minutes=10)
    busy = dict(running=64.0, waiting=30.0, ttft_seconds=3.0, ttft_within_slo=0.85, itl_seconds=0.05,
                itl_within_slo=0.999, queue_seconds=1.5, step_tokens_mean=4000.0, step_tokens_quantile=8000.0)
    state = decide(the_spec, state, long_prompt_window(state, the_spec, now=start, **busy), start).state
    decision = decide(the_spec, state, long_prompt_window(state, the_spec, **busy), T0)
    assert decision.action == DecisionAction.CHANGE and decision.knobs == knobs(8192, seqs), decision.reason


def test_rollout_times_keep_the_newest_within_the_status_cap_when_schedule_changes_fill_the_day():
    # a schedule change counts the last 23 hours: the rollouts of the 24th hour stay in the list, and with a high
    # budget the day's list would pass the CRD's 300 items (the status could then be neither written nor read)
    opens = T0.replace(hour=22)
    day = [utc_timestamp(opens - timedelta(hours=24) + timedelta(seconds=286 * (n + 1))) for n in range(300)]
    state = with_rollout(status(rollout_times=day), opens, knobs(16384, 512), KnobSource.SCHEDULE, "schedule night")
    assert len(state.rollout_times) == 300 and state.rollout_times[-1] == utc_timestamp(opens)
    VllmTuningStatus.model_validate(state.model_dump(by_alias=True))  # within the CRD's maxItems


def test_a_weekend_slo_whose_pre_roll_begins_during_the_nightly_presets_leaves_the_preset_running():
    # the nightly preset is pre-rolled 30 minutes ahead (a slow fleet); on Friday a weekend SLO of higher priority
    # from 22:00 enters its own pre-roll (the last rollout's 20 minutes and a margin) while the preset's runs: it says
    # nothing of the knobs, so the preset stays, as on Thursday, rather than being undone and redone at 22:00
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *", "preRoll": "30m", "knobs": PRESET}
    weekend = {"name": "weekend-slo", "priority": 5, "start": "0 22 * * 5", "end": "0 6 * * 1",
               "slo": {"ttft": {"seconds": 10}}}
    the_spec = spec(schedules=[night, weekend])
    friday = T0.replace(day=3, hour=21)  # 2024-05-03 is a Friday
    for day in (friday - timedelta(days=1), friday):
        state = status(since=day - timedelta(days=1)).model_copy(update={"rollout_seconds": 1200.0})
        changes, state = _evaluated(the_spec, state, day, day + timedelta(hours=2), timedelta(minutes=1))
        assert [(c.knobs, c.state.rollout_times[-1]) for c in changes] == [
            (knobs(16384, 512), utc_timestamp(day.replace(minute=30)))], [c.reason for c in changes]
