"""Run one policy through one scenario: a static config, or the real ``decide`` loop in simulated time.

The adaptive run is the operator's loop without Kubernetes: every
``evaluationInterval`` it builds the Observation from the fleet's scrapes
(the window after the current config settled, as the operator's PromQL
does), calls ``decide``, patches the fleet on a Change or Rollback, and
reports the rollout's fate through the same lifecycle functions the
operator calls (``rollout_succeeded`` when every pod is Ready,
``rollout_failed`` when the deadline passes with a pod crash-looping).
Every request is scored against the SLO in force when it arrived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from vllm_autotuner.api import SLO, CurrentKnobs, KnobSource, Knobs, VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.api.types import duration_seconds, utc_timestamp
from vllm_autotuner.policy import (
    adopt_generation,
    decide,
    effective_slo,
    hold_reason,
    rollout_failed,
    rollout_succeeded,
    strategy_seen,
)
from vllm_autotuner.policy.model import slow_gaps_allowed
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.startup import check_startup, default_knobs

from bench.tuning.fleet import GRACE_SECONDS, Fleet, Outcomes, engine_config
from bench.tuning.observe import observe
from bench.tuning.scenarios import START, BenchScenario

#: Fleet clock resolution of the adaptive run (a scrape interval).
TICK = 15.0
#: Resolution of the timeline drawn for each run.
SAMPLE = 300.0
#: Time after the last arrival for in-flight requests to finish.
DRAIN = 600.0
GENERATION = 1


@dataclass
class PhaseScore:
    requests: int = 0
    met: int = 0
    good_tokens: float = 0.0
    timed_out: int = 0
    """Requests whose clients gave up waiting for a first token."""


@dataclass
class Sample:
    """One point of a run's timeline."""

    t: float
    request_rate: float
    ttft_p95: float
    itl_p95: float
    tokens: int
    seqs: int


@dataclass
class RunResult:
    """A policy's score on a scenario, per phase, with what it did."""

    key: str
    policy: str
    knobs: Knobs | None
    started: bool = True
    """False for a static config that fails start-up on the profile."""
    phases: dict[str, PhaseScore] = field(default_factory=dict)
    timeline: list[Sample] = field(default_factory=list)
    rollouts: int = 0
    failed_rollouts: int = 0
    failed_retried: int = 0
    """Rollouts to a config that had already failed to start (must stay 0)."""
    changes_on_held: int = 0
    """Traffic-driven changes on an observation decide must hold on (must stay 0)."""
    lost_requests: int = 0
    down_pod_seconds: float = 0.0
    changes: list[tuple[float, str, str]] = field(default_factory=list)
    """(time, config, reason) of every change and rollback."""


def itl_targets(spec: VllmTuningSpec) -> tuple[float, ...]:
    """Every ITL target of the spec: its SLO's and its schedules' (a fleet counts each request's gaps over each)."""
    slos = [spec.slo, *(s.slo for s in spec.schedules if s.slo is not None)]
    return tuple(sorted({slo.itl.seconds for slo in slos}))


def slo_in_force(spec: VllmTuningSpec, arrival: np.ndarray) -> tuple[list[SLO], np.ndarray]:
    """The SLOs of the scenario, and which of them was in force when each request arrived (schedule windows
    without pre-roll)."""
    unrolled = spec.model_copy(update={"schedules": [s.model_copy(update={"pre_roll": "0s"}) for s in spec.schedules]})
    minutes = int(math.ceil((arrival.max() if len(arrival) else 0) / 60)) + 1
    slos: list[SLO] = []
    which = np.empty(minutes, np.int64)
    for minute in range(minutes):
        slo = effective_slo(unrolled, VllmTuningStatus(), START + timedelta(minutes=minute))
        if slo not in slos:
            slos.append(slo)
        which[minute] = slos.index(slo)
    return slos, which[(arrival // 60).astype(np.int64)]


def score(
    scenario: BenchScenario, outcomes: Outcomes, arrival: np.ndarray, output: np.ndarray
) -> dict[str, PhaseScore]:
    """Requests, requests within both targets, and their output tokens, per phase of the scenario.

    A request meets the SLO when it finished, its TTFT is within the TTFT
    target and its own inter-token latency at the ITL quantile is within the
    ITL target (at most ``1 - quantile`` of its gaps longer: a stream that
    stalls behind long prefills misses it even when its mean gap is short).
    The decision core estimates this share from the token-level histogram
    (``policy.model.request_itl_share``).
    """
    slos, which = slo_in_force(scenario.spec, arrival)
    targets = itl_targets(scenario.spec)
    ttft_target = np.array([s.ttft.seconds for s in slos])[which]
    column = np.array([targets.index(s.itl.seconds) for s in slos])[which]
    allowed = slow_gaps_allowed(np.array([s.itl.quantile for s in slos])[which], output - 1)
    slow = outcomes.slow_gaps[np.arange(len(which)), column]
    with np.errstate(invalid="ignore"):
        met = outcomes.finished & (outcomes.ttft <= ttft_target) & (slow <= allowed)
    phases = {}
    for phase in scenario.traffic.phases:
        mask = (arrival >= phase.start) & (arrival < phase.end)
        phases[phase.name] = PhaseScore(
            int(mask.sum()), int((met & mask).sum()), float(output[met & mask].sum()),
            int((outcomes.timed_out & mask).sum()),
        )  # fmt: skip
    return phases


def _sample(fleet: Fleet, slo: SLO, now: float) -> Sample | None:
    window = fleet.window(now - SAMPLE, now)
    if window is None:
        return None
    knobs = fleet.target
    ttft = window.quantile("vllm:time_to_first_token_seconds", slo.ttft.quantile)
    itl = window.quantile("vllm:inter_token_latency_seconds", slo.itl.quantile)
    return Sample(
        now,
        window.counters["request_success"] / window.seconds,
        ttft if ttft is not None else math.nan,
        itl if itl is not None else math.nan,
        knobs.max_num_batched_tokens,
        knobs.max_num_seqs,
    )


def default_config(scenario: BenchScenario) -> Knobs:
    """vLLM's knobs when the flags are absent, for the scenario's GPU."""
    return default_knobs(get_profile(scenario.profile)).knobs


def run_static(scenario: BenchScenario, knobs: Knobs) -> RunResult:
    """The scenario with ``knobs`` all day: vllm_default and every grid point of best_static / phase_oracle."""
    result = RunResult(scenario.key, "static", knobs)
    profile = get_profile(scenario.profile)
    if not check_startup(profile, engine_config(knobs)).ok:
        result.started = False
        return result
    workload = scenario.traffic.generate(scenario.seed)
    fleet = Fleet(profile, knobs, scenario.replicas, workload, scenario.seed, keep=2,
                  itl_targets=itl_targets(scenario.spec))
    now, end = 0.0, scenario.traffic.duration + DRAIN
    while now < end:
        now += SAMPLE
        fleet.advance(now)
        sample = _sample(fleet, scenario.spec.slo, now)
        if sample is not None and now <= scenario.traffic.duration:
            result.timeline.append(sample)
    result.phases = score(scenario, fleet.outcomes, workload.arrival, workload.output_tokens)
    return result


def _initial_state(knobs: Knobs) -> VllmTuningStatus:
    current = CurrentKnobs(
        max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs,
        since=utc_timestamp(START), source=KnobSource.INITIAL, from_defaults=True,
    )  # fmt: skip
    # the fleet's strategy stops one pod at a time and kills it GRACE_SECONDS after, as the operator reads a template
    return strategy_seen(adopt_generation(VllmTuningStatus(current=current), GENERATION), 1, GRACE_SECONDS)


def run_adaptive(scenario: BenchScenario) -> RunResult:
    """The real decide loop on the fleet, starting from vLLM's defaults."""
    spec = scenario.spec
    start_knobs = default_config(scenario)
    result = RunResult(scenario.key, "adaptive", None)
    workload = scenario.traffic.generate(scenario.seed)
    window = duration_seconds(spec.traffic.window)
    evaluate = duration_seconds(spec.traffic.evaluation_interval)
    settle = duration_seconds(spec.rollout.settle_time)
    deadline = duration_seconds(spec.rollout.progress_deadline)
    fleet = Fleet(
        get_profile(scenario.profile), start_knobs, scenario.replicas, workload, scenario.seed,
        keep=int(max(window, SAMPLE) / TICK) + 2, itl_targets=itl_targets(spec),
    )  # fmt: skip
    state = _initial_state(start_knobs)
    failed: set[Knobs] = set()
    now, end = 0.0, scenario.traffic.duration + DRAIN
    while now < end:
        now += TICK
        fleet.advance(now)
        moment = START + timedelta(seconds=now)
        progress = fleet.progress()
        if progress is not None and progress.complete:
            state = rollout_succeeded(state, moment)
            fleet.finish_rollout()
        elif progress is not None and now - progress.progressed >= deadline:
            message = progress.crashing or "pods not Ready by the progress deadline"
            failed.add(progress.target)
            result.failed_rollouts += 1
            decision = rollout_failed(state, moment, message, GENERATION)
            state = decision.state
            if decision.changes:
                fleet.start_rollout(decision.knobs)
                result.rollouts += 1
            else:  # a rollback that failed too: nobody patches the Deployment any more
                fleet.finish_rollout()
            result.changes.append((now, str(decision.knobs), decision.reason))
        if now % SAMPLE == 0 and now <= scenario.traffic.duration:
            sample = _sample(fleet, spec.slo, now)
            if sample is not None:
                result.timeline.append(sample)
        if now % evaluate or now > scenario.traffic.duration:
            continue
        slo = effective_slo(spec, state, moment)
        assert state.current is not None
        settled = _seconds(state.current.since) + settle
        observation = observe(fleet, max(now - window, settled), now, slo, START) if settled < now else None
        decision = decide(spec, state, observation, moment)
        if decision.changes:
            held = hold_reason(spec, slo, state, observation, moment)
            if held is not None and decision.source == KnobSource.TRAFFIC:
                result.changes_on_held += 1
            if decision.knobs in failed:
                result.failed_retried += 1
            fleet.start_rollout(decision.knobs)
            result.rollouts += 1
            result.changes.append((now, str(decision.knobs), decision.reason))
        state = decision.state
    result.phases = score(scenario, fleet.outcomes, workload.arrival, workload.output_tokens)
    result.lost_requests = int(fleet.outcomes.lost.sum())
    result.down_pod_seconds = fleet.down_pod_seconds
    return result


def _seconds(timestamp: str) -> float:
    """Seconds since the scenario's start of an RFC 3339 time in the status."""
    return (datetime.fromisoformat(timestamp) - START).total_seconds()
