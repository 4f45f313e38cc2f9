"""An evaluation's writes fail one by one: an Event that times out does not lose the status after it, nor does a
status write that times out stop the evaluations after it, and a refused one (409) counts nothing of what the
evaluation redone judges again, nor has the Events it sent sent again. A verdict whose status write did not land
(refused, timed out) is judged again by the next evaluation, and counted once. The reconciler is driven with the
stand-ins of ``test_reconcile_rollout``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.controller import test_reconcile_rollout as harness
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.api import DecisionAction, VllmTuningStatus
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report
from vllm_autotuner.policy import Decision


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


class Refused(harness.Kube):
    """The first ``times`` status writes fail with ``error`` (409: the VllmTuning changed since it was read), the
    next ones land."""

    def __init__(self, error: Exception | None = None, times: int = 1) -> None:
        self.error: Exception | None = error or ApiException(status=409, reason="Conflict")
        self.times = times
        self.statuses: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def create_event(self, body: dict[str, Any]) -> None:
        self.events.append(body)

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str | None) -> None:
        if self.error is not None and self.times > 0:
            self.times -= 1
            raise self.error
        self.statuses.append(status)


def completed(kube: harness.Kube, metrics: OperatorMetrics) -> Reconciler:
    """A reconciler of ``test_reconcile_rollout``'s tuning, whose rollout has just completed."""
    cache = harness.cache()
    reconciler = Reconciler(kube, cache, harness.Windows(harness.window((harness.OLD, harness.NEW))),  # type: ignore
                            metrics, OperatorSettings())
    cache.deployment("llm", "llama")["status"].update(updatedReplicas=2, availableReplicas=2)  # type: ignore[index]
    return reconciler


def succeeded(metrics: OperatorMetrics) -> float | None:
    return metrics.registry.get_sample_value("vllm_autotuner_rollouts_total",
                                             {"namespace": "llm", "tuning": "llama", "outcome": "Succeeded"})


def test_a_verdict_whose_status_write_is_refused_is_counted_once_when_the_evaluation_is_redone() -> None:
    kube, metrics = Refused(), OperatorMetrics()
    reconciler = completed(kube, metrics)
    refused = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    assert refused is not None and refused.refused and [v.outcome for v in refused.finished] == ["Succeeded"]
    asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=5)).timestamp()))
    assert [status["lastRollout"]["phase"] for status in kube.statuses] == ["Succeeded"]
    assert succeeded(metrics) == 1


def unprocessable() -> ApiException:
    """The apiserver's refusal of a status its schema (or a webhook) does not take."""
    return ApiException(status=422, reason="Unprocessable Entity")


def forbidden() -> ApiException:
    """The operator's Role no longer lets it write the status."""
    return ApiException(status=403, reason="Forbidden")


def unanswered() -> Exception:
    """No answer in time: the write may or may not have landed."""
    return ReadTimeoutError(None, "/apis", "read timed out")


def etcd_timeout() -> ApiException:
    """The apiserver's own timeout waiting on etcd, which may commit the write all the same."""
    return ApiException(status=504, reason="Gateway Timeout")


@pytest.mark.parametrize("error", [unprocessable, forbidden, unanswered, etcd_timeout])
def test_a_verdict_judged_again_after_a_status_write_that_did_not_land_is_counted_once(
    error: Callable[[], Exception]
) -> None:
    """Refused (not a 409: the evaluation is not redone at once; a Role without the grant refuses every write
    until it is fixed) or timed out, the write left the status without the verdict: each next evaluation judges
    the rollout again, until a write lands. One rollout, counted once, at once (the alert must not wait for a
    grant, nor fire at each evaluation), and not again."""
    kube, metrics = Refused(error(), times=3), OperatorMetrics()
    reconciler = completed(kube, metrics)
    for seconds in (0, 30, 60, 90):
        report = asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=seconds))
                                                 .timestamp()))
        assert report is not None and [v.outcome for v in report.finished] == ["Succeeded"]
        assert succeeded(metrics) == 1
    assert [status["lastRollout"]["phase"] for status in kube.statuses] == ["Succeeded"]
    # and its Event is sent once, not at each evaluation until a write lands
    assert [reason for _, reason, _, _ in sent(kube)] == ["RolloutSucceeded"]


def test_a_decision_whose_status_write_is_refused_is_counted_once_when_the_evaluation_is_redone() -> None:
    kube, metrics = Refused(), OperatorMetrics()
    reconciler = completed(kube, metrics)
    for seconds in (0, 5):
        report = asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=seconds))
                                                 .timestamp()))
        assert report is not None and report.decision is not None
    assert decisions(metrics) == {(report.decision.action, report.decision.hold or ""): 1}


def test_a_decision_whose_patch_was_written_is_counted_though_its_status_write_is_refused() -> None:
    """The redo finds the change in the template, follows it and decides anew (a Hold): the change is counted by
    the evaluation that made it."""
    kube, metrics = Refused(), OperatorMetrics()
    reconciler = completed(kube, metrics)
    body = reconciler.cache.tunings[("llm", "llama")]
    report = Report("llm", "llama", VllmTuningStatus(), 1, harness.NOW, uid=body["metadata"]["uid"],
                    decision=Decision(DecisionAction.CHANGE, None, "TTFT", VllmTuningStatus()), patched=True)
    asyncio.run(reconciler._finish(body, report, None, 0.0, write=True))
    assert report.refused and decisions(metrics) == {("Change", ""): 1}


def decisions(metrics: OperatorMetrics) -> dict[tuple[str, str], float]:
    """decisions_total, by action and hold reason, where counted."""
    return {(sample.labels["action"], sample.labels["reason"]): sample.value
            for family in metrics.registry.collect() if family.name == "vllm_autotuner_decisions"
            for sample in family.samples if sample.name.endswith("_total") and sample.value}


def test_the_decision_after_a_rollback_whose_status_write_is_refused_is_counted_once_by_the_redo() -> None:
    """Our rollout crash-loops: the evaluation writes its rollback, then decides a Hold, and its status write gets
    a 409. The rollback is no decision's patch: the Hold is counted by the redo alone."""
    crashing = {"metadata": {"name": harness.NEW[1], "ownerReferences": [{"kind": "ReplicaSet",
                                                                         "uid": "llama-7f8b-uid"}]},
                "status": {"containerStatuses": [{
                    "name": "vllm", "restartCount": 3, "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": "not enough KV cache",
                                                 "finishedAt": utc_timestamp(harness.NOW - timedelta(seconds=30))}}}]}}

    class Crashing(Refused):
        def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
            return [crashing]

        def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            return {"metadata": {"generation": 3}, "spec": {"template": {}}}

    metrics = OperatorMetrics()
    cache = harness.cache()
    cache.deployment("llm", "llama")["metadata"]["resourceVersion"] = "7"  # type: ignore[index]
    windows = harness.Windows(harness.window((harness.OLD, harness.NEW)))
    reconciler = Reconciler(Crashing(), cache, windows, metrics, OperatorSettings())  # type: ignore[arg-type]

    async def no_replicaset_template(target: Any) -> None:
        return None

    reconciler._replaced_template = no_replicaset_template  # type: ignore[method-assign]
    refused = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    assert refused is not None and refused.refused and refused.decision is not None and not refused.patched
    assert decisions(metrics) == {}



def sent(kube: Refused) -> list[tuple[str, str, str, str]]:
    """The Events sent: about what, and what they say."""
    return [(event["involvedObject"]["kind"], event["reason"], event["message"], event["type"])
            for event in kube.events]


def test_the_events_of_an_evaluation_whose_status_write_is_refused_are_not_sent_again_by_its_redo() -> None:
    """The redo reads a status without the refused write, judges the same rollout again and has the same Events
    to send: they were sent, and go once, however many redos are refused. Not once the write lands: an evaluation
    after it that sends the same Events again (here its status reads as before) sends them."""
    kube = Refused(times=2)
    reconciler = completed(kube, OperatorMetrics())
    verdict = [("VllmTuning", "RolloutSucceeded", "tokens=4096 seqs=64 is live: all replicas updated and available",
                "Normal")]
    for seconds, refused, events in ((0, True, verdict), (5, True, verdict), (10, False, verdict),
                                     (15, False, verdict * 2)):
        report = asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=seconds))
                                                 .timestamp()))
        assert report is not None and report.refused == refused and report.events == [verdict[0][1:]]
        assert sent(kube) == events
    assert [status["lastRollout"]["phase"] for status in kube.statuses] == ["Succeeded"] * 2


def test_an_event_the_redo_of_a_refused_status_write_has_anew_is_sent() -> None:
    """A person's edit refused the write: it names a time zone that does not exist. The redo sends InvalidSpec,
    not the verdict on the rollout again."""
    kube = Refused()
    reconciler = completed(kube, OperatorMetrics())
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp()))
    assert report is not None and report.refused
    reconciler.cache.tunings[("llm", "llama")]["spec"]["schedules"] = [
        {"name": "night", "timeZone": "Mars/Olympus", "start": "0 22 * * *", "end": "0 6 * * *",
         "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), (harness.NOW + timedelta(seconds=5)).timestamp()))
    assert report is not None and not report.refused
    assert [reason for reason, _, _ in report.events] == ["InvalidSpec", "RolloutSucceeded"]
    assert [reason for _, reason, _, _ in sent(kube)] == ["RolloutSucceeded", "InvalidSpec"]
