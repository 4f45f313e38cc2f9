"""RBAC is enforced by the local control plane.

The operator's chart grants it a narrow Role; tests of that chart only prove
anything if a missing rule really means 403, as in production.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.support import Cluster, token_client, wait_for

pytestmark = pytest.mark.integration


def test_service_account_gets_403_without_a_role_and_200_with_one(cluster: Cluster, namespace: str) -> None:
    core, rbac = client.CoreV1Api(cluster.api), client.RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    user = f"system:serviceaccount:{namespace}:reader"
    with token_client(cluster, namespace, "reader") as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status.user_info.username == user

        apps = client.AppsV1Api(api)
        with pytest.raises(ApiException) as denied:
            apps.list_namespaced_deployment(namespace)
        assert denied.value.status == 403
        message = json.loads(denied.value.body)["message"]
        assert user in message and 'cannot list resource "deployments"' in message
        can_i = ["auth", "can-i", "list", "deployments", "-n", namespace, "--as", user]
        assert cluster.kubectl(*can_i, check=False).stdout.strip() == "no"

        rbac.create_namespaced_role(namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="deployment-reader"),
            rules=[client.V1PolicyRule(api_groups=["apps"], resources=["deployments"], verbs=["get", "list"])],
        ))
        rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="deployment-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="deployment-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
        ))
        # The authorizer learns of the binding through a watch: allow it a moment.
        listed = wait_for(lambda: apps.list_namespaced_deployment(namespace), 30,
                          "the RoleBinding to let the ServiceAccount list deployments")
        assert listed.items == []
        assert cluster.kubectl(*can_i).stdout.strip() == "yes"

        # The Role is namespaced: other namespaces stay closed.
        with pytest.raises(ApiException) as elsewhere:
            apps.list_namespaced_deployment("default")
        assert elsewhere.value.status == 403
