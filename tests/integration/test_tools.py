"""The project's own kubectl and helm (bin/) work against the local cluster.

Users install the operator with ``kubectl apply -k`` or ``helm install``; the
tests of those paths use these binaries, built from the same releases every
time, rather than whatever happens to be on PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.support import Cluster, Helm
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def test_kubectl_is_the_bundled_multi_call_binary(cluster: Cluster) -> None:
    assert localenv.KUBECTL.resolve() == localenv.TESTENV.resolve()
    version = json.loads(cluster.kubectl("version", "--client", "-o", "json").stdout)
    assert version["clientVersion"]["gitVersion"] == client.VersionApi(cluster.api).get_code().git_version


def test_kubectl_apply_kustomization(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": namespace,
        "labels": [{"pairs": {"app.kubernetes.io/part-of": "probe"}}],
        "configMapGenerator": [{"name": "knobs", "literals": ["maxNumBatchedTokens=8192"]}],
    }))
    applied = cluster.kubectl("apply", "-k", str(tmp_path)).stdout
    assert "configmap/knobs-" in applied and "created" in applied
    (config_map,) = client.CoreV1Api(cluster.api).list_namespaced_config_map(
        namespace, label_selector="app.kubernetes.io/part-of=probe").items
    assert config_map.data == {"maxNumBatchedTokens": "8192"}


def test_helm_installs_a_chart(cluster: Cluster, helm: Helm, namespace: str, tmp_path: Path) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "probe", "version": "0.1.0"}))
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
        "data:\n  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n")
    helm = helm.on(cluster)

    assert helm("version", "--short").stdout.startswith("v3.")
    helm("install", "probe", str(chart), "--namespace", namespace, "--wait", "--timeout", "60s")
    (release,) = json.loads(helm("list", "--namespace", namespace, "-o", "json").stdout)
    assert release["name"] == "probe" and release["status"] == "deployed"
    # Helm asked this cluster for its version rather than assuming one.
    data = client.CoreV1Api(cluster.api).read_namespaced_config_map("probe", namespace).data
    assert data == {"kubeVersion": client.VersionApi(cluster.api).get_code().git_version}
