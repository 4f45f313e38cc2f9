"""What an evaluation leaves for the rollout slots: the operator's rollout, not someone else's that has ended.

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
        return reconciler.slots.holders(OTHER, None, tunings, reconciler.cache.target)

    assert holders() == ["llm/llama (rolling out)"]
    deployment["status"] = complete  # their rollout is done before the tuning is evaluated again
    assert holders() == []
