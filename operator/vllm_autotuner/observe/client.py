"""The one place the operator talks to Prometheus.

Wraps ``prometheus-api-client`` with what a production caller needs: a
timeout per query, retries with backoff (tenacity) for transient failures
only, bearer-token and private-CA support, and errors sorted into kinds that
say what to fix (unreachable, TLS, auth, bad query). Callers never see a
half-answer: a query either returns its samples or raises ``PrometheusError``,
which the controller turns into ``MetricsAvailable=False`` and a hold.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential
from urllib3.util.retry import Retry

from vllm_autotuner import USER_AGENT


class ErrorKind(StrEnum):
    UNREACHABLE = "PrometheusUnreachable"
    TLS = "PrometheusTLSError"
    AUTH = "PrometheusAuthError"
    QUERY = "PrometheusQueryError"


class PrometheusError(Exception):
    """A query failed; ``kind`` is a condition reason and the message says what to do."""

    def __init__(self, kind: ErrorKind, message: str, transient: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and a value per evaluation time (Unix seconds)."""

    labels: dict[str, str]
    times: list[float]
    values: list[float]


@dataclass(frozen=True)
class Connection:
    """How to reach one Prometheus; equal connections share a client (and a batch of queries)."""

    url: str
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    """User name and password."""
    headers: tuple[tuple[str, str], ...] = ()
    """More HTTP headers (a tenant's X-Scope-OrgID), as (name, value) pairs."""
    ca_pem: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0


def _classify(exc: Exception, url: str) -> PrometheusError:
    if isinstance(exc, PrometheusError):
        return exc
    if isinstance(exc, requests.exceptions.SSLError):
        return PrometheusError(
            ErrorKind.TLS,
            f"TLS handshake with {url} failed ({exc.__class__.__name__}); check spec.prometheus.caSecretRef "
            "holds the CA that signed the server certificate",
            transient=False,
        )
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return PrometheusError(
            ErrorKind.UNREACHABLE,
            f"Prometheus at {url} does not answer ({exc.__class__.__name__}); check spec.prometheus.url or the "
            "operator's --prometheus-url, and that Prometheus is running",
            transient=True,
        )
    text = str(exc)
    if isinstance(exc, PrometheusApiClientException) and ("401" in text[:30] or "403" in text[:30]):
        return PrometheusError(
            ErrorKind.AUTH,
            f"Prometheus at {url} refused the request ({text[:120]}); check spec.prometheus.bearerTokenSecretRef or "
            "basicAuth, and headers for a tenant a multi-tenant store needs (X-Scope-OrgID)",
            transient=False,
        )
    if isinstance(exc, PrometheusApiClientException) and "HTTP Status Code 5" in text:
        return PrometheusError(ErrorKind.UNREACHABLE, f"Prometheus at {url} failed: {text[:200]}", transient=True)
    return PrometheusError(ErrorKind.QUERY, f"query to {url} failed: {text[:300]}", transient=False)


def _ca_file(pem: str) -> str:
    """A file holding ``pem`` (requests verifies against a path), one per distinct bundle: clients made again
    for a rotated token reuse it rather than fill the operator's small /tmp."""
    path = os.path.join(tempfile.gettempdir(), f"prometheus-ca-{hashlib.sha256(pem.encode()).hexdigest()[:32]}.pem")
    if not os.path.exists(path):
        fd, partial = tempfile.mkstemp(prefix="prometheus-ca-", suffix=".partial")
        with os.fdopen(fd, "w") as handle:
            handle.write(pem)
        os.replace(partial, path)  # whole or not at all, if two clients write it at once
    return path


class PrometheusClient:
    """Queries against one Prometheus, retried on transient errors."""

    ATTEMPTS = 3

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.on_query: Callable[[], object] = lambda: None  # e.g. the operator's query counter
        self._session = session = requests.Session()
        # Named as the operator (a header of the tuning's own may rename it), not as python-requests: the query logs
        # of what sits in front of a Prometheus (Mimir, Thanos, an auth proxy) then say whose load it is.
        headers = {"User-Agent": USER_AGENT, **dict(connection.headers)}
        if connection.bearer_token:
            headers["Authorization"] = f"Bearer {connection.bearer_token}"
        if connection.ca_pem:
            session.verify = _ca_file(connection.ca_pem)
        # No retries inside: prometheus-api-client's default (3 more tries, 1 s backoff) under
        # ours made a refused connection cost 18 s per window instead of one second.
        self._prom = PrometheusConnect(url=connection.url, headers=headers, auth=connection.basic_auth,
                                       session=session, timeout=connection.timeout_seconds,
                                       retry=Retry(total=0, read=False))

    def close(self) -> None:
        """Close its connections (the service drops a client whose connection no tuning uses any more)."""
        self._session.close()

    def query(self, promql: str, at: float) -> list[Sample]:
        """Evaluate ``promql`` at Unix time ``at``. Raises PrometheusError."""
        rows = self._ask(lambda: self._prom.custom_query(promql, params={"time": f"{at:.3f}"}))
        return [Sample(labels=row.get("metric", {}), value=_number(row["value"][1])) for row in rows]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """Evaluate ``promql`` at ``start``, ``start + step``, ... up to ``end`` (Unix seconds). Raises PrometheusError."""
        # The library rounds start and end to whole seconds; its params override them with the exact times.
        exact = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
        rows = self._ask(lambda: self._prom.custom_query_range(
            promql, datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), f"{step:g}", params=exact))
        return [Series(labels=row.get("metric", {}), times=[float(t) for t, _ in row["values"]],
                       values=[_number(v) for _, v in row["values"]]) for row in rows]

    def _ask(self, request: Callable[[], list[dict]]) -> list[dict]:
        @retry(
            retry=retry_if_exception(lambda e: _classify(e, self.connection.url).transient),
            stop=stop_after_attempt(self.ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        def attempt() -> list[dict]:
            self.on_query()
            return request()

        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a classified PrometheusError
            raise _classify(exc, self.connection.url) from exc


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
