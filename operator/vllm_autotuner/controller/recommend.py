"""``vllm-autotuner recommend``: one recommendation from live data, nothing changed.

For teams not ready to let the operator act, or about to apply a VllmTuning:
it reads the Deployment and its current ReplicaSet once, runs the same
evaluation as the operator on the last two windows from Prometheus with a
Recommend-mode VllmTuning that exists only in memory (the manifest's spec,
or one built from flags), and prints what it would do and why. No status,
no Events, no patch.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from vllm_autotuner.api import API_VERSION, KIND, VllmTuningSpec
from vllm_autotuner.api.types import duration_seconds
from vllm_autotuner.controller.cache import ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.events import RESTART_LOSES_REQUESTS
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.operator import _load_kube_config
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report
from vllm_autotuner.observe.service import ObservationService


def read_manifest(path: Path, namespace: str | None) -> tuple[str, dict[str, Any]]:
    """The namespace and spec of the one VllmTuning in the YAML file at ``path`` (its metadata's namespace, else
    ``namespace``). Raises ValueError saying what the file lacks."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    tunings = [d for d in documents if d.get("apiVersion") == API_VERSION and d.get("kind") == KIND]
    if len(tunings) != 1:
        raise ValueError(f"{path} holds {len(tunings)} VllmTunings ({API_VERSION}); give a file with one")
    metadata = tunings[0].get("metadata") or {}
    written = metadata.get("namespace")
    if written and namespace and written != namespace:
        raise ValueError(f"{path}'s VllmTuning is in namespace {written}, not --namespace {namespace}")
    if not (written or namespace):
        raise ValueError(f"{path}'s VllmTuning names no namespace: give --namespace")
    return written or namespace, tunings[0].get("spec") or {}


async def recommend(namespace: str, spec: dict[str, Any], settings: OperatorSettings) -> Report:
    """Evaluate the VllmTuning ``spec`` in Recommend mode and return the report (state and decision), reaching
    Prometheus as an operator run with ``settings`` would (its URL, headers and credential files, for a spec that
    names no ``prometheus.url``). Raises pydantic's ValidationError for a spec the CRD would refuse.

    The traffic policy acts on a regime only once it has lasted a whole window,
    which a running operator knows from the windows before; so the window
    before the last is evaluated first, and its state carried over to the last
    as the operator's status would be.
    """
    tuning = VllmTuningSpec.model_validate({**spec, "mode": "Recommend"})
    deployment = tuning.target_ref.name
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
    body = {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"namespace": namespace, "name": f"{deployment}-recommend", "generation": 1},
        "spec": tuning.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    cache.on_tuning_event(None, body)
    reconciler = Reconciler(kube, cache, ObservationService(), metrics, replace(settings, naive_queries=True))
    key, now = (namespace, f"{deployment}-recommend"), time.time()
    before = await reconciler.evaluate(key, now - duration_seconds(tuning.traffic.window), write=False)
    assert before is not None
    cache.on_tuning_event(None, {**body, "status": before.state.model_dump(by_alias=True, mode="json")})
    report = await reconciler.evaluate(key, now, write=False)
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
    lines += [f"restarts:    {message}" for reason, message, _ in report.events if reason == RESTART_LOSES_REQUESTS]
    return "\n".join(lines) + "\n"
