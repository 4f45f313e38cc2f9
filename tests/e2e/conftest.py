"""The operator as a real process, for the end-to-end tests.

Each test starts ``vllm-autotuner run`` itself, the way a Deployment of the
operator would run it: its own process with the cluster's kubeconfig, the
session's Prometheus, watching only the test's namespace and holding its
leader Lease there (so tests never contend for one Lease). Tests look at it
from outside only: its /metrics and /healthz, its exit status, and what it
did to the cluster. When a test fails, the operator's log is kept next to
the servers' logs, since that is where the reason usually is.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import kept_logs
from tests.support import Cluster, wait_for

from vllm_autotuner.sim import localenv

#: pytest's reports of a test's phases, stashed on the test item (pytest's documented recipe).
PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[report.when] = report
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(r.failed for r in request.node.stash.get(PHASE_REPORTS, {}).values())


@dataclass
class OperatorProcess:
    """One ``vllm-autotuner run`` process and what can be seen of it from outside."""

    name: str
    port: int
    log: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def identity(self) -> str:
        """Its leader-election identity (``run``'s default: host name and pid)."""
        return f"{socket.gethostname()}-{self.process.pid}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Its /metrics: samples by sample name, each as (labels, value)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
        return sum(value for found, value in self.metrics().get(name, [])
                   if all(found.get(k) == v for k, v in labels.items()))

    def kill(self) -> None:
        """SIGKILL: no clean-up, no Lease release, as when its node dies."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM, as Kubernetes stops a pod; returns the exit status."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


class Operators:
    """Starts operator processes for one test and stops them after it."""

    def __init__(self, cluster: Cluster, prometheus_url: str, namespace: str, workdir: Path) -> None:
        self.cluster = cluster
        self.prometheus_url = prometheus_url
        self.namespace = namespace
        self.workdir = workdir
        self.started: list[OperatorProcess] = []

    def start(self, name: str = "operator", prometheus_url: str | None = None, *flags: str) -> OperatorProcess:
        """Run ``vllm-autotuner run`` for the test's namespace (with ``flags`` added) and return once it serves
        /healthz.

        It may still be waiting for the leader Lease then; a standby is healthy too.
        """
        port = localenv.free_port()
        log = self.workdir / f"{name}-{len(self.started)}.log"
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig))
        args = [sys.executable, "-m", "vllm_autotuner.cli", "run",
                f"--prometheus-url={prometheus_url or self.prometheus_url}", f"--namespace={self.namespace}",
                "--http-host=127.0.0.1", f"--http-port={port}", f"--lease-namespace={self.namespace}", *flags]
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        operator = OperatorProcess(name, port, log, process)
        self.started.append(operator)

        def serving() -> bool:
            if not operator.alive():
                pytest.fail(f"{name} exited with {process.returncode} while starting:\n"
                            f"{log.read_text(errors='replace')[-3000:]}", pytrace=False)
            return operator.healthy()

        wait_for(serving, 60, f"{name} to serve /healthz")
        return operator

    def stop_all(self) -> None:
        for operator in self.started:
            if operator.alive():
                operator.stop()


@pytest.fixture
def operators(request: pytest.FixtureRequest, cluster_with_crd: Cluster, prometheus: localenv.Prometheus,
              namespace: str, tmp_path: Path) -> Iterator[Operators]:
    """Operator processes for this test's namespace, stopped after it; their logs kept if it failed."""
    started = Operators(cluster_with_crd, prometheus.url, namespace, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()
        if _failed(request):
            target = kept_logs(request.config) / "operators" / request.node.name
            target.mkdir(parents=True, exist_ok=True)
            for operator in started.started:
                shutil.copy2(operator.log, target)
