"""The operator's status write, against a real apiserver: it lands on the VllmTuning an evaluation read, and on no
other created under its name since (``kubectl replace --force``, a reinstall), which would take the old one's
failed configs, rollout and target uid. A ``metadata.uid`` in the patch would not stop it: the status subresource
keeps the stored object's metadata whatever a patch says; the resourceVersion read does."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.bad_specs import target
from tests.integration.test_crd import GROUP, PLURAL, VERSION, create, vllm_tuning
from tests.support import Cluster

from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics

pytestmark = pytest.mark.integration


def test_a_status_write_lands_on_the_tuning_read_and_not_on_one_created_again_under_its_name(
        cluster_with_crd: Cluster, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster_with_crd.api)
    kube = Kube(cluster_with_crd.api, OperatorMetrics())
    read = create(cluster_with_crd, namespace, vllm_tuning("chat", target()))
    api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")
    again = create(cluster_with_crd, namespace, vllm_tuning("chat", target()))

    with pytest.raises(ApiException) as refused:
        kube.patch_tuning_status(namespace, "chat", {"targetUid": "old"}, read["metadata"]["resourceVersion"])
    assert refused.value.status == 409
    assert "status" not in api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")

    kube.patch_tuning_status(namespace, "chat", {"targetUid": "new"}, again["metadata"]["resourceVersion"])
    assert api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")["status"] == {
        "targetUid": "new"}
