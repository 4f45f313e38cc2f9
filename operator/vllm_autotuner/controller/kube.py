"""The operator's Kubernetes API calls outside the watches, counted and timed.

Watches (kopf) keep VllmTunings, Deployments and ReplicaSets in memory;
what remains are a few direct calls: patching a Deployment, reading the
ReplicaSet a rollback puts back, listing a rollout's pods (or those of a
Deployment whose name is too long for its pods' names to tell its revisions
apart), reading a Node's GPU labels, a Secret or the CRD, writing status and Events,
and the reviews of a /metrics caller's token (``metricsauth``).
They go through this one class so the scale benchmark can count and time
them and every call has the same timeout. Objects come back as plain dicts
in the API's own camelCase shape, which is what the pure modules work on.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vllm_autotuner.api import GROUP, PLURAL, VERSION
from vllm_autotuner.api.resource import CRD_NAME
from vllm_autotuner.controller.metrics import OperatorMetrics

TIMEOUT = 15.0
#: Seconds of the Lease a write must have left to be sent (``Kube.write_seconds_left``).
WRITE_MARGIN = 1.0
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


def api_error(exc: Exception) -> str:
    """What the apiserver said of a refused call: the HTTP reason and its Status message (an admission policy's or
    webhook's reason, the fields a validation refused), which says what to do about it; a call that got no answer
    (a timeout, a reset), what failed."""
    if not isinstance(exc, ApiException):
        return str(exc)
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):  # not JSON, or not a Status object
        message = None
    return f"{exc.reason}: {message}" if message else str(exc.reason)


def label_selector(selector: dict[str, Any]) -> str:
    """A Deployment's ``spec.selector`` as a list-call label selector: its matchLabels and its matchExpressions."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            terms.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            terms.append(key)
        else:
            terms.append(f"!{key}")
    return ",".join(terms)


class NotLeading(Exception):
    """A write not sent: it could land after another replica took the Lease over."""


class Kube:
    """Blocking API calls (run them with ``asyncio.to_thread``)."""

    def __init__(self, api_client: client.ApiClient, metrics: OperatorMetrics) -> None:
        self.api_client = api_client
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.extensions = client.ApiextensionsV1Api(api_client)
        self.authentication = client.AuthenticationV1Api(api_client)
        self.authorization = client.AuthorizationV1Api(api_client)
        self.metrics = metrics
        self.write_seconds_left: Callable[[], float] | None = None
        """With leader election, how long a write sent now has to land while this replica leads
        (``LeaderElector.write_seconds_left``): a write is sent only with more than WRITE_MARGIN of it left, and
        waits no longer, so that a stopping leader's thread sends none once a standby could lead (an apiserver slow
        to answer may still commit one: a Deployment patch is conditional on resourceVersion, so it and the next
        leader's do not both land on one revision). None: the only replica."""

    def _write_timeout(self, what: str) -> float:
        """The timeout of a write, or NotLeading where too little of the Lease is left to send it."""
        if self.write_seconds_left is None:
            return TIMEOUT
        left = self.write_seconds_left()
        if left <= WRITE_MARGIN:
            raise NotLeading(f"{what} not sent: this replica's Lease may pass to another within {max(left, 0):.1f}s "
                             f"(its renewals fail): it stops leading, and the leader after it evaluates again")
        return min(TIMEOUT, left - WRITE_MARGIN)

    @contextlib.contextmanager
    def _call(self, verb: str, resource: str) -> Iterator[None]:
        """One API request: counted, and timed however it ends."""
        self.metrics.api_calls.labels(verb, resource).inc()
        with self.metrics.api_call_seconds.labels(verb, resource).time():
            yield

    def _dict(self, obj: Any) -> dict[str, Any]:
        return self.api_client.sanitize_for_serialization(obj)

    def serves_tunings(self) -> bool:
        """Whether the apiserver serves VllmTunings (API discovery, which every authenticated client may read):
        False until the CRD is installed and Established."""
        try:
            with self._call("get", "discovery"):
                found = self.custom.get_api_resources(GROUP, VERSION, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.name == PLURAL for r in found.resources or [])

    def tuning_crd(self) -> dict[str, Any]:
        """The VllmTuning CRD as installed: the chart grants ``get`` on it alone, cluster-scoped."""
        with self._call("get", "customresourcedefinitions"):
            return self._served(self.extensions.read_custom_resource_definition(
                CRD_NAME, _preload_content=False, _request_timeout=TIMEOUT))

    def tuning_openapi(self) -> dict[str, Any]:
        """The OpenAPI v3 document of the VllmTunings' group-version (``crd.stale_in_openapi``): it publishes the
        installed CRD's schema to every authenticated client (the default ``system:discovery`` ClusterRole grants
        ``/openapi/*``), so it answers where ``tuning_crd`` is refused, under a Role of one's own."""
        request = self.api_client.param_serialize("GET", f"/openapi/v3/apis/{GROUP}/{VERSION}",
                                                  header_params={"Accept": "application/json"},
                                                  auth_settings=["BearerToken"])
        with self._call("get", "openapi"):
            response = self.api_client.call_api(*request, _request_timeout=TIMEOUT)
            response.read()
        return self.api_client.response_deserialize(response, {"200": "object"}).data

    @staticmethod
    def _served(response: Any) -> dict[str, Any]:
        """An object as the apiserver served it (a call made with ``_preload_content=False``): the client's models
        would drop what they do not know and nulls such as the pod template's ``creationTimestamp: null``, so a
        Deployment's template, compared field by field with a ReplicaSet's (``patch.undo_patch``), is read raw."""
        return json.loads(response.data)

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        with self._call("get", "deployments"):
            return self._served(self.apps.read_namespaced_deployment(name, namespace, _preload_content=False,
                                                                     _request_timeout=TIMEOUT))

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Strategic-merge patch; a ``metadata.resourceVersion`` in it makes the write conditional (409 on change)."""
        timeout = self._write_timeout(f"the patch of Deployment {namespace}/{name}")
        with self._call("patch", "deployments"):
            return self._served(self.apps.patch_namespaced_deployment(
                name, namespace, patch, _content_type=STRATEGIC_MERGE, _preload_content=False,
                _request_timeout=timeout))

    def read_replicaset(self, namespace: str, name: str) -> dict[str, Any]:
        """The ReplicaSet whose pod template a rollback puts back."""
        with self._call("get", "replicasets"):
            return self._served(self.apps.read_namespaced_replica_set(name, namespace, _preload_content=False,
                                                                      _request_timeout=TIMEOUT))

    def list_replicasets(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        with self._call("list", "replicasets"):
            sets = self.apps.list_namespaced_replica_set(namespace, label_selector=label_selector,
                                                         _request_timeout=TIMEOUT)
        return [self._dict(rs) for rs in sets.items]

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        with self._call("list", "pods"):
            pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector, _request_timeout=TIMEOUT)
        return [self._dict(p) for p in pods.items]

    def node_metadata(self, name: str) -> dict[str, Any]:
        """A node's metadata as the apiserver serves it: its labels (the GPU's) and its creationTimestamp (whether
        the labels may still be to come)."""
        with self._call("get", "nodes"):
            return self._served(self.core.read_node(name, _preload_content=False, _request_timeout=TIMEOUT))["metadata"]

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """A Secret's value, None when the key is absent. Raises ApiException (404) when the Secret is."""
        with self._call("get", "secrets"):
            secret = self.core.read_namespaced_secret(name, namespace, _request_timeout=TIMEOUT)
        raw = (secret.data or {}).get(key)
        return base64.b64decode(raw).decode() if raw is not None else None

    def read_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        """The VllmTuning as the apiserver has it now, read before a patch of its target: the watch's copy may be
        one deleted or edited while the watch was down."""
        with self._call("get", "vllmtunings"):
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                            _request_timeout=TIMEOUT)

    def patch_tuning_status(self, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str | None) -> None:
        """Merge-patch the status subresource; ``None`` values remove fields. The write is conditional on
        ``resource_version``, the object's as read (409 on change; None: none). A ``metadata.uid`` would not do:
        the status subresource keeps the stored object's metadata whatever the patch says, so it lands on an
        object created again under the name too."""
        timeout = self._write_timeout(f"the status of VllmTuning {namespace}/{name}")
        with self._call("patch", "vllmtunings/status"):
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name,
                {"metadata": {"resourceVersion": resource_version}, "status": status}, _content_type=MERGE,
                _request_timeout=timeout)

    def create_event(self, body: dict[str, Any]) -> None:
        timeout = self._write_timeout(f"the Event {body['reason']} of {body['involvedObject']['name']}")
        with self._call("create", "events"):
            self.core.create_namespaced_event(body["metadata"]["namespace"], body, _request_timeout=timeout)

    def review_token(self, token: str) -> dict[str, Any]:
        """The apiserver's TokenReview status of a bearer token: ``authenticated``, and the ``user`` it is."""
        with self._call("create", "tokenreviews"):
            return self._served(self.authentication.create_token_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                _preload_content=False, _request_timeout=TIMEOUT))["status"]

    def may_get_metrics(self, user: dict[str, Any]) -> bool:
        """Whether RBAC lets ``user`` (a TokenReview's: username, uid, groups, extra) get the non-resource URL
        /metrics (a SubjectAccessReview)."""
        spec = {field: user[key] for field, key in (("user", "username"), ("uid", "uid"), ("groups", "groups"),
                                                    ("extra", "extra")) if user.get(key)}
        spec["nonResourceAttributes"] = {"path": "/metrics", "verb": "get"}
        with self._call("create", "subjectaccessreviews"):
            review = self._served(self.authorization.create_subject_access_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
                _preload_content=False, _request_timeout=TIMEOUT))
        return bool(review["status"].get("allowed"))
