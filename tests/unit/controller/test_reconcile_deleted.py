"""A tuning deleted while the watch was down is dropped when its status write finds it gone.

After a watch outage kopf lists the VllmTunings again and sends an event for
each one there is, but none for one deleted meanwhile: without this, the
operator would evaluate it, and act for it, as long as it runs. The
reconciler is driven with the stand-ins of ``test_reconcile_rollout``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from tests.unit.controller import test_reconcile_rollout as harness

from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler


class Kube(harness.Kube):
    def __init__(self, status: int) -> None:
        self.status = status

    def create_event(self, body: dict[str, Any]) -> None:
        pass

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        raise ApiException(status=self.status, reason="NotFound" if self.status == 404 else "Conflict")


def cache_after_a_status_write_answered(status: int) -> Any:
    cache = harness.cache(finished=timedelta(minutes=30))
    reconciler = Reconciler(Kube(status), cache, harness.Windows(harness.window((harness.NEW,))),  # type: ignore[arg-type]
                            OperatorMetrics(), OperatorSettings())
    asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    return cache


def test_a_tuning_whose_status_write_finds_it_deleted_leaves_the_cache() -> None:
    cache = cache_after_a_status_write_answered(404)
    assert list(cache.tunings) == [] and cache.tunings_of("llm", "llama") == []


def test_a_status_write_that_fails_otherwise_keeps_the_tuning() -> None:
    cache = cache_after_a_status_write_answered(409)
    assert list(cache.tunings) == [("llm", "llama")] and cache.tunings_of("llm", "llama") == ["llama"]
