"""Every "not enough data" case holds, with its own reason."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_autotuner.api import SLO, LatencyTarget
from vllm_autotuner.api.status import Rollout, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy import HoldReason, decide, hold_reason
from vllm_autotuner.policy.observation import _NUMBERS, REQUIRED, SHARES

from .helpers import T0, knobs, long_prompt_window, spec, status

SPEC = spec()
STATE = status()


def reason_of(observation, state=STATE, now=T0):
    found = hold_reason(SPEC, SPEC.slo, state, observation, now)
    return found[0] if found else None


def test_a_usable_window_has_no_hold_reason():
    assert reason_of(long_prompt_window(STATE, SPEC)) is None


def test_no_observation():
    assert reason_of(None) == HoldReason.NO_DATA


def test_rollout_in_the_deployment_or_in_the_status_and_the_hold_says_whose():
    theirs = long_prompt_window(STATE, SPEC, rollout_in_progress=True)
    assert hold_reason(SPEC, SPEC.slo, STATE, theirs, T0) == (
        HoldReason.ROLLOUT_IN_PROGRESS, "a rollout of the Deployment the operator did not start is in progress (a "
        "person's change, an image update, a restart): no change until it completes")
    rolling = STATE.model_copy(
        update={
            "last_rollout": Rollout(
                from_knobs=knobs(8192, 1024),
                to_knobs=knobs(4096, 1024),
                source="Traffic",
                reason="r",
                started_at=utc_timestamp(T0),
                phase=RolloutPhase.IN_PROGRESS,
            )
        }
    )
    assert hold_reason(SPEC, SPEC.slo, rolling, long_prompt_window(rolling, SPEC), T0) == (
        HoldReason.ROLLOUT_IN_PROGRESS, "the operator's rollout to tokens=4096 seqs=1024 (traffic change at "
        "2024-05-01T12:00:00Z) is in progress: it is judged before any other change")


@pytest.mark.parametrize(("late", "age"), [(100, 0), (0, 100), (60, 31)])
def test_stale_when_query_time_plus_sample_age_exceeds_the_limit(late, age):
    # evaluationInterval 30s -> limit 90s
    window = long_prompt_window(STATE, SPEC, data_age_seconds=age)
    assert reason_of(window, now=T0 + timedelta(seconds=late)) == HoldReason.STALE
    assert reason_of(dataclasses.replace(window, data_age_seconds=0), now=T0 + timedelta(seconds=89)) is None


@pytest.mark.parametrize("config", [None, knobs(4096, 1024)])
def test_samples_under_another_or_several_configs(config):
    assert reason_of(long_prompt_window(STATE, SPEC, config=config)) == HoldReason.MIXED_CONFIG


def test_window_must_start_after_the_settle_time_and_be_full():
    young = status(since=T0 - timedelta(minutes=6))  # settled at T0-4m, window starts at T0-5m
    assert reason_of(long_prompt_window(young, SPEC), state=young) == HoldReason.NOT_SETTLED
    short = long_prompt_window(STATE, SPEC, window_start=T0 - timedelta(minutes=4))
    assert reason_of(short) == HoldReason.NOT_SETTLED


@pytest.mark.parametrize("before_window", [timedelta(minutes=-1), timedelta(0), timedelta(seconds=119)])
def test_a_pod_started_in_or_within_the_settle_time_before_the_window_holds(before_window):
    # a restart that is not a knob change (rollout restart, image bump, crash, scale-up): settleTime is 2m
    window = long_prompt_window(STATE, SPEC)
    restarted = dataclasses.replace(window, started_at=window.window_start - before_window)
    found = hold_reason(SPEC, SPEC.slo, STATE, restarted, T0)
    assert found is not None and found[0] == HoldReason.NOT_SETTLED
    assert utc_timestamp(restarted.started_at) in found[1]


@pytest.mark.parametrize("started_at", [None, T0 - timedelta(minutes=7), T0 - timedelta(hours=1)])
def test_pods_started_long_before_the_window_or_an_unknown_start_do_not_hold(started_at):
    assert reason_of(long_prompt_window(STATE, SPEC, started_at=started_at)) is None


def test_quantiles_for_another_slo():
    other = SLO(ttft=LatencyTarget(quantile=0.99, seconds=2.0))
    assert reason_of(long_prompt_window(STATE, SPEC, slo=other)) == HoldReason.OTHER_SLO


def test_too_few_requests():
    assert reason_of(long_prompt_window(STATE, SPEC, requests=49.0)) == HoldReason.TOO_FEW_SAMPLES
    assert reason_of(long_prompt_window(STATE, SPEC, requests=50.0)) is None


@pytest.mark.parametrize("name", _NUMBERS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_nan_infinite_or_negative_numbers(name, bad):
    window = long_prompt_window(STATE, SPEC, **{name: bad})
    assert reason_of(window) in (HoldReason.INVALID, HoldReason.STALE)


@pytest.mark.parametrize("name", SHARES)
def test_a_share_above_one_is_invalid_and_one_is_not(name):
    # a KV-cache usage of 1.4 (0.7 summed over a pod scraped by two jobs) or a share within target above 1 (buckets
    # that disagree) measures nothing: acted on, the traffic model would take it for a full cache or no misses
    found = hold_reason(SPEC, SPEC.slo, STATE, long_prompt_window(STATE, SPEC, **{name: 1.4}), T0)
    assert found is not None and found[0] == HoldReason.INVALID
    assert found[1].startswith(f"{name} is 1.4, above 1, which a share cannot be") and "labelMatchers" in found[1]
    assert reason_of(long_prompt_window(STATE, SPEC, **{name: 1.0})) is None
    state = decide(
        SPEC, STATE, long_prompt_window(STATE, SPEC, now=T0 - timedelta(minutes=10)), T0 - timedelta(minutes=10)
    ).state
    decision = decide(SPEC, state, long_prompt_window(STATE, SPEC, **{name: 1.4}), T0)
    assert not decision.changes and decision.hold == HoldReason.INVALID


@pytest.mark.parametrize("name", REQUIRED)
def test_missing_required_numbers(name):
    assert reason_of(long_prompt_window(STATE, SPEC, **{name: None})) == HoldReason.NO_DATA


def test_unknown_current_config():
    assert reason_of(long_prompt_window(STATE, SPEC), state=STATE.model_copy(update={"current": None})) == (
        HoldReason.UNKNOWN_CONFIG
    )


BAD = st.sampled_from([math.nan, math.inf, -math.inf, -5.0, None])


@given(
    field=st.sampled_from(_NUMBERS),
    value=BAD,
    other=st.sampled_from(["rollout", "mixed", "stale", "few", "none"]),
)
def test_unusable_windows_never_change_anything(field, value, other):
    """Whatever makes the window unusable, and however bad the traffic it shows, decide holds."""
    window = long_prompt_window(STATE, SPEC)
    window = {
        "rollout": dataclasses.replace(window, rollout_in_progress=True),
        "mixed": dataclasses.replace(window, config=None),
        "stale": dataclasses.replace(window, data_age_seconds=10_000.0),
        "few": dataclasses.replace(window, requests=1.0),
        "none": window,
    }[other]
    if other == "none" and (value is not None or field in REQUIRED):
        window = dataclasses.replace(window, **{field: value})
    elif other == "none":
        window = None
    # one usable window first, so the regime is old enough to act on if the second were usable
    state = decide(
        SPEC, STATE, long_prompt_window(STATE, SPEC, now=T0 - timedelta(minutes=10)), T0 - timedelta(minutes=10)
    ).state
    decision = decide(SPEC, state, window, T0)
    assert not decision.changes
    assert decision.hold is not None and decision.reason
