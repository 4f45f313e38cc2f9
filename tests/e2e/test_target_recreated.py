"""The target Deployment deleted and created again: the conditions say so, and the operator carries on.

Deleting a Deployment (a redeploy by a GitOps tool, a rename gone wrong) is
ordinary; the operator must report it as ``Ready=False TargetNotFound``
with a message that says what to do, keep running, and adopt the new
Deployment when it appears, afresh: a new uid, its own knobs as
``source: Initial``, and no patch of its own.
"""

from __future__ import annotations

import pytest
from tests.e2e.conftest import Operators
from tests.e2e.world import World, knob_args, tuning_spec
from tests.support import H100, Cluster, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e


def test_a_deleted_and_recreated_target_is_reported_then_adopted_afresh(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    first = world.create_deployment(H100, knob_args(2048, 64), replicas=1)
    world.create_tuning(tuning_spec(world.name))
    operator = operators.start()
    world.wait_condition("Ready", "True", "Tuning", 60)
    assert world.status()["targetUid"] == first.metadata.uid

    world.apps.delete_namespaced_deployment(world.name, namespace)
    gone = world.wait_condition("Ready", "False", "TargetNotFound", 60)
    assert f"Deployment {namespace}/{world.name} not found" in gone["message"]
    assert [e.type for e in world.events("TargetNotFound")] == ["Warning"]
    evaluations = operator.metric("vllm_autotuner_evaluation_duration_seconds_count")
    wait_for(lambda: operator.metric("vllm_autotuner_evaluation_duration_seconds_count") >= evaluations + 2, 30,
             "two more evaluations without a target")
    assert operator.alive() and operator.healthy()
    assert len(world.events("TargetNotFound")) == 1  # reported once, not at every evaluation

    second = world.create_deployment(H100, knob_args(4096, 128), replicas=1)
    world.wait_condition("Ready", "True", "Tuning", 60)
    status = world.status()
    assert status["targetUid"] == second.metadata.uid != first.metadata.uid
    current = status["current"]
    assert (current["maxNumBatchedTokens"], current["maxNumSeqs"], current["source"]) == (4096, 128, "Initial")
    wait_for(lambda: any("re-created" in e.message for e in world.events("TargetNotFound")), 30,
             "an Event saying the target was re-created (sent after the status patch)")
    assert world.deployment().metadata.generation == 1
    assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0
