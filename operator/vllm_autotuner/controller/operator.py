"""``vllm-autotuner run``: the operator process.

Startup order matters for safety: serve /healthz and /metrics (standbys are
healthy too), make sure the apiserver serves VllmTunings from a CRD as new as
the operator (else exit 2, before the Lease, so that no replica that could not
act stands by), win the leader Lease, and only then start kopf's watches and
the evaluator, so a standby never acts. Losing the lease stops everything
and exits non-zero (Kubernetes restarts the pod as a candidate), as does a
crash of kopf or the evaluator, logged with its traceback; SIGTERM
stops kopf and the evaluator and releases the lease so a standby takes over
at once. SIGTERM is handled from the start: in its container the operator is
PID 1, whose signals without a handler the kernel drops, and kopf's handler
comes only with kopf. A standby told to stop must exit then (exit 0), not
stand by until the kubelet's SIGKILL, free to take the Lease the leader it
stops beside releases and to act, its stop lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import kopf
from aiohttp import web
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from urllib3.exceptions import HTTPError

from vllm_autotuner import USER_AGENT
from vllm_autotuner.api import GROUP, PLURAL, VERSION
from vllm_autotuner.api.crd import stale_fields, stale_in_openapi
from vllm_autotuner.api.resource import CRD_NAME
from vllm_autotuner.controller.cache import ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.evaluator import Evaluator
from vllm_autotuner.controller.kube import Kube, api_error
from vllm_autotuner.controller.leader import LeaderElector, LeaseConfig
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.metricsauth import CertificateWatch, MetricsAuth, tls_context
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler
from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.observe.service import ObservationService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """Everything ``vllm-autotuner run`` takes from its flags."""

    settings: OperatorSettings
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    http_host: str | None = None  # None: every address, IPv4 and IPv6 (an IPv6-only cluster probes the pod there)
    http_port: int = 8080
    leader_election: bool = True
    lease_namespace: str = "default"
    lease_name: str = "vllm-autotuner"
    identity: str = ""
    metrics_auth: bool = False  # /metrics for callers RBAC lets get it, over HTTPS (``metricsauth``)
    tls_cert_file: str | None = None  # with metrics_auth; None: a self-signed certificate
    tls_key_file: str | None = None
    log_format: str = "json"
    verbose: bool = False


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built.

    At every watch event kopf builds the object's "essence" (a deep copy of
    it) to tell change handlers (``on.create``, ``on.update``, ``on.field``)
    what changed. This operator has none: its handlers feed the cache
    whatever changed, and at 1000 tunings the copies were a tenth of its CPU.
    A change handler added to the registry would never fire with this storage.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def registry_for(cache: ClusterCache) -> kopf.OperatorRegistry:
    """kopf handlers: thin glue that only feeds the cache."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A registry of our own has none of the default registry's login handlers: without
        # this, kopf has no credentials and stops at its first API request.
        return kopf.login_via_client(**kwargs)

    # Coroutines, though they never wait: kopf runs a plain function in a worker thread, a hop per
    # watch event, and every status write of the evaluator comes back as one.
    @kopf.index("apps", "v1", "deployments", id="deployments", registry=registry)
    async def deployments(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
        return deployment_index(namespace, name, body)

    @kopf.index("apps", "v1", "replicasets", id="replicasets", registry=registry)
    async def replicasets(namespace: str, body: kopf.Body, **_: Any) -> dict:
        return replicaset_index(namespace, body)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def tunings(event: dict, body: kopf.Body, deployments: kopf.Index, replicasets: kopf.Index,
                      **_: Any) -> None:
        cache.bind(deployments, replicasets)
        cache.on_tuning_event(event.get("type"), body)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # Events are ours, with named reasons; not kopf's handler chatter
        # No watching of CRDs (cluster-wide) or namespaces: the operator's RBAC grants neither.
        # kopf then resolves the VllmTuning resource once at start-up (API discovery) and
        # takes watched namespaces as exact names. The CRD is installed before the operator.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        settings.persistence.diffbase_storage = NoDiffBase()
        # kopf strips its finalizer from every object it watches that no handler of ours needs it on, and its
        # default name is shared by every kopf operator: left so, ours would take another kopf operator's
        # finalizer off any Deployment in the cluster (and fail on ReplicaSets, pausing their watch). No handler
        # of ours needs one, so a name of our own is never added and never taken off.
        settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"

    return registry


class HttpEndpoints:
    """/healthz (process alive, on every replica) and /metrics (the operator's metrics).

    With ``auth`` (and then ``tls``: HTTPS), /metrics answers only callers the apiserver lets get it; /healthz
    stays open, as the kubelet's probes carry no token. ``tls`` is a context, or a given certificate's watch, whose
    context is served and kept current while the server runs.
    """

    def __init__(self, metrics: OperatorMetrics, host: str | None, port: int, auth: MetricsAuth | None = None,
                 tls: ssl.SSLContext | CertificateWatch | None = None) -> None:
        self.metrics = metrics
        self.host, self.port = host, port
        self.auth, self.tls = auth, tls
        self._runner: web.AppRunner | None = None
        self._watch: asyncio.Task[None] | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.auth is not None:
            verdict = await self.auth.verdict(request.headers.get("Authorization"))
            if verdict.status != 200:
                return web.Response(status=verdict.status, text=verdict.reason + "\n",
                                    headers={"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        watch = self.tls if isinstance(self.tls, CertificateWatch) else None
        context = watch.context if watch else self.tls
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=context).start()
        log.info("serving /metrics and /healthz on %s://%s:%d%s", "https" if context else "http",
                 self.host or "every address", self.port, " (/metrics: RBAC)" if self.auth else "")
        if watch is not None:
            self._watch = asyncio.create_task(watch.run(), name="certificate")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.auth is not None:
            self.auth.close()


def _load_kube_config() -> client.ApiClient:
    """The API client of the operator's own calls: in the cluster, its service account; else the kubeconfig. It
    writes as the field manager ``FIELD_MANAGER``."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api = client.ApiClient()
    api.user_agent = USER_AGENT
    return api


def observation_service(metrics: OperatorMetrics) -> ObservationService:
    """Prometheus clients that report their query counts into the operator's metrics."""

    def client_for(connection: Connection) -> PrometheusClient:
        prometheus = PrometheusClient(connection)
        prometheus.on_query = metrics.prometheus_queries.inc
        return prometheus

    return ObservationService(client_for)


async def wind_down(workers: list[asyncio.Task], holding: asyncio.Task | None) -> bool:
    """Stop the tasks that act, once their stop flag is set; True when the Lease was lost, meanwhile or before.

    A replica that still leads lets the evaluations in flight finish (those not
    started yet are skipped) and renews the Lease meanwhile, so that no standby
    can lead while it still writes; the caller then releases the Lease. A
    replica whose Lease is lost, before or during this, cancels them at once:
    past the renew deadline a standby may take over from the end of the lease
    duration, and two replicas patching one Deployment is what the Lease
    exists to prevent.
    """
    if holding is None:
        await asyncio.gather(*workers, return_exceptions=True)
        return False
    pending = [task for task in workers if not task.done()]
    while pending and not holding.done():
        await asyncio.wait([holding, *pending], return_when=asyncio.FIRST_COMPLETED)
        pending = [task for task in pending if not task.done()]
    lost = holding.done()
    for task in pending:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    if not lost:
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
    return lost


async def _unless_stopped(step: Any, stop: asyncio.Event) -> bool:
    """Await ``step`` (a coroutine) unless ``stop`` is set first, which cancels it; True when it finished."""
    task = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()
    return True


async def _serves_tunings(kube: Kube) -> bool:
    """Whether the apiserver serves VllmTunings, the reason logged when not (the caller exits; the pod restarts).

    kopf resolves the resource once (no CRD watch, see ``configure``): started without it, it would never watch
    VllmTunings while /healthz said ok.
    """
    try:
        served = await asyncio.to_thread(kube.serves_tunings)
    except (ApiException, HTTPError) as exc:  # a 403, a 5xx, a timeout: unknown, asked again after the restart
        log.error("API discovery of %s/%s failed: %s; the pod restarts and asks again. If this lasts, check the "
                  "operator's connection to the apiserver and the apiserver's health", GROUP, VERSION, exc)
        return False
    if not served:
        log.error("the apiserver does not serve %s/%s %s: install the CRD first (kubectl apply -f crds/, or the "
                  "chart's crds/), then the operator", GROUP, VERSION, PLURAL)
    return served


async def _crd_current(kube: Kube) -> bool:
    """Whether the installed CRD takes every field of this version's (``crd.stale_fields``), what to do logged when
    not (the caller exits; the pod restarts until the CRD is applied, and no tuning is evaluated meanwhile). A
    CRD that cannot be read (a Role of one's own without the chart's grant) is judged by the schema the apiserver
    publishes from it (OpenAPI v3, which every authenticated client may read); when neither can be read, that is
    said and the CRD taken as current: nothing worse than before the check."""
    try:
        stale = stale_fields(await asyncio.to_thread(kube.tuning_crd))
    except (ApiException, HTTPError) as exc:
        try:
            stale = stale_in_openapi(await asyncio.to_thread(kube.tuning_openapi))
        except (ApiException, HTTPError, ValueError) as published:  # ValueError: not JSON, or no VllmTuning in it
            log.warning("neither the installed CRD %s (%s) nor its schema as the apiserver publishes it at "
                        "/openapi/v3/apis/%s/%s (%s) could be read, so whether it has this version's fields is not "
                        "known; grant get on the CRD, as the chart does (or get on /openapi/*, as the default "
                        "ClusterRole system:discovery does)", CRD_NAME, api_error(exc), GROUP, VERSION,
                        api_error(published))
            return True
    if stale:
        log.error("the installed CRD %s is older than this operator: it lacks %s, which the apiserver would drop "
                  "from every write or refuse (Helm never upgrades a chart's crds/). Apply this version's CRD: "
                  "kubectl apply --server-side --force-conflicts -f charts/vllm-autotuner/crds/ (or deploy/crds/); "
                  "the pod restarts and goes on", CRD_NAME, "; ".join(stale[:5]) + (
                      f" and {len(stale) - 5} more" if len(stale) > 5 else ""))
    return not stale


async def run(options: RunOptions) -> int:
    """Run until SIGTERM/SIGINT (0) or until leadership is lost (1)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):  # kopf puts its own in their place once it runs
        loop.add_signal_handler(number, stop.set)
    kopf.configure(verbose=options.verbose, log_format=kopf.LogFormat.JSON if options.log_format == "json"
                   else kopf.LogFormat.FULL)
    if not options.verbose:
        # kopf logs each watch event its handlers took at INFO ("Handler ... succeeded"): our handlers
        # only feed the cache, and each status write comes back as an event (2000 lines a minute
        # at 1000 tunings). Handler failures are warnings and errors, and still logged.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    metrics = OperatorMetrics()
    api_client = _load_kube_config()
    kube = Kube(api_client, metrics)
    secure = options.metrics_auth
    try:
        tls = (CertificateWatch(options.tls_cert_file, options.tls_key_file)
               if options.tls_cert_file and options.tls_key_file else tls_context(None, None)) if secure else None
    except OSError as exc:  # ssl.SSLError too: not PEM, or a key that is not the certificate's
        log.error("the HTTPS certificate of /metrics could not be loaded (--tls-cert-file %s, --tls-key-file %s): %s; "
                  "give a PEM certificate and its key, as a kubernetes.io/tls Secret holds them (tls.crt, tls.key)",
                  options.tls_cert_file, options.tls_key_file, exc)
        return 2
    http = HttpEndpoints(metrics, options.http_host, options.http_port, MetricsAuth(kube) if secure else None, tls)
    await http.start()
    # Before the Lease, on every replica: one that could not act must not stand by either. In a `helm upgrade`
    # onto an older CRD the new replicas would stand by, Ready, until the rollout had stopped every old one, then
    # each exit in turn; failing here, the first new one stops the rollout while the old ones lead.
    if not (await _serves_tunings(kube) and await _crd_current(kube)):
        await http.stop()
        return 2
    elector = None
    if options.leader_election:
        identity = options.identity or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaderElector(client.CoordinationV1Api(api_client),
                                LeaseConfig(options.lease_namespace, options.lease_name, identity))
        kube.write_seconds_left = elector.write_seconds_left
        if not await _unless_stopped(elector.acquire(), stop):
            log.info("stopped while standing by")
            await http.stop()
            return 0
    holding = asyncio.create_task(elector.hold(), name="lease") if elector else None
    metrics.leader.set(1)
    cache = ClusterCache()
    reconciler = Reconciler(kube, cache, observation_service(metrics), metrics, options.settings)
    evaluator = Evaluator(cache, reconciler, metrics)
    operator = asyncio.create_task(kopf.operator(
        registry=registry_for(cache), clusterwide=not options.namespaces, namespaces=list(options.namespaces),
        standalone=True, stop_flag=stop), name="kopf")
    evaluation = asyncio.create_task(evaluator.run(stop), name="evaluator")
    tasks = {operator, evaluation}
    if holding is not None:
        tasks.add(holding)
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    lost = await wind_down([operator, evaluation], holding)
    metrics.leader.set(0)
    if elector is not None and not lost:
        await asyncio.to_thread(elector.release)
    await http.stop()
    crashed = [task for task in (operator, evaluation) if not task.cancelled() and task.exception() is not None]
    for task in crashed:  # a bug: said, and the pod restarts with a failure the kubelet counts
        log.error("the %s task stopped the operator", task.get_name(), exc_info=task.exception())
    return 1 if lost or crashed else 0
