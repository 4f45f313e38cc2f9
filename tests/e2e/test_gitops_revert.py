"""The operator stops changing a Deployment whose args another writer keeps putting back.

A GitOps tool with self-heal (Argo CD, Flux) syncs the Deployment back to
its manifest soon after every change the operator makes. Each change then
costs two rolling restarts, the operator's and the sync's. Here the test
plays that tool: it puts the manifest's args back whenever they differ.
The operator adopts the first revert as a person's change (a cooldown),
naming the writer the apiserver recorded (its field manager), and stops at
the second: Degraded=True ChangesReverted naming that writer, with what to
do, one Warning Event, and no further patch while it only recommends. Once
the spec changes (the team has made the tool ignore the args) it tunes again.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException
from tests.e2e.world import World, knob_args, knobs_of, open_window, tuning_spec
from tests.support import H100, Cluster, NotYet, Operators, alert_watcher, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

MANIFEST, PRESET = (2048, 64), (8192, 128)
PATCHES = {"verb": "patch", "resource": "deployments"}


class SelfHeal:
    """A GitOps tool's self-heal: the manifest's args put back whenever the live Deployment's differ."""

    def __init__(self, world: World) -> None:
        self.world, self.reverts, self.stopped = world, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(1.0):  # its sync period
            try:
                if knobs_of(self.world.template_args()) != MANIFEST:
                    self.world.apps.patch_namespaced_deployment(self.world.name, self.world.namespace, {"spec": {
                        "template": {"spec": {"containers": [{"name": "vllm", "args": knob_args(*MANIFEST)}]}}}},
                        field_manager="argocd-controller")  # Argo CD's name in the write history
                    self.reverts += 1
            except ApiException:  # a conflict with the operator's write: synced again next period
                continue

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def test_changes_put_back_twice_stop_the_operator_until_the_spec_changes(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*MANIFEST), replicas=1)
    world.create_tuning(tuning_spec(world.name, rollout={"cooldown": "5s"}, schedules=[
        open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})]))
    sync = SelfHeal(world)
    try:
        operator = operators.start()
        with alert_watcher(tmp_path / "watcher", operator.url) as watcher:
            degraded = world.wait_condition("Degraded", "True", "ChangesReverted", 150)
            assert "argocd-controller put back" in degraded["message"], degraded  # who, as the write history says
            assert "edit this VllmTuning's spec" in degraded["message"], degraded
            assert len(world.status()["reverts"]) == 2 and sync.reverts == 2
            assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", **PATCHES) == 2
            holds = operator.metric("vllm_autotuner_decisions_total", reason="ChangesReverted")
            wait_for(lambda: operator.metric("vllm_autotuner_decisions_total", reason="ChangesReverted") >= holds + 3,
                     60, "three more evaluations that only recommend")
            assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", **PATCHES) == 2 and sync.reverts == 2
            assert world.status()["recommendation"]["maxNumBatchedTokens"] == PRESET[0]
            assert [e.type for e in world.events("ChangesReverted")] == ["Warning"]
            # each revert is adopted naming who made it, as the apiserver recorded the write
            adopted = [e.message for e in world.events("ManualChangeAdopted")]
            assert len(adopted) == 2 and all(" by argocd-controller;" in m for m in adopted), adopted
            # the chart's alert, on the operator's own series as a Prometheus scrapes them
            (alert,) = wait_for(lambda: watcher.active().get("VllmTuningChangesReverted") or NotYet("no alert"), 30,
                                "VllmTuningChangesReverted to fire")
        assert alert["state"] == "firing" and (alert["labels"]["namespace"], alert["labels"]["tuning"]) == (
            namespace, world.name), alert
    finally:
        sync.stop()

    world.patch_tuning({"rollout": {"cooldown": "6s"}})  # the tool now ignores the args; the spec is touched
    world.wait_condition("Degraded", "False", "AsExpected", 60)
    world.wait_rolled_out(knob_args(*PRESET), 120)
    assert world.status().get("reverts", []) == [] and "revertedBy" not in world.status()
