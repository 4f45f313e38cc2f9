"""Property tests of the guardrails: whatever the traffic, a change stays inside every rule."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_autotuner.api import (
    DecisionAction,
    FailedConfig,
    KnobSource,
    Knobs,
    LearnedOptimum,
    TimeWindow,
    VllmTuningSpec,
)
from vllm_autotuner.api.types import duration_seconds, utc_timestamp
from vllm_autotuner.knobs import startup_errors
from vllm_autotuner.policy import HoldReason, Observation, decide, rollout_failed, rollout_succeeded
from vllm_autotuner.policy.guardrails import in_bounds, step_range, within_step
from vllm_autotuner.policy.observation import stale_after

from .helpers import T0, long_prompt_window, quiet, spec, status

POSITIVE = st.floats(0.0, 1e5, allow_nan=False)
LATENCY = st.floats(0.001, 120.0)
SHARE = st.floats(0.0, 1.0)


@st.composite
def windows(draw, state, the_spec, now, nan=True):
    """A window under the current config with arbitrary numbers, some missing (and NaN when ``nan``)."""

    def maybe(strategy):
        return st.one_of(strategy, st.none(), *([st.just(math.nan)] if nan else []))

    rate = draw(st.floats(0.5, 200.0))
    # the lengths the counters and the histograms show agree, or the mix would be moving (a young regime holds)
    prompt, output = draw(st.floats(8, 16000)), draw(st.floats(1, 4000))
    return Observation(
        window_start=now - timedelta(minutes=5),
        window_end=now,
        config=state.current.knobs,
        pods=draw(st.integers(1, 16)),
        slo=the_spec.slo,
        data_age_seconds=draw(st.floats(0, 30)),
        requests=rate * 300,
        request_rate=rate,
        prompt_tokens_rate=rate * prompt,
        generation_tokens_rate=rate * output,
        ttft_seconds=draw(LATENCY),
        itl_seconds=draw(st.floats(0.001, 2.0)),
        e2e_seconds=draw(maybe(LATENCY)),
        queue_seconds=draw(maybe(LATENCY)),
        itl_mean_seconds=draw(maybe(st.floats(0.001, 2.0))),
        ttft_within_slo=draw(maybe(SHARE)),
        itl_within_slo=draw(maybe(SHARE)),
        running=draw(maybe(st.floats(0, 2048))),
        waiting=draw(maybe(st.floats(0, 5000))),
        kv_cache_usage=draw(maybe(SHARE)),
        preemption_rate=draw(maybe(st.floats(0, 100))),
        mean_prompt_tokens=prompt,
        mean_generation_tokens=output,
        step_tokens_mean=draw(maybe(st.floats(1, 65536))),
        step_tokens_quantile=draw(maybe(st.floats(1, 65536))),
        steps_per_second=draw(maybe(POSITIVE)),
    )


@st.composite
def setups(draw):
    tokens_min = draw(st.sampled_from([256, 512, 1024]))
    tokens_max = draw(st.sampled_from([2048, 8192, 32768]))
    seqs_min = draw(st.sampled_from([8, 64, 256]))
    seqs_max = draw(st.sampled_from([256, 512, 1024]))
    the_spec = spec(
        bounds={
            "maxNumBatchedTokens": {"min": tokens_min, "max": tokens_max},
            "maxNumSeqs": {"min": seqs_min, "max": seqs_max},
        },
        rollout={"maxStepFactor": draw(st.sampled_from([1.5, 2.0, 4.0])), "minImprovementPercent": 0},
        traffic={
            "strategy": draw(st.sampled_from(["Adaptive", "Adaptive", "Tiers"])),
            "tiers": [
                {
                    "name": "t",
                    "match": {"minPromptTokens": 1000},
                    "knobs": {  # a preset vLLM accepts (the spec refuses others), often outside the bounds
                        "maxNumBatchedTokens": (tier_tokens := draw(st.sampled_from([128, 4096, 65536]))),
                        "maxNumSeqs": min(draw(st.sampled_from([16, 128, 2048])), tier_tokens),
                    },
                }
            ],
        },
    )
    tokens = draw(st.sampled_from([256, 1024, 2048, 8192, 16384, 65536]))
    seqs = min(draw(st.sampled_from([8, 128, 256, 1024, 2048])), tokens)
    failed = [
        FailedConfig(max_num_batched_tokens=t, max_num_seqs=s, reason="oom", at=utc_timestamp(T0), generation=1)
        for t, s in draw(
            st.lists(
                st.tuples(st.sampled_from([1024, 2048, 4096, 16384]), st.sampled_from([128, 256, 1024])), max_size=6
            )
        )
        if s <= t
    ]
    # under Tiers, its one tier matched long ago: the first window that matches it may change the knobs at once
    matched = {"regime": "t", "regime_since": utc_timestamp(T0 - timedelta(days=1))}
    state = status(tokens=tokens, seqs=seqs, failed_configs=failed, observed_generation=1,
                   **(matched if the_spec.traffic.strategy == "Tiers" else {}))
    return the_spec, state


def check(change, the_spec, state, measured):
    assert in_bounds(change.knobs, the_spec.bounds)
    assert not startup_errors(change.knobs, state.current.max_model_len, state.current.chunked_prefill)
    assert all(
        (f.max_num_batched_tokens, f.max_num_seqs) != (change.knobs.max_num_batched_tokens, change.knobs.max_num_seqs)
        for f in state.failed_configs
    )
    outside = not in_bounds(state.current.knobs, the_spec.bounds)
    if change.source == KnobSource.TRAFFIC and not outside and the_spec.traffic.strategy == "Adaptive":
        # the window the change was decided on, as the policy remembers it: what it ran at once bounds the step
        key = (change.state.last_rollout.regime, state.current.knobs)
        base = next(m for m in change.state.measurements if (m.regime, m.knobs) == key)
        assert within_step(change.knobs, state.current.knobs, the_spec.rollout.max_step_factor, base.running) or (
            change.knobs in measured
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), data=st.data())
def test_no_change_ever_leaves_the_bounds_breaks_a_rule_or_retries_a_failure(setup, data):
    the_spec, state = setup
    earlier = T0 - timedelta(minutes=10)
    # windows without NaN, which holds every decision (``test_no_change_starts_blind...``): nearly all would hold
    for now in (earlier, T0):
        measured = {m.knobs for m in state.measurements}
        decision = decide(the_spec, state, data.draw(windows(state, the_spec, now, nan=False)), now)
        assert decision.reason
        if decision.changes:
            check(decision, the_spec, state, measured)
        else:
            assert decision.hold is not None
            assert decision.knobs is None or decision.state.history[0].hold == decision.hold  # `kubectl get` shows it
        state = decision.state


#: What decide is told from outside the tuning that holds a change, by the hold it gives.
OUTSIDE = {
    HoldReason.NO_SLOT: {"slot_holders": ["ns/other (rolling out)"], "max_concurrent_rollouts": 1},
    HoldReason.CONTROLLED: {"controlled_by": "InferenceService ns/llama"},
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), data=st.data(), waiting=st.booleans(), hold=st.sampled_from(sorted(OUTSIDE)))
def test_what_holds_from_outside_the_tuning_turns_a_change_into_a_hold_and_changes_no_other_decision(
        setup, data, waiting, hold):
    """Full rollout slots, or an object that controls the target, hold exactly the decisions that would be a
    Change, with it as the recommendation: the operator looks for the slots' holders only then, and a controlled
    target's recommendations are the changes it would make. Rollbacks of our own change are not held."""
    the_spec, state = setup
    earlier = T0 - timedelta(minutes=10)
    state = decide(the_spec, state, data.draw(windows(state, the_spec, earlier)), earlier).state
    if waiting:  # a change that already waits for a slot: its place is kept
        state = state.model_copy(update={"slot_wait_since": utc_timestamp(T0 - timedelta(minutes=5))})
    window = data.draw(st.one_of(windows(state, the_spec, T0), st.just(long_prompt_window(state, the_spec))))
    free = decide(the_spec, state, window, T0)
    held = decide(the_spec, state, window, T0, **OUTSIDE[hold])
    if free.action == DecisionAction.CHANGE:
        assert held.hold == hold and held.recommendation == free.knobs and not held.changes
        waits = state.slot_wait_since or utc_timestamp(T0) if hold == HoldReason.NO_SLOT else None
        assert held.state.slot_wait_since == waits and held.state.last_rollout == state.last_rollout
    else:
        assert held == free


#: Numbers of a window that Prometheus may answer NaN for.
MEASURED = ("request_rate", "ttft_seconds", "itl_seconds", "kv_cache_usage", "running", "step_tokens_mean")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), data=st.data(), blindness=st.sampled_from(["unreachable", "stale", "nan"]),
       preset=st.tuples(st.sampled_from([512, 4096, 16384]), st.sampled_from([64, 256, 512])))
def test_no_change_starts_blind_not_even_a_schedule_preset_which_waits_for_a_fresh_window(
        setup, data, blindness, preset):
    """Prometheus unreachable (no window), stale samples or NaN: whatever the traffic policy and a preset window
    open now would do, nothing changes; the preset a fresh but quiet window would roll out is the recommendation,
    and the hold says why."""
    the_spec, state = setup
    window = {"name": "w", "timeZone": "UTC", "start": "0 12 * * *", "end": "0 13 * * *",
              "knobs": {"maxNumBatchedTokens": preset[0], "maxNumSeqs": min(preset)}}
    the_spec = VllmTuningSpec.model_validate({**the_spec.model_dump(by_alias=True, exclude_none=True),
                                              "schedules": [window]})
    seen = data.draw(windows(state, the_spec, T0, nan=False))
    if blindness == "unreachable":
        blind, hold = None, HoldReason.NO_DATA
    elif blindness == "stale":
        old = stale_after(the_spec) + data.draw(st.floats(1.0, 1e5))
        blind, hold = dataclasses.replace(seen, data_age_seconds=old), HoldReason.STALE
    else:
        blind, hold = dataclasses.replace(seen, **{data.draw(st.sampled_from(MEASURED)): math.nan}), HoldReason.INVALID
    held = decide(the_spec, state, blind, T0)
    assert not held.changes
    sighted = decide(the_spec, state, quiet(T0), T0)
    if sighted.changes:
        assert sighted.source == KnobSource.SCHEDULE and held.hold == hold and held.recommendation == sighted.knobs
        assert "waits for a fresh window" in held.reason and sighted.reason in held.reason
    else:  # nothing to change seen either (the preset in force, the cooldown, ...): the same hold, or the blind one
        assert held.hold in (hold, sighted.hold)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), data=st.data(), rollout_minutes=st.integers(1, 12), fail_every=st.integers(2, 5),
       frozen_hours=st.sampled_from([None, (9, 17), (22, 2)]))
def test_a_day_of_random_traffic_respects_cooldown_budget_and_failures(
        setup, data, rollout_minutes, fail_every, frozen_hours):
    """Evaluate every 2 minutes for a day; rollouts take a while and some fail; there may be a change freeze (UTC
    hours). Check every rule on the way."""
    the_spec, state = setup
    if frozen_hours is not None:
        freeze = TimeWindow(name="f", start=f"0 {frozen_hours[0]} * * *", end=f"0 {frozen_hours[1]} * * *")
        the_spec = the_spec.model_copy(update={"rollout": the_spec.rollout.model_copy(update={"freezes": [freeze]})})

    def in_freeze(moment: datetime) -> bool:
        if frozen_hours is None:
            return False
        start, end = frozen_hours
        return start <= moment.hour < end if start < end else moment.hour >= start or moment.hour < end
    # the long-prompt window breaches ITL at large budgets, so the policy has reasons to move
    templates = [
        long_prompt_window(state, the_spec),
        *data.draw(st.lists(windows(state, the_spec, T0, nan=False), max_size=5)),
    ]
    cooldown = timedelta(seconds=duration_seconds(the_spec.rollout.cooldown))
    now, finished, starts, failed, changes = T0, None, [], set(), 0
    while now < T0 + timedelta(hours=24):
        rollout = state.last_rollout
        done_at = datetime.fromisoformat(rollout.started_at) + timedelta(minutes=rollout_minutes) if rollout else now
        if rollout is not None and rollout.phase == "InProgress" and now >= done_at:
            if rollout.source != KnobSource.ROLLBACK and changes % fail_every == 0:
                failed.add(rollout.to_knobs)
                decision = rollout_failed(state, now, "CUDA out of memory", generation=1)
                starts.append(now)
                # the change kept room for its rollback
                assert sum(1 for s in starts if now - s < timedelta(hours=24)) <= the_spec.rollout.max_rollouts_per_day
                state = decision.state
            else:
                state = rollout_succeeded(state, now)
            finished = now
        template = templates[int((now - T0).total_seconds() // 1800) % len(templates)]  # traffic changes every 30m
        window = dataclasses.replace(
            template, window_start=now - timedelta(minutes=5), window_end=now, config=state.current.knobs
        )
        decision = decide(the_spec, state, window, now)
        if decision.changes:
            changes += 1
            assert decision.knobs not in failed
            assert decision.source == KnobSource.ROLLBACK or not in_freeze(now), decision.reason
            check(decision, the_spec, state, {m.knobs for m in state.measurements})
            if decision.source == KnobSource.TRAFFIC and finished is not None:
                assert now - finished >= cooldown
            starts.append(now)
            assert sum(1 for s in starts if now - s < timedelta(hours=24)) <= the_spec.rollout.max_rollouts_per_day
        state = decision.state
        now += timedelta(minutes=2)


def test_a_step_goes_down_to_what_the_traffic_runs_and_at_most_the_factor_past_it():
    assert step_range(8192, 170.0, 2.0) == (85.0, 16384)
    assert step_range(256, 300.0, 2.0) == (128.0, 512)  # more running than the budget: the budget is the floor
    assert step_range(1024, None, 2.0) == (512.0, 2048)  # nothing measured: the factor either way
    here = Knobs(max_num_batched_tokens=8192, max_num_seqs=1024)
    goal = Knobs(max_num_batched_tokens=512, max_num_seqs=512)
    assert within_step(goal, here, 2.0, running=170.0)
    assert not within_step(goal, here, 2.0)
    assert not within_step(goal, here, 2.0, running=2000.0)  # 512 slots for 2,000 requests: past the factor
    assert not within_step(Knobs(max_num_batched_tokens=32768, max_num_seqs=1024), here, 2.0, running=170.0)


def test_restart_cost_grows_with_the_load_the_other_pods_must_carry():
    from vllm_autotuner.policy.guardrails import ASSUMED_UTILISATION, DEFAULT_RESTART_SECONDS, restart_cost_seconds

    state = status(restart_cost_seconds=None)
    light, busy, over = (restart_cost_seconds(state, 8, u, 2.0) for u in (0.5, 0.95, 1.0))
    assert light == pytest.approx(8 * 0.1 * DEFAULT_RESTART_SECONDS / 8)  # the other seven absorb the load
    assert busy > 10 * light and over > busy
    assert restart_cost_seconds(state, 2, 0.95, 2.0) > busy  # one of two pods out hurts more than one of eight
    # before any rollout was measured the fleet counts as busy
    assert restart_cost_seconds(state, 4, 0.3, 2.0) == restart_cost_seconds(state, 4, ASSUMED_UTILISATION, 2.0)
    # once measured, the measurement counts, but never below the estimate at the current load: rollouts measured
    # in the morning do not price a restart at the daily peak
    measured = state.model_copy(update={"restart_cost_seconds": 123.0})
    assert restart_cost_seconds(measured, 4, 0.5, 2.0) == 123.0
    assert restart_cost_seconds(measured, 4, 0.95, 2.0) == restart_cost_seconds(state, 4, 0.95, 2.0) > 123.0


def test_restart_cost_adds_the_requests_in_flight_that_pods_stopping_without_a_drain_cut():
    from vllm_autotuner.policy.guardrails import cut_seconds, restart_cost_seconds

    def cost(drain, in_flight, measured=123.0):
        return restart_cost_seconds(status(restart_cost_seconds=measured, drain_seconds=drain), 4, 0.5, 2.0, in_flight)

    # requests run 20 s in a pod on average: together the pods hold 20 s of the whole goodput in flight
    assert cost(None, 20.0) == cost(45.0, 0.0) == 123.0  # drain not known, or nothing in flight: nothing cut
    # vLLM aborting on SIGTERM loses all of it, on top of the measured cost, which never saw those requests
    assert cost(0.0, 20.0) == pytest.approx(123.0 + 20.0)
    assert cost(20.0, 20.0) == pytest.approx(123.0 + 20.0 / math.e)  # a drain as long as the mean request
    assert cost(45.0, 20.0) == pytest.approx(123.0 + 20.0 * math.exp(-45 / 20))
    drains = [cut_seconds(status(drain_seconds=d), 20.0) for d in (0.0, 5.0, 20.0, 45.0, 300.0)]
    assert drains == sorted(drains, reverse=True) and drains[-1] < 0.01


def test_the_time_a_request_runs_is_read_from_the_last_window_and_the_share_cut_from_it():
    from vllm_autotuner.api import ObservedTraffic
    from vllm_autotuner.policy.guardrails import cut_share, in_flight_seconds

    def window(running, pods=4, rate=13.0, refused=None):
        return ObservedTraffic(window_start="2024-05-01T12:00:00Z", window_end="2024-05-01T12:05:00Z", pods=pods,
                               request_rate=rate, prompt_tokens_per_second=0.0, generation_tokens_per_second=0.0,
                               running=running, refused_requests_per_second=refused)

    # 20 requests running in each of 4 pods, 13 ending a second in all: each runs 20 / (13 / 4) = 6.2 s
    assert in_flight_seconds(window(20.0)) == pytest.approx(20 * 4 / 13)
    # of 18 ending a second, 5 refused at admission: they never ran, and 13 a second leave the running ones
    assert in_flight_seconds(window(20.0, rate=18.0, refused=5.0)) == pytest.approx(20 * 4 / 13)
    assert in_flight_seconds(window(20.0, rate=5.0, refused=5.0)) == 0.0  # none ran to the end: not measured
    assert in_flight_seconds(None) == in_flight_seconds(window(None)) == in_flight_seconds(window(20.0, rate=0.0)) \
        == in_flight_seconds(window(20.0, pods=0)) == 0.0  # nothing measured
    assert cut_share(0.0, 6.0) == 1.0  # vLLM aborts them all
    assert cut_share(6.0, 6.0) == pytest.approx(1 / math.e)
    assert cut_share(18.0, 6.0) == pytest.approx(0.0498, abs=1e-4)  # three mean requests: 5%
    assert cut_share(None, 6.0) is None and cut_share(30.0, 0.0) is None  # not known


@given(drains=st.lists(st.floats(0, 600), min_size=2, max_size=2), in_flight=st.floats(0, 3600),
       measured=st.one_of(st.none(), st.floats(0, 3600)), utilisation=st.floats(0, 1.5), pods=st.integers(1, 64))
def test_a_longer_drain_never_makes_a_restart_dearer_nor_one_it_knows_cheaper_than_one_it_does_not(
        drains, in_flight, measured, utilisation, pods):
    from vllm_autotuner.policy.guardrails import restart_cost_seconds

    def cost(drain):
        state = status(restart_cost_seconds=measured, drain_seconds=drain)
        return restart_cost_seconds(state, pods, utilisation, 2.0, in_flight)

    short, long = sorted(drains)
    assert cost(None) <= cost(long) <= cost(short) <= cost(0.0) <= cost(None) + in_flight


def test_restart_cost_follows_the_pods_the_strategy_stops_at_once():
    from vllm_autotuner.policy.guardrails import DEFAULT_RESTART_SECONDS, restart_cost_seconds, restart_waves

    def cost(out, utilisation, measured=None):
        state = status(restart_cost_seconds=measured, rollout_unavailable=out)
        return restart_cost_seconds(state, 4, utilisation, 2.0)

    slower = 0.1 * DEFAULT_RESTART_SECONDS  # the others answer slower while they carry a stopped pod's share
    assert cost(None, 0.9) == cost(1, 0.9)  # not known: one at a time, as before the strategy was read
    assert cost(0, 0.9) == pytest.approx(slower) and slower < cost(1, 0.9)  # a surge keeps the capacity
    # at half load three pods of four carry the fourth's share, but nothing carries a Recreate's outage
    assert cost(1, 0.5, measured=1.0) == pytest.approx(slower)
    assert cost(2, 0.5, measured=1.0) == pytest.approx(slower)
    assert cost(4, 0.5, measured=1.0) > DEFAULT_RESTART_SECONDS
    assert restart_waves(status(rollout_unavailable=2), 4) == 2 and restart_waves(status(rollout_unavailable=2), 5) == 3
    assert restart_waves(status(rollout_unavailable=0), 4) == 4  # a surge-only update replaces one at a time


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), data=st.data())
def test_same_inputs_same_decision(setup, data):
    the_spec, state = setup
    window = data.draw(windows(state, the_spec, T0))
    first, second = decide(the_spec, state, window, T0), decide(the_spec, state, window, T0)
    assert first == second


def test_a_regimes_expected_life_is_its_mean_remaining_life_within_the_horizon():
    from vllm_autotuner.policy import guardrails

    def life(hours_lasted: float) -> float:
        since = T0 - timedelta(hours=hours_lasted)
        seen = status(regime="r4/p4k/o128", regime_since=since.isoformat(), learned=[learned("r2/p512/o256")])
        return guardrails.regime_life_seconds(seen, T0)

    assert life(0) == guardrails.MIN_REGIME_LIFE_SECONDS
    # young: it may well last hours, so more than the median remaining life (as long again)
    assert life(1) == pytest.approx(3600 * math.log(7)) and life(1) > 3600
    # old: the gain past the horizon does not count, so less than the horizon
    assert life(6) == pytest.approx(6 * 3600 * math.log(2)) and life(6) < guardrails.MAX_REGIME_LIFE_SECONDS
    assert life(0.5) < life(1) < life(6) < life(48) <= guardrails.MAX_REGIME_LIFE_SECONDS


def test_the_regime_in_force_when_the_operator_first_looked_is_not_taken_to_have_just_begun():
    from vllm_autotuner.policy import guardrails

    first = status(regime="r4/p4k/o128", regime_since=(T0 - timedelta(minutes=10)).isoformat())
    fresh = first.model_copy(update={"learned": [learned("r2/p512/o256")]})
    # just seen, its earlier age unknown within the six-hour horizon: half the horizon, and more as it lasts
    assert guardrails.regime_life_seconds(first, T0) > 3 * 3600
    assert guardrails.regime_life_seconds(first, T0) > guardrails.regime_life_seconds(fresh, T0)
    assert guardrails.regime_life_seconds(fresh, T0) == pytest.approx(600 * math.log(37))
    own = first.model_copy(update={"learned": [learned("r4/p4k/o128")]})
    assert guardrails.regime_life_seconds(own, T0) == guardrails.regime_life_seconds(first, T0)


def learned(regime: str) -> LearnedOptimum:
    return LearnedOptimum(regime=regime, max_num_batched_tokens=2048, max_num_seqs=256, goodput=1.0, measured_at="")

