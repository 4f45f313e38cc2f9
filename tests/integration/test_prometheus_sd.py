"""The local Prometheus scrapes what the targets file lists, labelled as in a real cluster.

The simulated fleet announces each pod's ``/metrics`` through that file, and
the operator's PromQL selects series by ``namespace``, ``pod`` and pod
labels; this checks the whole path with a real exporter and a real scrape.
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from tests.support import wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def test_ready(prometheus: localenv.Prometheus) -> None:
    with urllib.request.urlopen(prometheus.url + "/-/ready", timeout=5) as response:
        assert response.status == 200


def test_file_sd_target_is_scraped_with_namespace_pod_and_pod_labels(prometheus: localenv.Prometheus) -> None:
    registry = CollectorRegistry()
    Gauge("testenv_probe", "A value only this test exports", registry=registry).set(42)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    address = f"127.0.0.1:{server.server_port}"
    prom = PrometheusConnect(prometheus.url)
    try:
        localenv.write_targets(prometheus.targets_file, [localenv.file_sd_target(
            address, namespace="llm", pod="llama-7d9f-x2x4q",
            pod_labels={"app": "llama", "app.kubernetes.io/name": "vllm"})])
        (sample,) = wait_for(lambda: prom.custom_query("testenv_probe"), 30, f"a scrape of {address}")
        assert sample["metric"] == {
            "__name__": "testenv_probe", "job": "vllm", "instance": address,
            "namespace": "llm", "pod": "llama-7d9f-x2x4q", "app": "llama", "app_kubernetes_io_name": "vllm",
        }
        assert float(sample["value"][1]) == 42

        # Pods come and go: a target removed from the file is no longer scraped.
        localenv.write_targets(prometheus.targets_file, [])
        wait_for(lambda: all(t["labels"]["instance"] != address for t in prom.get_targets()["activeTargets"]), 30,
                 "Prometheus to drop the removed target")
    finally:
        localenv.write_targets(prometheus.targets_file, [])
        server.shutdown()
        server.server_close()
