"""The committed VllmTuning CRD, installed on a real apiserver.

The unit tests check the CRD as a document; only a real apiserver shows what
users meet: whether it is accepted and Established, what its OpenAPI
validation and CEL rules reject and with which words, which defaults it
fills in, and what ``kubectl get`` and ``kubectl explain`` print.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.bad_specs import BAD_SPECS, target
from tests.support import CRD_FILE, CRD_NAME, Cluster

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "autotuner.vllm-tuning.io", "v1alpha1", "vllmtunings"


def vllm_tuning(name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VllmTuning", "metadata": {"name": name}, "spec": spec}


def create(cluster: Cluster, namespace: str, body: dict, **kwargs: str) -> dict:
    return client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, **kwargs)


def rejection(cluster: Cluster, namespace: str, body: dict, **kwargs: str) -> str:
    """The apiserver's message for an object it must refuse."""
    with pytest.raises(ApiException) as refused:
        create(cluster, namespace, body, **kwargs)
    assert refused.value.status in (400, 422), refused.value.body
    return json.loads(refused.value.body)["message"]


def test_crd_is_established_with_its_names(cluster_with_crd: Cluster) -> None:
    crd = client.ApiextensionsV1Api(cluster_with_crd.api).read_custom_resource_definition(CRD_NAME)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == conditions["NamesAccepted"] == "True"
    assert crd.status.accepted_names.short_names == ["vlt"]
    resources = cluster_with_crd.kubectl("api-resources", f"--api-group={GROUP}", "-o", "name").stdout.split()
    assert resources == [CRD_NAME]


def test_a_minimal_object_is_accepted_with_defaults_filled_in(cluster_with_crd: Cluster, namespace: str) -> None:
    stored = create(cluster_with_crd, namespace, vllm_tuning("chat", target()))
    spec = stored["spec"]
    assert spec["targetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama",
                                 "ignoreController": False}
    assert spec["mode"] == "Auto" and spec["traffic"]["strategy"] == "Adaptive"
    assert spec["bounds"]["maxNumBatchedTokens"] == {"min": 256, "max": 32768}
    assert spec["bounds"]["maxNumSeqs"] == {"min": 8, "max": 1024}
    assert spec["slo"]["ttft"] == {"seconds": 2.0, "quantile": 0.95}
    assert spec["rollout"]["cooldown"] == "15m"


def test_a_full_object_is_accepted_as_written(cluster_with_crd: Cluster, namespace: str) -> None:
    spec = target(
        mode="Recommend",
        bounds={"maxNumBatchedTokens": {"min": 1024, "max": 16384}, "maxNumSeqs": {"min": 16, "max": 512}},
        traffic={"strategy": "Tiers", "tiers": [
            {"name": "chat", "match": {"maxPromptTokens": 2000}, "knobs": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256}},
            {"name": "rag", "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 128}}]},
        schedules=[
            {"name": "night", "timeZone": "Europe/Berlin", "start": "0 22 * * *", "end": "0 6 * * *",
             "knobs": {"maxNumBatchedTokens": 16384, "maxNumSeqs": 64}},
            {"name": "office", "start": "0 8 * * 1-5", "end": "0 18 * * 1-5", "slo": {"itl": {"seconds": 0.05}}}],
        engine={"vllmVersion": "0.10.2.dev5+g1234567"},  # a build from source says which commit
        prometheus={"basicAuth": {"username": {"name": "mimir", "key": "user"},
                                  "password": {"name": "mimir", "key": "token"}},
                    "headers": {"X-Scope-OrgID": "team-a|team-b"}},
        rollout={"cooldown": "30m", "maxRolloutsPerDay": 4, "progressDeadline": "10m",
                 "freezes": [{"name": "black-friday", "timeZone": "America/New_York", "start": "0 0 27 11 *",
                              "end": "0 0 1 12 *"}]},
    )
    stored = create(cluster_with_crd, namespace, vllm_tuning("rag", spec))["spec"]
    assert stored["traffic"]["tiers"][1]["knobs"] == {"maxNumBatchedTokens": 8192, "maxNumSeqs": 128}
    assert stored["schedules"][0]["timeZone"] == "Europe/Berlin"
    assert stored["schedules"][1]["timeZone"] == "UTC"  # defaulted
    assert stored["schedules"][1]["slo"] == {"itl": {"seconds": 0.05}}  # as written: the rest is spec.slo's
    assert stored["rollout"]["maxRolloutsPerDay"] == 4
    assert stored["rollout"]["freezes"][0]["start"] == "0 0 27 11 *"
    assert stored["prometheus"]["headers"] == {"X-Scope-OrgID": "team-a|team-b"}
    assert stored["prometheus"]["basicAuth"]["password"] == {"name": "mimir", "key": "token"}
    assert stored["engine"]["vllmVersion"] == "0.10.2.dev5+g1234567"


@pytest.mark.parametrize(("spec", "field", "reason"), BAD_SPECS)
def test_admission_rejects_bad_specs_naming_the_field(
    cluster_with_crd: Cluster, namespace: str, spec: dict, field: str, reason: str
) -> None:
    message = rejection(cluster_with_crd, namespace, vllm_tuning("bad", spec))
    assert f"{field}:" in message and reason in message, message


def test_the_target_cannot_change_but_the_rest_of_the_spec_can(cluster_with_crd: Cluster, namespace: str) -> None:
    """What a tuning measured and learned belongs to its Deployment: pointing it at another is refused at
    admission, saying what to do instead; any other change of the spec, and one that names the same target, pass."""
    create(cluster_with_crd, namespace, vllm_tuning("moved", target()))
    api = client.CustomObjectsApi(cluster_with_crd.api)
    with pytest.raises(ApiException) as refused:
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "moved",
                                           {"spec": {"targetRef": {"name": "mistral"}}})
    assert refused.value.status == 422, refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert "spec.targetRef.name: Invalid value" in message and "create a VllmTuning for it" in message, message
    stored = api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "moved", {"spec": {
        "mode": "Recommend", "targetRef": {"name": "llama", "container": "vllm", "ignoreController": True}}})["spec"]
    assert stored["mode"] == "Recommend" and stored["targetRef"]["name"] == "llama"
    assert stored["targetRef"]["container"] == "vllm"


def test_unknown_fields_are_pruned_or_rejected_when_strict(cluster_with_crd: Cluster, namespace: str) -> None:
    spec = target(maxNumBatchedTokens=4096, bounds={"maxNumSeqs": {"min": 8, "maximum": 64}})
    message = rejection(cluster_with_crd, namespace, vllm_tuning("strict", spec), field_validation="Strict")
    assert 'unknown field "spec.maxNumBatchedTokens"' in message
    assert 'unknown field "spec.bounds.maxNumSeqs.maximum"' in message
    # Without strict validation the apiserver drops what the schema does not know.
    stored = create(cluster_with_crd, namespace, vllm_tuning("pruned", spec))["spec"]
    assert "maxNumBatchedTokens" not in stored and stored["bounds"]["maxNumSeqs"] == {"min": 8, "max": 1024}


def test_status_takes_knobs_that_vllm_would_refuse(cluster_with_crd: Cluster, namespace: str) -> None:
    """Status records what happened: a rollout from knobs assumed from vLLM's defaults (512 tokens set by hand,
    1024 seqs assumed for a GPU of unknown memory) is written as it was, not refused by a spec rule."""
    create(cluster_with_crd, namespace, vllm_tuning("assumed", target()))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    refused = {"maxNumBatchedTokens": 512, "maxNumSeqs": 1024}
    status = {"status": {
        "resumeKnobs": refused,
        "lastRollout": {"from": refused, "to": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256}, "source": "Schedule",
                        "reason": "schedule night", "startedAt": now, "phase": "InProgress"},
    }}
    cluster_with_crd.kubectl("patch", "vlt", "assumed", "-n", namespace, "--subresource=status", "--type=merge",
                             "-p", json.dumps(status))
    stored = client.CustomObjectsApi(cluster_with_crd.api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "assumed")["status"]
    assert stored["lastRollout"]["from"] == stored["resumeKnobs"] == refused


def test_kubectl_get_shows_the_printer_columns(cluster_with_crd: Cluster, namespace: str) -> None:
    create(cluster_with_crd, namespace, vllm_tuning("chat", target(mode="Recommend")))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"status": {
        "current": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 256, "since": now, "source": "Traffic"},
        "recommendation": {"maxNumBatchedTokens": 1024, "maxNumSeqs": 512, "reason": "ITL", "time": now},
        "regime": "r8/p4k/o128",
        "activeSchedule": "night",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Tuning", "lastTransitionTime": now}],
        "history": [
            {"time": now, "action": "Hold", "maxNumBatchedTokens": 4096, "maxNumSeqs": 256, "reason": "frozen",
             "hold": "ChangeFreeze"},
            {"time": now, "action": "Change", "maxNumBatchedTokens": 4096, "maxNumSeqs": 256, "reason": "traffic"},
        ],
    }}
    cluster_with_crd.kubectl("patch", "vlt", "chat", "-n", namespace, "--subresource=status", "--type=merge",
                             "-p", json.dumps(status))
    header, row = cluster_with_crd.kubectl("get", "vlt", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "TARGET", "MODE", "TOKENS", "SEQS", "SCHEDULE", "READY", "HOLDING", "AGE"]
    assert row.split()[:8] == ["chat", "llama", "Recommend", "4096", "256", "night", "True", "ChangeFreeze"]
    header, row = cluster_with_crd.kubectl("get", "vlt", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert header.split()[-3:] == ["REC-TOKENS", "REC-SEQS", "REGIME"]
    assert row.split()[-3:] == ["1024", "512", "r8/p4k/o128"]


def test_kubectl_explain_shows_the_descriptions(cluster_with_crd: Cluster) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    explained = cluster_with_crd.kubectl("explain", "vlt.spec").stdout
    assert "KIND:       VllmTuning" in explained and f"VERSION:    {VERSION}" in explained
    # kubectl wraps long lines; compare the words.
    assert " ".join(spec["description"].split()) in " ".join(explained.split())
    assert "targetRef\t<Object> -required-" in explained
    bounds = cluster_with_crd.kubectl("explain", "vllmtunings.spec.bounds.maxNumSeqs").stdout
    described = spec["properties"]["bounds"]["properties"]["maxNumSeqs"]["description"]
    assert " ".join(described.split()) in " ".join(bounds.split())
