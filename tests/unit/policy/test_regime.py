"""Regime names, hysteresis at bin edges, and tier matching."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from vllm_autotuner.api import Tier, TierMatch
from vllm_autotuner.policy.regime import Regime, classify, matching_tier

from .helpers import knobs, long_prompt_window, spec, status


def test_names_read_as_powers_of_two():
    assert classify(8.0, 4000, 128, None, None).name == "r8/p4k/o128"
    assert classify(0.3, 500, 260, None, "night").name == "r0.25/p512/o256@night"


@given(st.integers(-6, 12), st.integers(3, 17), st.integers(0, 15), st.none() | st.sampled_from(["night", "batch-2"]))
def test_names_parse_back(rate, prompt, output, window):
    regime = Regime(rate, prompt, output, window)
    assert Regime.parse(regime.name) == regime


def test_a_value_must_clearly_leave_a_bin():
    # 8 rps is bin 3; the edge to bin 4 is at 2**3.5 = 11.3; hysteresis keeps bin 3 up to 2**3.75 = 13.5
    assert classify(12.0, 4000, 128, None, None).rate_level == 4
    assert classify(12.0, 4000, 128, "r8/p4k/o128", None).rate_level == 3
    assert classify(14.0, 4000, 128, "r8/p4k/o128", None).rate_level == 4
    # another schedule window is another memory: no hysteresis across it
    assert classify(12.0, 4000, 128, "r8/p4k/o128@night", None).rate_level == 4


def test_tiers_first_match_wins_and_missing_numbers_fail_conditions_that_need_them():
    state = status()
    window = long_prompt_window(state, spec())  # 13 rps, 4000-token prompts, 20.5 concurrency
    tiers = [
        Tier(name="busy", match=TierMatch(min_request_rate=20), knobs=knobs(8192, 512)),
        Tier(name="long", match=TierMatch(min_prompt_tokens=2000), knobs=knobs(2048, 256)),
        Tier(name="any", knobs=knobs(4096, 256)),
    ]
    assert matching_tier(tiers, window).name == "long"
    crowded = [Tier(name="crowded", match=TierMatch(min_concurrency=10), knobs=knobs(2048, 256)), tiers[2]]
    assert matching_tier(crowded, window).name == "crowded"
    assert matching_tier(crowded, dataclasses.replace(window, waiting=None)).name == "any"
    assert matching_tier(tiers[:2], dataclasses.replace(window, mean_prompt_tokens=500.0)) is None
