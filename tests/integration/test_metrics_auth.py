"""/metrics behind the apiserver's authentication and RBAC (``--metrics-auth``), proven on the real apiserver.

The chart is installed with ``metricsAuth.enabled`` and the operator's HTTP server runs with the chart's
ServiceAccount's token, so what the chart grants is what the reviews need: a scraper's ServiceAccount token is
refused (403) until it is bound to the chart's metrics-reader ClusterRole, a made-up token is not authenticated
(401), none at all is 401, and /healthz needs none; all of it over HTTPS. The whole operator, run with the flag,
answers so too: the kubelet's probe of /healthz, and a bound scraper.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from tests.support import (
    CHART,
    UNVERIFIED,
    Cluster,
    Helm,
    Operators,
    service_account_token,
    token_client,
    wait_for,
)

from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.metricsauth import MetricsAuth, self_signed_certificate, tls_context
from vllm_autotuner.controller.operator import HttpEndpoints
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration

RELEASE = "scraped"
ACCOUNT = f"{RELEASE}-vllm-autotuner"


@contextlib.contextmanager
def serving(endpoints: HttpEndpoints) -> Iterator[None]:
    """``endpoints`` served from an event loop of its own, so that the test's blocking requests and waits do not stall
    it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(endpoints.start(), loop).result(30)
    try:
        yield
    finally:
        asyncio.run_coroutine_threadsafe(endpoints.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def get(port: int, path: str, context: ssl.SSLContext, token: str | None = None) -> tuple[int, str]:
    """The status and body of an HTTPS GET of ``path``, with ``token`` as its bearer token."""
    request = urllib.request.Request(f"https://localhost:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def token_reviews(metrics: OperatorMetrics) -> float:
    return metrics.registry.get_sample_value("vllm_autotuner_kubernetes_api_calls_total",
                                             {"verb": "create", "resource": "tokenreviews"}) or 0


@dataclass(frozen=True)
class Release:
    """The chart installed with ``metricsAuth.enabled``, and a scraper: the ServiceAccount ``prometheus``, bound to
    nothing but by ``reader_bound``."""

    cluster: Cluster
    namespace: str
    scraper: str  # a token of the scraper's ServiceAccount

    @contextlib.contextmanager
    def reader_bound(self) -> Iterator[None]:
        """The scraper bound to the release's metrics-reader ClusterRole, until the block ends."""
        rbac = client.RbacAuthorizationV1Api(self.cluster.api)
        rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=f"{self.namespace}-prometheus-metrics"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                                      name=f"{ACCOUNT}-metrics-reader:{self.namespace}"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="prometheus", namespace=self.namespace)]))
        try:
            yield
        finally:
            rbac.delete_cluster_role_binding(f"{self.namespace}-prometheus-metrics")


@pytest.fixture(scope="module")
def release(cluster_with_crd: Cluster, helm: Helm) -> Iterator[Release]:
    cluster, helm = cluster_with_crd, helm.on(cluster_with_crd)
    with cluster.fresh_namespace() as namespace:
        helm("install", RELEASE, str(CHART), "-n", namespace, "--skip-crds", "--set", "metricsAuth.enabled=true")
        try:
            client.CoreV1Api(cluster.api).create_namespaced_service_account(
                namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="prometheus")))
            yield Release(cluster, namespace, service_account_token(cluster, namespace, "prometheus", 600))
        finally:
            helm("uninstall", RELEASE, "-n", namespace, "--wait")


def test_metrics_need_a_token_rbac_lets_get_them_over_https(release: Release) -> None:
    cluster, namespace, scraper = release.cluster, release.namespace, release.scraper
    port = localenv.free_port()
    metrics = OperatorMetrics()
    with token_client(cluster, namespace, ACCOUNT) as operator_api, \
            serving(HttpEndpoints(metrics, "127.0.0.1", port, MetricsAuth(Kube(operator_api, metrics)),
                                  tls_context(None, None))):
        # HTTPS, with the certificate made at start: trusted here as what it is, a self-signed one
        trusted = ssl.create_default_context(cadata=ssl.get_server_certificate(("127.0.0.1", port)))
        assert get(port, "/healthz", trusted) == (200, "ok")
        status, body = get(port, "/metrics", trusted)
        assert status == 401 and "bearer token" in body
        # The chart's grant of the reviews reaches the authorizer through a watch: until then, 503.
        status, body = wait_for(lambda: (answer := get(port, "/metrics", trusted, "not-a-token"))[0] != 503
                                and answer, 30, "the operator's grant of TokenReviews to be in force")
        assert status == 401 and "does not authenticate" in body
        status, body = get(port, "/metrics", trusted, scraper)
        assert status == 403 and f"system:serviceaccount:{namespace}:prometheus may not get /metrics" in body

        with release.reader_bound():
            # a refusal is cached for 10 s (DENIED_TTL), and the binding reaches the authorizer through a watch
            status, body = wait_for(lambda: (answer := get(port, "/metrics", trusted, scraper))[0] == 200
                                    and answer, 60, "the scraper's binding to let it read /metrics")
            reviews = token_reviews(metrics)
            assert get(port, "/metrics", trusted, scraper)[0] == 200
            assert token_reviews(metrics) == reviews  # the allow is cached: the token is not reviewed again
        assert {family.name for family in text_string_to_metric_families(body)} >= {"vllm_autotuner_leader"}
        with pytest.raises((OSError, http.client.HTTPException)):  # HTTPS only: plain HTTP gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


@pytest.mark.parametrize("given", [False, True], ids=["self-signed", "given-certificate"])
def test_the_operator_run_with_metrics_auth_serves_probes_and_bound_scrapers_over_https(
        release: Release, prometheus: localenv.Prometheus, tmp_path: Path, given: bool) -> None:
    """``vllm-autotuner run --metrics-auth``, the whole process: its /healthz answers the kubelet's HTTPS probe (no
    token, the certificate unverified) and /metrics only a token RBAC lets get it; over the certificate it was given
    (``--tls-cert-file``, ``--tls-key-file``) or one it made."""
    cert, key = self_signed_certificate()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    files = [f"--tls-cert-file={tmp_path / 'tls.crt'}", f"--tls-key-file={tmp_path / 'tls.key'}"] if given else []
    operators = Operators(release.cluster, prometheus.url, release.namespace, tmp_path)
    try:
        operator = operators.start("operator", None, "--metrics-auth", *files)  # once /healthz answers the probe
        served = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", operator.port)))
        assert (served == ssl.PEM_cert_to_DER_cert(cert.decode())) == given  # else one made at start
        status, body = get(operator.port, "/metrics", UNVERIFIED)
        assert status == 401 and "bearer token" in body
        with release.reader_bound():
            status, body = wait_for(lambda: (answer := get(operator.port, "/metrics", UNVERIFIED, release.scraper))[0]
                                    == 200 and answer, 60, "the scraper's binding to let it read /metrics")
        assert {family.name for family in text_string_to_metric_families(body)} >= {"vllm_autotuner_leader"}
    finally:
        operators.stop_all()
