"""Helpers for the tests that run against the real servers.

Those servers work asynchronously (controllers, the scheduler, Prometheus
scrapes), so a test waits for a condition with :func:`wait_for`, never with a
fixed sleep: it is as fast as the servers allow and, when it fails, says what
it waited for and what it last saw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.fleet import FLEET_LABEL, PROFILE_LABEL
from vllm_autotuner.sim.podlaunch import vllm_launch
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.startup import StartupOutcome, check_startup

T = TypeVar("T")

CRD_NAME = "vllmtunings.autotuner.vllm-tuning.io"
CRD_FILE = localenv.ROOT / "crds" / f"{CRD_NAME}.yaml"
CHART = localenv.ROOT / "charts" / "vllm-autotuner"
ALERTS = CHART / "files" / "alerts.yaml"
HELM = localenv.BIN / "helm"
MONITORING_CRDS = tuple(localenv.BIN / "crds" / f"monitoring.coreos.com_{plural}.yaml"
                        for plural in ("servicemonitors", "prometheusrules"))
"""prometheus-operator's CRDs of the kinds the chart renders, as `make testenv` copies them from its Go module."""
FLEET_POOLS = ("llama3-8b-h100:4", "llama3-8b-l4:1")
"""The session fleet's nodes: H100s for rollouts with a surge pod, an L4 for
budgets that do not fit its memory."""
FLEET_TIME_SCALE = 0.05
"""A vLLM start-up of 100 s takes 5 s."""
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
H100, L4 = "llama3-8b-h100", "llama3-8b-l4"
HEALTH = {"httpGet": {"path": "/health", "port": 8000}}


def wait_for(predicate: Callable[[], T], timeout: float, description: str) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    On timeout the test fails with ``description`` and the last value (or
    exception) the predicate produced. An exception, an AssertionError
    included, counts as "not yet": an invariant that must hold at every poll
    is collected in the predicate and asserted after the wait.
    """
    try:
        return localenv.wait_until(predicate, timeout, description)
    except TimeoutError as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclass
class Cluster:
    """The session's control plane, as a test sees it."""

    kubeconfig: Path
    api: kubernetes.client.ApiClient

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run the project's ``bin/kubectl`` (never one found on PATH) against this cluster.

        With ``check`` a non-zero exit fails the test, showing stderr.
        """
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), KUBERC="off")
        return _run([str(localenv.KUBECTL), *args], env, check, stdin)

    @contextlib.contextmanager
    def fresh_namespace(self) -> Iterator[str]:
        """A new namespace, ready for pods (its default ServiceAccount exists), deleted on exit."""
        core = kubernetes.client.CoreV1Api(self.api)
        name = f"it-{uuid.uuid4().hex[:8]}"
        core.create_namespace(kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name)))
        wait_for(lambda: core.read_namespaced_service_account("default", name), 60,
                 f"the serviceaccount controller to create {name}/default")
        try:
            yield name
        finally:
            core.delete_namespace(name)


@dataclass(frozen=True)
class Helm:
    """The project's ``bin/helm``, its caches and settings in ``home`` (never the user's).

    Without a kubeconfig it runs client-only commands (lint, template);
    :meth:`on` gives one that installs into a cluster.
    """

    home: Path
    kubeconfig: Path | None = None

    def on(self, cluster: Cluster) -> Helm:
        return dataclasses.replace(self, kubeconfig=cluster.kubeconfig)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``helm args``; with ``check`` a non-zero exit fails the test, showing stderr."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(HELM_CACHE_HOME=str(self.home / "cache"), HELM_CONFIG_HOME=str(self.home / "config"),
                   HELM_DATA_HOME=str(self.home / "data"))
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return _run([str(HELM), *args], env, check)

    def template(self, *args: str) -> list[dict]:
        """The objects ``helm template args`` renders."""
        return documents(self("template", *args).stdout)


def documents(text: str) -> list[dict]:
    """The objects of a multi-document YAML text (empty documents left out)."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def alert_rules() -> list[dict[str, Any]]:
    """The chart's alerting rules, as its rule file writes them."""
    return [r for group in yaml.safe_load(ALERTS.read_text())["groups"] for r in group["rules"]]


@dataclass(frozen=True)
class AlertWatcher:
    """A Prometheus evaluating the chart's alerts on an operator's /metrics (``alert_watcher``)."""

    url: str

    def api(self, path: str) -> Any:
        """The ``data`` of its HTTP API's answer at ``/api/v1/<path>``."""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=5) as response:
            return json.load(response)["data"]

    def active(self) -> dict[str, list[dict[str, Any]]]:
        """The alerts pending or firing now, by name."""
        found: dict[str, list[dict[str, Any]]] = {}
        for alert in self.api("alerts")["alerts"]:
            found.setdefault(alert["labels"]["alertname"], []).append(alert)
        return found


@contextlib.contextmanager
def alert_watcher(workdir: Path, operator_url: str) -> Iterator[AlertWatcher]:
    """A Prometheus that scrapes the operator at ``operator_url`` with the target labels a ServiceMonitor attaches
    (the operator's own namespace and pod, which must not replace a tuning's) and evaluates the chart's alerts."""
    watcher = localenv.start_prometheus(workdir, rules=ALERTS)
    try:
        scraped_as = {"namespace": "vllm-autotuner-system", "pod": "vllm-autotuner-0"}
        localenv.write_targets(watcher.operator_targets_file,
                               [{"targets": [operator_url.removeprefix("http://")], "labels": scraped_as}])
        yield AlertWatcher(watcher.url)
    finally:
        watcher.stop()


def _run(argv: list[str], env: dict[str, str], check: bool, stdin: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=180)
    if check and result.returncode != 0:
        pytest.fail(f"{Path(argv[0]).name} {' '.join(argv[1:])} exited {result.returncode}:\n{result.stderr}",
                    pytrace=False)
    return result


def service_account_token(cluster: Cluster, namespace: str, service_account: str, seconds: int = 3600) -> str:
    """A fresh token of the ServiceAccount, from the TokenRequest API (as the kubelet gets one for a pod)."""
    request = kubernetes.client.AuthenticationV1TokenRequest(
        spec=kubernetes.client.V1TokenRequestSpec(expiration_seconds=seconds))
    return kubernetes.client.CoreV1Api(cluster.api).create_namespaced_service_account_token(
        service_account, namespace, request).status.token


def token_client(cluster: Cluster, namespace: str, service_account: str) -> kubernetes.client.ApiClient:
    """An API client that authenticates with a fresh token of the ServiceAccount."""
    admin = cluster.api.configuration
    config = kubernetes.client.Configuration(
        host=admin.host,
        api_key={"authorization": f"Bearer {service_account_token(cluster, namespace, service_account, 600)}"})
    config.ssl_ca_cert = admin.ssl_ca_cert
    return kubernetes.client.ApiClient(config)


def token_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    """Write a kubeconfig that reaches the cluster as the ServiceAccount, with a fresh token; return ``path``."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    user = f"{namespace}-{service_account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": user, "user": {"token": service_account_token(cluster, namespace, service_account)}}],
        "contexts": [{"name": user, "context": {"cluster": admin["clusters"][0]["name"], "user": user,
                                                 "namespace": namespace}}],
        "current-context": user,
    }))
    return path


class NotYet(str):
    """A falsy answer for ``wait_for`` that says what is still missing (shown on timeout)."""

    def __bool__(self) -> bool:
        return False


def vllm_container(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM container as a platform team writes one: probes on /health, one GPU; ``env`` for its environment."""
    return {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve", MODEL],
        "args": args,
        **({"env": [{"name": k, "value": v} for k, v in env.items()]} if env else {}),
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": {**HEALTH, "periodSeconds": 10, "failureThreshold": 60},
        "readinessProbe": {**HEALTH, "periodSeconds": 5},
        "livenessProbe": {**HEALTH, "periodSeconds": 10},
    }


def vllm_deployment(name: str, profile: str, args: list[str], replicas: int = 2,
                    env: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM Deployment pinned to the fleet's nodes of ``profile``."""
    labels = {"app": name, "app.kubernetes.io/name": "vllm"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {PROFILE_LABEL: profile, FLEET_LABEL: "sim"},
                    "containers": [vllm_container(args, env)],
                },
            },
        },
    }


def expected_startup(profile: str, args: list[str]) -> StartupOutcome:
    """What the fleet should make of these args on this profile."""
    p = get_profile(profile)
    return check_startup(p, vllm_launch(vllm_container(args), p).config, time_scale=FLEET_TIME_SCALE)


def call_vllm(pod: kubernetes.client.V1Pod, path: str, method: str = "POST") -> Any:
    """Call the vLLM server of a fleet's pod (on its pod IP, port 8000), as an admin or a router does; its JSON."""
    request = urllib.request.Request(f"http://{pod.status.pod_ip}:8000{path}", method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200, (path, response.status)
        body = response.read()
    return json.loads(body) if body else None


def is_ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


#: A client as the kubelet's HTTPS probes are: it takes whatever certificate the server shows.
UNVERIFIED = ssl.create_default_context()
UNVERIFIED.check_hostname, UNVERIFIED.verify_mode = False, ssl.CERT_NONE


@dataclass
class OperatorProcess:
    """One ``vllm-autotuner run`` process and what can be seen of it from outside."""

    name: str
    port: int
    log: Path
    process: subprocess.Popen = field(repr=False)
    https: bool = False  # run with --metrics-auth

    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.port}"

    @property
    def identity(self) -> str:
        """Its leader-election identity (``run``'s default: host name and pid)."""
        return f"{socket.gethostname()}-{self.process.pid}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self) -> bool:
        """Whether /healthz answers 200, asked as the kubelet's probe asks: no token, no verification of HTTPS."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5, context=UNVERIFIED) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Its /metrics, asked with no token (so of an operator run without --metrics-auth): samples by sample name,
        each as (labels, value)."""
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
    """Starts operator processes for one test; :meth:`stop_all`, called by its teardown, stops them."""

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
        operator = OperatorProcess(name, port, log, process, https="--metrics-auth" in flags)
        self.started.append(operator)

        def serving() -> bool:
            if not operator.alive():
                pytest.fail(f"{name} exited with {process.returncode} while starting:\n"
                            f"{log.read_text(errors='replace')[-3000:]}", pytrace=False)
            return operator.healthy()

        wait_for(serving, 60, f"{name} to serve /healthz")
        return operator

    def stop_all(self) -> None:
        """SIGTERM to each still running; one that is still running 60 s later is killed, the others stopped all the
        same (none outlives its test), and the test fails: Kubernetes would have killed it too."""
        stuck = []
        for operator in self.started:
            if operator.alive():
                try:
                    operator.stop()
                except subprocess.TimeoutExpired:
                    operator.kill()
                    stuck.append(operator.process.args)
        assert not stuck, f"operators still running 60 s after SIGTERM, killed: {stuck}"
