"""What an evaluation leaves for the rollout slots: the operator's rollout, not someone else's that has ended, nor one
its Deployment's pause halts; the old pods of one that succeeded, while they drain.

Someone else's rollout of a tuned Deployment (a ``kubectl rollout
restart``, an image bump) holds a slot while the Deployment shows it; once
it is complete, another tuning's change must not wait for it until the
tuning it belongs to is evaluated again. The reconciler is driven with the
stand-ins of ``test_reconcile_rollout`` for the API server calls and the
Prometheus window.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from tests.unit.controller.test_reconcile_rollout import NEW, NOW, OLD, Kube, Windows, cache, window

from vllm_autotuner.api import ConditionType, RolloutPhase
from vllm_autotuner.controller import events
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler

OTHER = ("llm", "rag")


def test_someone_elses_rollout_holds_a_slot_while_it_runs_and_not_after_until_the_next_evaluation() -> None:
    # our rollout ended six minutes ago; then someone restarts the Deployment and its new pod is not ready yet
    tuned = cache(finished=timedelta(minutes=6))
    deployment = tuned.deployment("llm", "llama")
    complete = dict(deployment["status"])
    deployment["status"].update(updatedReplicas=1, availableReplicas=1)
    reconciler = Reconciler(Kube(), tuned, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings(max_concurrent_rollouts=1))
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert report is not None and report.decision.hold == "RolloutInProgress"
    tunings = {("llm", "llama"): {"metadata": {"name": "llama", "namespace": "llm"},
                                  "spec": {"targetRef": {"name": "llama"}}, "status": {}},
               OTHER: {"metadata": {"name": "rag", "namespace": "llm"}, "spec": {"targetRef": {"name": "rag"}}}}

    def holders() -> list[str]:
        return reconciler.slots.holders(OTHER, None, tunings, reconciler.cache.target, NOW)

    assert holders() == ["llm/llama (rolling out)"]
    deployment["status"] = complete  # their rollout is done before the tuning is evaluated again
    assert holders() == []


def test_our_rollout_holds_no_slot_while_someone_keeps_its_deployment_paused() -> None:
    """`kubectl rollout pause` halfway through our rollout: the evaluation refuses to go on (TargetPaused) and the
    rollout stays ours, in progress, its deadline halted; yet no pod of it starts until it is resumed, so the other
    tunings of the pool do not wait for it meanwhile (for hours or days), as long as none of its pods waits for a
    GPU (``test_a_deployment_paused_with_a_surge_pod_or_one_unavailable_still_holds_its_slot``)."""
    tuned = cache()
    deployment = tuned.deployment("llm", "llama")
    reconciler = Reconciler(Kube(), tuned, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings(max_concurrent_rollouts=1))
    tunings = {("llm", "llama"): tuned.tunings[("llm", "llama")],
               OTHER: {"metadata": {"name": "rag", "namespace": "llm"}, "spec": {"targetRef": {"name": "rag"}}}}

    def holders() -> list[str]:
        return reconciler.slots.holders(OTHER, None, tunings, reconciler.cache.target, NOW)

    report = asyncio.run(reconciler.evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert report is not None and report.decision.hold == "RolloutInProgress"
    assert holders() == ["llm/llama (rolling out)"]
    deployment["spec"]["paused"] = True  # between two steps: a pod of each revision, both serving
    deployment["status"]["availableReplicas"] = 2
    deployment["status"]["conditions"] = [{"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused"}]
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), (NOW + timedelta(minutes=1)).timestamp(), write=False))
    assert report is not None and report.has(ConditionType.READY, False, events.TARGET_PAUSED)
    assert report.state.last_rollout is not None and report.state.last_rollout.phase == RolloutPhase.IN_PROGRESS
    assert holders() == []
    del deployment["spec"]["paused"]  # resumed: the condition keeps its reason until the controller's next sync
    assert holders() == ["llm/llama (rolling out)"]


def test_our_rollout_succeeds_while_its_old_pod_drains_and_holds_the_slot_until_it_is_gone() -> None:
    """The rollout is complete, the old pod still drains its requests in flight on its GPU (terminatingReplicas):
    the verdict does not wait for it, but the other tunings of the pool do, as their surge pods would find no GPU."""
    key = ("llm", "llama")
    done = cache(finished=timedelta(seconds=1))
    done.tunings[key]["status"] = cache().tunings[key]["status"]  # our rollout in progress, as last written
    deployment = done.deployment(*key)
    deployment["status"]["terminatingReplicas"] = 1
    reconciler = Reconciler(Kube(), done, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings(max_concurrent_rollouts=1))
    report = asyncio.run(reconciler.evaluate(key, NOW.timestamp(), write=False))
    assert report is not None and report.state.last_rollout is not None
    assert report.state.last_rollout.phase == RolloutPhase.SUCCEEDED
    tunings = {key: done.tunings[key],
               OTHER: {"metadata": {"name": "rag", "namespace": "llm"}, "spec": {"targetRef": {"name": "rag"}}}}

    def holders() -> list[str]:
        return reconciler.slots.holders(OTHER, None, tunings, reconciler.cache.target, NOW)

    assert holders() == ["llm/llama (pods terminating)"]
    deployment["status"]["terminatingReplicas"] = 0  # the old pod is gone
    assert holders() == []
