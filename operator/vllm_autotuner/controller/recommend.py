"""``vllm-autotuner recommend``: one recommendation from live data, nothing changed.

For teams not ready to let the operator act: it reads the Deployment and
its current ReplicaSet once, observes one window from Prometheus, runs the
same evaluation as the operator with a Recommend-mode VllmTuning that exists
only in memory, and prints what it would do and why. No status, no Events,
no patch.
"""

from __future__ import annotations

import time
from typing import Any

from vllm_autotuner.api import API_VERSION, KIND, VllmTuningSpec
from vllm_autotuner.controller.cache import ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.operator import _load_kube_config
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report
from vllm_autotuner.observe.service import ObservationService


async def recommend(namespace: str, deployment: str, spec_overrides: dict[str, Any], prometheus_url: str) -> Report:
    """Evaluate once in Recommend mode and return the report (state and decision)."""
    metrics = OperatorMetrics()
    kube = Kube(_load_kube_config(), metrics)
    found = kube.read_deployment(namespace, deployment)
    selector = ",".join(f"{k}={v}" for k, v in sorted(found["spec"]["selector"].get("matchLabels", {}).items()))
    deployments: dict = {}
    for key, body in deployment_index(namespace, deployment, found).items():
        deployments.setdefault(key, []).append(body)
    replicasets: dict = {}
    for rs in kube.list_replicasets(namespace, selector):
        for key, body in replicaset_index(namespace, rs).items():
            replicasets.setdefault(key, []).append(body)
    cache = ClusterCache()
    cache.bind(deployments, replicasets)
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": deployment}, "mode": "Recommend", **spec_overrides})
    cache.on_tuning_event(None, {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"namespace": namespace, "name": f"{deployment}-recommend", "generation": 1},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    })
    reconciler = Reconciler(kube, cache, ObservationService(), metrics,
                            OperatorSettings(prometheus_url=prometheus_url, naive_queries=True))
    report = await reconciler.evaluate((namespace, f"{deployment}-recommend"), time.time(), write=False)
    assert report is not None
    return report


def render(report: Report) -> str:
    """The report as a person reads it."""
    state = report.state
    lines = []
    if state.current is not None:
        lines.append(f"current:     {state.current.knobs}" + (f"  ({state.current.defaults_table})"
                                                             if state.current.defaults_table else ""))
    for cond in state.conditions:
        if cond.status != "True" and cond.type in ("Ready", "MetricsAvailable"):
            lines.append(f"{cond.type}: {cond.reason}: {cond.message}")
    if state.observed is not None:
        o = state.observed
        lines.append(f"observed:    {o.request_rate:.2f} req/s over {o.pods} pods, TTFT {o.ttft_seconds} s, "
                     f"ITL {o.itl_seconds} s, KV {o.kv_cache_usage}")
    if state.regime:
        lines.append(f"regime:      {state.regime}")
    decision = report.decision
    if decision is not None:
        lines.append(f"decision:    {decision.action}")
        if decision.recommendation is not None:
            gain = f" (expected gain {decision.expected_gain_percent:.1f}%)" if decision.expected_gain_percent else ""
            lines.append(f"recommended: {decision.recommendation}{gain}")
        lines.append(f"why:         {decision.reason}")
    return "\n".join(lines) + "\n"
