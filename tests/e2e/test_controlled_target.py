"""A Deployment another object controls gets recommendations, not changes, until the spec says otherwise.

KServe's InferenceService, llm-d's and many operators' custom resources
render the vLLM Deployment and own it (a controller ownerReference): their
controller puts the args back after every change, so each change would cost
two rolling restarts and stick for none. The operator must see the owner
before its first change: a schedule preset wanted now is only recommended
(hold TargetControlled, Degraded=True TargetControlled, a Warning Event),
and the Deployment keeps its generation. Once ``spec.targetRef.ignoreController``
says the owner leaves the args alone, the preset rolls out. The owner's
finalizer, the one every kopf-based operator shares by default, stays on the
Deployment throughout (kopf takes its finalizer off what it watches unless told
another name).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.world import World, knob_args, knobs_of, open_window, tuning_spec
from tests.support import H100, Cluster, NotYet, Operators, alert_watcher, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

BEFORE, PRESET = (2048, 64), (8192, 128)
#: The finalizer another kopf-based operator puts on what it owns, unless told another name
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def test_a_controlled_deployment_gets_recommendations_until_the_spec_says_to_ignore_its_controller(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*BEFORE), replicas=1)
    owner = world.core.create_namespaced_config_map(namespace, {"metadata": {"name": f"{world.name}-owner"}})
    world.apps.patch_namespaced_deployment(world.name, namespace, {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid,
         "controller": True}], "finalizers": [KOPF_FINALIZER]}})
    try:
        _recommended_then_rolled_out(world, namespace, owner.metadata.name, operators, tmp_path)
        assert world.deployment().metadata.finalizers == [KOPF_FINALIZER]
    finally:
        world.apps.patch_namespaced_deployment(world.name, namespace, {"metadata": {"finalizers": None}})


def _recommended_then_rolled_out(world: World, namespace: str, owner: str, operators: Operators,
                                 tmp_path: Path) -> None:
    untouched = world.deployment().metadata
    preset = {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}
    world.create_tuning(tuning_spec(world.name, schedules=[open_window("Europe/Berlin", preset)]))
    operator = operators.start()

    def recommended() -> dict | NotYet:
        newest = (world.status().get("history") or [{}])[0]
        return newest if newest.get("hold") == "TargetControlled" else NotYet(f"{newest}")

    with alert_watcher(tmp_path / "watcher", operator.url) as watcher:
        held = wait_for(recommended, 60, "the preset to be only recommended")
        assert f"controlled by ConfigMap {namespace}/{owner}" in held["reason"], held
        assert world.status()["recommendation"]["maxNumBatchedTokens"] == PRESET[0]
        degraded = world.wait_condition("Degraded", "True", "TargetControlled", 30)
        assert "ignoreController" in degraded["message"]
        assert [e.type for e in world.events("TargetControlled")] == ["Warning"]
        # the chart's alert, on the operator's own series as a Prometheus scrapes them
        (alert,) = wait_for(lambda: watcher.active().get("VllmTuningTargetControlled") or NotYet("no alert"), 30,
                            "VllmTuningTargetControlled to fire")
    assert alert["state"] == "firing" and (alert["labels"]["namespace"], alert["labels"]["tuning"]) == (
        namespace, world.name), alert
    deployment = world.deployment().metadata
    assert (deployment.generation, knobs_of(world.template_args())) == (untouched.generation, BEFORE)

    world.patch_tuning({"targetRef": {"name": world.name, "ignoreController": True}})
    world.wait_rolled_out(knob_args(*PRESET), 90)
    world.wait_condition("Degraded", "False", None, 30)
