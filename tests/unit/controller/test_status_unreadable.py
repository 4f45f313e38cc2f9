"""A status the operator cannot read is left as it is, and nothing is changed until it can be read.

The status is the operator's memory (configs that failed to start, a rollout
in flight): one written by a newer operator, read after a downgrade, must not
be rebuilt from nothing, or a config that crash-looped could be tried again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.controller.test_target import DEPLOYMENT, NAMESPACE, TUNING, RecordingKube

from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler

#: A newer operator's status: a rollout phase this one does not know, and the memory of a config that failed.
NEWER = {
    "failedConfigs": [{"maxNumBatchedTokens": 16384, "maxNumSeqs": 512, "reason": "CUDA out of memory",
                       "time": "2026-12-03T09:00:00Z"}],
    "lastRollout": {"from": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256},
                    "to": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 256}, "source": "Traffic", "reason": "TTFT",
                    "startedAt": "2026-12-03T09:30:00Z", "phase": "Canarying"},
}


def evaluate(status: dict[str, Any]) -> tuple[Any, RecordingKube]:
    deployment = {
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "uid": "u1", "generation": 1},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model=M"]}]}}},
    }
    cache = ClusterCache()
    cache.bind({(NAMESPACE, DEPLOYMENT): [deployment]}, {})
    cache.on_tuning_event(None, {"metadata": {"namespace": NAMESPACE, "name": TUNING, "generation": 1,
                                              "resourceVersion": "5"},
                                 "spec": {"targetRef": {"name": DEPLOYMENT}}, "status": status})
    kube = RecordingKube()
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings(prometheus_url="http://prometheus.invalid"))
    report = asyncio.run(reconciler.evaluate((NAMESPACE, TUNING), 1_796_000_000.0))
    return report, kube


def test_an_unreadable_status_holds_and_only_its_ready_condition_is_written() -> None:
    report, kube = evaluate(NEWER)
    assert [verb for verb, _ in kube.calls] == ["create_event", "patch_tuning_status"]  # no Deployment call
    assert kube.calls[0][1][0]["reason"] == events.STATUS_UNREADABLE
    namespace, name, written, version = kube.calls[1][1]
    assert (namespace, name, list(written)) == (NAMESPACE, TUNING, ["conditions"])  # failedConfigs left alone
    assert version == "5"  # on the object read: not on one created again under its name
    (ready,) = written["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", events.STATUS_UNREADABLE)
    assert "lastRollout.phase" in ready["message"] and "--subresource=status" in ready["message"]
    assert report.decision is None


def test_the_newer_operators_other_conditions_are_kept_beside_the_ready_condition() -> None:
    degraded = {"type": "Degraded", "status": "True", "reason": "RolloutFailed", "message": "tokens=8192 crashed",
                "lastTransitionTime": "2026-12-03T09:00:00Z"}
    stale_ready = {"type": "Ready", "status": "True", "reason": "Tuning", "message": "",
                   "lastTransitionTime": "2026-12-03T09:00:00Z"}
    _, kube = evaluate({**NEWER, "conditions": [stale_ready, degraded]})
    _, _, written, _ = kube.calls[1][1]
    assert [(c["type"], c["reason"]) for c in written["conditions"]] == [
        ("Degraded", "RolloutFailed"), ("Ready", events.STATUS_UNREADABLE)]


def test_once_reported_an_unreadable_status_is_not_written_again() -> None:
    report, _ = evaluate(NEWER)
    conditions = report.state.model_dump(by_alias=True, mode="json")["conditions"]
    _, kube = evaluate({**NEWER, "conditions": conditions})
    assert kube.calls == []
