"""The ``hindsight`` run: phase_oracle's configs, reached as any policy has to reach them.

phase_oracle runs each phase's best grid config from the phase's first
second, for free: a bound no policy can approach, because a real one starts
under vLLM's defaults, has to measure traffic before it knows anything, and
pays for every change with a rolling restart. This run keeps phase_oracle's
foresight (it knows each phase's best grid config before the day starts) and
gives it only those handicaps: the fleet starts on vLLM's defaults, the first
change is made once the first observation window after the settle time is
complete (``settleTime + window``: the earliest moment ``decide`` can have a
measurement), every later one at the start of the phase it serves, and each
is the same rolling restart the adaptive run gets. Where hindsight scores
below a target, that target asks more than foresight of the grid gives a
policy that starts from the defaults.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from vllm_autotuner.api import Knobs
from vllm_autotuner.api.types import duration_seconds
from vllm_autotuner.sim.profiles import get_profile

from bench.tuning.fleet import Fleet
from bench.tuning.runner import DRAIN, SAMPLE, TICK, RunResult, _sample, default_config, itl_targets, score
from bench.tuning.scenarios import BenchScenario


def plan(scenario: BenchScenario, configs: Mapping[str, Knobs]) -> list[tuple[float, Knobs]]:
    """When hindsight changes to which config: ``configs`` names a config for each phase of the scenario.

    The first change waits for the first complete observation window; a
    phase whose config is already running needs no change, and of changes
    due at the same moment only the last is made.
    """
    spec = scenario.spec
    first = duration_seconds(spec.rollout.settle_time) + duration_seconds(spec.traffic.window)
    due: dict[float, Knobs] = {}
    for phase in scenario.traffic.phases:
        due[max(phase.start, first)] = configs[phase.name]
    changes, running = [], default_config(scenario)
    for at, knobs in sorted(due.items()):
        if knobs != running:
            changes.append((at, knobs))
            running = knobs
    return changes


def run_hindsight(scenario: BenchScenario, changes: list[tuple[float, Knobs]]) -> RunResult:
    """The scenario from vLLM's defaults, rolling out ``changes`` (from ``plan``) at their times.

    A change waits for the rollout before it to complete, as a Deployment
    patched mid-rollout would restart the pods it had just replaced.
    """
    result = RunResult(scenario.key, "hindsight", None)
    workload = scenario.traffic.generate(scenario.seed)
    fleet = Fleet(
        get_profile(scenario.profile), default_config(scenario), scenario.replicas, workload, scenario.seed,
        keep=int(SAMPLE / TICK) + 2, itl_targets=itl_targets(scenario.spec),
    )  # fmt: skip
    pending = deque(changes)
    now, end = 0.0, scenario.traffic.duration + DRAIN
    while now < end:
        now += TICK
        fleet.advance(now)
        progress = fleet.progress()
        if progress is not None and progress.complete:
            fleet.finish_rollout()
            progress = None
        if pending and now >= pending[0][0] and progress is None:
            _, knobs = pending.popleft()
            fleet.start_rollout(knobs)
            result.rollouts += 1
            result.changes.append((now, str(knobs), "the best grid config of the phase"))
        if now % SAMPLE == 0 and now <= scenario.traffic.duration:
            sample = _sample(fleet, scenario.spec.slo, now)
            if sample is not None:
                result.timeline.append(sample)
    result.phases = score(scenario, fleet.outcomes, workload.arrival, workload.output_tokens)
    result.lost_requests = int(fleet.outcomes.lost.sum())
    result.down_pod_seconds = fleet.down_pod_seconds
    return result
