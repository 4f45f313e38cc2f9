"""The GPU a Deployment runs on is read from the node of one of its own pods, found by its whole selector and
its ReplicaSets' ownership.

A selector may hold matchExpressions only; listing by its matchLabels alone
would then list every pod in the namespace, and the GPU labels could come
from another workload's node (and with them vLLM's default knobs). Another
Deployment's selector may overlap this one's: its pods match the labels too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from vllm_autotuner.api import VllmTuningSpec
from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.kube import Kube as ApiKube
from vllm_autotuner.controller.kube import label_selector
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler
from vllm_autotuner.knobs import Hardware, vllm_defaults


#: The evaluations' clock; nodes are a day old unless a test says otherwise
NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)
A_DAY_AGO = "2026-12-06T12:00:00Z"


def pod(node: str, owner: str) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "uid": owner}]}, "spec": {"nodeName": node}}


class Kube:
    """Pods by selector: the vLLM pod runs on an H100 node; another workload's pod, and the pod of a second
    Deployment labelled as this one's (its selector overlaps), on L4 nodes."""

    def __init__(self) -> None:
        self.selectors: list[str] = []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        vllm, copy = pod("h100-node", "rs-uid"), pod("l4-node", "copy-rs-uid")
        return [copy, vllm] if selector == "app in (llama)" else [pod("l4-node", "other-rs-uid"), copy, vllm]

    def node_metadata(self, name: str) -> dict[str, Any]:
        memory = {"h100-node": "81559", "l4-node": "23034"}[name]
        return {"name": name, "creationTimestamp": A_DAY_AGO, "labels": {
            "nvidia.com/gpu.memory": memory, "nvidia.com/gpu.product": name.removesuffix("-node").upper()}}


def test_the_gpu_is_read_from_a_pod_of_the_deployment_listed_by_its_selector() -> None:
    selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["llama"]}]}
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    deployment = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u1"},
                  "spec": {"selector": selector, "template": {"spec": {"containers": [container]}}}}
    kube, cache = Kube(), ClusterCache()
    cache.bind({}, {("llm", "u1"): [{"metadata": {"name": "llama-7f8b", "uid": "rs-uid"}}]})
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings())
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}})
    hardware = asyncio.run(reconciler._hardware(deployment, container, spec, NOW))
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


class Pools(Kube):
    """Pods by selector: revision 1's on an H100 node, revision 2's on an L4 node."""

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        return [pod("h100-node", "rs1-uid"), pod("l4-node", "rs2-uid")]


def test_the_gpu_is_read_again_when_the_spec_or_the_pools_the_pods_run_in_change() -> None:
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    deployment = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u1",
                               "annotations": {"deployment.kubernetes.io/revision": "1"}},
                  "spec": {"selector": {"matchLabels": {"app": "llama"}}, "template": {"spec": {
                      "containers": [container], "nodeSelector": {"pool": "h100"}}}}}
    kube, cache = Pools(), ClusterCache()
    revisions = [{"metadata": {"name": f"llama-{n}", "uid": f"rs{n}-uid",
                               "annotations": {"deployment.kubernetes.io/revision": str(n)}}} for n in (1, 2)]
    cache.bind({}, {("llm", "u1"): revisions})
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings())

    def read(engine: dict[str, Any] | None = None) -> tuple[str | None, int]:
        spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "engine": engine or {}})
        hardware = asyncio.run(reconciler._hardware(deployment, container, spec, NOW))
        return hardware.product, round(hardware.memory_gib or 0)

    assert read() == read() == ("H100", 80)
    assert len(kube.selectors) == 1  # a node is read once, not at each evaluation
    assert read({"gpuMemoryGib": 24}) == (None, 24)  # the spec corrected: its GPU memory, at once
    # the template sent to the L4 pool: revision 2's pods run there, revision 1's still on the H100 node
    deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "l4"}
    assert read() == ("L4", 22)


def test_no_node_is_read_from_pods_that_may_not_run_the_template_as_it_stands() -> None:
    # moved to the L4 pool: paused, then before the Deployment controller made revision 2, then before the
    # ReplicaSet watch brought it, revision 1's pods on the H100 node are not the GPU of the L4 template
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    annotations = {"deployment.kubernetes.io/revision": "1"}
    deployment = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u1", "generation": 1,
                               "annotations": annotations},
                  "spec": {"selector": {"matchLabels": {"app": "llama"}}, "template": {"spec": {
                      "containers": [container], "nodeSelector": {"pool": "h100"}}}},
                  "status": {"observedGeneration": 1}}
    kube, cache = Pools(), ClusterCache()
    revisions = [{"metadata": {"name": "llama-1", "uid": "rs1-uid",
                               "annotations": {"deployment.kubernetes.io/revision": "1"}}}]
    cache.bind({}, {("llm", "u1"): revisions})
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings())
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}})

    def read() -> tuple[str | None, int]:
        hardware = asyncio.run(reconciler._hardware(deployment, container, spec, NOW))
        return hardware.product, round(hardware.memory_gib or 0)

    assert read() == ("H100", 80)
    deployment["spec"]["paused"] = True
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "l4"}
    deployment["metadata"]["generation"] = deployment["status"]["observedGeneration"] = 3
    assert read() == read() == (None, 0)  # vLLM's defaults, as before a pod has a node, and read again
    del deployment["spec"]["paused"]
    deployment["metadata"]["generation"] = 4  # resumed: the controller has not made revision 2 yet
    assert read() == (None, 0)
    deployment["status"]["observedGeneration"] = 4
    annotations["deployment.kubernetes.io/revision"] = "2"  # made, its ReplicaSet not watched yet
    assert read() == (None, 0)
    assert len(kube.selectors) == 1  # no pod listed in any of these
    revisions.append({"metadata": {"name": "llama-2", "uid": "rs2-uid",
                                   "annotations": {"deployment.kubernetes.io/revision": "2"}}})
    assert read() == read() == ("L4", 22)
    assert len(kube.selectors) == 2
    # paused, or scaled (a generation the controller has not seen yet), with the template's pool as it was: the
    # reading stands, not vLLM's defaults for a GPU of unknown memory (which a template without knob flags would
    # take for the knobs it runs)
    deployment["spec"]["paused"] = True
    assert read() == ("L4", 22)
    del deployment["spec"]["paused"]
    deployment["metadata"]["generation"] = 5
    assert read() == ("L4", 22)
    assert len(kube.selectors) == 2
    # a new revision of a template edited elsewhere (tolerations: another GPU's nodes) is read again
    deployment["status"]["observedGeneration"] = 5
    annotations["deployment.kubernetes.io/revision"] = "3"
    revisions.append({"metadata": {"name": "llama-3", "uid": "rs3-uid",
                                   "annotations": {"deployment.kubernetes.io/revision": "3"}}})
    assert read() == ("L4", 22)  # its pods have no node yet (a surge pod waiting for a GPU): the reading stands
    assert len(kube.selectors) == 3


class OneNode(Kube):
    """Pods by selector: the vLLM pod pending until ``scheduled``, then on a node with ``labels``, made
    ``created``."""

    def __init__(self, labels: dict[str, str], created: str = A_DAY_AGO) -> None:
        super().__init__()
        self.labels, self.created, self.nodes, self.scheduled = labels, created, [], True

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        return [pod("gpu-node" if self.scheduled else "", "rs-uid")]

    def node_metadata(self, name: str) -> dict[str, Any]:
        self.nodes.append(name)
        return {"name": name, "creationTimestamp": self.created, "labels": self.labels}


def reading(kube: OneNode, node_selector: dict[str, str] | None = None,
            engine: dict[str, Any] | None = None) -> Callable[[], Hardware]:
    """An evaluation's reading of the GPU of a Deployment of one revision whose pods ``kube`` lists."""
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    deployment = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u1"},
                  "spec": {"selector": {"matchLabels": {"app": "llama"}}, "template": {"spec": {
                      "containers": [container], "nodeSelector": node_selector or {}}}}}
    cache = ClusterCache()
    cache.bind({}, {("llm", "u1"): [{"metadata": {"name": "llama-7f8b", "uid": "rs-uid"}}]})
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings())
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "engine": engine or {}})
    return lambda: asyncio.run(reconciler._hardware(deployment, container, spec, NOW))


def test_a_node_that_says_nothing_of_its_gpu_memory_is_read_once() -> None:
    # an EKS node a day old, without GPU Feature Discovery or Karpenter's labels
    kube = OneNode({"kubernetes.io/hostname": "gpu-node"})
    kube.scheduled = False
    read = reading(kube)
    assert read() == read() == Hardware(gpus=1)  # its pod pending: no node to read, asked again
    assert (len(kube.selectors), kube.nodes) == (2, [])
    kube.scheduled = True
    assert read() == read() == Hardware(gpus=1)  # two evaluations: vLLM's defaults for a GPU of unknown memory
    assert (len(kube.selectors), kube.nodes) == (3, ["gpu-node"])  # one pod list, one node read


GKE, KARPENTER_NAME, KARPENTER_MIB = ("cloud.google.com/gke-accelerator", "karpenter.k8s.aws/instance-gpu-name",
                                      "karpenter.k8s.aws/instance-gpu-memory")
PARTITION = "cloud.google.com/gke-gpu-partition-size"


@pytest.mark.parametrize(("labels", "expected"), [
    ({GKE: "nvidia-l4"}, (2048, 256)),
    ({GKE: "nvidia-tesla-t4"}, (2048, 256)),
    ({GKE: "nvidia-tesla-a100"}, (2048, 256)),
    ({GKE: "nvidia-a100-80gb"}, (2048, 256)),  # 80 GiB, but an A100: vLLM keeps it off the large-GPU defaults
    ({GKE: "nvidia-h100-80gb"}, (8192, 1024)),
    ({GKE: "nvidia-h100-mega-80gb"}, (8192, 1024)),
    ({GKE: "nvidia-h200-141gb"}, (8192, 1024)),
    ({GKE: "nvidia-b200"}, (16384, 1024)),
    # a multi-instance GPU partition: vLLM sees the slice's memory, not the H100's
    ({GKE: "nvidia-h100-80gb", PARTITION: "1g.10gb"}, (2048, 256)),
    ({GKE: "nvidia-h100-80gb", PARTITION: "3g.40gb"}, (2048, 256)),
    ({GKE: "nvidia-h100-80gb", PARTITION: "7g.80gb"}, (8192, 1024)),
    ({KARPENTER_NAME: "l4", KARPENTER_MIB: "22888"}, (2048, 256)),  # a g6 instance, as EC2 describes its GPU
    ({KARPENTER_NAME: "a100", KARPENTER_MIB: "81920"}, (2048, 256)),  # p4de
    ({KARPENTER_NAME: "h100", KARPENTER_MIB: "81920"}, (8192, 1024)),  # p5
    # GPU Feature Discovery's label before the cloud's
    ({"nvidia.com/gpu.memory": "81559", GKE: "nvidia-l4", KARPENTER_MIB: "22888"}, (8192, 1024)),
])
def test_the_gpu_is_read_from_gke_and_karpenter_node_labels(labels: dict[str, str],
                                                           expected: tuple[int, int]) -> None:
    kube = OneNode(labels)
    defaults = vllm_defaults("v0.30.0", reading(kube)())
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == expected
    assert "unknown" not in defaults.table
    assert kube.nodes == ["gpu-node"]


def test_a_gke_gpu_partition_is_a_gpu_of_its_memory() -> None:
    # asked for in the nodeSelector, as GKE's multi-instance GPUs are: no node to read
    kube = OneNode({})
    read = reading(kube, {GKE: "nvidia-h100-80gb", PARTITION: "1g.10gb"})
    assert read() == Hardware(gpus=1, memory_gib=10, product="nvidia-h100-80gb")  # NVML: 9.75 GiB
    assert (kube.selectors, kube.nodes) == ([], [])
    # GPU Feature Discovery's label (a partition's memory under its MIG "single" strategy) and the spec's before it
    gfd = OneNode({"nvidia.com/gpu.memory": "9856", GKE: "nvidia-h100-80gb", PARTITION: "1g.10gb"})
    assert reading(gfd)().memory_gib == 9856 / 1024
    assert reading(kube, {GKE: "nvidia-h100-80gb", PARTITION: "1g.10gb"}, {"gpuMemoryGib": 12})().memory_gib == 12


def test_a_gke_accelerator_in_the_node_selector_is_read_on_a_node_once_for_its_partition() -> None:
    # the selector names the whole GPU; the pod's node cuts it into multi-instance partitions, whose memory vLLM sees
    kube = OneNode({GKE: "nvidia-h100-80gb", PARTITION: "1g.10gb"}, created=ago(seconds=5))
    read = reading(kube, {GKE: "nvidia-h100-80gb", "cloud.google.com/gke-spot": "true"})
    assert read() == read() == Hardware(gpus=1, memory_gib=10, product="nvidia-h100-80gb")
    assert kube.nodes == ["gpu-node"]
    defaults = vllm_defaults("v0.30.0", read())
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == (2048, 256)
    # the spec's GPU memory before the labels, and no node read for it
    spec_given = OneNode({})
    assert reading(spec_given, {GKE: "nvidia-h100-80gb"}, {"gpuMemoryGib": 24})().memory_gib == 24
    assert spec_given.nodes == []


@pytest.mark.parametrize("node_selector", [{GKE: "nvidia-tesla-k80"}, {}])
def test_an_unknown_gke_accelerator_is_a_gpu_of_unknown_memory(node_selector: dict[str, str]) -> None:
    # an accelerator type the table leaves out (vLLM does not run on a K80; GKE adds new ones): as without the label
    kube = OneNode({GKE: "nvidia-tesla-k80"})
    read = reading(kube, node_selector)
    hardware = read()
    assert (hardware.memory_gib, read()) == (None, hardware)
    assert kube.nodes == ["gpu-node"]  # the node asked, once
    defaults = vllm_defaults("v0.30.0", hardware)
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == (8192, 1024)
    assert "GPU memory unknown" in defaults.table


def ago(**delta: float) -> str:
    return (NOW - timedelta(**delta)).isoformat()


def test_gpu_labels_that_come_after_a_young_node_is_first_read_are_read() -> None:
    # an autoscaled node: the pod binds as soon as the device plugin advertises the GPU; GPU Feature Discovery's
    # labels (through Node Feature Discovery) come seconds later
    kube = OneNode({"nvidia.com/gpu.present": "true"}, created=ago(seconds=40))
    read = reading(kube)
    assert read() == Hardware(gpus=1)  # vLLM's defaults for a GPU of unknown memory, for now
    kube.labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-L4",
                   "nvidia.com/gpu.memory": "23034"}
    assert read() == read() == Hardware(gpus=1, memory_gib=23034 / 1024, product="NVIDIA-L4")
    assert kube.nodes == ["gpu-node", "gpu-node"]  # read again until its labels came, then kept
    defaults = vllm_defaults("v0.30.0", read())
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == (2048, 256)


def test_a_node_without_gpu_labels_is_read_again_only_while_young() -> None:
    # EKS without GPU Feature Discovery: no label will come, so the node costs reads only for its first minutes
    kube = OneNode({"kubernetes.io/hostname": "gpu-node"}, created=ago(minutes=9, seconds=59))
    read = reading(kube)
    assert read() == read() == Hardware(gpus=1)
    assert kube.nodes == ["gpu-node"] * 2
    kube.created = ago(minutes=10)  # as old as labels take to come, at the next evaluation's clock
    assert read() == read() == read() == Hardware(gpus=1)
    assert kube.nodes == ["gpu-node"] * 3


@pytest.mark.parametrize("labels", [
    {GKE: "nvidia-l4"},
    {KARPENTER_NAME: "l4", KARPENTER_MIB: "22888"},
    {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034"},
])
def test_a_young_node_with_gpu_labels_is_read_once(labels: dict[str, str]) -> None:
    # GKE and Karpenter label a node when it registers: seconds old, its labels are all it will say
    kube = OneNode(labels, created=ago(seconds=5))
    read = reading(kube)
    assert read() == read()
    assert kube.nodes == ["gpu-node"]


def test_a_young_gke_node_of_a_type_not_in_the_table_is_read_again_for_gpu_feature_discoverys_labels() -> None:
    # GKE names the type when the node registers; GPU Feature Discovery, where it runs, says the memory later
    kube = OneNode({GKE: "nvidia-b300"}, created=ago(minutes=1))
    read = reading(kube)
    assert read().memory_gib is None
    kube.labels = {GKE: "nvidia-b300", "nvidia.com/gpu.memory": "275040"}
    assert read() == read() == Hardware(gpus=1, memory_gib=275040 / 1024, product="nvidia-b300")
    assert kube.nodes == ["gpu-node", "gpu-node"]
    defaults = vllm_defaults("v0.30.0", read())
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == (16384, 1024)


def test_a_nodes_labels_and_creation_time_are_read_as_served() -> None:
    served = {"metadata": {"name": "gpu-node", "creationTimestamp": "2026-12-07T11:59:20Z",
                           "labels": {"nvidia.com/gpu.present": "true"}},
              "status": {"capacity": {"nvidia.com/gpu": "1"}}}
    kube = ApiKube(client.ApiClient(), OperatorMetrics())
    kube.core = SimpleNamespace(  # type: ignore[assignment]
        read_node=lambda name, _preload_content=True, **_: SimpleNamespace(data=json.dumps(served).encode()))
    meta = kube.node_metadata("gpu-node")
    assert (meta["labels"], NOW - datetime.fromisoformat(meta["creationTimestamp"])) == (
        {"nvidia.com/gpu.present": "true"}, timedelta(seconds=40))
