"""deploy/: the plain manifests equal the chart's defaults, install with the README's
`kubectl apply -k deploy/`, and the examples are accepted by the apiserver.
"""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from tests.integration.packaging import DEPLOY, INSTALLED, as_yaml, key, readme_command, without_helm_labels
from tests.support import CHART, CRD_NAME, Cluster, Helm, documents, wait_for

from vllm_autotuner.api import VllmTuningSpec
from vllm_autotuner.controller.reconcile import spec_problems

pytestmark = pytest.mark.integration

EXAMPLES = DEPLOY / "examples"
TUNINGS = ("chat.yaml", "nightly-batch.yaml", "tiers.yaml", "recommend-only.yaml")


def test_the_plain_manifests_are_the_chart_with_its_defaults(cluster: Cluster, helm: Helm) -> None:
    built = documents(cluster.kubectl("kustomize", str(DEPLOY)).stdout)
    (namespace,) = [o for o in built if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == INSTALLED
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    plain = {key(o): o for o in built if o["kind"] != "Namespace"}
    charted = {key(o): without_helm_labels(o) for o in helm.template(INSTALLED, str(CHART), "-n", INSTALLED,
                                                                      "--include-crds")}
    assert plain.keys() == charted.keys(), "deploy/ is stale: run `make manifests`"
    for name, obj in charted.items():
        assert plain[name] == obj, f"{name} differs from the chart's: run `make manifests`"


@pytest.fixture
def applied_by_kustomize(cluster_with_crd: Cluster):
    """Whatever `kubectl apply -k deploy/` creates is deleted afterwards, the CRD (shared by the session) excepted."""
    built = [o for o in documents(cluster_with_crd.kubectl("kustomize", str(DEPLOY)).stdout)
             if o["kind"] != "CustomResourceDefinition"]
    yield built
    cluster_with_crd.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait", stdin=as_yaml(built))
    core = client.CoreV1Api(cluster_with_crd.api)
    wait_for(lambda: not core.list_namespace(field_selector=f"metadata.name={INSTALLED}").items, 120,
             f"namespace {INSTALLED} to be deleted")


def test_readme_kubectl_apply_k_installs_the_operator(cluster_with_crd: Cluster, applied_by_kustomize: list[dict]) -> None:
    args = readme_command("kubectl")
    assert args == ["apply", "-k", str(DEPLOY)]
    out = cluster_with_crd.kubectl(*args).stdout
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in out
    names = cluster_with_crd.kubectl("get", "-f", "-", "-o", "name", stdin=as_yaml(applied_by_kustomize)).stdout
    assert len(names.split()) == len(applied_by_kustomize)
    # The namespace enforces the restricted Pod Security Standard, and the operator pods got in.
    core = client.CoreV1Api(cluster_with_crd.api)
    wait_for(lambda: len(core.list_namespaced_pod(INSTALLED).items) == 2, 60,
             "the ReplicaSet controller to create both operator pods")
    # What is live is what the manifests say: `kubectl diff` (a server-side dry run) finds nothing to change.
    assert cluster_with_crd.kubectl("diff", "-k", str(DEPLOY)).stdout == ""


def test_the_examples_are_accepted_by_the_apiserver_and_the_operator(cluster_with_crd: Cluster, namespace: str) -> None:
    for example in ("vllm-llama-3-8b.yaml", *TUNINGS):
        out = cluster_with_crd.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / example))
        assert "(server dry run)" in out.stdout
    for example in TUNINGS:
        spec = VllmTuningSpec.model_validate(yaml.safe_load((EXAMPLES / example).read_text())["spec"])
        assert spec_problems(spec) == [] and spec.target_ref.name == "llama-3-8b"
    built = documents(cluster_with_crd.kubectl("kustomize", str(EXAMPLES)).stdout)
    assert sorted(key(o) for o in built) == [("Deployment", "inference", "llama-3-8b"),
                                             ("Service", "inference", "llama-3-8b"),
                                             ("VllmTuning", "inference", "llama-3-8b")]
