"""The evaluation clock: no evaluation starts once stopping, a clock stepped back does not stall the tunings, and
the tunings' own series come and go with them."""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.evaluator import Evaluator
from vllm_autotuner.controller.kube import NotLeading
from vllm_autotuner.controller.metrics import ROLLOUT_OUTCOMES, OperatorMetrics


class Reconciler:
    """Records evaluations; with ``stop``, the first one sets it, as SIGTERM does in the middle of a tick."""

    class Observations:
        def forget(self) -> None:
            pass

    def __init__(self, stop: asyncio.Event | None = None) -> None:
        self.stop = stop
        self.evaluated: list[tuple[Any, float]] = []
        self.observations = self.Observations()

    def forget(self, key: Any) -> None:
        pass

    async def evaluate(self, key: Any, at: float) -> None:
        self.evaluated.append((key, at))
        if self.stop is not None:
            self.stop.set()


def evaluator(reconciler: Reconciler, clock: Any) -> Evaluator:
    cache = ClusterCache()
    for name in ("a", "b", "c"):
        cache.on_tuning_event(None, {"metadata": {"namespace": "llm", "name": name}, "spec": {}})
    return Evaluator(cache, reconciler, OperatorMetrics(), clock=clock)  # type: ignore[arg-type]


def test_once_stopping_the_evaluator_starts_no_further_evaluation() -> None:
    stop = asyncio.Event()
    reconciler = Reconciler(stop)
    asyncio.run(evaluator(reconciler, lambda: 1000.0).run(stop))
    assert len(reconciler.evaluated) == 1


def test_a_clock_stepped_back_makes_every_tuning_due_at_once() -> None:
    now = [1000.0]
    reconciler = Reconciler()
    clock = evaluator(reconciler, lambda: now[0])
    stop = asyncio.Event()
    assert asyncio.run(clock.tick(stop)) == 3  # new tunings: at once; then every 30 s (the default interval)
    now[0] = 1010.0
    assert asyncio.run(clock.tick(stop)) == 0
    now[0] = 400.0  # an NTP step of ten minutes back
    assert asyncio.run(clock.tick(stop)) == 3
    assert {at for _, at in reconciler.evaluated[3:]} == {400.0}


def rollout_counts(metrics: OperatorMetrics) -> dict[tuple[str, str], float]:
    """The ``vllm_autotuner_rollouts_total`` samples exported now, by (tuning, outcome)."""
    (family,) = [m for m in metrics.registry.collect() if m.name == "vllm_autotuner_rollouts"]
    return {(s.labels["tuning"], s.labels["outcome"]): s.value for s in family.samples if s.name.endswith("_total")}


def test_a_tunings_rollout_counts_are_exported_at_zero_from_its_first_evaluation_until_it_is_deleted() -> None:
    # a first failed rollout must be an increase Prometheus can see: from 0, not a series born at 1
    clock = evaluator(Reconciler(), lambda: 1000.0)
    asyncio.run(clock.tick(asyncio.Event()))
    assert rollout_counts(clock.metrics) == {(name, o): 0.0 for name in "abc" for o in ROLLOUT_OUTCOMES}

    clock.cache.on_tuning_event("DELETED", {"metadata": {"namespace": "llm", "name": "b"}, "spec": {}})
    asyncio.run(clock.tick(asyncio.Event()))

    assert rollout_counts(clock.metrics) == {(name, o): 0.0 for name in "ac" for o in ROLLOUT_OUTCOMES}


def test_a_write_refused_for_the_running_out_lease_is_a_warning_and_the_other_tunings_go_on(caplog) -> None:
    """Not a failure with a traceback: the replica is about to stop leading, and says so once per tuning."""

    class Refusing(Reconciler):
        async def evaluate(self, key: Any, at: float) -> None:
            await super().evaluate(key, at)
            raise NotLeading("the status of VllmTuning llm/a not sent: this replica's Lease may pass to another")

    reconciler = Refusing()
    stop = asyncio.Event()
    asyncio.run(evaluator(reconciler, lambda: 1000.0).tick(stop))
    assert len(reconciler.evaluated) == 3
    stopped = [r for r in caplog.records if "stopped" in r.getMessage()]
    assert len(stopped) == 3 and all(r.levelname == "WARNING" and r.exc_info is None for r in stopped)


def test_a_changed_spec_is_evaluated_at_once_and_its_new_interval_followed_from_then() -> None:
    # 6 h between evaluations, shortened to 30 s: not after the 6 h reckoned under the old spec
    now = [1000.0]
    reconciler = Reconciler()
    cache = ClusterCache()
    body = {"metadata": {"namespace": "llm", "name": "a", "generation": 1},
            "spec": {"traffic": {"evaluationInterval": "6h"}}}
    cache.on_tuning_event(None, body)
    clock = Evaluator(cache, reconciler, OperatorMetrics(), clock=lambda: now[0])  # type: ignore[arg-type]
    stop = asyncio.Event()
    assert asyncio.run(clock.tick(stop)) == 1
    now[0] = 1010.0
    cache.on_tuning_event(None, body)  # listed again (the watch reconnected): the same spec, nothing due
    assert asyncio.run(clock.tick(stop)) == 0
    cache.on_tuning_event("MODIFIED", {"metadata": {**body["metadata"], "generation": 2},
                                       "spec": {"traffic": {"evaluationInterval": "30s"}}})
    assert asyncio.run(clock.tick(stop)) == 1
    assert reconciler.evaluated[-1] == (("llm", "a"), 1010.0)
    now[0] = 1019.0
    assert asyncio.run(clock.tick(stop)) == 0
    now[0] = 1020.0  # the new interval's next multiple
    assert asyncio.run(clock.tick(stop)) == 1


def tuning(name: str, uid: str, generation: int, interval: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "llm", "name": name, "uid": uid, "generation": generation},
            "spec": {"traffic": {"evaluationInterval": interval}}}


def test_a_tuning_created_again_under_its_name_is_a_new_one_though_its_generation_is_the_same() -> None:
    # kubectl replace --force between two ticks: a 6 h tuning replaced by a 30 s one, both at generation 1
    now = [1000.0]
    clock = evaluator(Reconciler(), lambda: now[0])
    clock.cache.on_tuning_event(None, tuning("d", "old", 1, "6h"))
    asyncio.run(clock.tick(asyncio.Event()))
    clock.metrics.rollouts.labels("llm", "d", "Failed").inc()
    clock.cache.on_tuning_event("DELETED", tuning("d", "old", 1, "6h"))
    clock.cache.on_tuning_event("ADDED", tuning("d", "new", 1, "30s"))
    now[0] = 1010.0
    assert asyncio.run(clock.tick(asyncio.Event())) == 1  # at once, not on the old one's 6 h
    assert rollout_counts(clock.metrics)[("d", "Failed")] == 0.0  # the old one's counts are not the new one's
    now[0] = 1020.0
    assert asyncio.run(clock.tick(asyncio.Event())) == 4  # its own 30 s, with the others'


def test_an_edit_read_by_the_evaluation_it_landed_before_is_not_evaluated_again_at_once() -> None:
    now = [1000.0]

    class Editing(Reconciler):
        async def evaluate(self, key: Any, at: float) -> None:
            await super().evaluate(key, at)
            if key == ("llm", "a") and len(self.evaluated) == 5:  # a's edit lands while d waits for its turn
                clock.cache.on_tuning_event("MODIFIED", tuning("d", "u", 2, "30s"))

    clock = evaluator(Editing(), lambda: now[0])
    clock.cache.on_tuning_event(None, tuning("d", "u", 1, "30s"))
    asyncio.run(clock.tick(asyncio.Event()))
    now[0] = 1030.0
    assert asyncio.run(clock.tick(asyncio.Event())) == 4  # d's evaluation read generation 2
    now[0] = 1031.0
    assert asyncio.run(clock.tick(asyncio.Event())) == 0
