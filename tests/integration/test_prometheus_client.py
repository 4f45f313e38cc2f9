"""The operator's Prometheus client against the real server: range queries evaluate exactly where asked.

Reports line their steps up with the times they asked for, so a client that
moved the range (prometheus-api-client rounds start and end to whole
seconds) would pair every value with the wrong step.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from tests.support import wait_for

from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.observe.queries import PodMatch, Selector, pod_matchers
from vllm_autotuner.observe.window import fetch_window
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def test_a_range_query_is_evaluated_at_the_exact_times_asked(prometheus: localenv.Prometheus) -> None:
    client = PrometheusClient(Connection(url=prometheus.url))
    start = round(time.time(), 0) - 100.375
    (series,) = client.query_range("time()", start, start + 3 * 2.5, 2.5)
    expected = [start + 2.5 * k for k in range(4)]
    assert series.times == pytest.approx(expected, abs=1e-6)
    assert series.values == pytest.approx(expected, abs=1e-6)  # time() is the evaluation time itself


class _StartedServer:
    """A vLLM counter whose server started at ``created``, with the ``_created`` gauge prometheus-client adds."""

    def __init__(self, created: float) -> None:
        self.created = created

    def collect(self):
        family = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels=["engine", "model_name"])
        family.add_metric(["0", "tiny-llama"], 1234.0, created=self.created)
        yield family


def _serve_text_format(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """``/metrics`` in the Prometheus text format, as the simulator serves it (keeps the ``vllm:`` names)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_server_start_family_reads_the_created_gauge_batched_and_per_target(
    prometheus: localenv.Prometheus,
) -> None:
    created = round(time.time(), 0) - 123.5
    registry = CollectorRegistry()
    registry.register(_StartedServer(created))
    server = _serve_text_format(registry)
    address = f"127.0.0.1:{server.server_port}"
    client = PrometheusClient(Connection(url=prometheus.url))
    pod = ("llm", "llama-abc-x2x4q")
    try:
        localenv.write_targets(prometheus.targets_file, [localenv.file_sd_target(address, *pod)])
        wait_for(lambda: client.query(f'vllm:prompt_tokens_created{{pod="{pod[1]}"}}', time.time()), 30,
                 f"a scrape of {address}")
        selector = Selector()
        batched = fetch_window(client, selector, 60, time.time())
        assert batched.values["started"][pod] == pytest.approx(created)  # other tests' pods may be there too
        extra = pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))
        per_target = fetch_window(client, selector, 60, time.time(), extra)
        assert per_target.values["started"] == {pod: pytest.approx(created)}
        # by exact names (a Deployment name too long for its pods' prefix): one gone, one a prefix of the pod's
        extra = pod_matchers(selector, "llm", PodMatch(names=("llama-abc-x2x4", pod[1], "llama-abc-gone1")))
        by_name = fetch_window(client, selector, 60, time.time(), extra)
        assert by_name.values["started"] == {pod: pytest.approx(created)}
        extra = pod_matchers(selector, "llm", PodMatch(names=("llama-abc-x2x4",)))
        assert fetch_window(client, selector, 60, time.time(), extra).values["started"] == {}
    finally:
        localenv.write_targets(prometheus.targets_file, [])
        server.shutdown()
        server.server_close()
