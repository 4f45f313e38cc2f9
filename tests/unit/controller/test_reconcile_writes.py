"""An evaluation's writes fail one by one: an Event that times out does not lose the status after it, nor does a
status write that times out stop the evaluations after it, and a refused one (409) counts
nothing of what the evaluation redone judges again. The reconciler is driven with the stand-ins of
``test_reconcile_rollout``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from tests.unit.controller import test_reconcile_rollout as harness
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler


class Kube(harness.Kube):
    """Events time out; status writes time out ``failing`` times, then land."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.statuses: list[dict[str, Any]] = []

    def create_event(self, body: dict[str, Any]) -> None:
        raise ReadTimeoutError(None, "/api/v1/events", "read timed out")

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str | None) -> None:
        if self.failing:
            self.failing -= 1
            raise ReadTimeoutError(None, "/apis", "read timed out")
        self.statuses.append(status)


def test_events_that_time_out_leave_the_status_written_and_a_status_that_times_out_is_written_next_time() -> None:
    kube = Kube(failing=1)
    cache = harness.cache()  # our rollout in progress: its evaluation sends Events
    windows = harness.Windows(harness.window((harness.OLD, harness.NEW)))
    reconciler = Reconciler(kube, cache, windows, OperatorMetrics(), OperatorSettings())  # type: ignore[arg-type]
    cache.deployment("llm", "llama")["status"].update(updatedReplicas=2, availableReplicas=2)  # type: ignore[index]
    first = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    assert first is not None and first.events and kube.statuses == []
    asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(minutes=1)).timestamp()))
    assert [status["lastRollout"]["phase"] for status in kube.statuses] == ["Succeeded"]


class Conflicted(harness.Kube):
    """The first status write is refused (409: the VllmTuning changed since it was read), the next ones land."""

    def __init__(self) -> None:
        self.refused = False
        self.statuses: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def create_event(self, body: dict[str, Any]) -> None:
        self.events.append(body)

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str | None) -> None:
        if not self.refused:
            self.refused = True
            raise ApiException(status=409, reason="Conflict")
        self.statuses.append(status)


def test_a_verdict_whose_status_write_is_refused_is_counted_once_when_the_evaluation_is_redone() -> None:
    kube, metrics = Conflicted(), OperatorMetrics()
    cache = harness.cache()
    reconciler = Reconciler(kube, cache, harness.Windows(harness.window((harness.OLD, harness.NEW))),  # type: ignore
                            metrics, OperatorSettings())
    cache.deployment("llm", "llama")["status"].update(updatedReplicas=2, availableReplicas=2)  # type: ignore[index]
    refused = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    assert refused is not None and refused.refused and refused.finished == ["Succeeded"]
    asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=5)).timestamp()))
    assert [status["lastRollout"]["phase"] for status in kube.statuses] == ["Succeeded"]
    succeeded = {"namespace": "llm", "tuning": "llama", "outcome": "Succeeded"}
    assert metrics.registry.get_sample_value("vllm_autotuner_rollouts_total", succeeded) == 1
