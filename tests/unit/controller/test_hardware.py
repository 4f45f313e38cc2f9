"""The GPU a Deployment runs on is read from the node of one of its own pods, found by its whole selector.

A selector may hold matchExpressions only; listing by its matchLabels alone
would then list every pod in the namespace, and the GPU labels could come
from another workload's node (and with them vLLM's default knobs).
"""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_autotuner.api import VllmTuningSpec
from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.kube import label_selector
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler


class Kube:
    """Pods by selector: the vLLM pod runs on an H100 node, another workload's pod on an L4 node."""

    def __init__(self) -> None:
        self.selectors: list[str] = []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        vllm = {"spec": {"nodeName": "h100-node"}}
        return [vllm] if selector == "app in (llama)" else [{"spec": {"nodeName": "l4-node"}}, vllm]

    def node_labels(self, name: str) -> dict[str, str]:
        memory = {"h100-node": "81559", "l4-node": "23034"}[name]
        return {"nvidia.com/gpu.memory": memory, "nvidia.com/gpu.product": name.removesuffix("-node").upper()}


def test_the_gpu_is_read_from_a_pod_the_deployments_selector_lists() -> None:
    selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["llama"]}]}
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    deployment = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u1"},
                  "spec": {"selector": selector, "template": {"spec": {"containers": [container]}}}}
    kube = Kube()
    reconciler = Reconciler(kube, ClusterCache(), observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings())
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}})
    hardware = asyncio.run(reconciler._hardware(deployment, container, spec))
    assert kube.selectors == ["app in (llama)"]
    assert (hardware.product, round(hardware.memory_gib or 0)) == ("H100", 80)


def test_label_selector_of_a_deployment() -> None:
    assert (
        label_selector(
            {
                "matchLabels": {"b": "2", "a": "1"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["x", "y"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "zone", "operator": "NotIn", "values": ["z"]},
                ],
            }
        )
        == "a=1,b=2,tier in (x,y),!canary,gpu,zone notin (z)"
    )
