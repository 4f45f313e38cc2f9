"""What the operator sends to a Prometheus that asks for credentials or a tenant: spec.prometheus's basicAuth and
bearer token read from Secrets, its headers, and the condition when a Secret key is missing; for the operator's
own Prometheus (no spec.prometheus.url), the operator's headers and credential files under the tuning's. Every
query names the operator as its User-Agent, so the query logs of a Mimir or an auth proxy in front of Prometheus
say whose load it is.

The reconciler is driven with the stand-ins of ``test_reconcile_rollout``; its Windows stand-in records the
connection each window was asked with, and the client it would build from it is inspected as it stands.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.unit.controller import test_reconcile_rollout as harness

from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler
from vllm_autotuner.observe.client import Connection, PrometheusClient

SECRETS = {("llm", "mimir", "user"): "123456\n", ("llm", "mimir", "token"): "glc_secret\n"}


class Kube(harness.Kube):
    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        return SECRETS.get((namespace, name, key))


class Windows(harness.Windows):
    def __init__(self) -> None:
        super().__init__(harness.window((harness.NEW,)))
        self.connections: list[Connection] = []

    async def window(self, connection, *args: Any, **kwargs: Any):  # noqa: ANN001, ANN201
        self.connections.append(connection)
        return await super().window(connection, *args, **kwargs)


def evaluate(prometheus: dict[str, Any], settings: OperatorSettings | None = None) -> tuple[Any, Windows]:
    """Evaluate with ``prometheus`` as spec.prometheus (over a URL of its own unless ``settings`` are given: then
    the operator's Prometheus)."""
    cache = harness.cache(finished=timedelta(hours=1))
    cache.tunings[("llm", "llama")]["spec"]["prometheus"] = (
        prometheus if settings else {"url": "http://prometheus:9090", **prometheus})
    windows = Windows()
    reconciler = Reconciler(Kube(), cache, windows, OperatorMetrics(),  # type: ignore[arg-type]
                            settings or OperatorSettings())
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp(), write=False))
    return report, windows


def test_basic_auth_and_headers_reach_the_client_that_queries_prometheus() -> None:
    report, windows = evaluate({"basicAuth": {"username": {"name": "mimir", "key": "user"},
                                              "password": {"name": "mimir", "key": "token"}},
                                "headers": {"X-Scope-OrgID": "team-a|team-b"}})
    assert report.decision is not None
    (connection,) = windows.connections
    # a Secret written from a file ends in a newline, which is no part of the credential
    assert connection.basic_auth == ("123456", "glc_secret") and connection.bearer_token is None
    assert "glc_secret" not in repr(connection)
    prom = PrometheusClient(connection)._prom
    assert (prom.auth, prom.headers) == (("123456", "glc_secret"),
                                         {"User-Agent": "vllm-autotuner/0.1.0", "X-Scope-OrgID": "team-a|team-b"})


def test_a_bearer_token_goes_with_the_headers() -> None:
    _, windows = evaluate({"bearerTokenSecretRef": {"name": "mimir", "key": "token"},
                           "headers": {"X-Scope-OrgID": "team-a"}})
    prom = PrometheusClient(windows.connections[0])._prom
    assert prom.auth is None
    assert prom.headers == {"User-Agent": "vllm-autotuner/0.1.0", "X-Scope-OrgID": "team-a",
                            "Authorization": "Bearer glc_secret"}


def test_a_user_agent_in_the_tunings_headers_replaces_the_operators() -> None:
    _, windows = evaluate({"headers": {"User-Agent": "team-a-tuner/2"}})
    assert PrometheusClient(windows.connections[0])._prom.headers == {"User-Agent": "team-a-tuner/2"}


def test_a_missing_password_key_says_which_field_to_fix_and_queries_nothing() -> None:
    report, windows = evaluate({"basicAuth": {"username": {"name": "mimir", "key": "user"},
                                              "password": {"name": "mimir", "key": "password"}}})
    assert windows.connections == []
    (ready,) = [c for c in report.state.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", "SecretNotFound")
    assert "Secret llm/mimir has no key 'password'; fix spec.prometheus.basicAuth.password.key" in ready.message


def operator_settings(tmp_path: Path) -> OperatorSettings:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    return OperatorSettings(prometheus_url="http://thanos-querier:9091",
                            prometheus_headers=(("X-Scope-OrgID", "platform"), ("X-Team", "ml")),
                            prometheus_bearer_token_file=str(tmp_path / "token"),
                            prometheus_ca_file=str(tmp_path / "ca.pem"))


def test_the_operators_prometheus_comes_with_its_headers_and_credential_files(tmp_path: Path) -> None:
    _, windows = evaluate({"headers": {"x-scope-orgid": "team-a"}}, operator_settings(tmp_path))
    (connection,) = windows.connections
    assert connection.url == "http://thanos-querier:9091"
    # the tuning's tenant goes over the operator's, whatever the letters' case; the operator's other header stays
    assert connection.headers == (("X-Team", "ml"), ("x-scope-orgid", "team-a"))
    assert (connection.bearer_token, connection.ca_pem) == ("sa-token", "-----BEGIN CERTIFICATE-----")


def test_a_tunings_own_credentials_or_prometheus_take_none_of_the_operators(tmp_path: Path) -> None:
    settings = operator_settings(tmp_path)
    _, windows = evaluate({"basicAuth": {"username": {"name": "mimir", "key": "user"},
                                         "password": {"name": "mimir", "key": "token"}}}, settings)
    (connection,) = windows.connections
    assert (connection.bearer_token, connection.basic_auth) == (None, ("123456", "glc_secret"))
    _, windows = evaluate({"url": "https://other:9090"}, settings)
    (connection,) = windows.connections
    assert (connection.headers, connection.bearer_token, connection.ca_pem) == ((), None, None)


def test_a_credential_file_the_operator_cannot_read_says_which_setting_names_it(tmp_path: Path) -> None:
    settings = operator_settings(tmp_path)
    (tmp_path / "token").unlink()
    report, windows = evaluate({}, settings)
    assert windows.connections == []
    (ready,) = [c for c in report.state.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", "PrometheusCredentialsUnreadable")
    setting = "(--prometheus-bearer-token-file, chart value prometheus.bearerTokenFile)"
    assert f"cannot read {tmp_path / 'token'} {setting}" in ready.message
