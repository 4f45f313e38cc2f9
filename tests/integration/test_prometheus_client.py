"""The operator's Prometheus client and queries against the real server.

Range queries evaluate exactly where asked: reports line their steps up with
the times they asked for, so a client that moved the range
(prometheus-api-client rounds start and end to whole seconds) would pair
every value with the wrong step. The families whose answers depend on how
Prometheus ends series (stale markers at a failed scrape, at a target gone)
and what a restart leaves of them are checked on real scrapes: a fake
server could not say what the real one does. Credentials and TLS are checked
against a Prometheus whose own web config asks for basic auth or serves
HTTPS, as one behind a platform team's login or internal CA does.
"""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from tests.support import wait_for

from vllm_autotuner.api import SLO
from vllm_autotuner.observe.client import Connection, ErrorKind, PrometheusClient, PrometheusError
from vllm_autotuner.observe.queries import PodMatch, Selector, pod_matchers, reach
from vllm_autotuner.observe.window import fetch_window, observe_target
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def test_a_range_query_is_evaluated_at_the_exact_times_asked(prometheus: localenv.Prometheus) -> None:
    client = PrometheusClient(Connection(url=prometheus.url))
    start = round(time.time(), 0) - 100.375
    (series,) = client.query_range("time()", start, start + 3 * 2.5, 2.5)
    expected = [start + 2.5 * k for k in range(4)]
    assert series.times == pytest.approx(expected, abs=1e-6)
    assert series.values == pytest.approx(expected, abs=1e-6)  # time() is the evaluation time itself


#: A Prometheus web config holds a bcrypt hash of the password, not the password: this one is PASSWORD's, at cost 4
#: (quick to check).
USER, PASSWORD, PASSWORD_HASH = "autotuner", "tuning-pass", "$2b$04$dvrRUquhYRxa0BFKsZOqc.IfZ2rur8.ToO4vDhkTA4ZgY6MDQsovG"


def test_a_prometheus_behind_basic_auth_answers_with_the_credentials_and_refuses_without(tmp_path) -> None:
    server = localenv.start_prometheus(tmp_path, basic_auth=(USER, PASSWORD, PASSWORD_HASH))
    try:
        client = PrometheusClient(Connection(url=server.url, basic_auth=(USER, PASSWORD),
                                             headers=(("X-Scope-OrgID", "team-a"),)))
        assert [sample.value for sample in client.query("vector(7)", time.time())] == [7.0]
        for refused in (Connection(url=server.url), Connection(url=server.url, basic_auth=(USER, "wrong")),
                        Connection(url=server.url, bearer_token=PASSWORD)):
            with pytest.raises(PrometheusError) as error:
                PrometheusClient(refused).query("vector(7)", time.time())
            assert error.value.kind is ErrorKind.AUTH and "basicAuth" in str(error.value), error.value
    finally:
        server.stop()


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, ec.EllipticCurvePrivateKey],
                 ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        builder = builder.add_extension(x509.SubjectAlternativeName([loopback]), critical=False)
    return builder.sign(issuer[1], hashes.SHA256())


def _pki(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA named ``name`` and a serving certificate it signed for 127.0.0.1: (CA, certificate, key) files."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    files = directory / f"{name}-ca.crt", directory / f"{name}.crt", directory / f"{name}.key"
    files[0].write_bytes(_certificate(name, ca_key, (name, ca_key), ca=True).public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(_certificate("prometheus", key, (name, ca_key), ca=False).public_bytes(
        serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return files


def test_a_prometheus_serving_tls_is_trusted_with_the_ca_that_signed_it_and_refused_otherwise(tmp_path) -> None:
    tls = _pki(tmp_path, "internal")
    server = localenv.start_prometheus(tmp_path / "prometheus", tls=tls)
    try:
        assert server.url.startswith("https://")
        client = PrometheusClient(Connection(url=server.url, ca_pem=tls[0].read_text()))
        assert [sample.value for sample in client.query("vector(7)", time.time())] == [7.0]
        other_ca = _pki(tmp_path, "other")[0].read_text()
        for untrusted in (Connection(url=server.url), Connection(url=server.url, ca_pem=other_ca)):
            with pytest.raises(PrometheusError) as error:
                PrometheusClient(untrusted).query("vector(7)", time.time())
            assert error.value.kind is ErrorKind.TLS and "caSecretRef" in str(error.value), error.value
    finally:
        server.stop()


class _StartedServer:
    """A vLLM counter whose server started at ``created``, with the ``_created`` gauge prometheus-client adds."""

    def __init__(self, created: float) -> None:
        self.created = created

    def collect(self):
        family = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels=["engine", "model_name"])
        family.add_metric(["0", "tiny-llama"], 1234.0, created=self.created)
        yield family


class _Server:
    """A vLLM server exporting no ``_created`` gauges (prometheus-client's multiprocess mode, vLLM's with
    ``--api-server-count`` over 1): a prompt-token counter a restart sets back, the running requests; while
    ``failing``, its ``/metrics`` answers 503 (a server starting again, a stuck one)."""

    def __init__(self) -> None:
        self.prompt_tokens = 5000.0
        self.failing = False

    def collect(self):
        counter = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                      labels=["engine", "model_name"])
        counter.add_metric(["0", "tiny-llama"], self.prompt_tokens)
        yield counter
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=["engine", "model_name"])
        running.add_metric(["0", "tiny-llama"], 1.0)
        yield running


def _serve_text_format(registry: CollectorRegistry, vllm: _Server | None = None) -> ThreadingHTTPServer:
    """``/metrics`` in the Prometheus text format, as the simulator serves it (keeps the ``vllm:`` names); 503
    while ``vllm`` is failing."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if vllm is not None and vllm.failing:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
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


@pytest.fixture
def pods(prometheus: localenv.Prometheus):
    """``pods(namespace, names)``: fake vLLM servers scraped as those pods; the targets are cleared after."""
    started: list[ThreadingHTTPServer] = []

    def scrape(namespace: str, names: list[str]) -> tuple[dict[str, _Server], list[dict]]:
        servers = {name: _Server() for name in names}
        targets = []
        for name, server in servers.items():
            registry = CollectorRegistry()
            registry.register(server)
            http = _serve_text_format(registry, server)
            started.append(http)
            targets.append(localenv.file_sd_target(f"127.0.0.1:{http.server_port}", namespace, name))
        localenv.write_targets(prometheus.targets_file, targets)
        return servers, targets

    yield scrape
    localenv.write_targets(prometheus.targets_file, [])
    for http in started:
        http.shutdown()
        http.server_close()


def _series(client: PrometheusClient, promql: str) -> dict[str, float]:
    """The rows of an instant query now, by pod."""
    return {row.labels.get("pod", ""): row.value for row in client.query(promql, time.time())}


def test_a_pod_whose_scrapes_fail_keeps_its_newest_sample_and_a_deleted_one_stays_out(prometheus, pods) -> None:
    # Prometheus marks a target's series stale at its first failed scrape, and the series of a target gone (a pod
    # deleted in a scale-down) too: the first pod is still Ready and the staleness limit judges it, the other is
    # no pod any more and must not stand in for a Ready one that never reported
    client = PrometheusClient(Connection(url=prometheus.url))
    namespace, (serving, failing, deleted) = "scrape-fails", ["llama-abc-1", "llama-abc-2", "llama-abc-3"]
    servers, targets = pods(namespace, [serving, failing, deleted])
    running = f'vllm:num_requests_running{{namespace="{namespace}"}}'
    # scraped for longer than a step of the 60 s window's subqueries (2 s), so some step sees a sample of each
    wait_for(lambda: len(_series(client, f"{running} offset 5s")) == 3, 30, "the three pods' scrapes")
    servers[failing].failing = True
    failed_at = time.time()
    localenv.write_targets(prometheus.targets_file, targets[:2])
    up = f'up{{namespace="{namespace}"}}'
    wait_for(lambda: _series(client, up) == {serving: 1.0, failing: 0.0} and set(_series(client, running)) == {serving},
             30, f"a failed scrape of {failing} and {deleted}'s target gone")
    # a spec matcher on a label of the vLLM series alone, which `up` has not
    selector = Selector(matchers=(("model_name", "tiny-llama"),))
    match = PodMatch(("llama-abc-",))
    for extra in ((), pod_matchers(selector, namespace, match)):
        data = fetch_window(client, selector, 60, time.time(), extra)
        last_seen = {pod: at for (ns, pod), at in data.values["last_seen"].items() if ns == namespace}
        assert set(last_seen) == {serving, failing}, extra
        assert failed_at - 5 <= last_seen[failing] <= failed_at, extra  # its newest real sample
        observation, why = observe_target(data, namespace, match, 2, None, SLO(), False, stale_after_seconds=90)
        assert why is None and observation is not None and observation.pods == 2
        observation, why = observe_target(data, namespace, match, 3, None, SLO(), False, stale_after_seconds=90)
        assert observation is None
        assert why == "only 2 of 3 Ready pods are scraped by Prometheus and have series in the window: partial data"


def test_a_container_restarted_in_place_without_created_gauges_is_a_server_start(prometheus, pods) -> None:
    # kubelet restarts a crashed container in the same pod: the series go on under the same labels, counting from
    # zero, after the scrapes failed while vLLM started again (stale markers); no `_created` gauge says when
    client = PrometheusClient(Connection(url=prometheus.url))
    namespace, pod = "restarts", "llama-abc-1"
    server = pods(namespace, [pod])[0][pod]
    window = 10  # the fallback reaches two windows back: 20 s, in steps of 1 s
    extra = pod_matchers(Selector(), namespace, PodMatch(names=(pod,)))

    def started() -> dict[tuple[str, str], float]:
        return fetch_window(client, Selector(), window, time.time(), extra).values["started"]

    began_long_ago = f'vllm:num_requests_running{{pod="{pod}"}} offset {2 * window + 1}s'
    wait_for(lambda: _series(client, began_long_ago) and started() == {}, 60,
             f"{pod}'s series to begin more than two windows ago (an unknown start)")
    server.failing = True
    wait_for(lambda: _series(client, f'up{{pod="{pod}"}}') == {pod: 0.0}, 30, f"a failed scrape of {pod}")
    restarted_at = time.time()
    server.prompt_tokens = 10.0
    server.failing = False
    prompt_tokens = f'vllm:prompt_tokens_total{{pod="{pod}"}}'
    wait_for(lambda: _series(client, prompt_tokens) == {pod: 10.0}, 30, f"a scrape of {pod} restarted")
    # a subquery's steps are whole seconds: the newest one may fall before the sample just scraped
    wait_for(lambda: restarted_at - 1 <= started().get((namespace, pod), 0.0) <= time.time(), 10,
             f"{pod}'s restart as its server start")
    # restarted again with no scrape failing in between (a start quicker than a scrape interval)
    restarted_at = time.time()
    server.prompt_tokens = 3.0
    wait_for(lambda: _series(client, prompt_tokens) == {pod: 3.0}, 30, f"a scrape of {pod} restarted again")
    wait_for(lambda: restarted_at - 1 <= started().get((namespace, pod), 0.0) <= time.time(), 10,
             f"{pod}'s restart as its server start")
    # out of two windows' reach, a restart is still found over a settle time of three windows before the window
    wait_for(lambda: started() == {}, 40, f"{pod}'s restart to be more than two windows old")
    settled = fetch_window(client, Selector(), window, time.time(), extra, reach(window, 3 * window))
    assert restarted_at - 1 <= settled.values["started"][(namespace, pod)] < restarted_at + window
