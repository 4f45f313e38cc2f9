"""A rollout whose new pod finds no free GPU is rolled back without blaming the config.

Kubernetes' default rolling update starts a new pod before it stops an old
one (maxSurge 25% rounds up to one pod, maxUnavailable 25% down to none
below four replicas). On a GPU node with no spare GPU the new pod stays
Pending: the real kube-scheduler reports it Unschedulable, Insufficient
nvidia.com/gpu. Nothing is wrong with the knobs, so the operator must not
record them as failed (they would never be tried again); at the progress
deadline it puts the old config back (the old pod served all along and
keeps serving), says why and what to change (Degraded=True RolloutBlocked,
a Warning Event), counts the rollout as Blocked, and waits the cooldown
before the schedule window may try again. Once the Deployment does as the
advice says (maxSurge 0, maxUnavailable 1: the old pod stops first and
leaves its GPU to the new one), the window's change runs at once rather
than after the cooldown, and succeeds.
"""

from __future__ import annotations

import pytest
from tests.e2e.world import World, knob_args, knobs_of, open_window, tuning_spec
from tests.support import L4, Cluster, NotYet, Operators, expected_startup, is_ready, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, PRESET = (2048, 64), (1024, 64)
PROGRESS_DEADLINE = 30
COOLDOWN = 900  # longer than the test: a change after the fix cannot be the cooldown's end


def test_a_rollout_with_no_gpu_for_its_new_pod_is_rolled_back_and_the_config_not_blamed(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    assert expected_startup(L4, knob_args(*PRESET)).ok  # the preset would run, given a GPU
    world = World(cluster_with_crd, namespace)
    # the L4 node's one GPU, the default strategy; the Deployment's progressDeadlineSeconds (600 s by default)
    # would hold the operator's deadline up to it
    world.create_deployment(L4, knob_args(*START), replicas=1, progressDeadlineSeconds=PROGRESS_DEADLINE)
    (serving,) = world.pods()
    world.create_tuning(tuning_spec(
        world.name, rollout={"progressDeadline": f"{PROGRESS_DEADLINE}s", "cooldown": f"{COOLDOWN}s"},
        schedules=[open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})]))
    operator = operators.start()

    def pending() -> list | NotYet:
        stuck = [p for p in world.pods() if any(
            (c.type, c.status, c.reason) == ("PodScheduled", "False", "Unschedulable")
            for c in p.status.conditions or [])]
        return stuck or NotYet(f"pods {[(p.metadata.name, p.status.phase) for p in world.pods()]}")

    wait_for(pending, 60, "the preset's surge pod left Pending by the scheduler")
    assert knobs_of(world.template_args()) == PRESET

    blocked = world.wait_condition("Degraded", "True", "RolloutBlocked", PROGRESS_DEADLINE + 60)
    assert "Insufficient nvidia.com/gpu" in blocked["message"] and "maxSurge: 0" in blocked["message"], blocked
    recovered = world.wait_condition("Degraded", "False", "RecoveredByRollback", 60)
    assert "not blamed" in recovered["message"], recovered
    (pod,) = world.wait_rolled_out(knob_args(*START), 60)
    assert pod.metadata.uid == serving.metadata.uid and is_ready(pod)  # the old pod never stopped serving
    assert len(world.replicasets()) == 2  # the rollback reused the old ReplicaSet: no new pod, no restart

    status = world.status()
    assert status.get("failedConfigs", []) == []  # the knobs did not decide where the pod fits
    assert status["rolloutUnavailable"] == 0  # the default strategy on one replica: it surges, never stops one first
    rollback = status["lastRollout"]
    assert (rollback["source"], rollback["phase"]) == ("Rollback", "Succeeded")
    assert "not blamed" in rollback["reason"]
    assert [e.type for e in world.events("RolloutBlocked")] == ["Warning"]
    assert operator.metric("vllm_autotuner_rollouts_total", outcome="Blocked") == 1
    assert operator.metric("vllm_autotuner_rollouts_total", outcome="Failed") == 0

    # The window still asks for the preset; it waits the cooldown rather than stall again at once.
    wait_for(lambda: "could not start its pods" in world.history()[-1]["reason"], 30,
             "a hold for the cooldown after the block")
    assert knobs_of(world.template_args()) == START

    # The advice taken: the strategy now stops the old pod first, so the new one needs no spare GPU. The
    # change runs without waiting out the cooldown, on the GPU the old pod leaves.
    world.apps.patch_namespaced_deployment(world.name, namespace, {"spec": {"strategy": {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}})
    (pod,) = world.wait_rolled_out(knob_args(*PRESET), 120)
    assert pod.metadata.uid != serving.metadata.uid

    def preset_succeeded() -> dict | NotYet:
        status = world.status()
        last = status["lastRollout"]
        return status if (last["source"], last["phase"]) == ("Schedule", "Succeeded") else NotYet(f"lastRollout {last}")

    done = wait_for(preset_succeeded, 60, "the preset's rollout judged a success")
    assert done["lastRollout"]["to"] == {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}
    assert done["rolloutUnavailable"] == 1 and "blockedAt" not in done
    (unblocked,) = world.events("RolloutUnblocked")
    assert unblocked.type == "Normal" and "stops 1 pod(s)" in unblocked.message
    assert operator.metric("vllm_autotuner_rollouts_total", outcome="Succeeded") == 2  # the rollback, the preset
