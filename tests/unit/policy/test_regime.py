"""Regime names, hysteresis at bin edges, and tier matching."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from vllm_autotuner.api import ObservedTraffic, Tier, TierMatch
from vllm_autotuner.policy.regime import HYSTERESIS, MIX_NOISE, MIX_SHIFT, Regime, classify, matching_tier, mix_moved

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


def _last(prompt: float, generation: float) -> ObservedTraffic:
    """The status's record of a previous window with these mean lengths."""
    stamp = "2026-03-02T12:00:00Z"
    return ObservedTraffic(
        window_start=stamp, window_end=stamp, pods=4, request_rate=13.0, prompt_tokens_per_second=13.0 * prompt,
        generation_tokens_per_second=13.0 * generation, mean_prompt_tokens=prompt, mean_generation_tokens=generation,
    )  # fmt: skip


@given(
    st.floats(16, 100_000), st.floats(1, 10_000), st.floats(1, 1e6), st.sampled_from(["prompt", "generation", "rate"])
)
def test_the_length_mix_moves_exactly_when_a_mean_leaves_its_allowance(prompt, generation, requests, which):
    state = status()
    window = long_prompt_window(
        state, spec(), requests=requests, mean_prompt_tokens=prompt, mean_generation_tokens=generation,
        prompt_tokens_rate=13.0 * prompt,
    )  # fmt: skip
    assert not mix_moved(_last(prompt, generation), window) and not mix_moved(None, window)
    allowed = MIX_SHIFT + MIX_NOISE / requests**0.5
    for factor, moved in ((1 + 0.99 * allowed, False), (1 + 1.01 * allowed, True), (1 / (1 + 1.01 * allowed), True)):
        if which == "prompt":  # the finished requests' prompts moved since the last window
            moved_prompt = prompt * factor
            changed = dataclasses.replace(
                window, mean_prompt_tokens=moved_prompt, prompt_tokens_rate=13.0 * moved_prompt
            )
        elif which == "generation":
            changed = dataclasses.replace(window, mean_generation_tokens=generation * factor)
        else:  # prefills of other lengths than the requests that finished in the window
            changed = dataclasses.replace(window, prompt_tokens_rate=13.0 * prompt * factor)
        assert mix_moved(_last(prompt, generation), changed) == moved, (factor, allowed)


def test_tiers_first_match_wins_and_missing_numbers_fail_conditions_that_need_them():
    state = status()
    window = long_prompt_window(state, spec())  # 13 rps, 4000-token prompts, 20.5 concurrency
    tiers = [
        Tier(name="busy", match=TierMatch(min_request_rate=20), knobs=knobs(8192, 512)),
        Tier(name="long", match=TierMatch(min_prompt_tokens=2000), knobs=knobs(2048, 256)),
        Tier(name="any", knobs=knobs(4096, 256)),
    ]
    assert matching_tier(tiers, window, ()).name == "long"
    crowded = [Tier(name="crowded", match=TierMatch(min_concurrency=10), knobs=knobs(2048, 256)), tiers[2]]
    assert matching_tier(crowded, window, ()).name == "crowded"
    assert matching_tier(crowded, dataclasses.replace(window, waiting=None), ()).name == "any"
    assert matching_tier(tiers[:2], dataclasses.replace(window, mean_prompt_tokens=500.0), ()) is None


def test_the_tier_in_force_holds_until_the_traffic_is_clearly_out_of_it():
    """Traffic hovering at the boundary between two tiers keeps the tier in force (else their knobs swap, a
    rolling restart each, every cooldown): the way up and the way down cross it at points HYSTERESIS powers of two
    apart. Tiers are still tried in order, the others strictly."""
    window = long_prompt_window(status(), spec())  # 13 rps, 20.5 running plus waiting
    tiers = [
        Tier(name="low", match=TierMatch(max_request_rate=10, max_concurrency=20), knobs=knobs(8192, 256)),
        Tier(name="high", match=TierMatch(min_request_rate=10), knobs=knobs(4096, 512)),
    ]
    margin = 2.0**HYSTERESIS
    at = dataclasses.replace(window, request_rate=10.3, running=10.0, waiting=0.0)
    assert matching_tier(tiers, at, ()).name == "high"
    assert matching_tier(tiers, at, {"low"}).name == "low"
    assert matching_tier(tiers, dataclasses.replace(at, request_rate=10 * margin * 0.99), {"low"}).name == "low"
    assert matching_tier(tiers, dataclasses.replace(at, request_rate=10 * margin), {"low"}).name == "high"
    assert matching_tier(tiers, dataclasses.replace(at, waiting=20 * margin - 10), {"low"}).name == "high"
    # down from high: low is tried first, strictly, so high's own margin below 10 is never reached
    below = dataclasses.replace(at, request_rate=9.7)
    assert matching_tier(tiers, below, {"high"}).name == "low"
    assert matching_tier(tiers, dataclasses.replace(below, waiting=15.0), {"high"}).name == "high"  # not in low
    # a tier tried before a catch-all in force takes over as soon as the traffic is in it, however narrow, and is
    # left only once the traffic is clearly out of it; one after a tier in force that is clearly left is no detour
    mid = Tier(name="mid", match=TierMatch(min_request_rate=10, max_request_rate=13), knobs=knobs(2048, 256))
    rest = Tier(name="rest", knobs=knobs(4096, 512))
    assert matching_tier([mid, rest], dataclasses.replace(at, request_rate=11.5), {"rest"}).name == "mid"
    assert matching_tier([mid, rest], dataclasses.replace(at, request_rate=13 * margin * 0.99), {"mid"}).name == "mid"
    assert matching_tier([mid, rest], dataclasses.replace(at, request_rate=13 * margin), {"mid"}).name == "rest"
    up = Tier(name="up", match=TierMatch(min_request_rate=12), knobs=knobs(2048, 128))
    assert matching_tier([tiers[0], up, rest], dataclasses.replace(at, request_rate=9.0), {"up"}).name == "low"
    # every tier with the knobs that run is in force, not only the first of them: the traffic in the second keeps
    # them until clearly out of it; a tier of other knobs tried before both still takes the traffic strictly in it
    quiet = Tier(name="quiet", match=TierMatch(max_request_rate=10), knobs=knobs(2048, 256))
    shared = [Tier(name="long", match=TierMatch(min_prompt_tokens=2000), knobs=quiet.knobs), quiet, rest]
    short = dataclasses.replace(at, request_rate=10 * margin * 0.99, mean_prompt_tokens=500.0)
    assert matching_tier(shared, short, {"long", "quiet"}).name == "quiet"
    assert matching_tier(shared, dataclasses.replace(short, request_rate=10 * margin), {"long", "quiet"}).name == "rest"
    assert matching_tier([tiers[0], *shared], dataclasses.replace(short, request_rate=9.0), {"long", "quiet"}).name == (
        "low")
