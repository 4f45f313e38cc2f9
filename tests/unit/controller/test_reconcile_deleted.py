"""A tuning deleted while the watch was down is dropped when its status write finds it gone.

After a watch outage kopf lists the VllmTunings again and sends an event for
each one there is, but none for one deleted meanwhile: without this, the
operator would evaluate it, and act for it, as long as it runs. A status
write is conditional on the tuning as the evaluation read it: one deleted and
created again under its name meanwhile refuses it, and the evaluation's result
is dropped. The reconciler is driven with the stand-ins of
``test_reconcile_rollout``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from tests.unit.controller import test_reconcile_rollout as harness

from vllm_autotuner.controller.evaluator import Evaluator
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler


class Kube(harness.Kube):
    def __init__(self, status: int) -> None:
        self.status = status
        self.versions: list[str | None] = []

    def create_event(self, body: dict[str, Any]) -> None:
        pass

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str | None) -> None:
        self.versions.append(resource_version)
        raise ApiException(status=self.status, reason="NotFound" if self.status == 404 else "Conflict")


class Windows(harness.Windows):
    def forget(self) -> None:
        """Called by the evaluator after each tick (``ObservationService.forget``): nothing is kept here."""


def reconciler_of(kube: Kube) -> Reconciler:
    """A reconciler whose cache holds the tuning read at resourceVersion 41, its status writes answered by
    ``kube``."""
    cache = harness.cache(finished=timedelta(minutes=30))
    cache.tunings[("llm", "llama")]["metadata"]["resourceVersion"] = "41"
    return Reconciler(kube, cache, Windows(harness.window((harness.NEW,))),  # type: ignore[arg-type]
                      OperatorMetrics(), OperatorSettings())


def cache_after_a_status_write_answered(kube: Kube) -> Any:
    """The cache after an evaluation of the tuning, whose status write ``kube`` answers."""
    reconciler = reconciler_of(kube)
    asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    return reconciler.cache


def test_a_tuning_whose_status_write_finds_it_deleted_leaves_the_cache() -> None:
    cache = cache_after_a_status_write_answered(Kube(404))
    assert list(cache.tunings) == [] and cache.tunings_of("llm", "llama") == []


def test_a_status_write_is_conditional_on_the_tuning_read_and_refused_keeps_the_tuning_to_read_again(caplog) -> None:
    caplog.set_level(logging.INFO, "vllm_autotuner.controller.reconcile")
    kube = Kube(409)  # the apiserver's answer to a resourceVersion no longer the object's: replaced, or edited
    cache = cache_after_a_status_write_answered(kube)
    assert kube.versions == ["41"]
    assert list(cache.tunings) == [("llm", "llama")] and cache.tunings_of("llm", "llama") == ["llama"]
    (said,) = [r for r in caplog.records if "status of llm/llama" in r.getMessage()]
    assert said.levelname == "INFO" and "deleted and created again" in said.getMessage()


def test_a_tuning_whose_status_write_was_refused_is_evaluated_again_as_soon_as_it_is_read_anew() -> None:
    # not an evaluationInterval later; nor again and again before the watch brings the tuning as changed
    kube = Kube(409)
    reconciler, now = reconciler_of(kube), [harness.NOW.timestamp()]
    clock = Evaluator(reconciler.cache, reconciler, reconciler.metrics, clock=lambda: now[0])
    stop = asyncio.Event()
    assert asyncio.run(clock.tick(stop)) == 1
    now[0] += 1
    assert asyncio.run(clock.tick(stop)) == 0  # the version refused: nothing new to read yet
    reconciler.cache.tunings[("llm", "llama")]["metadata"]["resourceVersion"] = "42"
    now[0] += 1
    assert asyncio.run(clock.tick(stop)) == 1
    assert kube.versions == ["41", "42"]
