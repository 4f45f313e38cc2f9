"""What the operator's Prometheus client makes of an answer: one that may lack series is an error, never samples.

A Thanos Querier answers a query one of its stores failed with HTTP 200, the other stores' series and a warning,
unless asked for no partial response, and a VictoriaMetrics cluster's vmselect one a vmstorage node did not answer,
marked ``isPartial`` (or refused with HTTP 503 when asked for no partial response); Google Managed Prometheus
refuses either parameter that asks for whole answers with HTTP 400; an auth proxy in front of Prometheus answers HTTP 200 with its login page; a
query frontend turns queries away with HTTP 429. The answers come from a transport adapter on the client's session,
as a Prometheus, a querier or a proxy would send them (or as the transport fails), so no server is needed.
"""

from __future__ import annotations

import io
import json
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import urllib3
from requests.adapters import BaseAdapter

from vllm_autotuner.observe.client import Connection, ErrorKind, PrometheusClient, PrometheusError

URL = "http://thanos-querier:9091"
ROW = {"metric": {"pod": "llama-abc-1"}, "value": [1000, "2"]}
#: What a Thanos Querier says when a store timed out and partial responses are on
TIMED_OUT = ("receive series from Addr: prometheus-k8s-1.prometheus-operated:10901 LabelSets: "
             "{prometheus_replica=\"prometheus-k8s-1\"}: rpc error: code = DeadlineExceeded desc = context deadline "
             "exceeded")


def answer(**fields: object) -> dict:
    """A successful instant query's answer with one row, and ``fields`` (warnings, infos) besides."""
    return {"status": "success", "data": {"resultType": "vector", "result": [ROW]}, **fields}


class Answers(BaseAdapter):
    """Answers each request with the next of ``bodies`` (HTTP 200, or the status of a (status, body) pair; a dict
    as JSON, bytes as they are) or raises it (an exception of the transport's), keeping the requests' parameters."""

    def __init__(self, *bodies: dict | bytes | tuple[int, dict] | Exception) -> None:
        super().__init__()
        self.bodies = list(bodies)
        self.asked: list[dict[str, list[str]]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        self.asked.append(parse_qs(urlsplit(request.url).query))
        response = requests.Response()
        body = self.bodies.pop(0)
        if isinstance(body, Exception):
            raise body
        status, body = body if isinstance(body, tuple) else (200, body)
        response.status_code, response.url, response.request = status, request.url, request
        response.raw = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
        return response

    def close(self) -> None:
        pass


def client_of(answers: Answers) -> PrometheusClient:
    client = PrometheusClient(Connection(url=URL))
    client._session.mount(URL, answers)
    return client


def test_every_query_asks_for_no_partial_response():
    answers = Answers(answer(), {"status": "success", "data": {"resultType": "matrix", "result": []}})
    client = client_of(answers)
    assert [sample.value for sample in client.query("up", 1000.0)] == [2.0]
    assert client.query_range("up", 1000.0, 1060.0, 30.0) == []
    assert [asked["partial_response"] for asked in answers.asked] == [["false"], ["false"]]
    assert [asked["deny_partial_response"] for asked in answers.asked] == [["1"], ["1"]]


def test_an_answer_with_warnings_is_a_transient_error_that_names_the_warning():
    client = client_of(Answers(*[answer(warnings=[TIMED_OUT])] * PrometheusClient.ATTEMPTS))
    with pytest.raises(PrometheusError) as error:
        client.query("up", 1000.0)
    assert error.value.kind is ErrorKind.PARTIAL and error.value.transient
    message = str(error.value)
    assert message.startswith(f"Prometheus at {URL} answered with a warning, so the answer may lack series: "
                              "receive series from Addr: prometheus-k8s-1")
    assert "--store.response-timeout" in message


def test_an_answer_a_victoriametrics_cluster_marks_partial_is_a_transient_error_that_says_where_to_look():
    client = client_of(Answers(*[answer(isPartial=True)] * PrometheusClient.ATTEMPTS))
    with pytest.raises(PrometheusError) as error:
        client.query("up", 1000.0)
    assert error.value.kind is ErrorKind.PARTIAL and error.value.transient
    assert "isPartial: true" in str(error.value) and "vmstorage pods" in str(error.value)
    assert [sample.value for sample in client_of(Answers(answer(isPartial=False))).query("up", 1000.0)] == [2.0]


def test_the_503_a_victoriametrics_cluster_denying_a_partial_answer_sends_is_a_partial_answer_not_an_outage():
    body = {"status": "error", "errorType": "503", "error": (
        "error occured during search: cannot fetch query results from vmstorage nodes: cannot perform search on "
        "vmstorage vmstorage-1.vmstorage.monitoring.svc:8401: cannot obtain connection from a pool")}
    client = client_of(Answers(*[(503, body)] * PrometheusClient.ATTEMPTS))
    with pytest.raises(PrometheusError) as error:
        client.query("up", 1000.0)
    assert error.value.kind is ErrorKind.PARTIAL and error.value.transient
    assert "vmstorage pods" in str(error.value) and "HTTP Status Code 503" in str(error.value)
    other = client_of(Answers(*[(503, {"status": "error", "errorType": "503", "error": "overloaded"})]
                              * PrometheusClient.ATTEMPTS))
    with pytest.raises(PrometheusError) as error:
        other.query("up", 1000.0)
    assert error.value.kind is ErrorKind.UNREACHABLE and error.value.transient


def test_a_whole_answer_after_a_partial_one_is_taken():
    answers = Answers(answer(warnings=[TIMED_OUT]), answer())
    assert [sample.value for sample in client_of(answers).query("up", 1000.0)] == [2.0]
    assert len(answers.asked) == 2


@pytest.mark.parametrize("fields", [
    {"infos": ["PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket"]},
    # a Thanos Querier returns PromQL's info annotations among its warnings
    {"warnings": ["PromQL info: input to histogram_quantile needed to be fixed for monotonicity"]},
    {"warnings": []},
])
def test_info_annotations_leave_the_answer_whole(fields):
    answers = Answers(answer(**fields))
    assert [sample.value for sample in client_of(answers).query("up", 1000.0)] == [2.0]
    assert len(answers.asked) == 1


@pytest.mark.parametrize("body", [
    b"<html><body>Log in with OpenShift</body></html>",  # an OAuth proxy's login page
    {"database": "ok", "version": "11.2.0"},  # Grafana's health answer: a URL of Grafana, not of its data source
    {"status": "success", "data": {"resultType": "scalar", "result": [1000, "1"]}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "1"}]}},
], ids=["login-page", "other-json", "scalar", "malformed-row"])
def test_an_answer_that_is_not_the_apis_is_a_query_error_that_says_which_url_to_check(body):
    answers = Answers(body)
    with pytest.raises(PrometheusError) as error:
        client_of(answers).query("up", 1000.0)
    assert error.value.kind is ErrorKind.QUERY and not error.value.transient
    assert len(answers.asked) == 1
    assert str(error.value).startswith(f"{URL} answered HTTP 200 with ")
    assert str(error.value).endswith(": not a Prometheus HTTP API answer: check spec.prometheus.url's path and any "
                                     "auth proxy in front of it (or the operator's --prometheus-url)")


def test_a_range_query_is_answered_by_a_matrix():
    with pytest.raises(PrometheusError, match="resultType of 'vector', not 'matrix'") as error:
        client_of(Answers(answer())).query_range("up", 1000.0, 1060.0, 30.0)
    assert error.value.kind is ErrorKind.QUERY


def test_a_query_a_frontend_turns_away_is_not_asked_again_at_once():
    """Thanos's, Mimir's or Cortex's query frontend, past its limit of queries in flight, sheds load: asking again
    within the evaluation would triple the queries it turns away. The next evaluation asks again."""
    answers = Answers((429, {"status": "error", "errorType": "too_many_requests",
                             "error": "too many outstanding requests"}), answer())
    with pytest.raises(PrometheusError) as error:
        client_of(answers).query("up", 1000.0)
    assert len(answers.asked) == 1
    assert error.value.kind is ErrorKind.UNREACHABLE and not error.value.transient
    assert "the next evaluation asks again" in str(error.value) and "raise its limit for the tenant" in str(error.value)


@pytest.mark.parametrize(("failure", "said"), [
    (requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead(40 bytes read, 111 more expected)"),
     "cut mid-answer"),
    (requests.exceptions.ContentDecodingError("Received response with content-encoding: gzip, but failed to decode"),
     "cut mid-answer"),
], ids=["cut-mid-body", "cut-compressed-body"])
def test_a_query_cut_short_is_asked_again(failure, said):
    answers = Answers(failure, answer())
    assert [sample.value for sample in client_of(answers).query("up", 1000.0)] == [2.0]
    assert len(answers.asked) == 2
    with pytest.raises(PrometheusError) as error:
        client_of(Answers(*[failure] * PrometheusClient.ATTEMPTS)).query("up", 1000.0)
    assert error.value.kind is ErrorKind.UNREACHABLE and error.value.transient
    assert said in str(error.value)


def test_a_slow_query_is_told_apart_from_a_prometheus_that_does_not_answer():
    with pytest.raises(PrometheusError) as slow:
        client_of(Answers(*[requests.exceptions.ReadTimeout()] * PrometheusClient.ATTEMPTS)).query("up", 1000.0)
    assert str(slow.value) == (f"Prometheus at {URL} took longer than 10s to answer (ReadTimeout): the query was slow; "
                               "raise spec.prometheus.timeout, or check Prometheus's load")
    # timed out while reading the body, after the headers: requests raises a ConnectionError around urllib3's
    mid_answer = requests.exceptions.ConnectionError(urllib3.exceptions.ReadTimeoutError(None, "/api/v1/query",
                                                                                         "Read timed out."))
    with pytest.raises(PrometheusError) as late:
        client_of(Answers(*[mid_answer] * PrometheusClient.ATTEMPTS)).query("up", 1000.0)
    assert "took longer than 10s to answer" in str(late.value) and late.value.transient
    for unreachable in (requests.exceptions.ConnectTimeout(), requests.exceptions.ConnectionError("refused")):
        with pytest.raises(PrometheusError) as error:
            client_of(Answers(*[unreachable] * PrometheusClient.ATTEMPTS)).query("up", 1000.0)
        assert "does not answer" in str(error.value) and "that Prometheus is running" in str(error.value)
        assert "spec.prometheus.timeout" not in str(error.value)
    assert slow.value.transient and error.value.transient


def refused(name: str) -> tuple[int, dict]:
    """Google Managed Prometheus's frontend's answer to a query parameter it has no field for."""
    said = (f"Invalid JSON payload received. Unknown name \"{name}\": Cannot bind query parameter. Field '{name}' "
            "could not be found in request message.")
    return 400, {"error": {"code": 400, "message": said, "status": "INVALID_ARGUMENT",
                           "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                        "fieldViolations": [{"description": said}]}]}}


@pytest.mark.parametrize(("name", "kept"), [("partial_response", "deny_partial_response"),
                                            ("deny_partial_response", "partial_response")])
def test_a_parameter_the_backend_refuses_by_name_is_left_out_from_then_on(name, kept, caplog):
    """Google Managed Prometheus refuses every query that sends a parameter it does not know: without it, no query
    would ever be answered."""
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    answers = Answers(refused(name), answer(), answer(), matrix)
    client = client_of(answers)
    with caplog.at_level("INFO", logger="vllm_autotuner.observe.client"):
        assert [sample.value for sample in client.query("up", 1000.0)] == [2.0]
        assert [sample.value for sample in client.query("up", 1060.0)] == [2.0]
        assert client.query_range("up", 1000.0, 1060.0, 30.0) == []
    assert [name in asked for asked in answers.asked] == [True, False, False, False]
    assert all(kept in asked for asked in answers.asked)
    assert [record.getMessage() for record in caplog.records if name in record.getMessage()] == [
        f"Prometheus at {URL} refuses the query parameter {name}: queries go without it, so a partial answer is not "
        "refused by it (warnings and isPartial still are)"]


def test_a_backend_that_refuses_both_parameters_as_text_is_asked_without_either():
    answers = Answers((400, refused("partial_response")[1]["error"]["message"].encode()),
                      (400, refused("deny_partial_response")[1]["error"]["message"].encode()), answer())
    assert [sample.value for sample in client_of(answers).query("up", 1000.0)] == [2.0]
    assert [sorted(set(asked) - {"query", "time"}) for asked in answers.asked] == [
        ["deny_partial_response", "partial_response"], ["deny_partial_response"], []]


@pytest.mark.parametrize("body", [
    {"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\": 1:4: parse error: "
                                                          "unexpected \"partial_response\""},
    {"error": {"code": 400, "message": "Invalid value at 'time' (type.googleapis.com/google.protobuf.Timestamp)",
               "status": "INVALID_ARGUMENT"}},
], ids=["bad-query", "other-field"])
def test_any_other_bad_request_is_a_query_error_that_drops_no_parameter(body):
    answers = Answers((400, body), answer())
    client = client_of(answers)
    with pytest.raises(PrometheusError) as error:
        client.query("up(", 1000.0)
    assert error.value.kind is ErrorKind.QUERY and not error.value.transient
    assert len(answers.asked) == 1
    assert [sample.value for sample in client.query("up", 1000.0)] == [2.0]
    assert all(asked["partial_response"] == ["false"] and asked["deny_partial_response"] == ["1"]
               for asked in answers.asked)
