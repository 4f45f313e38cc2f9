"""The local control plane behaves as a real cluster does where the operator depends on it.

The operator patches Deployments and follows their rollouts; that only means
something if the Deployment and ReplicaSet controllers and the scheduler are
the real ones, with real GPU accounting. These tests pin that down, together
with the version the build claims.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from kubernetes import client
from tests.support import Cluster, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
POOL_LABEL = "test.vllm-autotuner.io/pool"


def pinned_kubernetes_version() -> str:
    for line in (localenv.ROOT / "hack" / "testenv" / "go.mod").read_text().splitlines():
        fields = line.split()
        if fields[:1] == ["k8s.io/kubernetes"]:
            return fields[1]
    raise AssertionError("hack/testenv/go.mod does not require k8s.io/kubernetes")


def test_version_is_the_pinned_release(cluster: Cluster) -> None:
    version = pinned_kubernetes_version()
    info = client.VersionApi(cluster.api).get_code()
    assert info.git_version == version
    assert f"v{info.major}.{info.minor}." in version
    both = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert both["clientVersion"]["gitVersion"] == both["serverVersion"]["gitVersion"] == version


def test_readyz(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    verbose = cluster.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "[+]etcd ok" in verbose and "readyz check passed" in verbose


def gpu_node(name: str, pool: str) -> client.V1Node:
    """A Node as a kubelet would register it: one GPU, Ready."""
    now = datetime.now(timezone.utc)
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "1"}
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={POOL_LABEL: pool}),
        status=client.V1NodeStatus(
            capacity=resources,
            allocatable=resources,
            conditions=[client.V1NodeCondition(type="Ready", status="True", reason="KubeletReady",
                                               message="simulated kubelet", last_heartbeat_time=now,
                                               last_transition_time=now)],
        ),
    )


@pytest.fixture
def gpu_pool(cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    """Two one-GPU Nodes that the scheduler may use, labelled with a pool of their own.

    New Nodes are born tainted not-ready (admission); only the node lifecycle
    controller lifts that, on seeing them Ready.
    """
    core = client.CoreV1Api(cluster.api)
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    names = [f"{pool}-gpu-{i}" for i in range(2)]
    for name in names:
        core.create_node(gpu_node(name, pool))

    def untainted() -> list:
        nodes = [core.read_node(name) for name in names]
        if all(not node.spec.taints for node in nodes):
            return nodes
        return [(node.metadata.name, node.spec.taints) for node in nodes]

    wait_for(untainted, 60, "the node lifecycle controller to lift the not-ready taint of the Ready nodes")
    try:
        yield pool, names
    finally:
        for name in names:
            core.delete_node(name)


def vllm_deployment(name: str, pool: str, tokens: int) -> client.V1Deployment:
    labels = {"app": name}
    container = client.V1Container(
        name="vllm",
        image="vllm/vllm-openai:v0.11.0",
        args=["--model=Qwen/Qwen3-0.6B", f"--max-num-batched-tokens={tokens}"],
        resources=client.V1ResourceRequirements(limits={GPU: "1"}),
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[container], node_selector={POOL_LABEL: pool}),
            ),
        ),
    )


def test_deployment_pods_are_scheduled_onto_gpu_nodes_and_a_template_change_rolls(
    cluster: Cluster, namespace: str, gpu_pool: tuple[str, list[str]]
) -> None:
    pool, nodes = gpu_pool
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    deployment = apps.create_namespaced_deployment(namespace, vllm_deployment("llama", pool, 2048))

    def owned_replicasets(count: int) -> list[client.V1ReplicaSet]:
        owned = [rs for rs in apps.list_namespaced_replica_set(namespace).items
                 if any(o.uid == deployment.metadata.uid for o in rs.metadata.owner_references or [])]
        return owned if len(owned) == count else []

    first = wait_for(lambda: owned_replicasets(1), 60, "the deployment controller to create a ReplicaSet")[0]

    def bound_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace).items
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else []

    pods = wait_for(bound_pods, 60, "the scheduler to bind both pods")
    # One GPU per node and one per pod: the scheduler must use both nodes.
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    assert all(p.metadata.owner_references[0].uid == first.metadata.uid for p in pods)

    patch = {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "args": ["--model=Qwen/Qwen3-0.6B", "--max-num-batched-tokens=4096"]}]}}}}
    apps.patch_namespaced_deployment("llama", namespace, patch)
    both = wait_for(lambda: owned_replicasets(2), 60, "the deployment controller to create a second ReplicaSet")
    new = next(rs for rs in both if rs.metadata.uid != first.metadata.uid)
    assert new.metadata.labels["pod-template-hash"] != first.metadata.labels["pod-template-hash"]
    assert "--max-num-batched-tokens=4096" in new.spec.template.spec.containers[0].args

    # The surge pod of the rolling update needs a third GPU, which no node has.
    new_pods = f"pod-template-hash={new.metadata.labels['pod-template-hash']}"

    def unschedulable_surge_pod() -> str | None:
        for pod in core.list_namespaced_pod(namespace, label_selector=new_pods).items:
            for condition in pod.status.conditions or []:
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return condition.message
        return None

    message = wait_for(unschedulable_surge_pod, 60, "the scheduler to report the new pod unschedulable")
    assert f"Insufficient {GPU}" in message


def test_pods_of_a_deployment_with_a_long_name_begin_with_the_cut_replicaset_name(
    cluster: Cluster, namespace: str
) -> None:
    """The apiserver keeps 58 characters of a generateName: a Deployment named with 50 loses part of its
    ReplicaSet's hash in its pods' names, and the operator must still find their series."""
    from vllm_autotuner.controller.reconcile import pod_prefix

    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    name = "llama-3-1-8b-instruct-chat-production-eu-west-one"
    assert len(name) == 49
    deployment = apps.create_namespaced_deployment(namespace, vllm_deployment(name, "no-such-pool", 2048))

    def pods() -> list[client.V1Pod]:
        found = core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
        return found if len(found) == 2 else []

    found = wait_for(pods, 60, "the ReplicaSet controller to create both pods (unschedulable, which is fine)")
    (rs,) = [r for r in apps.list_namespaced_replica_set(namespace).items
             if r.metadata.owner_references[0].uid == deployment.metadata.uid]
    assert all(p.metadata.name.startswith(pod_prefix(rs.metadata.name)) for p in found)
    assert not any(p.metadata.name.startswith(f"{rs.metadata.name}-") for p in found)  # the uncut name misses them


def test_the_other_controllers_the_operator_relies_on_run(cluster: Cluster, namespace: str) -> None:
    core, policy = client.CoreV1Api(cluster.api), client.PolicyV1Api(cluster.api)
    meta = client.V1ObjectMeta

    # root-ca publisher: pods find the cluster CA in every namespace.
    root_ca = wait_for(lambda: core.read_namespaced_config_map("kube-root-ca.crt", namespace), 30,
                       "the root CA publisher to fill the new namespace")
    with open(cluster.api.configuration.ssl_ca_cert) as ca:
        assert root_ca.data["ca.crt"].strip() == ca.read().strip()

    # serviceaccount-token: a legacy token Secret gets its token.
    core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=meta(name="default-token", annotations={"kubernetes.io/service-account.name": "default"}),
        type="kubernetes.io/service-account-token"))
    wait_for(lambda: (core.read_namespaced_secret("default-token", namespace).data or {}).get("token"), 30,
             "the token controller to fill the Secret")

    # disruption: a PodDisruptionBudget gets a computed status.
    policy.create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget(
        metadata=meta(name="llama"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=1, selector=client.V1LabelSelector(match_labels={"app": "llama"}))))
    pdb = wait_for(lambda: policy.read_namespaced_pod_disruption_budget("llama", namespace).status.observed_generation,
                   30, "the disruption controller to observe the PodDisruptionBudget")
    assert pdb == 1

    # garbage collector: deleting an owner deletes what it owns.
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta(name="owner")))
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta(
        name="owned", owner_references=[client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)])))
    core.delete_namespaced_config_map("owner", namespace)
    wait_for(lambda: not [cm for cm in core.list_namespaced_config_map(namespace).items if cm.metadata.name == "owned"],
             30, "the garbage collector to delete the owned ConfigMap")

    # namespace: a deleted namespace is emptied and goes away.
    core.create_namespace(client.V1Namespace(metadata=meta(name=f"{namespace}-gone")))
    core.create_namespaced_config_map(f"{namespace}-gone", client.V1ConfigMap(metadata=meta(name="content")))
    core.delete_namespace(f"{namespace}-gone")
    wait_for(lambda: f"{namespace}-gone" not in [ns.metadata.name for ns in core.list_namespace().items], 60,
             "the namespace controller to finish deleting the namespace")
