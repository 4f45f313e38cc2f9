"""Condition semantics and the watch cache's ReplicaSet lookup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vllm_autotuner.api import ConditionType
from vllm_autotuner.controller.cache import ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.conditions import set_condition

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_transition_time_moves_only_when_status_changes():
    conds = set_condition([], ConditionType.READY, True, "Tuning", "a", 1, T0)
    conds = set_condition(conds, ConditionType.READY, True, "Tuning", "b", 2, T0 + timedelta(minutes=5))
    (ready,) = conds
    assert ready.last_transition_time == "2026-11-30T12:00:00Z" and ready.message == "b"
    assert ready.observed_generation == 2
    conds = set_condition(conds, ConditionType.READY, False, "TargetNotFound", "c", 2, T0 + timedelta(minutes=9))
    assert conds[0].last_transition_time == "2026-11-30T12:09:00Z" and conds[0].status == "False"


def test_conditions_are_listed_in_a_stable_order():
    conds = set_condition([], ConditionType.DEGRADED, False, "AsExpected", "", 1, T0)
    conds = set_condition(conds, ConditionType.READY, None, "Unknown", "", 1, T0)
    assert [c.type for c in conds] == ["Ready", "Degraded"] and conds[0].status == "Unknown"


def rs(name, revision, uid="d-uid"):
    return {
        "metadata": {
            "name": name,
            "namespace": "llm",
            "annotations": {"deployment.kubernetes.io/revision": revision},
            "ownerReferences": [{"uid": uid}],
            "managedFields": [{"x": 1}],
        }
    }


def test_current_replicaset_is_the_deployment_revision():
    dep = {
        "metadata": {
            "name": "llama",
            "namespace": "llm",
            "uid": "d-uid",
            "annotations": {"deployment.kubernetes.io/revision": "2"},
        }
    }
    cache = ClusterCache()
    replicasets: dict = {}
    for body in (rs("llama-a", "1"), rs("llama-b", "2"), rs("other-x", "9", uid="other")):
        for key, value in replicaset_index("llm", body).items():
            replicasets.setdefault(key, []).append(value)
    cache.bind({k: [v] for k, v in deployment_index("llm", "llama", dep).items()}, replicasets)
    assert cache.deployment("llm", "llama") is not None and cache.deployment("llm", "nope") is None
    current = cache.current_replicaset(dep)
    assert current["metadata"]["name"] == "llama-b" and "managedFields" not in current["metadata"]
    # The ReplicaSet watch lags the Deployment's: revision 3 is not in the cache yet, the newest seen stands in.
    ahead = {"metadata": {**dep["metadata"], "annotations": {"deployment.kubernetes.io/revision": "3"}}}
    assert cache.current_replicaset(ahead)["metadata"]["name"] == "llama-b"


def test_the_indexes_keep_what_the_operator_reads_and_not_the_bulk():
    applied = {"kubectl.kubernetes.io/last-applied-configuration": "{...the whole Deployment...}",
               "deployment.kubernetes.io/revision": "3"}
    body = {"metadata": {"name": "llama-b", "uid": "r", "annotations": applied, "managedFields": [{"manager": "x"}],
                         "labels": {"pod-template-hash": "b"}, "ownerReferences": [{"uid": "d-uid"}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "vllm"}]}}},
            "status": {"readyReplicas": 2}}
    (entry,) = replicaset_index("llm", body).values()
    assert entry == {"metadata": {"name": "llama-b", "uid": "r", "annotations": {"deployment.kubernetes.io/revision": "3"},
                                  "labels": {"pod-template-hash": "b"}, "ownerReferences": [{"uid": "d-uid"}]},
                     "status": {"readyReplicas": 2}}
    (deployment,) = deployment_index("llm", "llama", body).values()
    assert deployment["spec"] == body["spec"] and deployment["metadata"]["annotations"] == {
        "deployment.kubernetes.io/revision": "3"}
    assert "last-applied" in str(body)  # the watched object itself is left as it was


def test_tuning_events():
    cache = ClusterCache()
    body = {"metadata": {"namespace": "llm", "name": "chat"}, "spec": {}}
    cache.on_tuning_event(None, body)
    assert ("llm", "chat") in cache.tunings
    cache.on_tuning_event("DELETED", body)
    assert cache.tunings == {}
    cache.on_tuning_event(None, body)
    # deleted, but kept by another controller's finalizer: the operator acts for it no more
    deleting = {**body, "metadata": {**body["metadata"], "deletionTimestamp": "2026-12-06T14:00:00Z"}}
    cache.on_tuning_event("MODIFIED", deleting)
    assert cache.tunings == {}


def test_tunings_are_indexed_by_the_deployment_they_target():
    cache = ClusterCache()

    def tuning(name, target, namespace="ml"):
        return {"metadata": {"namespace": namespace, "name": name}, "spec": {"targetRef": {"name": target}}}

    cache.on_tuning_event(None, tuning("chat", "llama"))
    cache.on_tuning_event("ADDED", tuning("chat-night", "llama"))
    cache.on_tuning_event("ADDED", tuning("rag", "mistral"))
    cache.on_tuning_event("ADDED", tuning("chat", "llama", namespace="other"))
    assert cache.tunings_of("ml", "llama") == ["chat", "chat-night"]
    cache.on_tuning_event("MODIFIED", tuning("chat-night", "mistral"))  # retargeted
    assert cache.tunings_of("ml", "llama") == ["chat"] and cache.tunings_of("ml", "mistral") == ["chat-night", "rag"]
    cache.on_tuning_event("DELETED", tuning("rag", "mistral"))
    assert cache.tunings_of("ml", "mistral") == ["chat-night"] and cache.tunings_of("other", "llama") == ["chat"]
