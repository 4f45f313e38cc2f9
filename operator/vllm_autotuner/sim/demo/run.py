"""``vllm-autotuner sim demo``: the compressed day, end to end, on the local cluster.

The order of things, and why:

1. **Servers.** The demo runs against real servers: the control plane and
   Prometheus that ``make up`` keeps running (or those named on the command
   line, as the end-to-end test does), else its own under ``.local/demo/``,
   which start in seconds. Its simulated GPU nodes are its own either way
   (``demo-llama3-8b-h100-*``, selected by the Deployments' nodeSelector), so
   nothing else lands on them and they add nothing to anyone else's fleet.
2. **Objects.** The CRD, a fresh namespace (a previous run's is deleted
   first), the two Deployments (both Ready before the day starts), then the
   operator, and last the VllmTuning, whose nightly window is written in
   wall-clock cron for this run's clock.
3. **The day.** Both Deployments get the same requests (one scenario, one
   seed) from two senders in one event loop; the live view prints a line per
   simulated hour and one per decision.
4. **The report**, from Prometheus, once the day is over or interrupted.
5. **Shutdown**, whatever happened: the operator, the fleet (its nodes
   deleted again when the cluster is not the demo's own), and the servers the
   demo started. The namespace stays where the cluster outlives the demo, so
   ``kubectl -n vllm-demo get rs`` shows what was rolled out.

Ctrl-C during the day ends the traffic and writes the report for the part
of the day that ran; a second Ctrl-C skips the report. Either way everything
the demo started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from vllm_autotuner.api import GROUP, PLURAL, VERSION, Knobs
from vllm_autotuner.api.resource import CRD_NAME
from vllm_autotuner.api.types import duration_seconds
from vllm_autotuner.knobs import CommandLineError, EngineArgs, find_vllm_container
from vllm_autotuner.observe.client import Connection, PrometheusClient, PrometheusError
from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.demo import plan, report
from vllm_autotuner.sim.demo.live import Latency, LiveView
from vllm_autotuner.sim.demo.plan import NAMESPACE, STATIC, TUNED, DemoDay
from vllm_autotuner.sim.load import Load
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.startup import default_knobs
from vllm_autotuner.sim.workload import Scenario

WORKDIR = localenv.STATE_DIR / "demo"
CRD_FILE = localenv.ROOT / "crds" / f"{CRD_NAME}.yaml"
DEFAULT_REPORT_DIR = localenv.ROOT / "demo-report"
READY_TIMEOUT_S = 180
DRAIN_S = 10.0
POLL_S = 1.0
REVISION = "deployment.kubernetes.io/revision"


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


@dataclass
class World:
    """The servers the demo talks to; those it started (the control plane and Prometheus, stopped last first),
    its fleet and its operator."""

    kubeconfig: Path
    prometheus_url: str
    targets_dir: Path
    own_cluster: bool
    started: list[localenv.Server] = field(default_factory=list)
    fleet: localenv.Fleet | None = None
    operator: localenv.Operator | None = None

    @property
    def fleet_targets(self) -> Path:
        return self.targets_dir / "demo-fleet.json"


def servers(args: argparse.Namespace) -> World:
    """The control plane and Prometheus to use: given, ``make up``'s, or started here."""
    given = (args.kubeconfig, args.prometheus_url, args.prometheus_targets_dir)
    if any(given):
        if not all(given):
            raise SystemExit("sim demo: --kubeconfig, --prometheus-url and --prometheus-targets-dir go together "
                             "(a cluster and the Prometheus that reads file-SD targets from that directory)")
        say(f"using the given cluster and Prometheus ({args.prometheus_url})")
        return World(Path(args.kubeconfig), args.prometheus_url, Path(args.prometheus_targets_dir), own_cluster=False)
    settings = localenv.running()
    if settings is not None:
        say(f"using the environment `make up` keeps running (settings in {localenv.STATE_DIR / 'env'})")
        return World(Path(settings["KUBECONFIG"]), settings["PROMETHEUS_URL"],
                     Path(settings["FLEET_TARGETS"]).parent, own_cluster=False)
    say("starting a local control plane (etcd, kube-apiserver, controller manager, scheduler)")
    control_plane = localenv.start_control_plane(WORKDIR / "testenv", kubeconfig=WORKDIR / "kubeconfig")
    try:
        say("starting Prometheus (1 s scrapes)")
        prometheus = localenv.start_prometheus(WORKDIR / "prometheus")
    except BaseException:
        control_plane.stop()
        raise
    return World(control_plane.kubeconfig, prometheus.url, prometheus.targets_file.parent, own_cluster=True,
                 started=[control_plane, prometheus])


def kubectl(world: World, *args: str, stdin: str | None = None) -> None:
    env = dict(os.environ, KUBECONFIG=str(world.kubeconfig), KUBERC="off")
    result = subprocess.run([str(localenv.KUBECTL), *args], env=env, input=stdin, capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")


class Cluster:
    """The API calls the demo makes, through the Python client."""

    def __init__(self, world: World) -> None:
        self.api = kubernetes.config.new_client_from_config(config_file=str(world.kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.apps = kubernetes.client.AppsV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.extensions = kubernetes.client.ApiextensionsV1Api(self.api)

    def crd_established(self) -> bool:
        conditions = self.extensions.read_custom_resource_definition(CRD_NAME).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    def fresh_namespace(self) -> None:
        """Delete the previous run's namespace (waiting until it is gone), then create it anew."""
        try:
            self.core.delete_namespace(NAMESPACE)
            say(f"deleting namespace {NAMESPACE} of a previous run")
        except ApiException as exc:
            if exc.status != 404:
                raise
        localenv.wait_until(lambda: not self._exists(), 180, f"namespace {NAMESPACE} to be deleted", 0.5)
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        localenv.wait_until(lambda: self.core.read_namespaced_service_account("default", NAMESPACE), 60,
                            f"the default ServiceAccount of {NAMESPACE}", 0.5)

    def _exists(self) -> bool:
        try:
            self.core.read_namespace(NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def available(self, name: str) -> int:
        return self.apps.read_namespaced_deployment_status(name, NAMESPACE).status.available_replicas or 0

    def tuning_status(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, TUNED).get("status") or {}

    def knobs(self, name: str) -> Knobs | None:
        """The knobs the Deployment's pod template asks for (vLLM's defaults for absent flags)."""
        deployment = self.api.sanitize_for_serialization(self.apps.read_namespaced_deployment(name, NAMESPACE))
        return template_knobs(deployment["spec"]["template"])

    def replicaset_knobs(self) -> dict[str, Knobs]:
        """Each ReplicaSet's knobs, by ReplicaSet name."""
        listing = self.api.sanitize_for_serialization(self.apps.list_namespaced_replica_set(NAMESPACE))
        found = {}
        for rs in listing["items"]:
            knobs = template_knobs(rs["spec"]["template"])
            if knobs is not None:
                found[rs["metadata"]["name"]] = knobs
        return found

    def revisions(self) -> dict[str, int]:
        return {name: int((self.apps.read_namespaced_deployment(name, NAMESPACE).metadata.annotations or {})
                          .get(REVISION, 0)) for name in (TUNED, STATIC)}

    def events(self) -> list[dict[str, Any]]:
        """The operator's Events and the tuned Deployment's rolling updates, oldest first."""
        found = []
        for event in self.core.list_namespaced_event(NAMESPACE).items:
            ours = event.source and event.source.component == "vllm-autotuner"
            rolling = event.involved_object.name == TUNED and event.reason == "ScalingReplicaSet"
            if ours or rolling:
                when = event.first_timestamp or event.event_time or event.metadata.creation_timestamp
                found.append({"time": when.timestamp(), "object": f"{event.involved_object.kind}/"
                              f"{event.involved_object.name}", "reason": event.reason, "message": event.message})
        return sorted(found, key=lambda e: e["time"])


def template_knobs(template: dict[str, Any]) -> Knobs | None:
    """The knobs a pod template's vLLM container runs with on the demo's H100s."""
    try:
        args = EngineArgs.from_container(find_vllm_container(template["spec"]))
    except CommandLineError:
        return None
    return args.effective(default_knobs(get_profile(plan.PROFILE)))[0]


def create_objects(world: World, cluster: Cluster) -> None:
    say("installing the VllmTuning CRD")
    kubectl(world, "apply", "--server-side", "-f", str(CRD_FILE))
    localenv.wait_until(cluster.crd_established, 60, f"CRD {CRD_NAME} to be Established", 0.5)
    cluster.fresh_namespace()
    objects = [plan.huggingface_secret(), *(plan.vllm_deployment(name) for name in (TUNED, STATIC))]
    kubectl(world, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))
    say(f"created {TUNED} and {STATIC} ({plan.REPLICAS} replicas each, vLLM's default knobs); waiting for "
        "their pods to start")
    started = shown = time.monotonic()

    def ready() -> bool:
        nonlocal shown
        counts = {name: cluster.available(name) for name in (TUNED, STATIC)}
        if time.monotonic() - shown >= 10:
            shown = time.monotonic()
            print(f"    {shown - started:3.0f}s: " + ", ".join(
                f"{name} {n}/{plan.REPLICAS} available" for name, n in counts.items()), flush=True)
        return all(n == plan.REPLICAS for n in counts.values())

    localenv.wait_until(ready, READY_TIMEOUT_S, f"both Deployments to be available (the fleet's log: "
                        f"{WORKDIR / 'fleet' / 'fleet.log'})", 0.5)


# --- the day -------------------------------------------------------------------------------------


@dataclass
class Traffic:
    """The two senders and the live view, run in one event loop until the day ends or is interrupted."""

    day: DemoDay
    cluster: Cluster
    prometheus: PrometheusClient
    view: LiveView
    seed: int
    loads: dict[str, Load] = field(default_factory=dict)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each sender's summary when the day ended or was interrupted."""
    interrupted: bool = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        interrupts = 0

        def interrupt() -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:
                print("\n==> interrupted: ending the day here; Ctrl-C again to skip the report", flush=True)
                self.interrupted = True
                stop.set()
            else:
                raise KeyboardInterrupt

        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            await asyncio.sleep(max(0.0, self.day.start - time.time()))
            scenario = self.day.scenario()
            senders = [asyncio.ensure_future(self._send(name, scenario)) for name in (TUNED, STATIC)]
            sending = asyncio.gather(*senders)
            watcher = asyncio.ensure_future(self._watch())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([stopped, sending], return_when=asyncio.FIRST_COMPLETED)
            # Before cancelling: requests still open when the day was interrupted are neither answered nor failed.
            self.summaries = {name: load.stats.summary(load.elapsed or time.time() - self.day.start)
                              for name, load in self.loads.items()}
            for task in (*senders, watcher, stopped):
                task.cancel()
            outcome, *_ = await asyncio.gather(sending, watcher, stopped, return_exceptions=True)
            if isinstance(outcome, Exception):  # a sender failed (cancellation is no Exception)
                raise outcome
            for line in self.view.new_decisions(await asyncio.to_thread(self.cluster.tuning_status)):
                print(line, flush=True)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    async def _send(self, name: str, scenario: Scenario) -> None:
        load = self.loads[name] = Load(self.cluster.api, NAMESPACE, name)
        await load.run(scenario, start_s=0.0, duration=self.day.duration, max_requests=10_000_000,
                       max_in_flight=2_000, drain=DRAIN_S, progress=math.inf, seed=self.seed, wait=30.0)

    async def _watch(self) -> None:
        """Decisions as they appear; a status line at every simulated hour."""
        next_hour = self.day.start
        while True:
            try:
                status = await asyncio.to_thread(self.cluster.tuning_status)
                for line in self.view.new_decisions(status):
                    print(line, flush=True)
                if time.time() >= next_hour:
                    print(await asyncio.to_thread(self._hour_line, time.time()), flush=True)
                    next_hour += self.day.hour
            except (ApiException, PrometheusError, OSError) as exc:
                print(f"    (live view: {exc}; retrying)", flush=True)
            await asyncio.sleep(POLL_S)

    def _hour_line(self, now: float) -> str:
        window = max(self.day.hour, 2.0)
        latency = {name: Latency(*(report.quantile(self._histogram(kind, name, window, now))
                                   for kind in ("ttft_buckets", "itl_buckets")))
                   for name in (TUNED, STATIC)}
        knobs = {name: self.cluster.knobs(name) for name in (TUNED, STATIC)}
        return self.view.hour_line(now, knobs, latency, report.slo_at(self.day.spec(), now))

    def _histogram(self, kind: str, name: str, window: float, at: float) -> report.Histogram:
        rows = self.prometheus.query(report.promql(kind, name, window), at)
        return {float(row.labels["le"]): row.value for row in rows if not math.isnan(row.value)}


# --- main ----------------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace, duration: float, world: World, command: str) -> int:
    cluster = Cluster(world)
    create_objects(world, cluster)
    world.operator = localenv.start_operator(WORKDIR / "operator", world.kubeconfig, world.prometheus_url,
                                             NAMESPACE)
    say(f"operator running (log: {world.operator.log})")
    day = DemoDay.plan(time.time() + 2.0, duration)
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, day.tuning())
    say(f"VllmTuning {TUNED} created: Adaptive, TTFT p95 <= {plan.CHAT_SLO['ttft']['seconds']:g}s and ITL p95 <= "
        f"{plan.CHAT_SLO['itl']['seconds'] * 1000:g}ms; nightly window {day.clock(day.window[0])}-"
        f"{day.clock(day.window[1])} (cron '{day.tuning()['spec']['schedules'][0]['start']}' to "
        f"'{day.tuning()['spec']['schedules'][0]['end']}' UTC)")
    say(f"the day starts: 24 simulated hours in {duration:g}s (one hour = {day.hour:g}s), the same requests to both "
        "Deployments")
    prometheus = PrometheusClient(Connection(url=world.prometheus_url, timeout_seconds=30))
    view = LiveView(day)
    print(view.header(day.spec().slo), flush=True)
    traffic = Traffic(day, cluster, prometheus, view, args.seed)
    asyncio.run(traffic.run())
    end = min(time.time(), day.end)
    facts = report.RunFacts(decisions=view.decisions, events=cluster.events(), revisions=cluster.revisions(),
                            interrupted=traffic.interrupted, load=traffic.summaries)
    say("the day is over: stopping the operator, then writing the report from Prometheus")
    _stop(world.operator)
    world.operator = None
    step = report.step_seconds(day)
    if end - day.start < step:
        say("the day ended before its first half hour: nothing to report")
        return 130
    localenv.wait_until(lambda: all(report.scraped_until(prometheus, name, time.time()) >= end
                                    for name in (TUNED, STATIC)), 30, "Prometheus to scrape the day's last samples")
    measured = {name: report.fetch(prometheus, name, day.start, end, step) for name in (TUNED, STATIC)}
    replicasets = cluster.replicaset_knobs()
    pods = {pod: replicasets[pod.rsplit("-", 1)[0]] for m in measured.values() for pod in m.pod_requests
            if pod.rsplit("-", 1)[0] in replicasets}
    built = report.build(day, end, measured, pods, facts)
    path = report.write(built, args.report_dir or DEFAULT_REPORT_DIR, command)
    say(f"report: {path}")
    print(f"\nSLO goodput, tuned / static: {built.ratio:.2f}x ({built.whole.goodput[TUNED]:,.0f} vs "
          f"{built.whole.goodput[STATIC]:,.0f} tokens/s within TTFT p95 <= {plan.CHAT_SLO['ttft']['seconds']:g}s and "
          f"ITL p95 <= {plan.CHAT_SLO['itl']['seconds'] * 1000:g}ms)", flush=True)
    return 0


def _stop(server: localenv.Server | None) -> None:
    if server is not None and server.alive():
        server.stop()


def shutdown(world: World) -> None:
    """Stop what the demo started, last first; take its nodes and scrape targets out of a cluster it borrowed."""
    say("shutting down what the demo started")
    _stop(world.operator)
    _stop(world.fleet)
    if world.fleet is not None and not world.own_cluster:
        with contextlib.suppress(Exception):
            core = Cluster(world).core
            for node in world.fleet.nodes:
                with contextlib.suppress(ApiException):
                    core.delete_node(node)
        world.fleet_targets.unlink(missing_ok=True)
    for server in reversed(world.started):
        _stop(server)


def main(args: argparse.Namespace) -> int:
    try:
        duration = float(args.duration) if args.duration.replace(".", "", 1).isdigit() \
            else duration_seconds(args.duration)
        DemoDay.plan(time.time(), duration)
    except ValueError as exc:
        print(f"sim demo: --duration {args.duration}: {exc}", file=sys.stderr)
        return 2
    command = f"make demo DURATION={args.duration}" if os.environ.get("MAKELEVEL") else \
        "vllm-autotuner sim demo " + " ".join(sys.argv[3:])
    WORKDIR.mkdir(parents=True, exist_ok=True)
    world: World | None = None
    try:
        world = servers(args)
        say(f"starting {plan.FLEET_NODES} simulated H100 nodes (vLLM start-ups at {plan.FLEET_TIME_SCALE:g}x real "
            "time)")
        world.fleet = localenv.start_fleet(WORKDIR / "fleet", world.kubeconfig, world.fleet_targets,
                                           pools=(f"{plan.PROFILE}:{plan.FLEET_NODES}",),
                                           time_scale=plan.FLEET_TIME_SCALE, name_prefix=plan.FLEET_PREFIX)
        return run_demo(args, duration, world, command)
    except KeyboardInterrupt:
        print("\nsim demo: interrupted; no report written", file=sys.stderr)
        return 130
    except (localenv.StartError, TimeoutError, RuntimeError, ApiException, PrometheusError) as exc:
        print(f"sim demo: {exc}\nThe servers' logs are under {WORKDIR}; `make demo` again starts afresh.",
              file=sys.stderr)
        return 1
    finally:
        if world is not None:
            shutdown(world)

