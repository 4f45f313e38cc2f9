"""Session fixtures: one real control plane and one real Prometheus per test run.

They start only when a test asks for them (unit tests pay nothing), on free
loopback ports and in pytest's temporary directory, so two test sessions can
run side by side. They stop at the end of the session; when a test failed,
their logs are first copied to ``.test-logs/`` and the summary says where.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml
from tests.support import CRD_FILE, FLEET_POOLS, FLEET_TIME_SCALE, MONITORING_CRDS, Cluster, Helm, wait_for

from vllm_autotuner.sim import localenv

LOG_DIR = pytest.StashKey[Path]()


def _start(start, workdir: Path):
    try:
        return start(workdir)
    except localenv.StartError as exc:
        pytest.fail(str(exc), pytrace=False)


def kept_logs(config: pytest.Config) -> Path:
    """Where this session keeps logs for failed tests (named in the summary)."""
    return config.stash.setdefault(
        LOG_DIR, localenv.ROOT / ".test-logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def _stop(request: pytest.FixtureRequest, server: localenv.Server, workdir: Path) -> None:
    server.stop()
    if request.session.testsfailed:
        kept = kept_logs(request.config) / server.name
        kept.mkdir(parents=True, exist_ok=True)
        for f in workdir.iterdir():
            if f.is_file():
                shutil.copy2(f, kept)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real kube-apiserver, controller manager and scheduler (bin/testenv)."""
    workdir = tmp_path_factory.mktemp("testenv")
    control_plane = _start(localenv.start_control_plane, workdir)
    api = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield Cluster(control_plane.kubeconfig, api)
    finally:
        api.close()
        _stop(request, control_plane, workdir)


def _establish(cluster: Cluster, crd_file: Path) -> None:
    """Apply the CRD in ``crd_file`` and wait until its kind is served."""
    name = yaml.safe_load(crd_file.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "-f", str(crd_file))
    extensions = kubernetes.client.ApiextensionsV1Api(cluster.api)

    def established() -> bool:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, 60, f"CRD {name} to be Established")


@pytest.fixture(scope="session")
def cluster_with_crd(cluster: Cluster) -> Cluster:
    """The cluster with the committed VllmTuning CRD applied and Established."""
    _establish(cluster, CRD_FILE)
    return cluster


@pytest.fixture(scope="session")
def monitoring_crds(cluster: Cluster) -> None:
    """prometheus-operator's own ServiceMonitor and PrometheusRule CRDs on the cluster, so that the apiserver
    validates the chart's objects of those kinds by their real schemas (unknown fields refused when strict)."""
    for crd_file in MONITORING_CRDS:
        if not crd_file.exists():
            pytest.fail(f"{crd_file.relative_to(localenv.ROOT)} missing: run `make testenv`", pytrace=False)
        _establish(cluster, crd_file)


@pytest.fixture(scope="session")
def prometheus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[localenv.Prometheus]:
    """A real Prometheus scraping what its targets files list.

    Tests write ``.targets_file``; the simulated fleet writes ``.fleet_targets_file``.
    """
    workdir = tmp_path_factory.mktemp("prometheus")
    server = _start(localenv.start_prometheus, workdir)
    try:
        yield server
    finally:
        _stop(request, server, workdir)


@pytest.fixture(scope="session")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, cluster: Cluster,
          prometheus: localenv.Prometheus) -> Iterator[localenv.Fleet]:
    """Simulated GPU nodes (``FLEET_POOLS``) whose kubelet runs vLLM pods at
    ``FLEET_TIME_SCALE`` of real start-up time; Prometheus scrapes the pods."""
    workdir = tmp_path_factory.mktemp("fleet")
    server = _start(lambda w: localenv.start_fleet(w, cluster.kubeconfig, prometheus.fleet_targets_file,
                                                   pools=FLEET_POOLS, time_scale=FLEET_TIME_SCALE), workdir)
    try:
        yield server
    finally:
        _stop(request, server, workdir)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists), deleted afterwards."""
    with cluster.fresh_namespace() as name:
        yield name


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The project's helm, with a home of its own for the session."""
    return Helm(tmp_path_factory.mktemp("helm"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if LOG_DIR in config.stash:
        terminalreporter.write_line(f"server logs kept in {config.stash[LOG_DIR]}")
