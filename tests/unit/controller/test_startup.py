"""Starting: the leader renews its Lease while it asks the apiserver whether it serves VllmTunings, and releases
it when the answer is no, or none came, so that a standby can take over at once after the restart."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.controller import operator
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.leader import LeaseConfig
from vllm_autotuner.controller.reconcile import OperatorSettings

from .test_leader import FakeLeases, Store

OPTIONS = operator.RunOptions(settings=OperatorSettings(), http_host="127.0.0.1", http_port=0, identity="me",
                              log_format="text")


def start(monkeypatch: pytest.MonkeyPatch, store: Store, discovery, config=LeaseConfig) -> int:
    monkeypatch.setattr(operator, "_load_kube_config", client.ApiClient)
    monkeypatch.setattr(operator.client, "CoordinationV1Api", lambda api: FakeLeases(store))
    monkeypatch.setattr(operator, "LeaseConfig", config)
    monkeypatch.setattr(Kube, "serves_tunings", discovery)
    return asyncio.run(operator.run(OPTIONS))


@pytest.mark.parametrize("failure", [ApiException(status=503, reason="Service Unavailable"),
                                     ApiException(status=403, reason="Forbidden"),
                                     ReadTimeoutError(None, "/apis", "read timed out")])
def test_a_failed_discovery_exits_and_releases_the_lease(monkeypatch, failure) -> None:
    def discovery(kube: Kube) -> bool:
        raise failure

    store = Store()
    assert start(monkeypatch, store, discovery) == 2
    assert store.commit_times("me") and store.lease.spec.holder_identity is None  # no standby waits the lease out


def test_the_leader_renews_during_a_discovery_longer_than_its_renew_deadline(monkeypatch) -> None:
    store, renewed = Store(), []
    short = functools.partial(LeaseConfig, lease_seconds=1.0, renew_deadline_seconds=0.5, renew_seconds=0.1,
                              retry_seconds=0.05)

    def discovery(kube: Kube) -> bool:
        before = len(store.commit_times("me"))
        time.sleep(1.5)  # a slow apiserver's answer: three renew deadlines
        renewed.append(len(store.commit_times("me")) - before)
        return False

    assert start(monkeypatch, store, discovery, short) == 2
    assert renewed[0] >= 5 and store.lease.spec.holder_identity is None


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
