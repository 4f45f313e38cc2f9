"""A simulated vLLM Deployment: replicas behind a Service, rolling restarts, and what Prometheus would see.

Each replica is the simulator's ``Engine``. Requests go round-robin to the
Ready pods, as a Service spreads connections. A change of the knobs is a
rolling update with ``maxSurge: 0, maxUnavailable: 1`` (a GPU pod cannot
surge without a spare GPU): one pod at a time stops receiving traffic, is
killed after a grace period (what it had not finished is lost), and its
replacement becomes Ready after the profile's start-up time (``torch.compile``
cold for a token budget the pod never ran) or crash-loops when the simulator's
start-up model refuses the config. The replacement runs on the GPU its
predecessor freed, so its engine keeps the pod's seed: the same speed factor
(GPUs of one type differ by a few percent, and at the knee a pod a few percent
slower queues for hours), whatever the config. Static runs and the adaptive
run so compare configs on the same hardware. ``window`` gives what Prometheus
holds of a window, as the operator's PromQL sums it: increases of counters
and histograms summed over the current pods, and every scrape in it (the
``Observation`` built from it is ``bench.tuning.observe``'s).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from vllm_autotuner.api import Knobs
from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.metricstate import HistogramSnapshot, MetricsSnapshot
from vllm_autotuner.sim.profiles import Profile
from vllm_autotuner.sim.startup import check_startup
from vllm_autotuner.sim.workload import Workload

#: Seconds a terminating pod keeps serving what it has before it is killed (terminationGracePeriodSeconds).
GRACE_SECONDS = 30.0
#: Age of the newest sample when the operator queries: about half a scrape interval.
SCRAPE_LAG_SECONDS = 7.5


class PodState(Enum):
    READY = "ready"
    TERMINATING = "terminating"
    STARTING = "starting"
    CRASHING = "crashing"


@dataclass
class Pod:
    """One replica: its knobs, its engine while it runs, and the scrapes of its metrics."""

    index: int
    knobs: Knobs
    state: PodState
    until: float = 0.0
    """When the current state ends (terminating, starting)."""
    engine: Engine | None = None
    offset: float = 0.0
    """Fleet time at which the engine's clock started."""
    compiled: set[int] = field(default_factory=set)
    """Token budgets this pod's node has compiled (a warm torch.compile cache)."""
    in_flight: dict[int, int] = field(default_factory=dict)
    """Engine request id -> workload index of what it has not finished."""
    scrapes: deque[tuple[float, MetricsSnapshot]] = field(default_factory=deque)


@dataclass
class Outcomes:
    """What happened to every request of the workload."""

    ttft: np.ndarray
    slow_gaps: np.ndarray
    """Per request (rows) and ITL target (columns, ``Fleet.itl_targets``): its inter-token gaps over the target."""
    finished: np.ndarray
    lost: np.ndarray
    """Killed with its pod during a rolling restart."""
    timed_out: np.ndarray
    """Aborted when its client gave up waiting for a first token (``Request.first_token_timeout``)."""


@dataclass(frozen=True)
class RolloutProgress:
    target: Knobs
    started: float
    progressed: float
    """When a new pod last became Ready (or the rollout started): the Deployment's progress deadline counts from it."""
    complete: bool
    crashing: str | None
    """The vLLM error of a crash-looping new pod, if any."""


def _sum(histograms: list[HistogramSnapshot]) -> HistogramSnapshot:
    first = histograms[0]
    cumulative = [sum(values) for values in zip(*(h.cumulative for h in histograms), strict=True)]
    return HistogramSnapshot(first.bounds, tuple(cumulative), sum(h.sum for h in histograms))


@dataclass(frozen=True)
class Window:
    """What Prometheus holds of the current pods over a window: increases summed over them, and every scrape."""

    seconds: float
    pods: int
    knobs: frozenset[Knobs]
    histograms: dict[str, HistogramSnapshot]
    counters: dict[str, float]
    scrapes: list[MetricsSnapshot]

    def quantile(self, histogram: str, q: float) -> float | None:
        """Prometheus's ``histogram_quantile`` of a histogram's increase; None when nothing was observed."""
        h = self.histograms[histogram]
        return h.quantile(q) if h.count else None


def engine_config(knobs: Knobs) -> EngineConfig:
    """The simulator's engine config for the two knobs (everything else at vLLM's defaults)."""
    return EngineConfig(max_num_batched_tokens=knobs.max_num_batched_tokens, max_num_seqs=knobs.max_num_seqs)


class Fleet:
    """The replicas of one Deployment running a workload under simulated time."""

    def __init__(
        self,
        profile: Profile,
        knobs: Knobs,
        replicas: int,
        workload: Workload,
        seed: int,
        keep: int,
        itl_targets: tuple[float, ...],
    ) -> None:
        self.profile = profile
        self.itl_targets = itl_targets
        """The ITL targets (s) each request's gaps are counted against: every SLO of the scenario."""
        self.workload = workload
        self.seed = seed
        self.keep = keep
        """Scrapes kept per pod (enough for the observation window)."""
        self.now = 0.0
        self.target = knobs
        self.rollout_started: float | None = None
        self.progressed = 0.0
        self.down_pod_seconds = 0.0
        """Pod-seconds out of service (terminating, starting or crash-looping): capacity lost to restarts."""
        n = len(workload)
        self.outcomes = Outcomes(
            ttft=np.full(n, math.nan),
            slow_gaps=np.zeros((n, len(itl_targets)), np.int64),
            finished=np.zeros(n, bool),
            lost=np.zeros(n, bool),
            timed_out=np.zeros(n, bool),
        )
        self._next = 0  # next workload index to route
        self._rr = 0
        self._arrival = workload.arrival
        self.pods = [Pod(i, knobs, PodState.STARTING, compiled={knobs.max_num_batched_tokens}) for i in range(replicas)]
        for pod in self.pods:
            self._start_engine(pod, 0.0)

    # ------------------------------------------------------------- rollouts

    def start_rollout(self, knobs: Knobs) -> None:
        """Patch the Deployment to ``knobs``: pods not running them are replaced one at a time."""
        self.target = knobs
        self.rollout_started = self.progressed = self.now

    def progress(self) -> RolloutProgress | None:
        """The rolling update in progress, or None when every pod runs the target and is Ready."""
        if self.rollout_started is None:
            return None
        complete = all(p.state == PodState.READY and p.knobs == self.target for p in self.pods)
        crashing = next((p for p in self.pods if p.state == PodState.CRASHING), None)
        error = None
        if crashing is not None:
            error = check_startup(self.profile, engine_config(crashing.knobs)).error
        return RolloutProgress(self.target, self.rollout_started, self.progressed, complete, error)

    def finish_rollout(self) -> None:
        self.rollout_started = None

    def _start_engine(self, pod: Pod, at: float) -> None:
        pod.engine = Engine(
            self.profile,
            engine_config(pod.knobs),
            seed=self.seed * 1000 + pod.index,
            slow_gap_seconds=self.itl_targets,
        )
        pod.offset = at
        pod.state = PodState.READY
        pod.scrapes.clear()

    def _kill(self, pod: Pod) -> None:
        for index in pod.in_flight.values():
            self.outcomes.lost[index] = True
        pod.in_flight.clear()
        pod.engine = None
        pod.scrapes.clear()

    def _transitions(self) -> None:
        """Move the rolling update along at ``now``: one pod out of service at a time."""
        now = self.now
        for pod in self.pods:
            if pod.state == PodState.CRASHING and pod.knobs != self.target:
                # rolled back: the crash-looping pod is replaced at once, it has nothing to drain
                pod.state, pod.until = PodState.TERMINATING, now
        for pod in self.pods:
            if pod.state == PodState.TERMINATING and now >= pod.until:
                self._kill(pod)
                pod.knobs = self.target
                outcome = check_startup(
                    self.profile,
                    engine_config(pod.knobs),
                    compile_cached=pod.knobs.max_num_batched_tokens in pod.compiled,
                )
                pod.state = PodState.STARTING if outcome.ok else PodState.CRASHING
                pod.until = now + outcome.seconds
            elif pod.state == PodState.STARTING and now >= pod.until:
                pod.compiled.add(pod.knobs.max_num_batched_tokens)
                self._start_engine(pod, pod.until)
                self.progressed = pod.until
        if any(p.state != PodState.READY for p in self.pods):
            return
        stale = next((p for p in self.pods if p.knobs != self.target), None)
        if stale is not None:
            stale.state, stale.until = PodState.TERMINATING, now + GRACE_SECONDS

    # -------------------------------------------------------------- serving

    def advance(self, until: float) -> None:
        """Route the arrivals before ``until`` to Ready pods and run every engine to ``until``."""
        self._transitions()
        serving = [p for p in self.pods if p.state == PodState.READY]
        end = int(np.searchsorted(self._arrival, until, side="left"))
        w = self.workload
        if serving:
            for index in range(self._next, end):
                pod = serving[self._rr % len(serving)]
                self._rr += 1
                assert pod.engine is not None
                rid = pod.engine.submit(w.request(index, float(w.arrival[index]) - pod.offset))
                pod.in_flight[rid] = index
            self._next = end
        outcomes = self.outcomes
        self.down_pod_seconds += (until - self.now) * (len(self.pods) - len(serving))
        for pod in self.pods:
            if pod.engine is None:
                continue
            for done in pod.engine.advance(until - pod.offset):
                index = pod.in_flight.pop(done.rid)
                outcomes.ttft[index] = done.ttft
                outcomes.slow_gaps[index] = done.slow_gaps
                outcomes.finished[index] = True
            for rid in pod.engine.timed_out:
                outcomes.timed_out[pod.in_flight.pop(rid)] = True
            pod.scrapes.append((until, pod.engine.snapshot()))
            while len(pod.scrapes) > self.keep:
                pod.scrapes.popleft()
        self.now = until

    # ------------------------------------------------------------ observing

    def current_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.engine is not None]

    def window(self, start: float, end: float) -> Window | None:
        """What Prometheus holds of ``[start, end]`` for the pods running now, or None without scrapes."""
        deltas = []
        for pod in self.current_pods():
            first = next((s for t, s in pod.scrapes if t >= start - 1e-6), None)
            if first is None or not pod.scrapes or pod.scrapes[-1][0] < end - 1e-6:
                continue
            deltas.append((pod, pod.scrapes[-1][1] - first, [s for t, s in pod.scrapes if t >= start - 1e-6]))
        if not deltas:
            return None
        return Window(
            seconds=end - start,
            pods=len(deltas),
            knobs=frozenset(pod.knobs for pod, _, _ in deltas),
            histograms={name: _sum([d.histograms[name] for _, d, _ in deltas]) for name in deltas[0][1].histograms},
            counters={name: sum(d.counters[name] for _, d, _ in deltas) for name in deltas[0][1].counters},
            scrapes=[s for _, _, series in deltas for s in series],
        )
