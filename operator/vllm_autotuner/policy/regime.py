"""Traffic regimes: a name for "this kind of traffic", so the policy can remember what it liked.

The best knobs depend on the load on each pod and on the length mix (long
prompts want a small token budget so decodes are not stalled behind
prefill chunks; many short requests want concurrency). A regime is the
request rate per pod, the mean prompt length and the mean output length,
each rounded to a power of two: ``r8/p4k/o128`` is about 8 requests per
second per pod with 4k-token prompts and 128-token outputs. A bin is kept
until the value is clearly in another (hysteresis), so traffic that
hovers at a boundary does not flap between regimes. Regimes measured
under a schedule window that overrides bounds or SLO get the window's
name as a suffix (``@night``): what was best under other targets is
another memory. Because a bin holds, the first windows of a shift from
chat to long prompts still carry chat's name while their mean lengths climb
(``mix_moved`` tells them apart): they mix two populations, and neither what
they measure nor what the model extrapolates from them belongs to either.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from vllm_autotuner.api import ObservedTraffic, Tier, TierMatch
from vllm_autotuner.policy.observation import Observation

#: How far past a bin's edge (in powers of two) a value must go to leave it.
HYSTERESIS = 0.25
#: Relative move of the mean prompt or output length from one usable window to the next past which the length mix
#: counts as changing, on top of its sampling noise.
MIX_SHIFT = 0.1
#: Sampling noise of the difference of two mean lengths, in multiples of one over the square root of the window's
#: requests: three standard errors (request lengths spread about as widely as their mean, and each of the two means
#: has its own error), rarely passed by chance.
MIX_NOISE = 4.0
_LEVELS = {"r": (-6, 12), "p": (3, 17), "o": (0, 15)}
_NAME = re.compile(r"^r([0-9.]+k?)/p([0-9.]+k?)/o([0-9.]+k?)(@.+)?$")


def _label(level: int) -> str:
    value = 2.0**level
    if value >= 1024:
        return f"{value / 1024:g}k"
    return f"{value:g}"


def _level(label: str) -> int:
    value = float(label[:-1]) * 1024 if label.endswith("k") else float(label)
    return round(math.log2(value))


@dataclass(frozen=True)
class Regime:
    """Load and length mix as powers of two: request rate per pod, prompt tokens, output tokens."""

    rate_level: int
    prompt_level: int
    output_level: int
    window: str | None = None
    """Name of the schedule window whose bounds or SLO override the spec's."""

    @property
    def name(self) -> str:
        suffix = f"@{self.window}" if self.window else ""
        return f"r{_label(self.rate_level)}/p{_label(self.prompt_level)}/o{_label(self.output_level)}{suffix}"

    @classmethod
    def parse(cls, name: str | None) -> Regime | None:
        """The regime a name stands for; None for a tier's name or no name."""
        match = _NAME.match(name or "")
        if match is None:
            return None
        rate, prompt, output, suffix = match.groups()
        return cls(_level(rate), _level(prompt), _level(output), suffix[1:] if suffix else None)


def _bin(kind: str, value: float, previous: int | None) -> int:
    low, high = _LEVELS[kind]
    exact = math.log2(value) if value > 0 else float(low)
    if previous is not None and abs(exact - previous) < 0.5 + HYSTERESIS:
        return previous
    return max(low, min(high, round(exact)))


def classify(
    request_rate_per_pod: float, mean_prompt: float, mean_output: float, previous: str | None, window: str | None
) -> Regime:
    """The regime of a window, keeping the previous regime's bins unless the traffic clearly left them."""
    before = Regime.parse(previous)
    same_window = before is not None and before.window == window
    return Regime(
        rate_level=_bin("r", request_rate_per_pod, before.rate_level if same_window and before else None),
        prompt_level=_bin("p", mean_prompt, before.prompt_level if same_window and before else None),
        output_level=_bin("o", mean_output, before.output_level if same_window and before else None),
        window=window,
    )


def mix_moved(before: ObservedTraffic | None, observation: Observation) -> bool:
    """Whether the length mix is changing: moving within the window, or since the last usable one (``before``, the
    status's ``observed``), by more than chance explains.

    vLLM counts a request's prompt tokens when its prefill ends and its
    lengths (the means) when it finishes, so while the mix changes the prompt
    tokens per finished request part from the mean prompt of the finished
    ones (refused requests left out: vLLM prefills none): new requests are
    still running. That shows a change in its first
    window, before the finished requests (and the regime's name) do. The
    window's means are compared with the last window's as well. The
    allowance is MIX_SHIFT plus MIX_NOISE over the square root of the
    window's requests (at 50 requests 67%, at 4,000 16%). Only the length mix
    counts: load moves within a regime all the time (bursts), and the model
    prices it.
    """
    requests = observation.requests
    if not requests:
        return False
    allowed = MIX_SHIFT + MIX_NOISE / math.sqrt(requests)
    pairs = []
    # requests refused at admission are in the rate, and never prefilled
    admitted = (observation.request_rate or 0.0) - (observation.refused_rate or 0.0)
    if admitted > 0 and observation.prompt_tokens_rate is not None:
        pairs.append((observation.prompt_tokens_rate / admitted, observation.mean_prompt_tokens))
    if before is not None:
        pairs.append((before.mean_prompt_tokens, observation.mean_prompt_tokens))
        pairs.append((before.mean_generation_tokens, observation.mean_generation_tokens))
    return any(old and new and max(old / new, new / old) - 1 > allowed for old, new in pairs)


def _within(value: float | None, low: float | None, high: float | None, margin: float) -> bool:
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low / margin) and (high is None or value < high * margin)


def tier_matches(match: TierMatch, observation: Observation, margin: float = 1.0) -> bool:
    """Whether every condition of a tier holds for the window, each bound widened by the factor ``margin`` (a
    missing number fails a condition that needs it)."""
    concurrency = None
    if observation.running is not None and observation.waiting is not None:
        concurrency = observation.running + observation.waiting
    return (
        _within(observation.request_rate, match.min_request_rate, match.max_request_rate, margin)
        and _within(concurrency, match.min_concurrency, match.max_concurrency, margin)
        and _within(observation.mean_prompt_tokens, match.min_prompt_tokens, match.max_prompt_tokens, margin)
    )


def matching_tier(tiers: list[Tier], observation: Observation, in_force: Collection[str]) -> Tier | None:
    """The first tier whose conditions hold, the tiers in force (``in_force``: those whose knobs run) held to
    their bounds widened by HYSTERESIS powers of two (a factor 1.19), as a regime's bin is left.

    Traffic that hovers at a boundary between two tiers would otherwise swap
    their knobs, a rolling restart each, every cooldown. The tiers are still
    tried in order, each other one strictly: traffic strictly in a tier
    tried before one in force goes to it, and traffic leaves the knobs in
    force for a tier after it only when clearly out of it, so the way up
    and the way down cross a boundary at different points. Every tier with
    the knobs that run is in force, not only the first of them: the margin
    keeps the config, and the traffic may be in any of them (long prompts
    and quiet hours in two tiers of the same knobs; with the margin on the
    first only, traffic hovering at the second's bound would swap the knobs
    each time it crossed). A tier matched by a window whose change never ran
    (held, or matched under a schedule's preset) is not in force, and gets
    no margin.
    """
    margin = 2.0**HYSTERESIS
    return next((tier for tier in tiers if tier_matches(tier.match, observation, margin if tier.name in in_force
                                                        else 1.0)), None)
