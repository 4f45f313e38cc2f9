"""The Helm chart: lint, its schema, what it renders, and a real install and uninstall.

Rendering is checked by the apiserver itself (a server-side dry run runs
every admission and schema check), and the install runs the README's own
command into a namespace that enforces the "restricted" Pod Security
Standard, so the operator's pods exist only if the apiserver let them in.
"""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client
from tests.integration.packaging import INSTALLED, readme_command
from tests.support import CHART, CRD_NAME, Cluster, Helm, documents, token_client, wait_for

from vllm_autotuner.cli import build_parser
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics

pytestmark = pytest.mark.integration

# Value sets beyond the defaults that change what is rendered.
NAMESPACED = ("--set", "watchNamespaces={team-a,team-b}",
              "--set", "rbac.secrets[0].namespace=team-a", "--set", "rbac.secrets[0].names={prometheus-token}",
              "--set", "rbac.secrets[1].namespace=team-b", "--set", "rbac.secrets[1].names={prometheus-ca}")
SINGLE = ("--set", "replicaCount=1", "--set", "leaderElection.enabled=false", "--set", "podDisruptionBudget.enabled=false")
EXTRAS = ("--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
          "--set", "dashboard.namespace=monitoring", "--set", "verbose=true")
DIGEST = "sha256:" + "0123456789abcdef" * 4
# The NetworkPolicy, its scrapers named and its egress restricted (DNS, the apiserver, Prometheus).
SCRAPERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
            {"ipBlock": {"cidr": "192.0.2.0/24"}}]
EGRESS = [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
          {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]},
          {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
           "ports": [{"port": 9090, "protocol": "TCP"}]}]
NETWORK_POLICY = ("--set", "networkPolicy.enabled=true",
                  "--set-json", f"networkPolicy.metricsFrom={json.dumps(SCRAPERS)}",
                  "--set-json", f"networkPolicy.egress={json.dumps(EGRESS)}")
# /metrics behind the apiserver's authentication and RBAC, over HTTPS with a certificate of cert-manager's.
SECURE = ("--set", "metricsAuth.enabled=true", "--set", "metricsAuth.tlsSecret=metrics-tls")
# ... scraped by a ServiceMonitor as a ServiceAccount of the chart's, its token from a Secret, not Prometheus' own.
SCRAPER = (*SECURE, "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.scraperServiceAccount.create=true")
# The ServiceMonitor's other ways to scrape: plain HTTP (with the PrometheusRule), Prometheus' own token over HTTPS
# (bearerTokenFile), a Secret of the user's (`authorization`), the certificate verified with its CA.
MONITORED = ("--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
BEARER_FILE = (*SECURE, "--set", "serviceMonitor.enabled=true")
TOKEN_SECRET = (*BEARER_FILE, "--set", "serviceMonitor.tokenSecret.name=prometheus-scraper")
CA_TLS = {"ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}}, "serverName": "rel-vllm-autotuner.ops.svc"}
VERIFIED = (*BEARER_FILE, "--set-json", f"serviceMonitor.tlsConfig={json.dumps(CA_TLS)}")
# The image pinned by digest; names and a budget the apiserver takes that the schema must not refuse.
PINNED = ("--set", f"image.digest={DIGEST}", "--set", "podDisruptionBudget.maxUnavailable=50%",
          "--set", "serviceAccount.name=operator.v1", "--set", "leaderElection.leaseName=lease.v1")


@pytest.mark.parametrize("values", [(), NAMESPACED, SINGLE, EXTRAS, PINNED, NETWORK_POLICY, SECURE, SCRAPER],
                         ids=["defaults", "namespaced", "single", "extras", "pinned", "network-policy", "secure",
                              "scraper"])
def test_lint_is_clean_in_strict_mode(helm: Helm, values: tuple[str, ...]) -> None:
    out = helm("lint", "--strict", str(CHART), *values).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out


@pytest.mark.parametrize(("values", "complaint"), [
    (("--set", "replicaCount=two"), "at '/replicaCount': got string, want integer"),
    (("--set", "logFormat=xml"), "at '/logFormat': value must be one of 'json', 'text'"),
    (("--set", "replicas=2"), "additional properties 'replicas' not allowed"),
    (("--set", "leaderElection.enabled=false"), "at '/replicaCount': maximum: got 2, want 1"),
    (("--set", "prometheus.url=prometheus:9090"), "at '/prometheus/url'"),
    (("--set", "watchNamespaces={Team_A}"), "at '/watchNamespaces/0'"),
    (("--set", "rbac.secrets[0].names={token}"), "missing property 'namespace'"),
    (("--set", "rbac.secrets[0].namespace=team-a"), "missing property 'names'"),
    (("--set", "image.pullPolicy=Sometimes"), "at '/image/pullPolicy'"),
    (("--set", "maxConcurrentRollouts=-1"), "at '/maxConcurrentRollouts': minimum"),
    (("--set", "rolloutPoolLabel=node pool"), "at '/rolloutPoolLabel': 'node pool' does not match pattern"),
    (("--set", "recommendOnly=yes"), "at '/recommendOnly': got string, want boolean"),
    # The full name becomes the Service's name, a DNS-1035 label: no dot, no leading digit.
    (("--set", "fullnameOverride=my.tuner"), "at '/fullnameOverride': 'my.tuner' does not match pattern"),
    (("--set", "nameOverride=1tuner"), "at '/nameOverride': '1tuner' does not match pattern"),
    (("--set", "podDisruptionBudget.maxUnavailable=0%"), "at '/podDisruptionBudget/maxUnavailable': '0%' does not"),
    (("--set", "image.digest=sha256:abc"), "at '/image/digest': 'sha256:abc' does not match pattern"),
    (("--set-json", 'prometheus.headers={"Authorization": "Bearer x"}'), "invalid propertyName 'Authorization'"),
    (("--set-json", 'prometheus.headers={"X-Scope-OrgID": "a\\nX-Admin: 1"}'),
     "at '/prometheus/headers/X-Scope-OrgID'"),
    # NOTES.txt lists a grant's names with no fallback for an empty list: the schema must refuse one.
    (("--set-json", 'rbac.secrets=[{"namespace": "a", "names": []}]'), "at '/rbac/secrets/0/names': minItems"),
    # A misspelt peer key would be dropped, and the peer widened to whatever its other keys allow.
    (("--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelecter": {}}]'),
     "at '/networkPolicy/metricsFrom/0': additional properties 'namespaceSelecter' not allowed"),
    (("--set-json", 'networkPolicy.egress=[{"port": 53}]'),
     "at '/networkPolicy/egress/0': additional properties 'port' not allowed"),
    # ... and a misspelt selector key likewise: `podSelector: {}` selects every pod of the namespace
    (("--set-json", 'networkPolicy.metricsFrom=[{"podSelector": {"matchLabel": {"app": "prometheus"}}}]'),
     "at '/networkPolicy/metricsFrom/0/podSelector': additional properties 'matchLabel' not allowed"),
    # `matchLabels:` emptied by commenting out its only label is null, which the apiserver reads as no
    # requirement (every namespace): refused rather than widened; `{}` says "all" on purpose
    (("--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelector": {"matchLabels": null}}]'),
     "at '/networkPolicy/metricsFrom/0/namespaceSelector/matchLabels': got null, want object"),
    # the apiserver refuses an ipBlock beside a selector in one peer
    (("--set-json", 'networkPolicy.metricsFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}]'),
     "at '/networkPolicy/metricsFrom/0'"),
    (("--set", "metricsAuth.enabled=yes"), "at '/metricsAuth/enabled': got string, want boolean"),
    (("--set", "metricsAuth.tlsSecret=Metrics_TLS"), "at '/metricsAuth/tlsSecret'"),
    # A token for the ServiceMonitor means nothing without metricsAuth (plain HTTP: it would go in the clear) or
    # without the ServiceMonitor; the chart's scraper binds the reader role, which only rbac.create makes; and
    # the chart's token Secret and one of the user's cannot both be presented.
    (("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.scraperServiceAccount.create=true"),
     "at '/metricsAuth/enabled': value must be true"),
    (("--set", "metricsAuth.enabled=true", "--set", "serviceMonitor.scraperServiceAccount.create=true"),
     "at '/serviceMonitor/enabled': value must be true"),
    ((*SCRAPER, "--set", "rbac.create=false"), "at '/rbac/create': value must be true"),
    ((*SCRAPER, "--set", "serviceMonitor.tokenSecret.name=mine"),
     "at '/serviceMonitor/tokenSecret/name': value must be ''"),
    (("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.tokenSecret.name=mine"),
     "at '/metricsAuth/enabled': value must be true"),
    (("--set", "metricsAuth.enabled=true", "--set", "serviceMonitor.tokenSecret.name=mine"),
     "at '/serviceMonitor/enabled': value must be true"),
    (("--set", "serviceMonitor.tokenSecret.name=My_Token"), "at '/serviceMonitor/tokenSecret/name'"),
    (("--set", "serviceMonitor.scraperServiceAccount.create=yes"),
     "at '/serviceMonitor/scraperServiceAccount/create': got string, want boolean"),
], ids=["replicas-string", "log-format", "unknown-key", "two-leaders", "url", "namespace-name", "secret-grant",
        "secret-grant-without-names", "pull-policy", "negative-rollout-limit", "pool-label", "recommend-only",
        "fullname-with-dot", "name-with-leading-digit", "pdb-zero-percent", "digest", "authorization-header", "header-on-two-lines",
        "secret-grant-of-no-names", "network-policy-peer", "network-policy-egress-rule",
        "network-policy-selector", "network-policy-null-match-labels", "network-policy-ipblock-and-selector",
        "metrics-auth-string", "metrics-auth-secret-name", "scraper-without-metrics-auth",
        "scraper-without-service-monitor", "scraper-without-rbac", "scraper-and-token-secret",
        "token-secret-without-metrics-auth", "token-secret-without-service-monitor", "token-secret-name",
        "scraper-string"])
def test_bad_values_are_rejected_by_the_schema(helm: Helm, values: tuple[str, ...], complaint: str) -> None:
    result = helm("template", "x", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr and complaint in result.stderr


def test_a_secret_grant_for_one_namespace_twice_is_refused(helm: Helm) -> None:
    result = helm("template", "x", str(CHART), "--set", "rbac.secrets[0].namespace=a",
                  "--set", "rbac.secrets[0].names={token}", "--set", "rbac.secrets[1].namespace=a",
                  "--set", "rbac.secrets[1].names={ca}", check=False)
    assert result.returncode != 0 and "rbac.secrets lists namespace a twice" in result.stderr


def test_helm_install_refuses_bad_values_and_creates_nothing(cluster: Cluster, helm: Helm, namespace: str) -> None:
    helm = helm.on(cluster)
    result = helm("install", "bad", str(CHART), "-n", namespace, "--skip-crds", "--set", "replicaCount=two",
                  check=False)
    assert result.returncode != 0 and "at '/replicaCount': got string, want integer" in result.stderr
    assert json.loads(helm("list", "-n", namespace, "--all", "-o", "json").stdout) == []
    assert client.AppsV1Api(cluster.api).list_namespaced_deployment(namespace).items == []


def _operator(objects: list[dict]) -> dict:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment


def test_the_operator_deployment_is_hardened_and_leader_elected(helm: Helm) -> None:
    objects = helm.template("rel", str(CHART), "-n", "ops")
    deployment = _operator(objects)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert "--lease-name=rel-vllm-autotuner" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["PROMETHEUS_URL"]["value"] == "http://prometheus-operated.monitoring.svc:9090"
    assert container["image"] == "ghcr.io/vllm-tuning/vllm-autotuner:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}} in pod["volumes"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == "rel-vllm-autotuner"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "vllm-autotuner" and labels["app.kubernetes.io/instance"] == "rel"
    (spread,) = pod["topologySpreadConstraints"]  # a node that fails takes the leader or its standby, not both
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    single = _operator(helm.template("rel", str(CHART), *SINGLE))
    assert single["spec"]["replicas"] == 1 and "--no-leader-election" in single["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "topologySpreadConstraints" not in single["spec"]["template"]["spec"]
    # a rolling update would run the new pod beside the stopping one, with no Lease to keep one of them idle
    assert single["spec"]["strategy"] == {"type": "Recreate"} and "strategy" not in deployment["spec"]


def test_a_digest_pins_the_image_and_overrides_the_tag(helm: Helm) -> None:
    pinned = _operator(helm.template("rel", str(CHART), "--set", f"image.digest={DIGEST}", "--set", "image.tag=9.9.9"))
    assert pinned["spec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/vllm-tuning/vllm-autotuner@{DIGEST}"
    tagged = _operator(helm.template("rel", str(CHART), "--set", "image.tag=9.9.9"))
    assert tagged["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/vllm-tuning/vllm-autotuner:9.9.9"


def _cluster_scoped(objects: list[dict]) -> tuple[str, str, str]:
    """The ClusterRole's name, the ClusterRoleBinding's, and the ClusterRole its roleRef names."""
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["kind"] == "ClusterRole"
    return role["metadata"]["name"], binding["metadata"]["name"], binding["roleRef"]["name"]


@pytest.mark.parametrize("values", [(), NAMESPACED, ("--set", "fullnameOverride=" + "a" * 63)],
                         ids=["defaults", "namespaced", "longest-name"])
def test_cluster_scoped_names_differ_between_release_namespaces(helm: Helm, values: tuple[str, ...]) -> None:
    # Releases of one name in two namespaces must not claim the same cluster-scoped objects.
    names = {ns: _cluster_scoped(helm.template("vllm-autotuner", str(CHART), "-n", ns, *values))
             for ns in ("ops-a", "ops-b")}
    for ns, (role, binding, bound) in names.items():
        assert role == binding == bound
        assert role == ("a" * 63 if values and "fullnameOverride" in values[1] else "vllm-autotuner") + f":{ns}"


def test_cluster_scoped_names_of_two_releases_never_meet(helm: Helm) -> None:
    # Release vllm-autotuner in namespace a-b and release vllm-autotuner-a in namespace b: joined
    # by '-', both were vllm-autotuner-a-b. A ':' is in no full name nor namespace, so it keeps them apart.
    names = {_cluster_scoped(helm.template(release, str(CHART), "-n", ns))[0]
             for release, ns in [("vllm-autotuner", "a-b"), ("vllm-autotuner-a", "b")]}
    assert names == {"vllm-autotuner:a-b", "vllm-autotuner-a:b"}


def test_the_apiserver_takes_the_longest_cluster_scoped_names(cluster: Cluster, helm: Helm) -> None:
    # A 63-character full name and a 63-character namespace: 127 characters, uncut. RBAC names are
    # path segments (no '/', no '%', not '.' or '..') of any length; the apiserver says so itself.
    namespace = "n" * 63
    rendered = helm("template", "x", str(CHART), "-n", namespace, "--set", "fullnameOverride=" + "a" * 63).stdout
    cluster_scoped = [o for o in documents(rendered) if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["name"] for o in cluster_scoped} == {"a" * 63 + ":" + namespace}
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                              stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_scoped})).stdout
    assert f"clusterrole.rbac.authorization.k8s.io/{'a' * 63}:{namespace} created (server dry run)" in applied
    assert f"clusterrolebinding.rbac.authorization.k8s.io/{'a' * 63}:{namespace} created (server dry run)" in applied


def _dashboard(objects: list[dict]) -> tuple[str, str]:
    """The dashboard ConfigMap's namespace and name."""
    (dashboard,) = [o for o in objects if o["kind"] == "ConfigMap"]
    return dashboard["metadata"]["namespace"], dashboard["metadata"]["name"]


def test_the_dashboard_in_a_shared_namespace_is_named_after_the_release_namespace(helm: Helm) -> None:
    # In its own namespace the ConfigMap keeps its name (renaming it would make a Grafana sidecar
    # drop the dashboard file on upgrade); elsewhere ".<release namespace>" follows, after the one dot.
    assert _dashboard(helm.template("rel", str(CHART), "-n", "ops")) == ("ops", "rel-vllm-autotuner-dashboard")
    assert _dashboard(helm.template("rel", str(CHART), "-n", "ops", "--set", "dashboard.namespace=ops")) == (
        "ops", "rel-vllm-autotuner-dashboard")
    shared = {_dashboard(helm.template(release, str(CHART), "-n", ns, "--set", "dashboard.namespace=grafana"))
              for release, ns in [("rel", "ops-a"), ("rel", "ops-b"), ("rel", "a-b"), ("rel-a", "b")]}
    assert shared == {("grafana", "rel-vllm-autotuner-dashboard.ops-a"), ("grafana", "rel-vllm-autotuner-dashboard.ops-b"),
                      ("grafana", "rel-vllm-autotuner-dashboard.a-b"), ("grafana", "rel-a-vllm-autotuner-dashboard.b")}


def test_a_release_name_with_a_dot_is_refused(helm: Helm) -> None:
    # Helm takes one, but the full name names the Service, and the names above rely on its having no dot.
    result = helm("template", "ops.rel", str(CHART), check=False)
    assert result.returncode != 0 and "makes the full name ops.rel-vllm-autotuner, which names the Service" in result.stderr
    assert _dashboard(helm.template("ops.rel", str(CHART), "--set", "fullnameOverride=rel"))[1] == "rel-dashboard"


def test_releases_of_one_name_in_two_namespaces_install_side_by_side(cluster: Cluster, helm: Helm) -> None:
    helm, rbac, core = helm.on(cluster), client.RbacAuthorizationV1Api(cluster.api), client.CoreV1Api(cluster.api)
    with cluster.fresh_namespace() as ops_a, cluster.fresh_namespace() as ops_b, \
            cluster.fresh_namespace() as team_a, cluster.fresh_namespace() as team_b, \
            cluster.fresh_namespace() as grafana:
        releases = {ops_a: team_a, ops_b: team_b}
        try:
            # Both dashboards go to one namespace, as with a Grafana sidecar that watches only its own.
            for ops, team in releases.items():
                helm("install", INSTALLED, str(CHART), "-n", ops, "--skip-crds", "--set", f"watchNamespaces={{{team}}}",
                     "--set", f"dashboard.namespace={grafana}")
            for ops in releases:
                objects = documents(helm("get", "manifest", INSTALLED, "-n", ops).stdout)
                names = _cluster_scoped(objects)
                binding = rbac.read_cluster_role_binding(names[1])
                assert [(s.namespace, s.name) for s in binding.subjects] == [(ops, INSTALLED)]
                assert rbac.read_cluster_role(binding.role_ref.name).rules[0].resources == ["nodes"]
                shared, name = _dashboard(objects)
                assert shared == grafana
                assert core.read_namespaced_config_map(name, grafana).metadata.annotations[
                    "meta.helm.sh/release-namespace"] == ops
        finally:
            for ops in releases:
                helm("uninstall", INSTALLED, "-n", ops, "--wait", check=False)
        assert core.list_namespaced_config_map(grafana, label_selector="grafana_dashboard").items == []


def _notes(cluster: Cluster, helm: Helm, namespace: str, *values: str) -> str:
    """The NOTES.txt an install with these values prints (a client-side dry run: nothing is created)."""
    out = helm.on(cluster)("install", "rel", str(CHART), "-n", namespace, "--dry-run", "--skip-crds", "-o", "json",
                           *values).stdout
    return json.loads(out)["info"]["notes"]


def test_the_notes_point_at_the_lease_only_when_there_is_one(cluster: Cluster, helm: Helm, namespace: str) -> None:
    elected = _notes(cluster, helm, namespace)
    assert "get lease rel-vllm-autotuner" in elected and "the others stand by" in elected
    single = _notes(cluster, helm, namespace, *SINGLE)
    assert "lease" not in single and "stand by" not in single
    assert f"kubectl -n {namespace} get pods -l app.kubernetes.io/instance=rel" in single


def test_the_notes_name_the_dashboard_configmap_where_it_is(cluster: Cluster, helm: Helm, namespace: str) -> None:
    assert f"ConfigMap {namespace}/rel-vllm-autotuner-dashboard (" in _notes(cluster, helm, namespace)
    shared = _notes(cluster, helm, namespace, "--set", "dashboard.namespace=grafana")
    assert f"ConfigMap grafana/rel-vllm-autotuner-dashboard.{namespace} (" in shared


def test_the_notes_say_how_metrics_are_read(cluster: Cluster, helm: Helm, namespace: str) -> None:
    url = f"rel-vllm-autotuner.{namespace}.svc:8080/metrics"
    assert f"Operator metrics: http://{url}\n" in _notes(cluster, helm, namespace)
    secure = _notes(cluster, helm, namespace, "--set", "metricsAuth.enabled=true")
    assert f"Operator metrics: https://{url}," in secure
    assert f"ClusterRole\nrel-vllm-autotuner-metrics-reader:{namespace}." in secure
    # without rbac.create the chart made no reader role: the notes must not name one
    unbound = _notes(cluster, helm, namespace, "--set", "metricsAuth.enabled=true", "--set", "rbac.create=false")
    assert "metrics-reader" not in unbound and "with nonResourceURLs [/metrics], verbs [get]" in unbound
    assert "grant them with rbac.secrets.\n\nOperator metrics" in _notes(cluster, helm, namespace)  # a line between


@pytest.mark.usefixtures("monitoring_crds")
def test_the_notes_say_whose_token_the_service_monitor_presents(cluster: Cluster, helm: Helm, namespace: str) -> None:
    scraped = _notes(cluster, helm, namespace, *SCRAPER)
    assert f"presents the token of\nServiceAccount {namespace}/rel-vllm-autotuner-metrics-scraper (" in scraped
    assert f"bound to ClusterRole\nrel-vllm-autotuner-metrics-reader:{namespace}." in scraped
    owned = _notes(cluster, helm, namespace, *TOKEN_SECRET)
    assert f"bind the ServiceAccount whose token the\nServiceMonitor presents (Secret {namespace}/prometheus-scraper)" in owned


def test_the_notes_say_what_the_operator_may_read_only_when_the_chart_grants_it(
        cluster: Cluster, helm: Helm, namespace: str) -> None:
    assert "It can read no Secret." in _notes(cluster, helm, namespace)
    granted = _notes(cluster, helm, namespace, *NAMESPACED)
    assert "team-a: prometheus-token" in granted and "team-b: prometheus-ca" in granted
    # Without rbac.create the chart grants nothing: the notes must not say what it grants.
    for values in [(), NAMESPACED]:
        notes = _notes(cluster, helm, namespace, "--set", "rbac.create=false", *values)
        assert "It can read no Secret" not in notes and "It may read these Secrets" not in notes
        assert f"created no Role or binding (rbac.create=false): grant ServiceAccount\n   {namespace}/rel-vllm-autotuner" in notes


def test_the_change_policy_values_reach_the_operator_as_its_parser_reads_them(helm: Helm) -> None:
    objects = helm.template("rel", str(CHART), "--set", "maxConcurrentRollouts=2",
                            "--set", "rolloutPoolLabel=karpenter.sh/nodepool", "--set", "recommendOnly=true")
    args = build_parser().parse_args(["run", *_operator(objects)["spec"]["template"]["spec"]["containers"][0]["args"]])
    assert (args.max_concurrent_rollouts, args.rollout_pool_label, args.recommend_only) == (
        2, "karpenter.sh/nodepool", True)
    default = _operator(helm.template("rel", str(CHART)))["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(["run", *default])
    assert (parsed.rollout_pool_label, parsed.recommend_only) == ("", False)  # one pool; changes made
    assert (parsed.prometheus_header, parsed.prometheus_bearer_token_file, parsed.prometheus_ca_file) == (
        None, None, None)


def test_the_default_prometheus_headers_and_credential_files_reach_the_operator_as_its_parser_reads_them(
        helm: Helm) -> None:
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    objects = helm.template("rel", str(CHART), "--set-json", 'prometheus.headers={"X-Scope-OrgID": "team-a|team-b"}',
                            "--set", f"prometheus.bearerTokenFile={token}", "--set", "prometheus.caFile=/etc/ca.pem")
    args = build_parser().parse_args(["run", *_operator(objects)["spec"]["template"]["spec"]["containers"][0]["args"]])
    assert args.prometheus_header == [("X-Scope-OrgID", "team-a|team-b")]
    assert (args.prometheus_bearer_token_file, args.prometheus_ca_file) == (token, "/etc/ca.pem")


def test_metrics_service_monitor_and_dashboard(helm: Helm) -> None:
    objects = {o["kind"]: o for o in helm.template("rel", str(CHART), "-n", "ops", *EXTRAS)}
    service, monitor = objects["Service"], objects["ServiceMonitor"]
    assert service["spec"]["ports"] == [{"name": "http-metrics", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    # The operator's `namespace` label is the VllmTuning's; the scrape must not overwrite it.
    assert endpoint["honorLabels"] is True
    dashboard = objects["ConfigMap"]
    assert (dashboard["metadata"]["namespace"], dashboard["metadata"]["name"]) == (
        "monitoring", "rel-vllm-autotuner-dashboard.ops")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["vllm-autotuner.json"]) == json.loads((CHART / "files" / "dashboard.json").read_text())
    assert "--verbose" in objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "ServiceMonitor" not in {o["kind"] for o in helm.template("rel", str(CHART))}


def test_metrics_auth_serves_https_grants_the_reviews_and_a_reader_role_and_scrapes_with_a_token(helm: Helm) -> None:
    """Opt-in: by default /metrics is plain HTTP and open, as before, so that an upgrade keeps its scrapers."""
    default = helm.template("rel", str(CHART), "-n", "ops", "--set", "serviceMonitor.enabled=true")
    args = build_parser().parse_args(["run", *_operator(default)["spec"]["template"]["spec"]["containers"][0]["args"]])
    assert (args.metrics_auth, args.tls_cert_file) == (False, None)
    (role,) = [o for o in default if o["kind"] == "ClusterRole"]
    assert not {"tokenreviews", "subjectaccessreviews"} & {r for rule in role["rules"] for r in rule["resources"]}
    (monitor,) = [o for o in default if o["kind"] == "ServiceMonitor"]
    assert not {"scheme", "bearerTokenFile", "tlsConfig"} & set(monitor["spec"]["endpoints"][0])
    assert "scheme" not in _operator(default)["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]
    (service,) = [o for o in default if o["kind"] == "Service"]
    assert "appProtocol" not in service["spec"]["ports"][0]

    objects = helm.template("rel", str(CHART), "-n", "ops", "--set", "serviceMonitor.enabled=true", *SECURE)
    pod = _operator(objects)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(["run", *container["args"]])
    assert (args.metrics_auth, args.tls_cert_file, args.tls_key_file) == (
        True, "/etc/vllm-autotuner/tls/tls.crt", "/etc/vllm-autotuner/tls/tls.key")
    assert {"name": "tls", "mountPath": "/etc/vllm-autotuner/tls", "readOnly": True} in container["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "metrics-tls"}} in pod["volumes"]
    for probe in ("livenessProbe", "readinessProbe"):  # /healthz shares the port, now HTTPS
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert service["spec"]["ports"][0]["appProtocol"] == "https"  # a mesh must not take it for plain HTTP
    roles = {o["metadata"]["name"]: o["rules"] for o in objects if o["kind"] == "ClusterRole"}
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in roles[
        "rel-vllm-autotuner:ops"]
    assert {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]} in roles[
        "rel-vllm-autotuner:ops"]
    assert roles["rel-vllm-autotuner-metrics-reader:ops"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["scheme"], endpoint["bearerTokenFile"], endpoint["tlsConfig"]) == (
        "https", "/var/run/secrets/kubernetes.io/serviceaccount/token", {"insecureSkipVerify": True})
    (monitor,) = [o for o in helm.template("rel", str(CHART), "-n", "ops", *VERIFIED) if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["tlsConfig"] == CA_TLS

    self_signed = _operator(helm.template("rel", str(CHART), "--set", "metricsAuth.enabled=true"))
    (container,) = self_signed["spec"]["template"]["spec"]["containers"]
    assert "--metrics-auth" in container["args"] and not any(a.startswith("--tls-") for a in container["args"])
    assert {m["name"] for m in container["volumeMounts"]} == {"tmp"}


def _scrape_endpoint(objects: list[dict]) -> dict:
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    return endpoint


def test_the_service_monitor_presents_a_scraper_s_token_from_a_secret_when_told(helm: Helm) -> None:
    """Prometheus' own token (bearerTokenFile) is deprecated by prometheus-operator and refused by a Prometheus with
    arbitraryFSAccessThroughSMs.deny: the ServiceMonitor may instead present, with `authorization`, the token of a
    ServiceAccount the chart makes and binds to the reader role alone, or the token in a Secret of the user's."""
    scraper = "rel-vllm-autotuner-metrics-scraper"
    objects = helm.template("rel", str(CHART), "-n", "ops", *SCRAPER)
    made = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert made["ServiceAccount", scraper]["metadata"]["namespace"] == "ops"
    secret = made["Secret", scraper]
    assert secret["metadata"]["namespace"] == "ops" and secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": scraper}
    binding = made["ClusterRoleBinding", f"{scraper}:ops"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "rel-vllm-autotuner-metrics-reader:ops"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": scraper, "namespace": "ops"}]
    endpoint = _scrape_endpoint(objects)
    assert "bearerTokenFile" not in endpoint and endpoint["scheme"] == "https"
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": scraper, "key": "token"}}

    own = helm.template("rel", str(CHART), "-n", "ops", *TOKEN_SECRET, "--set", "serviceMonitor.tokenSecret.key=jwt")
    endpoint = _scrape_endpoint(own)
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "prometheus-scraper", "key": "jwt"}}
    assert not {name for kind, name in made if name.startswith(scraper)} & {o["metadata"]["name"] for o in own}


def test_the_network_policy_opens_only_the_metrics_port_and_restricts_egress_only_when_told(helm: Helm) -> None:
    """Opt-in, for namespaces that deny by default: the operator's pods take scrapes on their one port, from any pod
    unless scrapers are named; egress stays open (the apiserver's and Prometheus' addresses differ per cluster)
    unless rules are given, and then only those."""
    assert "NetworkPolicy" not in {o["kind"] for o in helm.template("rel", str(CHART))}
    objects = helm.template("rel", str(CHART), "-n", "ops", "--set", "networkPolicy.enabled=true",
                            "--set", "httpPort=9102")
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    deployment = _operator(objects)
    assert policy["metadata"]["namespace"] == "ops"
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9102
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    assert policy["spec"]["ingress"] == [{"from": [{"namespaceSelector": {}}],
                                          "ports": [{"port": 9102, "protocol": "TCP"}]}]

    (policy,) = [o for o in helm.template("rel", str(CHART), *NETWORK_POLICY) if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [{"from": SCRAPERS, "ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert policy["spec"]["egress"] == EGRESS


def test_the_scraper_s_token_secret_is_filled_and_lets_it_get_metrics(cluster: Cluster, helm: Helm,
                                                                     namespace: str) -> None:
    """serviceMonitor.scraperServiceAccount.create on the real apiserver: the token controller fills the chart's
    Secret with a token of the scraper's ServiceAccount, which the operator's reviews, made with its own token and
    the chart's grants, take for a user RBAC lets get /metrics. Only the ServiceAccounts, their RBAC and the Secret
    are applied: the testenv has no prometheus-operator to read the ServiceMonitor, whose `authorization` is
    checked as rendered (test_the_service_monitor_presents_a_scraper_s_token_from_a_secret_when_told) and by its
    CRD (test_rendered_manifests_pass_a_server_side_dry_run)."""
    rendered = helm("template", "rel", str(CHART), "-n", namespace, *SCRAPER,
                    "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
                    "--show-only", "templates/metrics-scraper.yaml").stdout
    cluster.kubectl("apply", "-f", "-", stdin=rendered)
    try:
        core = client.CoreV1Api(cluster.api)
        token = wait_for(lambda: (core.read_namespaced_secret("rel-vllm-autotuner-metrics-scraper", namespace).data
                                  or {}).get("token"), 60, "the token controller to fill the scraper's Secret")
        with token_client(cluster, namespace, "rel-vllm-autotuner") as operator_api:
            kube = Kube(operator_api, OperatorMetrics())
            # the grants (the operator's reviews, the scraper's binding) reach the authorizer through a watch
            user = wait_for(lambda: kube.review_token(base64.b64decode(token).decode()), 30,
                            "the operator's grant of TokenReviews to be in force")
            assert user["authenticated"] is True
            assert user["user"]["username"] == f"system:serviceaccount:{namespace}:rel-vllm-autotuner-metrics-scraper"
            wait_for(lambda: kube.may_get_metrics(user["user"]), 30, "the scraper's binding to let it get /metrics")
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=rendered)


@pytest.mark.usefixtures("monitoring_crds")
@pytest.mark.parametrize("values", [(), NAMESPACED, SINGLE, PINNED, NETWORK_POLICY, SECURE, MONITORED, BEARER_FILE,
                                    SCRAPER, TOKEN_SECRET, VERIFIED],
                         ids=["defaults", "namespaced", "single", "pinned", "network-policy", "secure", "monitored",
                              "bearer-file", "scraper", "token-secret", "verified"])
def test_rendered_manifests_pass_a_server_side_dry_run(cluster_with_crd: Cluster, helm: Helm, namespace: str,
                                                       values: tuple[str, ...]) -> None:
    """Every object as the apiserver would store it, the ServiceMonitor and PrometheusRule by prometheus-operator's
    own CRDs: strict field validation refuses a field their schemas lack (a misspelling, one of another version)."""
    with cluster_with_crd.fresh_namespace() as team_a, cluster_with_crd.fresh_namespace() as team_b:
        values = tuple(v.replace("team-a", team_a).replace("team-b", team_b) for v in values)
        rendered = helm("template", "dry", str(CHART), "-n", namespace, "--include-crds", *values).stdout
        applied = cluster_with_crd.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                           stdin=rendered).stdout
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in applied
    assert "deployment.apps/dry-vllm-autotuner created (server dry run)" in applied
    assert applied.count("(server dry run)") == len([line for line in rendered.splitlines() if line.startswith("kind:")])


@pytest.mark.usefixtures("monitoring_crds")
@pytest.mark.parametrize(("template", "field", "misspelt", "complaint"), [
    ("servicemonitor.yaml", "authorization:", "authorisation:", 'unknown field "spec.endpoints[0].authorisation"'),
    ("prometheusrule.yaml", "for:", "fore:", 'unknown field "spec.groups[0].rules[0].fore"'),
], ids=["service-monitor", "prometheus-rule"])
def test_the_dry_run_refuses_a_field_prometheus_operator_does_not_know(
        cluster: Cluster, helm: Helm, namespace: str, template: str, field: str, misspelt: str, complaint: str) -> None:
    """What the dry run above is worth for these kinds: a CRD that kept any field would pass a misspelt one."""
    rendered = helm("template", "dry", str(CHART), "-n", namespace, *SCRAPER, "--set", "prometheusRule.enabled=true",
                    "--show-only", f"templates/{template}").stdout
    assert field in rendered
    refused = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", check=False,
                              stdin=rendered.replace(field, misspelt, 1))
    assert refused.returncode != 0 and complaint in refused.stderr


@pytest.fixture
def readme_helm_release(cluster_with_crd: Cluster, helm: Helm):
    """The README's `helm install`, into its namespace created beforehand to enforce the restricted Pod Security Standard."""
    core = client.CoreV1Api(cluster_with_crd.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=INSTALLED, labels={"pod-security.kubernetes.io/enforce": "restricted"})))
    helm = helm.on(cluster_with_crd)
    args = readme_command("helm")
    try:
        yield helm, args
    finally:
        helm("uninstall", INSTALLED, "-n", INSTALLED, "--wait", check=False)
        core.delete_namespace(INSTALLED)
        wait_for(lambda: not core.list_namespace(field_selector=f"metadata.name={INSTALLED}").items, 120,
                 f"namespace {INSTALLED} to be deleted")


def test_readme_helm_install_then_uninstall_leaves_only_the_crd(cluster_with_crd: Cluster, readme_helm_release) -> None:
    helm, args = readme_helm_release
    assert args[:2] == ["install", INSTALLED] and "--create-namespace" in args
    helm(*args)
    (release,) = json.loads(helm("list", "-n", INSTALLED, "-o", "json").stdout)
    assert release["status"] == "deployed" and release["app_version"] == "0.1.0"
    manifest = helm("get", "manifest", INSTALLED, "-n", INSTALLED).stdout
    kinds = {o["kind"] for o in documents(manifest)}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
                     "Deployment", "PodDisruptionBudget", "ConfigMap"}
    names = cluster_with_crd.kubectl("get", "-f", "-", "-o", "name", stdin=manifest).stdout.split()
    assert len(names) == len(documents(manifest))
    # Pod Security admission let both operator pods in: the pod meets the restricted standard.
    core = client.CoreV1Api(cluster_with_crd.api)
    selector = f"app.kubernetes.io/instance={INSTALLED}"
    wait_for(lambda: len(core.list_namespaced_pod(INSTALLED, label_selector=selector).items) == 2, 60,
             "the ReplicaSet controller to create both operator pods")

    helm("uninstall", INSTALLED, "-n", INSTALLED, "--wait")
    assert cluster_with_crd.kubectl("get", "-f", "-", "-o", "name", "--ignore-not-found", stdin=manifest).stdout == ""
    extensions = client.ApiextensionsV1Api(cluster_with_crd.api)
    assert extensions.read_custom_resource_definition(CRD_NAME).metadata.name == CRD_NAME
