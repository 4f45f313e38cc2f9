"""What the operator's Prometheus client makes of an answer: one that may lack series is an error, never samples.

A Thanos Querier answers a query one of its stores failed with HTTP 200, the other stores' series and a warning,
unless asked for no partial response; an auth proxy in front of Prometheus answers HTTP 200 with its login page.
The answers come from a transport adapter on the client's session, as a Prometheus, a querier or a proxy would send
them, so no server is needed.
"""

from __future__ import annotations

import io
import json
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
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
    """Answers each request with the next of ``bodies`` (HTTP 200; a dict as JSON, bytes as they are), keeping the
    requests' parameters."""

    def __init__(self, *bodies: dict | bytes) -> None:
        super().__init__()
        self.bodies = list(bodies)
        self.asked: list[dict[str, list[str]]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        self.asked.append(parse_qs(urlsplit(request.url).query))
        response = requests.Response()
        response.status_code, response.url, response.request = 200, request.url, request
        body = self.bodies.pop(0)
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


def test_an_answer_with_warnings_is_a_transient_error_that_names_the_warning():
    client = client_of(Answers(*[answer(warnings=[TIMED_OUT])] * PrometheusClient.ATTEMPTS))
    with pytest.raises(PrometheusError) as error:
        client.query("up", 1000.0)
    assert error.value.kind is ErrorKind.PARTIAL and error.value.transient
    message = str(error.value)
    assert message.startswith(f"Prometheus at {URL} answered with a warning, so the answer may lack series: "
                              "receive series from Addr: prometheus-k8s-1")
    assert "--store.response-timeout" in message


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
