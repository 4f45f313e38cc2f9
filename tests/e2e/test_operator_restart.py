"""The operator killed in the middle of a rollout, and started again, finishes that rollout and starts no other.

The operator keeps no state of its own: the status is its memory, and its
patch is recognised by the pod-template annotations even when the status
write after it never happened. SIGKILL gives it no chance to clean up: it
neither releases its Lease (the new process waits for it to expire) nor
finishes the evaluation it was in. The rollout is made slow enough to be
caught in the middle with ``minReadySeconds``, as teams set it for vLLM's
warm-up. The evidence of "no second rollout" is in the objects: one new
ReplicaSet, revision 2, one patch, one RolloutStarted Event.
"""

from __future__ import annotations

import pytest
from tests.e2e.world import REVISION, World, knob_args, open_window, tuning_spec
from tests.support import H100, Cluster, Operators, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, PRESET = (2048, 64), (4096, 128)


def test_an_operator_killed_mid_rollout_and_restarted_finishes_it_without_a_second_rollout(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*START), replicas=2, minReadySeconds=10)
    world.create_tuning(tuning_spec(world.name, schedules=[
        open_window("America/Sao_Paulo", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})]))
    first = operators.start("first")

    def mid_rollout() -> bool:
        deployment = world.deployment()
        return deployment.metadata.generation == 2 and (deployment.status.updated_replicas or 0) < 2
    wait_for(mid_rollout, 60, "the preset's rollout to start")
    # The Events follow the patch; killed between the two, an operator loses them (as any controller would).
    wait_for(lambda: world.events("RolloutStarted") and world.events("VllmKnobsChanged", kind="Deployment"), 30,
             "the first operator's RolloutStarted and VllmKnobsChanged Events")
    assert mid_rollout(), "the rollout finished before the kill; minReadySeconds should hold it longer"
    first.kill()
    before = world.status()

    second = operators.start("second")
    world.wait_rolled_out(knob_args(*PRESET), 120)
    done = wait_for(lambda: (r := world.status().get("lastRollout") or {}).get("phase") == "Succeeded" and r, 90,
                    "the restarted operator to see the rollout through")
    holds = second.metric("vllm_autotuner_decisions_total", reason="SchedulePreset")
    wait_for(lambda: second.metric("vllm_autotuner_decisions_total", reason="SchedulePreset") >= holds + 3, 60,
             "three evaluations with the preset live")

    assert second.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0
    assert world.deployment().metadata.generation == 2
    old, new = world.replicasets()
    assert new.metadata.annotations[REVISION] == "2" and old.status.replicas == 0
    assert len(world.events("RolloutStarted")) == 1 and len(world.events("VllmKnobsChanged", kind="Deployment")) == 1
    status = world.status()
    assert len(status["rolloutTimes"]) == 1 and [h["action"] for h in world.history()].count("Change") == 1
    assert done["source"] == "Schedule" and (done["to"]["maxNumBatchedTokens"], done["to"]["maxNumSeqs"]) == PRESET
    assert status["current"]["source"] == "Schedule" and status["activeSchedule"] == "preset"
    if before.get("lastRollout"):  # killed after the status write: the record it left is the one completed
        assert done["startedAt"] == before["lastRollout"]["startedAt"]
        assert done["deploymentGeneration"] == before["lastRollout"]["deploymentGeneration"] == 2
