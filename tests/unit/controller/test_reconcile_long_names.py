"""A Deployment whose name is too long for its pods' names to say which revision they belong to.

The apiserver keeps 58 characters of a generateName: the pods of a
Deployment named with 57 characters are all named ``<name>-xxxxx``, whatever
their ReplicaSet, and so are those of another Deployment whose name begins
the same (``<name>-canary``). By name prefix, the window of the current
config would then sum the old revision's pods and the other Deployment's
too; instead the pods of such a ReplicaSet are listed and matched by their
exact names (their ownerReferences name it). Names of normal length are
still told apart by prefix, at no API call.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.unit.controller.test_reconcile_rollout import NOW, Windows, window
from vllm_autotuner.api import VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.controller.cache import REVISION, ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report, pod_prefix

LONG = "llama-3-1-70b-instruct-chat-production-europe-west4-green"


def pod(name: str, owner: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "llm", "ownerReferences": [{"kind": "ReplicaSet", "uid": owner}]},
            "spec": {}}


class Kube:
    """The pods the Deployment's selector lists (another Deployment with the same labels' among them)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.selectors: list[str] = []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        return self.pods


def cache(name: str, finished: timedelta | None = None) -> ClusterCache:
    """Deployment ``name`` at revision 2 (2 Ready pods), revision 1 scaled down; our rollout to revision 2
    ``finished`` that long ago, or a config unchanged for two hours."""
    args = ["--model", "m", "--max-num-batched-tokens", "4096", "--max-num-seqs", "64"]
    deployment = {
        "metadata": {"name": name, "namespace": "llm", "uid": "d-uid", "generation": 2,
                     "annotations": {REVISION: "2"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}},
                 "template": {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                                       "args": args}]}}},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
    }
    replicasets: dict[Any, list[dict[str, Any]]] = {}
    for hash_, revision, ready in (("6c9d7b8f5a", "1", 0), ("7f8b6d5c4b", "2", 2)):
        body = {"metadata": {"name": f"{name}-{hash_}", "namespace": "llm", "uid": f"rs{revision}-uid",
                             "ownerReferences": [{"uid": "d-uid"}], "labels": {"pod-template-hash": hash_},
                             "annotations": {REVISION: revision}},
                "status": {"replicas": ready, "readyReplicas": ready, "availableReplicas": ready}}
        for key, value in replicaset_index("llm", body).items():
            replicasets.setdefault(key, []).append(value)
    status: dict[str, Any] = {"targetUid": "d-uid", "current": {
        "maxNumBatchedTokens": 4096, "maxNumSeqs": 64, "since": utc_timestamp(NOW - timedelta(hours=2)),
        "source": "Initial"}}
    if finished is not None:
        started = NOW - finished - timedelta(minutes=3)
        status["lastRollout"] = {
            "from": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 32},
            "to": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 64},
            "source": "Traffic", "reason": "TTFT", "startedAt": utc_timestamp(started), "phase": "Succeeded",
            "finishedAt": utc_timestamp(NOW - finished), "deploymentGeneration": 2, "baselineAttainment": 0.95}
        status["current"].update(since=utc_timestamp(NOW - finished), source="Traffic")
    tuning = {"metadata": {"name": "llama", "namespace": "llm", "generation": 1},
              "spec": {"targetRef": {"name": name}, "prometheus": {"url": "http://prometheus:9090"}},
              "status": {"observedGeneration": 1, **status}}
    result = ClusterCache()
    result.bind({k: [v] for k, v in deployment_index("llm", name, deployment).items()}, replicasets)
    result.on_tuning_event(None, tuning)
    return result


def observe(name: str, kube: Kube, windows: Windows, finished: timedelta | None = None) -> tuple[Any, str]:
    """The Observation of the tuning's window (what ``decide`` is given), and the MetricsAvailable message."""
    reconciler = Reconciler(kube, cache(name, finished), windows, OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings(naive_queries=True))
    body = reconciler.cache.tunings[("llm", "llama")]
    spec = VllmTuningSpec.model_validate(body["spec"])
    report = Report("llm", "llama", VllmTuningStatus.model_validate(body["status"]), 1, NOW)

    async def run() -> Any:
        target = await reconciler._target("llm", spec, report.now)
        return await reconciler._observe("llm", spec, target, report, rolling=False, ours=False)

    observation = asyncio.run(run())
    return observation, next(c for c in report.state.conditions if c.type == "MetricsAvailable").message


# The current revision's two pods, an old revision's pod still terminating, one deleted in the window, and a pod
# of Deployment `<LONG>-canary` (same labels, also cut to `<LONG>-`): every one has series in the window.
NEW_1, NEW_2, OLD_LEFT, OLD_GONE, CANARY = (f"{LONG}-{s}" for s in ("x2x4q", "k9j2w", "b7m5z", "p3r8t", "c4n1y"))
LISTED = [pod(NEW_1, "rs2-uid"), pod(NEW_2, "rs2-uid"), pod(OLD_LEFT, "rs1-uid"), pod(CANARY, "canary-rs-uid")]
SERIES = window(tuple(("llm", p) for p in (NEW_1, NEW_2, OLD_LEFT, OLD_GONE, CANARY)))  # 2 requests/s each


def test_a_cut_prefix_no_longer_tells_revisions_or_deployments_apart() -> None:
    assert len(LONG) == 57 and pod_prefix(f"{LONG}-7f8b6d5c4b") == pod_prefix(f"{LONG}-canary-5d4c") == f"{LONG}-"


def test_the_current_revision_of_a_long_named_deployment_is_its_own_pods_by_name() -> None:
    kube, windows = Kube(LISTED), Windows(SERIES)
    observation, _ = observe(LONG, kube, windows)
    assert observation.pods == 2 and observation.request_rate == 4.0  # not the old revision's, nor the canary's
    assert observation.config is not None  # one config's samples: evidence for the decision core
    assert kube.selectors == ["app=llama"]
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", f"({NEW_2}|{NEW_1})"))]


def test_windows_reaching_back_into_our_rollout_take_every_revisions_pods_that_still_exist() -> None:
    windows = Windows(SERIES)
    observation, _ = observe(LONG, Kube(LISTED), windows, finished=timedelta(seconds=10))
    # the old revision's pod already deleted is not seen (its name is no longer listed), nor is the canary
    assert observation.pods == 3 and observation.request_rate == 6.0 and observation.config is None
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", f"({OLD_LEFT}|{NEW_2}|{NEW_1})"))]


def test_without_pods_of_its_own_the_hold_says_none_were_listed() -> None:
    observation, message = observe(LONG, Kube([pod(CANARY, "canary-rs-uid")]), Windows(SERIES))
    assert observation is None
    assert message.startswith("no vLLM series for pods (none listed) in namespace llm"), message


def test_names_of_normal_length_are_told_apart_by_prefix_without_listing_pods() -> None:
    kube = Kube(LISTED)
    pods = ("llama-7f8b6d5c4b-x2x4q", "llama-7f8b6d5c4b-k9j2w", "llama-6c9d7b8f5a-b7m5z")
    windows = Windows(window(tuple(("llm", p) for p in pods)))
    observation, _ = observe("llama", kube, windows)
    assert observation.pods == 2 and kube.selectors == []
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", "(llama-7f8b6d5c4b-.*)"))]


def test_pods_that_cannot_be_listed_hold_for_want_of_data() -> None:
    class Forbidden(Kube):
        def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
            raise ApiException(status=403, reason="Forbidden")

    windows = Windows(SERIES)
    observation, message = observe(LONG, Forbidden([]), windows)
    assert observation is None and windows.asked == []  # nothing taken by the ambiguous prefix instead
    assert message == f"the pods of Deployment llm/{LONG} are unreadable (Forbidden); holding"
