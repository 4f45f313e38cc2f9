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

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import kept_logs
from tests.support import Cluster, Operators

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
