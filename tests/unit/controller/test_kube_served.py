"""A rollback whose write meets a conflict still puts back the replaced ReplicaSet's pod template exactly.

The apiserver serves a pod template with ``metadata.creationTimestamp: null``,
in a Deployment and in a ReplicaSet alike; the kubernetes client's models drop
that null (and any field they do not know). A Deployment re-read through them
after a 409 would differ from the ReplicaSet read as served, and the rollback
would become a new template: a restart of every pod, those still running the
old config too. Here the real ``Kube`` calls an AppsV1Api stand-in that
answers as the client does (the JSON served with ``_preload_content=False``,
the models otherwise), and ``apply_knobs`` retries on a conflict. The same
stand-in's conflict shows a refused call counted and timed like the others.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.unit.policy.helpers import T0, knobs

from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.rollout.apply import RolloutBusy, apply_knobs
from vllm_autotuner.rollout.patch import WRITTEN_AT_ANNOTATION, knob_patch

A, B = knobs(2048, 64), knobs(8192, 128)


class Apps:
    """The AppsV1Api calls ``Kube`` makes for a rollback: the first patch meets a conflict (the HPA scaled the
    Deployment meanwhile)."""

    def __init__(self, api_client: client.ApiClient, deployment: dict[str, Any]) -> None:
        self.api_client = api_client
        self.deployment = deployment
        self.patches: list[dict[str, Any]] = []

    def _answer(self, body: dict[str, Any], preload: bool) -> Any:
        served = json.dumps(body)
        if preload:
            return self.api_client.deserialize(served, "V1Deployment", "application/json")
        return SimpleNamespace(data=served.encode())

    def read_namespaced_deployment(self, name: str, namespace: str, _preload_content: bool = True,
                                   **_: Any) -> Any:
        return self._answer(self.deployment, _preload_content)

    def patch_namespaced_deployment(self, name: str, namespace: str, body: dict[str, Any],
                                    _preload_content: bool = True, **_: Any) -> Any:
        self.patches.append(body)
        if len(self.patches) == 1:
            raise ApiException(status=409, reason="Conflict")
        return self._answer(self.deployment, _preload_content)


def template(of: Any) -> dict[str, Any]:
    """A pod template as the apiserver serves it, defaults and the null creation time included."""
    return {"metadata": {"creationTimestamp": None, "labels": {"app": "llama"}},
            "spec": {"containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                "args": ["M", "--max-num-batched-tokens", str(of.max_num_batched_tokens),
                         "--max-num-seqs", str(of.max_num_seqs)],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
                "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
                "securityContext": {}, "terminationGracePeriodSeconds": 30}}


def test_a_rollback_after_a_write_conflict_puts_back_the_old_template_and_restarts_nothing_else():
    before = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"namespace": "llm", "name": "llama", "resourceVersion": "100", "generation": 2},
              "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}}, "template": template(A)},
              "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}
    change = knob_patch(before, "vllm", B, "ITL breach", "chat", "Traffic", T0)["spec"]["template"]
    ours = copy.deepcopy(before)  # our change to B, rolling, as the watch last saw it
    ours["metadata"].update({"resourceVersion": "101", "generation": 3})
    ours["spec"]["template"]["metadata"]["annotations"] = change["metadata"]["annotations"]
    ours["spec"]["template"]["spec"]["containers"][0]["args"] = change["spec"]["containers"][0]["args"]
    ours["status"] = {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    scaled = copy.deepcopy(ours)  # the HPA's write since
    scaled["metadata"]["resourceVersion"] = "102"
    scaled["spec"]["replicas"] = 3
    replaced = template(A)  # the ReplicaSet that ran A, as served
    replaced["metadata"]["labels"]["pod-template-hash"] = "5c4d"
    kube = Kube(client.ApiClient(), OperatorMetrics())
    apps = Apps(kube.api_client, scaled)
    kube.apps = apps  # type: ignore[assignment]

    back = T0 + timedelta(minutes=10)
    apply_knobs(kube, ours, "vllm", A, f"{B} failed", "chat", "Rollback", back, during_rollout=True,
                previous=replaced)

    first, second = apps.patches
    for patch, read_at in ((first, "101"), (second, "102")):
        assert patch["metadata"]["resourceVersion"] == read_at
        # the old template's annotations back (it had none), ours on the Deployment: the old ReplicaSet scales up
        assert patch["spec"]["template"]["metadata"]["annotations"][WRITTEN_AT_ANNOTATION] is None
        assert patch["metadata"]["annotations"][WRITTEN_AT_ANNOTATION] == "2024-05-01T12:10:00Z"


def test_a_change_that_meets_a_conflict_with_an_edit_of_the_vllm_container_or_a_new_deployment_is_not_written():
    """Our change to B is refused with a 409: a person (or Argo CD) set 1024/64 meanwhile. Rebuilt on the fresh
    object, the patch would write over their edit unseen: nothing is written, and the next evaluation reads it."""
    ours = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"namespace": "llm", "name": "llama", "resourceVersion": "100", "generation": 2},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}}, "template": template(A)},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}
    edited = copy.deepcopy(ours)
    edited["metadata"]["resourceVersion"] = "101"
    edited["spec"]["template"] = template(knobs(1024, 64))
    kube = Kube(client.ApiClient(), OperatorMetrics())
    apps = Apps(kube.api_client, edited)
    kube.apps = apps  # type: ignore[assignment]

    with pytest.raises(RolloutBusy, match="llm/llama had its vLLM container changed since it was read"):
        apply_knobs(kube, ours, "vllm", B, "ITL breach", "chat", "Traffic", T0)
    assert len(apps.patches) == 1  # the refused one
    # nor is a change written into a Deployment paused, or deleted and re-created under the same name, meanwhile
    ours["metadata"]["uid"] = "d-uid"
    paused, recreated = copy.deepcopy(ours), copy.deepcopy(ours)
    paused["metadata"]["resourceVersion"], paused["spec"]["paused"] = "101", True
    recreated["metadata"].update({"resourceVersion": "5", "uid": "new-uid"})
    for meanwhile, what in ((paused, "was paused"), (recreated, "was re-created")):
        apps = Apps(kube.api_client, meanwhile)
        kube.apps = apps  # type: ignore[assignment]
        with pytest.raises(RolloutBusy, match=f"llm/llama {what} since it was read"):
            apply_knobs(kube, ours, "vllm", B, "ITL breach", "chat", "Traffic", T0)
        assert len(apps.patches) == 1
    # an edit elsewhere (a label) is no reason to stop: the same change goes through on the fresh object
    labelled = copy.deepcopy(ours)
    labelled["metadata"].update({"resourceVersion": "101", "labels": {"team": "inference"}})
    apps = Apps(kube.api_client, labelled)
    kube.apps = apps  # type: ignore[assignment]
    apply_knobs(kube, ours, "vllm", B, "ITL breach", "chat", "Traffic", T0)
    assert [patch["metadata"]["resourceVersion"] for patch in apps.patches] == ["100", "101"]


def test_every_call_is_counted_and_timed_a_refused_one_too():
    metrics = OperatorMetrics()
    kube = Kube(client.ApiClient(), metrics)
    kube.apps = Apps(kube.api_client, {"metadata": {"name": "llama"}})  # type: ignore[assignment]
    with pytest.raises(ApiException):  # the Apps stand-in's conflict
        kube.patch_deployment("llm", "llama", {})
    kube.patch_deployment("llm", "llama", {})
    kube.read_deployment("llm", "llama")

    def value(name: str, verb: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"verb": verb, "resource": "deployments"})

    assert value("vllm_autotuner_kubernetes_api_calls_total", "patch") == 2
    assert value("vllm_autotuner_kubernetes_api_call_duration_seconds_count", "patch") == 2
    assert value("vllm_autotuner_kubernetes_api_call_duration_seconds_count", "get") == 1
    assert value("vllm_autotuner_kubernetes_api_call_duration_seconds_sum", "get") >= 0
