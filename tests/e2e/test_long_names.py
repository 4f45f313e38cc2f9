"""A Deployment named too long for its pods' names to carry their ReplicaSet's hash is observed by its own pods.

The apiserver keeps 58 characters of a generated name, so the pods of a
Deployment named with 57 begin with that name and '-' alone: no hash, and a
Deployment named ``<name>-c`` (a canary beside it) has pods that begin the
same. The operator must list the pods of the tuned Deployment and take their
series by exact name: the canary's pods, scraped by the same Prometheus, are
not the tuned Deployment's and must not be in its window.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.test_traffic import settled_window
from tests.e2e.world import Load, World, knob_args, tuning_spec
from tests.support import H100, Cluster, Operators, wait_for

from vllm_autotuner.controller.reconcile import pod_prefix
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

NAME = "llama-3-1-8b-instruct-chat-production-eu-west-one-abcdefg"
KNOBS = (512, 16)


def test_the_window_of_a_long_named_deployment_takes_its_own_pods_not_a_canarys(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path) -> None:
    assert len(NAME) == 57
    world = World(cluster_with_crd, namespace, name=NAME)
    canary = World(cluster_with_crd, namespace, name=f"{NAME}-c")
    canary.create_deployment(H100, knob_args(*KNOBS), replicas=1)
    world.create_deployment(H100, knob_args(*KNOBS), replicas=2)
    (replicaset,) = world.replicasets()
    assert pod_prefix(replicaset.metadata.name) == f"{NAME}-"  # no hash left: the canary's pods begin the same
    assert all(pod.metadata.name.startswith(f"{NAME}-") for pod in canary.pods())

    world.create_tuning(tuning_spec(world.name, mode="Recommend"))
    operators.start()
    with Load(world, tmp_path, rate=6):
        observed = wait_for(lambda: settled_window(world, KNOBS), 150, "a first usable window")

    assert observed["pods"] == 2, observed  # the tuned Deployment's two pods, not the canary's third
    assert world.has_condition("MetricsAvailable", "True", "WindowObserved")
