"""Starting: every replica asks the apiserver whether it serves VllmTunings from a CRD as new as the operator
before it asks for the Lease, and exits without it when the answer is no, or none came: a replica that could not
act must not stand by, Ready, for the leader it replaces to stop."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.api.crd import crd
from vllm_autotuner.controller import operator
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metricsauth import CertificateWatch, self_signed_certificate
from vllm_autotuner.controller.reconcile import OperatorSettings

from ..test_api import published

from .test_leader import FakeLeases, Store

OPTIONS = operator.RunOptions(settings=OperatorSettings(), http_host="127.0.0.1", http_port=0, identity="me",
                              log_format="text")


def start(monkeypatch: pytest.MonkeyPatch, store: Store, discovery, installed: dict | None = None,
          options: operator.RunOptions = OPTIONS) -> int:
    """Run the operator with ``options`` on ``store``'s Lease, the apiserver answering discovery with ``discovery``
    and the CRD read with ``installed`` (default: this version's)."""
    monkeypatch.setattr(operator, "_load_kube_config", client.ApiClient)
    monkeypatch.setattr(operator.client, "CoordinationV1Api", lambda api: FakeLeases(store))
    monkeypatch.setattr(Kube, "serves_tunings", discovery)
    monkeypatch.setattr(Kube, "tuning_crd", lambda kube: installed or crd())
    return asyncio.run(operator.run(options))


@pytest.mark.parametrize("failure", [ApiException(status=503, reason="Service Unavailable"),
                                     ApiException(status=403, reason="Forbidden"),
                                     ReadTimeoutError(None, "/apis", "read timed out")])
def test_a_failed_discovery_exits_without_the_lease(monkeypatch, failure) -> None:
    def discovery(kube: Kube) -> bool:
        raise failure

    store = Store()
    assert start(monkeypatch, store, discovery) == 2
    assert not store.commit_times("me") and store.lease is None  # no standby waits a lease out


def test_a_replica_on_an_older_crd_exits_without_the_lease_even_while_another_leads(monkeypatch, caplog) -> None:
    older = crd()
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["learned"]
    for leading in (None, "the-old-operator"):
        store = Store()
        if leading:
            store.commit(client.V1Lease(  # fresh: without the check first, "me" would take it in 15 s
                metadata=client.V1ObjectMeta(name="vllm-autotuner", namespace="default"),
                spec=client.V1LeaseSpec(holder_identity=leading, lease_duration_seconds=15,
                                        renew_time=datetime.now(UTC), acquire_time=datetime.now(UTC))))
        assert start(monkeypatch, store, lambda kube: True, older) == 2
        assert not store.commit_times("me")
        assert (store.lease.spec.holder_identity if store.lease else None) == leading
    assert "is older than this operator: it lacks status.learned," in caplog.text


@pytest.mark.parametrize("answer", ["older", "current", "none", "a page", "refused"])
def test_a_crd_it_may_not_read_is_judged_by_the_schema_the_apiserver_publishes(caplog, answer) -> None:
    """Refused the CRD (a Role of one's own), the operator judges the schema the apiserver publishes: stale when
    older; unknown, said with what it could not read, and taken as current when nothing tells (not published yet,
    a proxy's page, refused too), rather than a crash or a stale verdict that would say to apply a CRD."""
    older = crd()
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["learned"]

    def refused() -> dict:
        raise ApiException(status=403, reason="Forbidden")

    def openapi() -> object:
        if answer == "refused":
            refused()
        return {"older": published(older), "current": published(crd()), "none": {"components": {}},
                "a page": "<html>sign in</html>"}[answer]

    current = asyncio.run(operator._crd_current(SimpleNamespace(tuning_crd=refused, tuning_openapi=openapi)))
    assert current == (answer != "older")
    assert ("is older than this operator: it lacks status.learned," in caplog.text) == (answer == "older")
    assert ("could be read" in caplog.text) == (answer not in ("older", "current")), caplog.text


@pytest.mark.parametrize("files", ["missing", "swapped"])
def test_a_certificate_that_cannot_be_loaded_exits_saying_which_and_what_to_give(monkeypatch, caplog, tmp_path,
                                                                                files) -> None:
    cert, key = self_signed_certificate()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    paths = {"missing": (tmp_path / "none.crt", tmp_path / "tls.key"),
             "swapped": (tmp_path / "tls.key", tmp_path / "tls.crt")}[files]
    store = Store()
    options = replace(OPTIONS, metrics_auth=True, tls_cert_file=str(paths[0]), tls_key_file=str(paths[1]))
    monkeypatch.setattr(operator, "_load_kube_config", client.ApiClient)
    monkeypatch.setattr(operator.client, "CoordinationV1Api", lambda api: FakeLeases(store))
    assert asyncio.run(operator.run(options)) == 2 and store.lease is None
    assert f"the HTTPS certificate of /metrics could not be loaded (--tls-cert-file {paths[0]}" in caplog.text
    assert "give a PEM certificate and its key" in caplog.text


def test_a_given_certificate_is_watched_while_the_https_server_runs(monkeypatch, tmp_path) -> None:
    """--tls-cert-file's watch runs beside the HTTPS server from its start: served the watch's context alone, the
    server would keep the first certificate for the pod's life, renewals unseen."""
    cert, key = self_signed_certificate()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    watched: list[tuple[str, str]] = []

    async def watch(self: CertificateWatch) -> None:
        watched.append(self.files)

    monkeypatch.setattr(CertificateWatch, "run", watch)
    options = replace(OPTIONS, metrics_auth=True, tls_cert_file=str(tmp_path / "tls.crt"),
                      tls_key_file=str(tmp_path / "tls.key"))
    assert start(monkeypatch, Store(), lambda kube: False, options=options) == 2  # no VllmTunings: a failed start
    assert watched == [(options.tls_cert_file, options.tls_key_file)]


def test_a_crash_of_kopf_is_logged_and_exits_with_a_failure_after_releasing_the_lease(monkeypatch, caplog) -> None:
    async def crash(**_: object) -> None:
        raise RuntimeError("kopf broke")

    def discovery(kube: Kube) -> bool:
        return True

    monkeypatch.setattr(operator.kopf, "operator", crash)
    store = Store()
    assert start(monkeypatch, store, discovery) == 1
    assert "the kopf task stopped the operator" in caplog.text and "kopf broke" in caplog.text
    assert store.lease.spec.holder_identity is None
