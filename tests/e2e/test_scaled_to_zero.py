"""A config written while the Deployment is scaled to zero is judged when its first pod starts.

KEDA and similar autoscalers scale idle vLLM Deployments to zero, and a
schedule preset often opens then. Written into a Deployment with no
replicas, the rollout is complete at once by the Deployment controller's
measure, though no pod has started the config. The operator must not take
that for success: it marks the rollout Unverified, and when the Deployment
scales up and the new pod crash-loops (on the simulated L4 a 24576-token
budget leaves no KV cache for one max-length request, as in a real vLLM),
it rolls back, records the config as failed and never writes it again.
"""

from __future__ import annotations

import pytest
from tests.e2e.world import World, knob_args, knobs_of, open_window, tuning_spec
from tests.support import L4, Cluster, NotYet, Operators, expected_startup, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, TOO_BIG = (2048, 64), (24576, 256)


def test_a_config_written_at_zero_replicas_is_rolled_back_when_the_scale_up_cannot_start_it(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    assert "KV cache" in expected_startup(L4, knob_args(*TOO_BIG)).error
    world = World(cluster_with_crd, namespace)
    world.create_deployment(L4, knob_args(*START), replicas=1,  # one GPU: no room for a surge pod
                            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    world.apps.patch_namespaced_deployment_scale(world.name, namespace, {"spec": {"replicas": 0}})
    wait_for(lambda: not world.pods() or NotYet(f"{len(world.pods())} pods left"), 60, "no pod left")
    world.create_tuning(tuning_spec(
        world.name, rollout={"progressDeadline": "60s"},
        schedules=[open_window("Europe/Berlin", {"maxNumBatchedTokens": TOO_BIG[0], "maxNumSeqs": TOO_BIG[1]})]))
    operators.start()

    def unverified() -> dict | NotYet:
        rollout = world.status().get("lastRollout") or {}
        return rollout if rollout.get("phase") == "Unverified" else NotYet(f"lastRollout {rollout}")

    rollout = wait_for(unverified, 90, "the preset written and left unverified")
    assert knobs_of(world.template_args()) == TOO_BIG and rollout["source"] == "Schedule"
    assert world.status().get("failedConfigs", []) == []
    assert world.has_condition("Progressing", "False", "Unverified")
    assert len(world.events("RolloutUnverified")) == 1 and not world.events("RolloutSucceeded")

    world.apps.patch_namespaced_deployment_scale(world.name, namespace, {"spec": {"replicas": 1}})
    degraded = world.wait_condition("Degraded", "True", "RolloutFailed", 120)
    assert "crash-looping" in degraded["message"] and "KV cache" in degraded["message"], degraded
    world.wait_condition("Degraded", "False", "RecoveredByRollback", 120)
    world.wait_rolled_out(knob_args(*START), 60)
    status = world.status()
    (failed,) = status["failedConfigs"]
    assert (failed["maxNumBatchedTokens"], failed["maxNumSeqs"]) == TOO_BIG and "KV cache" in failed["reason"]
    assert status["lastRollout"]["source"] == "Rollback" and status["lastRollout"]["phase"] == "Succeeded"
    wait_for(lambda: "not retried" in world.history()[-1]["reason"], 60, "a hold that refuses to retry the config")
    assert knobs_of(world.template_args()) == START
