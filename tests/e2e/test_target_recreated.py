"""The target in a state the operator must not act on: deleted, paused, or claimed by two tunings.

Deleting a Deployment (a redeploy by a GitOps tool, a rename gone wrong) is
ordinary; the operator must report it as ``Ready=False TargetNotFound``
with a message that says what to do, keep running, and adopt the new
Deployment when it appears, afresh: a new uid, its own knobs as
``source: Initial``, and no patch of its own. A paused Deployment cannot
roll, and two VllmTunings on one Deployment would undo each other's
changes: both are reported (``TargetPaused``, ``TargetConflict``) and
nothing is patched until they are resolved.
"""

from __future__ import annotations

import pytest
from tests.e2e.world import World, knob_args, open_window, tuning_spec
from tests.support import H100, Cluster, Operators, wait_for

from vllm_autotuner.api import GROUP, PLURAL, VERSION

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


def test_a_paused_target_and_a_second_tuning_on_it_change_nothing_and_say_why(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(8192, 1024), replicas=1)
    # a preset window open now: without the pause the operator would patch at once
    world.create_tuning(tuning_spec(world.name, schedules=[open_window("UTC", {"maxNumBatchedTokens": 2048,
                                                                                "maxNumSeqs": 256})]))
    world.apps.patch_namespaced_deployment(world.name, namespace, {"spec": {"paused": True}})
    operator = operators.start()
    paused = world.wait_condition("Ready", "False", "TargetPaused", 60)
    assert f"kubectl rollout resume deployment/{world.name}" in paused["message"]
    evaluations = operator.metric("vllm_autotuner_evaluation_duration_seconds_count")
    wait_for(lambda: operator.metric("vllm_autotuner_evaluation_duration_seconds_count") >= evaluations + 2, 30,
             "two more evaluations of the paused target")
    assert world.deployment().metadata.generation == 2 and len(world.events("TargetPaused")) == 1

    world.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VllmTuning", "metadata": {"name": "second"},
        "spec": tuning_spec(world.name)})
    world.apps.patch_namespaced_deployment(world.name, namespace, {"spec": {"paused": False}})
    conflict = world.wait_condition("Ready", "False", "TargetConflict", 60)
    assert f"VllmTunings {world.name}, second all target Deployment {namespace}/{world.name}" in conflict["message"]
    evaluations = operator.metric("vllm_autotuner_evaluation_duration_seconds_count")
    wait_for(lambda: operator.metric("vllm_autotuner_evaluation_duration_seconds_count") >= evaluations + 2, 30,
             "two more evaluations of the claimed target")
    assert world.deployment().metadata.generation == 3  # the unpause only
    assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0

    world.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "second")
    world.wait_rolled_out(knob_args(2048, 256), 120)  # the preset, once the target is this tuning's alone
