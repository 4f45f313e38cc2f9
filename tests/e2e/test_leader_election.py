"""Two replicas of the operator on one Lease: exactly one acts, and the other takes over when it stops.

Both processes run the same command on the same Lease, as the chart's two
replicas do. Which one acted is read from each process's own /metrics (its
leader gauge, its decisions, its Deployment patches) and from the Lease's
holder; the objects show that one rollout happened per change, not two.
A third replica, stopped while it stands by, exits at once. The leader is
then stopped as Kubernetes stops a pod (SIGTERM): it must hand the Lease
over, and the standby must carry on, here by rolling out a preset changed
after the takeover.
"""

from __future__ import annotations

import kubernetes
import pytest
from tests.e2e.world import World, knob_args, open_window, tuning_spec
from tests.support import H100, Cluster, OperatorProcess, Operators, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

ZONE = "Europe/Berlin"
START, FIRST, SECOND = (2048, 64), (4096, 128), (8192, 256)
PATCHES = {"verb": "patch", "resource": "deployments"}


def preset(knobs: tuple[int, int]) -> dict:
    return open_window(ZONE, {"maxNumBatchedTokens": knobs[0], "maxNumSeqs": knobs[1]})


def leading(operator: OperatorProcess) -> bool:
    return operator.metric("vllm_autotuner_leader") == 1


def test_of_two_replicas_only_the_leader_acts_and_the_standby_takes_over_when_it_stops(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    coordination = kubernetes.client.CoordinationV1Api(cluster_with_crd.api)
    world.create_deployment(H100, knob_args(*START), replicas=1)
    leader = operators.start("leader")
    wait_for(lambda: leading(leader), 30, "the first replica to lead")
    standby = operators.start("standby")

    world.create_tuning(tuning_spec(world.name, schedules=[preset(FIRST)]))
    world.wait_rolled_out(knob_args(*FIRST), 90)
    wait_for(lambda: (world.status().get("lastRollout") or {}).get("phase") == "Succeeded", 60,
             "the leader to see its rollout through")
    assert leader.metric("vllm_autotuner_decisions_total") > 0 and leader.metric(
        "vllm_autotuner_kubernetes_api_calls_total", **PATCHES) == 1
    assert not leading(standby) and standby.healthy()
    assert standby.metric("vllm_autotuner_decisions_total") == 0 and standby.metric("vllm_autotuner_tunings") == 0
    # before it stood by, it asked once whether VllmTunings are served, from a CRD as new as it is; since, nothing
    assert standby.metric("vllm_autotuner_kubernetes_api_calls_total") == 2
    assert standby.metric("vllm_autotuner_kubernetes_api_calls_total", verb="get", resource="discovery") == 1
    assert standby.metric("vllm_autotuner_kubernetes_api_calls_total", verb="get",
                          resource="customresourcedefinitions") == 1
    lease = coordination.read_namespaced_lease("vllm-autotuner", namespace)
    assert lease.spec.holder_identity == leader.identity
    assert world.deployment().metadata.generation == 2 and len(world.events("RolloutStarted")) == 1
    # a standby told to stop exits at once, by its own handler: in its container it is PID 1, whose signals
    # without one the kernel drops (it would stand by until the kubelet's SIGKILL, free to take the Lease meanwhile)
    late = operators.start("late")
    assert late.stop() == 0 and "stopped while standing by" in late.log.read_text()

    assert leader.stop() == 0
    wait_for(lambda: leading(standby), 30, "the standby to take the Lease over")
    assert coordination.read_namespaced_lease("vllm-autotuner", namespace).spec.holder_identity == standby.identity
    world.patch_tuning({"schedules": [preset(SECOND)]})
    world.wait_rolled_out(knob_args(*SECOND), 90)
    assert standby.metric("vllm_autotuner_kubernetes_api_calls_total", **PATCHES) == 1
    assert world.deployment().metadata.generation == 3 and len(world.events("RolloutStarted")) == 2
