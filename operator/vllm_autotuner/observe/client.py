"""The one place the operator talks to Prometheus.

Wraps ``prometheus-api-client`` with what a production caller needs: a
timeout per query, retries with backoff (tenacity) for transient failures
only (no connection, a slow query, HTTP 5xx, an answer cut short; not a
query frontend's 429, which sheds load: the next evaluation asks again),
bearer-token and private-CA support, and errors sorted into kinds that
say what to fix (unreachable, TLS, auth, bad query, partial answer).
Callers never see a half-answer: a query either returns its samples or raises
``PrometheusError``, which the controller turns into
``MetricsAvailable=False`` and a hold. A Thanos Querier (OpenShift's
monitoring stack) answers by default what the stores that answered have,
with HTTP 200 and a warning, when one fails or times out: every query asks
for no partial response (``partial_response=false``, which Prometheus
ignores), and an answer that carries warnings all the same, whose data
alone prometheus-api-client would hand on, is a transient error. A
VictoriaMetrics cluster's vmselect does the same when a vmstorage node is
unavailable, and marks the answer ``"isPartial": true`` rather than warn:
every query asks it for no partial response too
(``deny_partial_response=1``), and such an answer is the same error, as is
the HTTP 503 a vmselect that honours the parameter sends instead. Google
Managed Prometheus's frontend answers a parameter it does not know with
HTTP 400 ("Unknown name ...: Cannot bind query parameter"): the query is
asked again at once without it, and the client leaves it out from then on
(its warnings and ``isPartial`` are still read). PromQL's
info annotations (``infos`` from Prometheus 3, among the warnings from a
Thanos Querier) say nothing is missing and pass. An answer with HTTP 200
that is not the Prometheus HTTP API's (an auth proxy's login page, a
Grafana URL, a result of another type than the query's) is a query error
that names the URL to check, not a parser's complaint.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from urllib.parse import parse_qs, urlsplit

import requests
import urllib3
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential
from urllib3.util.retry import Retry

from vllm_autotuner import USER_AGENT

log = logging.getLogger(__name__)


class ErrorKind(StrEnum):
    UNREACHABLE = "PrometheusUnreachable"
    TLS = "PrometheusTLSError"
    AUTH = "PrometheusAuthError"
    QUERY = "PrometheusQueryError"
    PARTIAL = "PrometheusPartialResponse"


#: Asked of every query: Thanos Querier's ``partial_response`` (on by default) answers a query a store failed with
#: the others' series, and VictoriaMetrics' vmselect one a vmstorage node could not answer (unless started with
#: ``-search.denyPartialResponse``); asked not to, each fails the query instead. Prometheus ignores a parameter it
#: does not know, and so does each of them the other's; Google Managed Prometheus's frontend refuses it by name
#: instead (HTTP 400), and a client leaves out for good a parameter its backend refused.
_WHOLE_ANSWER = {"partial_response": "false", "deny_partial_response": "1"}
#: How PromQL's info annotations begin ("PromQL info: metric might not be a counter..."), which a Thanos Querier
#: returns among its warnings: a possible false positive about the query, not data left out of the answer.
_PROMQL_INFO = "PromQL info"
#: What stands for the warning of an answer that says it is partial (a VictoriaMetrics cluster's ``isPartial``)
_PARTIAL = "isPartial: true (a vmstorage node did not answer)"
#: What a VictoriaMetrics cluster's vmselect answers, with HTTP 503, in place of a partial answer it was told to deny
_VMSTORAGE_MISSING = "cannot fetch query results from vmstorage nodes"
#: Where to look when a vmstorage node did not answer
_VMSTORAGE_HINT = ("behind a VictoriaMetrics cluster a vmstorage node did not answer: check the vmstorage pods and "
                   "vmselect's -storageNode list")
#: How Google Managed Prometheus's frontend, which binds each query parameter to a field of its request, refuses one it
#: has none for, with HTTP 400: in a Google API error's JSON (the quotes escaped) or as text
_UNKNOWN_PARAMETER = re.compile(r'Unknown name \\?"(\w+)\\?": Cannot bind query parameter')


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


class _NotAnAnswer(Exception):
    """An answer with HTTP 200 that is not the Prometheus HTTP API's to the query asked; the message says what it
    held instead."""


class _Refused(Exception):
    """An answer with HTTP 400 that refuses by name a parameter of ``_WHOLE_ANSWER`` the query sent: the query
    itself was not read, so it is asked again without the parameter rather than failed."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Warned(Exception):
    """An answer with HTTP 200 that may lack the series of a store that failed: it carries warnings (a Thanos
    Querier's), or says it is partial (a VictoriaMetrics cluster's ``isPartial``)."""

    def __init__(self, warnings: list[str]) -> None:
        super().__init__("; ".join(warnings))
        self.warnings = warnings


def _point(value: object) -> bool:
    """Whether ``value`` is a sample of the API's: its time and its value as text."""
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int | float)
            and isinstance(value[1], str))


def _row(row: object, points: str) -> bool:
    """Whether ``row`` is a series of the API's: its labels and its sample (``value``, an instant query's) or
    samples (``values``, a range query's)."""
    if not isinstance(row, dict) or not isinstance(row.get("metric"), dict):
        return False
    found = row.get(points)
    return _point(found) if points == "value" else isinstance(found, list) and all(map(_point, found))


def _check_answer(response: requests.Response, *args: object, **kwargs: object) -> None:
    """A response hook on every answer, as prometheus-api-client takes apart one with HTTP 200 unchecked and
    keeps only the status of any other: raises ``_Refused`` for an HTTP 400 refusing a parameter of
    ``_WHOLE_ANSWER`` the query sent, ``_NotAnAnswer`` for an HTTP 200 that is not the API's answer to the query
    asked (a range query's a matrix, an instant query's a vector, each row a series) and ``_Warned`` for one whose
    warnings are more than info annotations, or that says it is partial, which the library would pass on as
    whole."""
    if response.status_code == 400:
        sent = parse_qs(urlsplit(response.request.url).query)
        for name in _UNKNOWN_PARAMETER.findall(response.text):
            if name in _WHOLE_ANSWER and name in sent:
                raise _Refused(name)
    if response.status_code != 200:
        return
    try:
        body = response.json()
    except ValueError:
        raise _NotAnAnswer(f"no JSON ({response.headers.get('Content-Type', 'no Content-Type')})") from None
    response.json = lambda **_: body  # prometheus-api-client takes it apart next: one parse, not two
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or body.get("status") != "success":
        raise _NotAnAnswer("JSON without a successful status and data")
    result_type, points = (("matrix", "values") if urlsplit(response.url).path.endswith("/query_range")
                           else ("vector", "value"))
    if data.get("resultType") != result_type:
        raise _NotAnAnswer(f"a resultType of {str(data.get('resultType'))[:40]!r}, not {result_type!r}")
    if not isinstance(data.get("result"), list) or not all(_row(row, points) for row in data["result"]):
        raise _NotAnAnswer(f"a {result_type} whose rows are not series")
    warnings = [str(w) for w in body.get("warnings") or () if not str(w).startswith(_PROMQL_INFO)]
    if body.get("isPartial") is True:
        warnings.append(_PARTIAL)
    if warnings:
        raise _Warned(warnings)


#: How the transport fails, the first an exception is an instance of: its kind, the message (of the URL, the
#: exception's class name and the timeout) and whether it is transient
_TRANSPORT_FAILURES: tuple[tuple[type[Exception] | tuple[type[Exception], ...], ErrorKind, str, bool], ...] = (
    (requests.exceptions.SSLError, ErrorKind.TLS,
     "TLS handshake with {url} failed ({name}); check spec.prometheus.caSecretRef holds the CA that signed the "
     "server certificate", False),
    # connected, but no answer in time
    (requests.exceptions.ReadTimeout, ErrorKind.UNREACHABLE,
     "Prometheus at {url} took longer than {timeout:g}s to answer ({name}): the query was slow; raise "
     "spec.prometheus.timeout, or check Prometheus's load", True),
    ((requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError), ErrorKind.UNREACHABLE,
     "Prometheus at {url} broke off its answer ({name}): the connection was cut mid-answer; if it persists, check "
     "the logs of Prometheus and of any proxy or load balancer in front of it", True),
    ((requests.exceptions.ConnectionError, requests.exceptions.Timeout), ErrorKind.UNREACHABLE,
     "Prometheus at {url} does not answer ({name}); check spec.prometheus.url or the operator's --prometheus-url, "
     "and that Prometheus is running", True),
)


def _classify(exc: Exception, connection: Connection) -> PrometheusError:
    url = connection.url
    if isinstance(exc, PrometheusError):
        return exc
    if isinstance(exc, _Warned):
        return PrometheusError(
            ErrorKind.PARTIAL,
            f"Prometheus at {url} answered with a warning, so the answer may lack series: {exc.warnings[0][:200]}; "
            + (_VMSTORAGE_HINT if _PARTIAL in exc.warnings else
               "behind a Thanos Querier a store (a sidecar, a store gateway, a receiver) failed or timed out: check "
               "it on the querier's Stores page, or raise --store.response-timeout"),
            transient=True,
        )
    if isinstance(exc, _NotAnAnswer):
        return PrometheusError(
            ErrorKind.QUERY,
            f"{url} answered HTTP 200 with {exc}: not a Prometheus HTTP API answer: check spec.prometheus.url's "
            "path and any auth proxy in front of it (or the operator's --prometheus-url)",
            transient=False,
        )
    if isinstance(exc, requests.exceptions.ConnectionError) and exc.args and isinstance(
            exc.args[0], urllib3.exceptions.ReadTimeoutError):
        exc = requests.exceptions.ReadTimeout(*exc.args)  # timed out mid-answer: requests calls that a ConnectionError
    for failures, kind, message, transient in _TRANSPORT_FAILURES:
        if isinstance(exc, failures):
            return PrometheusError(kind, message.format(url=url, name=exc.__class__.__name__,
                                                        timeout=connection.timeout_seconds), transient)
    text = str(exc)
    if isinstance(exc, PrometheusApiClientException) and ("401" in text[:30] or "403" in text[:30]):
        return PrometheusError(
            ErrorKind.AUTH,
            f"Prometheus at {url} refused the request ({text[:120]}); check spec.prometheus.bearerTokenSecretRef or "
            "basicAuth, and headers for a tenant a multi-tenant store needs (X-Scope-OrgID)",
            transient=False,
        )
    if isinstance(exc, PrometheusApiClientException) and "HTTP Status Code 429" in text[:30]:
        # not asked again at once: a frontend that sheds load would get three times the queries
        return PrometheusError(
            ErrorKind.UNREACHABLE,
            f"Prometheus at {url} turned the query away as too many ({text[:200]}); a query frontend (Thanos, Mimir, "
            "Cortex) limits the queries in flight, and the next evaluation asks again: if it persists, raise its "
            "limit for the tenant",
            transient=False,
        )
    if isinstance(exc, PrometheusApiClientException) and "HTTP Status Code 5" in text and _VMSTORAGE_MISSING in text:
        return PrometheusError(ErrorKind.PARTIAL, f"Prometheus at {url} could not answer whole ({text[:200]}); "
                               f"{_VMSTORAGE_HINT}", transient=True)
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
        self._whole_answer = _WHOLE_ANSWER  # less what this backend refused
        self._session = session = requests.Session()
        # Named as the operator (a header of the tuning's own may rename it), not as python-requests: the query logs
        # of what sits in front of a Prometheus (Mimir, Thanos, an auth proxy) then say whose load it is.
        headers = {"User-Agent": USER_AGENT, **dict(connection.headers)}
        if connection.bearer_token:
            headers["Authorization"] = f"Bearer {connection.bearer_token}"
        if connection.ca_pem:
            session.verify = _ca_file(connection.ca_pem)
        session.hooks["response"].append(_check_answer)
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
        rows = self._ask(lambda: self._prom.custom_query(promql, params={"time": f"{at:.3f}", **self._whole_answer}))
        return [Sample(labels=row["metric"], value=_number(row["value"][1])) for row in rows]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """Evaluate ``promql`` at ``start``, ``start + step``, ... up to ``end`` (Unix seconds). Raises PrometheusError."""
        # The library rounds start and end to whole seconds; its params override them with the exact times.
        rows = self._ask(lambda: self._prom.custom_query_range(
            promql, datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), f"{step:g}",
            params={"start": f"{start:.3f}", "end": f"{end:.3f}", **self._whole_answer}))
        return [Series(labels=row["metric"], times=[float(t) for t, _ in row["values"]],
                       values=[_number(v) for _, v in row["values"]]) for row in rows]

    def _ask(self, request: Callable[[], list[dict]]) -> list[dict]:
        @retry(
            retry=retry_if_exception(lambda e: _classify(e, self.connection).transient),
            stop=stop_after_attempt(self.ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        def attempt() -> list[dict]:
            # Ends: a refusal names a parameter the request sent, and it is never sent again.
            while True:
                self.on_query()
                try:
                    return request()
                except _Refused as refused:
                    if refused.name in self._whole_answer:  # once, unless two threads' queries are refused at once
                        # replaced, not changed in place: another thread's query may be unpacking it
                        self._whole_answer = {k: v for k, v in self._whole_answer.items() if k != refused.name}
                        log.info("Prometheus at %s refuses the query parameter %s: queries go without it, so a "
                                 "partial answer is not refused by it (warnings and isPartial still are)",
                                 self.connection.url, refused.name)

        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a classified PrometheusError
            raise _classify(exc, self.connection) from exc


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
