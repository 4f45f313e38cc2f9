"""What each benchmark pod serves: the steady state of a simulated vLLM engine, replayed.

Running one engine per pod in real time (as ``sim fleet`` does) is far too
heavy for a thousand pods on a small machine, and the operator never sees
engines anyway, only the series Prometheus scrapes. So every pod serves the
series of *one short simulation*: the engine simulator runs the pod's
traffic (a request mix at a request rate) under the pod's own knobs for
:data:`WARMUP_S` + :data:`MEASURED_S` simulated seconds, and the increase of
every counter and histogram bucket over the measured part, per second, is
what the pod has been adding ever since it started; the gauges stay at their
values at the end. Rendered by the simulator's vLLM exporter
(:class:`~vllm_autotuner.sim.metrics.VllmCollector`), each scrape has vLLM's
families, labels and buckets, and ``rate()`` over any window gives the
simulated steady state exactly. A pod that the operator restarts with other
knobs serves the simulation of the same traffic under the new knobs, so the
operator's changes have the effect the engine model predicts.

Simulations are cached per (traffic, engine config, GPU profile): a fleet of
a thousand pods with two kinds of traffic runs a handful of them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.metrics import ServerInfo, server_info
from vllm_autotuner.sim.metricstate import HistogramSnapshot, MetricsSnapshot
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.workload import MIXES, steady

WARMUP_S = 120.0
"""Simulated seconds before the measured part: the batch fills and the queue settles."""
MEASURED_S = 300.0
"""Simulated seconds whose increase per second each pod replays."""
SEED = 0


@dataclass(frozen=True)
class Traffic:
    """What one Deployment's pods serve: requests of a mix (``vllm_autotuner.sim.workload.MIXES``)
    at ``rate`` requests per second per pod."""

    mix: str
    rate: float

    def __str__(self) -> str:
        return f"{self.mix}@{self.rate:g}"

    @classmethod
    def parse(cls, text: str) -> Traffic:
        """The inverse of ``str``: ``chat@18`` is chat at 18 requests per second."""
        mix, _, rate = text.partition("@")
        if mix not in MIXES:
            raise ValueError(f"unknown mix {mix!r} in {text!r}; one of {', '.join(sorted(MIXES))}")
        return cls(mix, float(rate))


@dataclass(frozen=True)
class SteadyState:
    """Per-second increase of an engine's counters and histograms (with its gauges), and what its server states."""

    per_second: MetricsSnapshot
    info: ServerInfo

    def at(self, age: float) -> MetricsSnapshot:
        """The metrics of a pod that has served this traffic for ``age`` seconds."""
        return _scaled(self.per_second, age)


def _scaled(snapshot: MetricsSnapshot, factor: float) -> MetricsSnapshot:
    """Every counter and histogram times ``factor``; the gauges as they are."""
    return MetricsSnapshot(
        snapshot.time * factor,
        {name: value * factor for name, value in snapshot.counters.items()},
        {name: HistogramSnapshot(h.bounds, tuple(c * factor for c in h.cumulative), h.sum * factor)
         for name, h in snapshot.histograms.items()},
        snapshot.gauges,
    )


@functools.cache
def steady_state(traffic: Traffic, config: EngineConfig, profile: str) -> SteadyState:
    """Simulate ``traffic`` on one replica of ``profile`` running ``config`` (raises StartupError if it cannot start)."""
    engine = Engine(get_profile(profile), config, seed=SEED)
    hours = (WARMUP_S + MEASURED_S) / 3600
    for request in steady(traffic.rate, MIXES[traffic.mix], hours=hours).generate(
            SEED, engine.config.max_model_len).requests():
        engine.submit(request)
    engine.advance(WARMUP_S)
    before = engine.snapshot()
    engine.advance(WARMUP_S + MEASURED_S)
    increase = engine.snapshot() - before  # keeps the gauges at the end
    return SteadyState(_scaled(increase, 1 / MEASURED_S), server_info(engine, created=0.0))


def served_info(state: SteadyState, model_name: str, started: float) -> ServerInfo:
    """What a pod started at Unix time ``started`` states about itself."""
    return dataclasses.replace(state.info, model_name=model_name, created=started)
