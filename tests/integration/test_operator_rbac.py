"""The chart's RBAC is sufficient and minimal, proven on the real apiserver.

Sufficient: the operator, installed as the image installs it and started
with the chart's own args and environment, runs as a local process with a
token of the chart's ServiceAccount (TokenRequest API) and retunes the
example vLLM Deployment, running on the simulated GPU fleet, end to end: it
wins the leader Lease, watches, reads the GPU labels of the pod's Node and
the Prometheus credentials Secret it was granted, patches the Deployment,
follows the real rolling update, writes status and Events, and is never
refused.

Minimal: the ServiceAccount's effective permissions, as the apiserver
reports them (SelfSubjectRulesReview), are exactly the rules below, each
needed by a call the operator makes; `kubectl auth can-i` shows what it
must not do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.packaging import DEPLOY, as_yaml
from tests.support import CHART, Cluster, Helm, documents, token_client, token_kubeconfig, wait_for

from vllm_autotuner.api import GROUP, PLURAL, VERSION
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration

RELEASE = "rbac"
ACCOUNT = f"{RELEASE}-vllm-autotuner"  # the chart's ServiceAccount and Lease name
SECRET = "prometheus-token"
EXAMPLES = DEPLOY / "examples"

# (API group, resource, verb, resource name or "" for any), and the call that needs it.
WATCHED_NAMESPACE = {
    (GROUP, "vllmtunings", "list"),  # kopf's watch of VllmTunings: the initial listing...
    (GROUP, "vllmtunings", "watch"),  # ...and the stream
    (GROUP, "vllmtunings", "get"),  # Kube.read_tuning: the tuning read again before a patch of its target
    (GROUP, "vllmtunings/status", "patch"),  # Kube.patch_tuning_status
    ("apps", "deployments", "get"),  # Kube.read_deployment (re-read on a write conflict)
    ("apps", "deployments", "list"),  # kopf's index of Deployments
    ("apps", "deployments", "watch"),
    ("apps", "deployments", "patch"),  # Kube.patch_deployment: the knobs
    ("apps", "replicasets", "get"),  # Kube.read_replicaset: the pod template a rollback puts back
    ("apps", "replicasets", "list"),  # kopf's index of ReplicaSets: a Deployment's current pods
    ("apps", "replicasets", "watch"),
    ("", "pods", "list"),  # Kube.list_pods: rollout progress, the node a vLLM pod runs on, pods by name
    ("", "events", "create"),  # Kube.create_event
}
EVERYWHERE = {("", "nodes", "get"),  # Kube.node_metadata: GPU labels; cluster-scoped
              # Kube.tuning_crd: whether the installed CRD is as new as the operator, at start-up
              ("apiextensions.k8s.io", "customresourcedefinitions", "get", f"{PLURAL}.{GROUP}")}
LEASE = {("coordination.k8s.io", "leases", "create"),  # LeaderElector: the first candidate creates it
         ("coordination.k8s.io", "leases", "get", ACCOUNT),  # then reads and renews only its own Lease
         ("coordination.k8s.io", "leases", "update", ACCOUNT)}
PROMETHEUS_SECRET = {("", "secrets", "get", SECRET)}  # Kube.secret_value, by name, only where granted
METRICS_AUTH = {("authentication.k8s.io", "tokenreviews", "create"),  # Kube.review_token: who a scraper is
                ("authorization.k8s.io", "subjectaccessreviews", "create")}  # Kube.may_get_metrics


def rules(*groups: set[tuple[str, ...]]) -> set[tuple[str, str, str, str]]:
    return {(rule + ("",))[:4] for group in groups for rule in group}


def effective_rules(api: client.ApiClient, namespace: str) -> set[tuple[str, str, str, str]]:
    """What the authorizer lets this client do in ``namespace`` (cluster-wide grants included)."""
    review = client.AuthorizationV1Api(api).create_self_subject_rules_review(client.V1SelfSubjectRulesReview(
        spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace)))
    assert not review.status.incomplete
    return {(group, resource, verb, name)
            for rule in review.status.resource_rules
            for group in rule.api_groups or [""] for resource in rule.resources for verb in rule.verbs
            for name in rule.resource_names or [""]}


@dataclass(frozen=True)
class Install:
    cluster: Cluster
    watching: str  # "all" namespaces (the default), or only "tuned" (watchNamespaces)
    ops: str  # the release namespace: the operator's pods and Lease
    tuned: str  # a namespace with vLLM, whose Prometheus Secret the release may read
    other: str  # any other namespace

    def granted(self, namespace: str) -> set[tuple[str, str, str, str]]:
        """The ServiceAccount's rules in ``namespace``, beyond what an account without bindings has."""
        with token_client(self.cluster, self.ops, ACCOUNT) as api, \
                token_client(self.cluster, self.ops, "nobody") as nobody:
            return effective_rules(api, namespace) - effective_rules(nobody, namespace)

    def expected(self, namespace: str) -> set[tuple[str, str, str, str]]:
        """The rules documented for ``namespace``."""
        return rules(EVERYWHERE,
                     WATCHED_NAMESPACE if self.watching == "all" or namespace == self.tuned else set(),
                     LEASE if namespace == self.ops else set(),
                     PROMETHEUS_SECRET if namespace == self.tuned else set())


@pytest.fixture(scope="module", params=["all", "tuned"], ids=["cluster-wide", "watch-namespaces"])
def install(request: pytest.FixtureRequest, cluster_with_crd: Cluster, helm: Helm) -> Iterator[Install]:
    """The chart with one Secret grant (rbac.secrets: [{namespace: tuned, names: [SECRET]}]), watching every
    namespace (the default) or, with watchNamespaces, only ``tuned``; its bindings in force."""
    cluster, helm = cluster_with_crd, helm.on(cluster_with_crd)
    with cluster.fresh_namespace() as ops, cluster.fresh_namespace() as tuned, cluster.fresh_namespace() as other:
        scope = ["--set", f"watchNamespaces={{{tuned}}}"] if request.param == "tuned" else []
        helm("install", RELEASE, str(CHART), "-n", ops, "--set", f"rbac.secrets[0].namespace={tuned}",
             "--set", f"rbac.secrets[0].names={{{SECRET}}}", *scope)
        client.CoreV1Api(cluster.api).create_namespaced_service_account(
            ops, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody")))
        installed = Install(cluster, request.param, ops, tuned, other)
        try:
            # The authorizer learns of new bindings through a watch: wait until the release's are in force.
            wait_for(lambda: installed.granted(ops) == installed.expected(ops), 30,
                     "the release's RBAC bindings to be in force")
            yield installed
        finally:
            helm("uninstall", RELEASE, "-n", ops, "--wait")


def test_the_service_account_has_exactly_the_documented_permissions(install: Install) -> None:
    for namespace in (install.ops, install.tuned, install.other):
        assert install.granted(namespace) == install.expected(namespace), namespace


def test_metrics_auth_adds_only_the_two_reviews(cluster_with_crd: Cluster, helm: Helm) -> None:
    """metricsAuth.enabled grants what --metrics-auth calls, cluster-wide (the reviews are cluster-scoped), and
    nothing else; tests/integration/test_metrics_auth.py shows it is enough."""
    cluster, helm = cluster_with_crd, helm.on(cluster_with_crd)
    with cluster.fresh_namespace() as ops, cluster.fresh_namespace() as other:
        helm("install", RELEASE, str(CHART), "-n", ops, "--set", "metricsAuth.enabled=true")
        client.CoreV1Api(cluster.api).create_namespaced_service_account(
            ops, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody")))
        installed = Install(cluster, "all", ops, tuned="", other=other)
        try:
            for namespace in (ops, other):
                expected = rules(EVERYWHERE, WATCHED_NAMESPACE, LEASE if namespace == ops else set(), METRICS_AUTH)
                wait_for(lambda namespace=namespace, expected=expected: installed.granted(namespace) == expected, 30,
                         f"the release's RBAC in {namespace} to be the documented rules and the two reviews")
        finally:
            helm("uninstall", RELEASE, "-n", ops, "--wait")


@pytest.mark.parametrize(("question", "where", "answer"), [
    (f"get secrets/{SECRET}", "tuned", "yes"),
    ("get secrets/another-secret", "tuned", "no"),
    (f"get secrets/{SECRET}", "other", "no"),
    (f"get secrets/{SECRET}", "ops", "no"),
    ("list secrets", "tuned", "no"),
    ("watch secrets", "tuned", "no"),
    ("list secrets", "all", "no"),
    ("patch deployments", "tuned", "yes"),
    ("delete deployments", "tuned", "no"),
    ("create deployments", "tuned", "no"),
    ("update deployments", "tuned", "no"),
    ("patch deployments --subresource=scale", "tuned", "no"),
    ("patch vllmtunings.autotuner.vllm-tuning.io --subresource=status", "tuned", "yes"),
    ("patch vllmtunings.autotuner.vllm-tuning.io", "tuned", "no"),
    ("update vllmtunings.autotuner.vllm-tuning.io", "tuned", "no"),
    ("delete vllmtunings.autotuner.vllm-tuning.io", "tuned", "no"),
    ("get configmaps", "tuned", "no"),
    ("create pods --subresource=exec", "tuned", "no"),
    ("delete pods", "tuned", "no"),
    ("create pods", "tuned", "no"),
    ("list clusterroles", "all", "no"),
    ("create rolebindings", "tuned", "no"),
    ("escalate clusterroles", "all", "no"),
    ("impersonate serviceaccounts", "tuned", "no"),
    ("create serviceaccounts --subresource=token", "ops", "no"),
    (f"update leases.coordination.k8s.io/{ACCOUNT}", "ops", "yes"),
    ("update leases.coordination.k8s.io/someone-elses", "ops", "no"),
    (f"delete leases.coordination.k8s.io/{ACCOUNT}", "ops", "no"),
    ("create leases.coordination.k8s.io", "tuned", "no"),
    ("get nodes", "all", "yes"),
    ("list nodes", "all", "no"),
    ("patch nodes", "all", "no"),
    ("list customresourcedefinitions.apiextensions.k8s.io", "all", "no"),
    (f"get customresourcedefinitions.apiextensions.k8s.io/{PLURAL}.{GROUP}", "all", "yes"),
    ("get customresourcedefinitions.apiextensions.k8s.io/another.example.com", "all", "no"),
    ("list namespaces", "all", "no"),
])
def test_kubectl_auth_can_i(cluster_with_crd: Cluster, install: Install, question: str, where: str,
                            answer: str) -> None:
    scope = ["--all-namespaces"] if where == "all" else ["-n", getattr(install, where)]
    asked = cluster_with_crd.kubectl("auth", "can-i", *question.split(), *scope,
                                     f"--as=system:serviceaccount:{install.ops}:{ACCOUNT}", check=False)
    assert asked.stdout.strip() == answer, asked.stderr


@dataclass
class RunningOperator:
    process: subprocess.Popen
    log: Path
    http_port: int

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as response:
            return response.read().decode()


@pytest.fixture
def operator(cluster_with_crd: Cluster, install: Install, operator_venv: Path, prometheus: localenv.Prometheus,
             tmp_path: Path) -> Iterator[RunningOperator]:
    """The operator from the image's install, with the chart's args and environment, as the ServiceAccount.

    What the pod would get from Kubernetes is given by hand: the token (a
    kubeconfig from the TokenRequest API), POD_NAMESPACE (the downward API);
    the Prometheus URL is the test's; /metrics and /healthz move to a free port.
    """
    deployment = client.AppsV1Api(cluster_with_crd.api).read_namespaced_deployment(ACCOUNT, install.ops)
    container = deployment.spec.template.spec.containers[0]
    env = {e.name: e.value for e in container.env if e.value is not None}
    assert {e.name for e in container.env if e.value_from} == {"POD_NAMESPACE"}
    assert env.get("WATCH_NAMESPACES") == (install.tuned if install.watching == "tuned" else None)
    port = localenv.free_port()
    env.update(POD_NAMESPACE=install.ops, PROMETHEUS_URL=prometheus.url,
               KUBECONFIG=str(token_kubeconfig(cluster_with_crd, install.ops, ACCOUNT, tmp_path / "kubeconfig")))
    log = tmp_path / "operator.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(operator_venv / "bin" / "vllm-autotuner"), "run", *container.args,
                                    f"--http-port={port}"],
                                   env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
                                   stdout=out, stderr=subprocess.STDOUT)
    running = RunningOperator(process, log, port)
    try:
        wait_for(lambda: process.poll() is None and urllib.request.urlopen(
            f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200, 60, "the operator's /healthz")
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def example_vllm() -> dict:
    """deploy/examples' vLLM Deployment, scaled to one replica and without --max-num-seqs: the operator
    then reads the GPU labels of the Node its pod runs on to know the value vLLM defaults to."""
    deployment, _service = documents((EXAMPLES / "vllm-llama-3-8b.yaml").read_text())
    deployment["spec"]["replicas"] = 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["args"] = [arg for arg in container["args"] if not arg.startswith("--max-num-seqs")]
    return deployment


def cron_at(moment: datetime) -> str:
    return f"{moment.minute} {moment.hour} * * *"


def test_the_operator_retunes_a_vllm_deployment_with_the_service_account_token(
        cluster_with_crd: Cluster, install: Install, fleet: localenv.Fleet, operator: RunningOperator) -> None:
    core, apps = client.CoreV1Api(cluster_with_crd.api), client.AppsV1Api(cluster_with_crd.api)
    custom = client.CustomObjectsApi(cluster_with_crd.api)
    ns = install.tuned
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name="huggingface"),
                                                      string_data={"token": "hf_not_needed_by_the_simulator"}))
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name=SECRET),
                                                      string_data={"token": "not-checked-by-this-prometheus"}))
    cluster_with_crd.kubectl("apply", "-n", ns, "-f", "-", stdin=as_yaml([example_vllm()]))
    wait_for(lambda: (apps.read_namespaced_deployment_status("llama-3-8b", ns).status.available_replicas or 0) == 1,
             120, "the vLLM pod to start on a simulated H100")
    now = datetime.now(UTC)
    # A schedule window open now, with a preset: a change the policy makes without waiting for traffic.
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VllmTuning", "metadata": {"name": "llama-3-8b"},
        "spec": {
            "targetRef": {"name": "llama-3-8b"},
            "prometheus": {"bearerTokenSecretRef": {"name": SECRET, "key": "token"}},
            "traffic": {"evaluationInterval": "2s"},
            "schedules": [{"name": "now", "start": cron_at(now - timedelta(hours=2)),
                           "end": cron_at(now + timedelta(hours=2)),
                           "knobs": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 256}}],
        },
    })

    def finished() -> dict | None:
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "llama-3-8b").get("status") or {}
        return status if (status.get("lastRollout") or {}).get("phase") == "Succeeded" else None

    status = wait_for(finished, 180, "the operator to roll out the schedule's preset")
    assert status["lastRollout"]["from"] == {"maxNumBatchedTokens": 8192, "maxNumSeqs": 1024}  # H100 default
    assert status["current"]["maxNumBatchedTokens"] == 4096 and status["current"]["maxNumSeqs"] == 256
    assert status["current"]["source"] == "Schedule" and status["activeSchedule"] == "now"
    assert status["drainSeconds"] == 45  # --shutdown-timeout=45, after a 10 s preStop sleep, within 60 s of grace
    # The new pod runs the new flags and is Ready: a real rolling update on the simulated fleet.
    (pod,) = [p for p in core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/name=llama-3-8b").items
              if not p.metadata.deletion_timestamp]
    (container,) = pod.spec.containers
    assert "--max-num-batched-tokens=4096" in container.args and "--max-num-seqs=256" in container.args
    assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)

    events = core.list_namespaced_event(ns, field_selector="source=vllm-autotuner").items
    reasons = {(e.involved_object.kind, e.reason) for e in events}
    assert {("VllmTuning", "RolloutStarted"), ("VllmTuning", "RolloutSucceeded"),
            ("Deployment", "VllmKnobsChanged")} <= reasons
    # the example's pods drain (a preStop sleep, --shutdown-timeout, a grace period for both): nothing to warn of
    assert ("VllmTuning", "RestartLosesRequests") not in reasons

    lease = client.CoordinationV1Api(cluster_with_crd.api).read_namespaced_lease(ACCOUNT, install.ops)
    assert lease.spec.holder_identity.endswith(f"-{operator.process.pid}")
    samples = [sample for family in text_string_to_metric_families(operator.metrics()) for sample in family.samples]
    assert [s.value for s in samples if s.name == "vllm_autotuner_leader"] == [1]
    assert [s.value for s in samples if s.name == "vllm_autotuner_drain_seconds"] == [45]
    calls = {(s.labels["resource"], s.labels["verb"]): s.value
             for s in samples if s.name == "vllm_autotuner_kubernetes_api_calls_total"}
    # With this token it read the Node's GPU labels and the granted Secret (to query Prometheus), and
    # patched the Deployment once; every call it made outside the watches is one the rules above name.
    assert calls[("nodes", "get")] >= 1 and calls[("secrets", "get")] >= 1 and calls[("deployments", "patch")] == 1
    assert calls[("customresourcedefinitions", "get")] == 1  # is the CRD as new as the operator? at start-up
    # API discovery (is the CRD served?) once at start-up: a non-resource URL every authenticated user may read
    # (the system:discovery ClusterRole), so no rule of ours names it
    assert calls.pop(("discovery", "get")) == 1
    assert set(calls) <= {(resource, verb) for _, resource, verb, _ in rules(WATCHED_NAMESPACE, EVERYWHERE,
                                                                             PROMETHEUS_SECRET)}

    operator.process.send_signal(signal.SIGTERM)
    assert operator.process.wait(60) == 0
    log = operator.log.read_text()
    assert "forbidden" not in log.lower(), log
    released = client.CoordinationV1Api(cluster_with_crd.api).read_namespaced_lease(ACCOUNT, install.ops)
    assert not released.spec.holder_identity
