"""One pod on a simulated GPU node, from binding to deletion: the kubelet's job.

A :class:`PodRunner` gives the pod an address, runs its vLLM container
attempt after attempt, and writes what a kubelet would write. Each attempt
asks :func:`~vllm_autotuner.sim.startup.check_startup` how this command line
starts on the node's GPU profile, lays the result over the container's
probes (:func:`~vllm_autotuner.sim.kubelet.plan_attempt`) and plays that
timeline in wall-clock time: the container runs, is ``started``, begins to
serve (the engine and its HTTP server come up on the pod's address), turns
Ready; or it exits (vLLM's error, or a probe the kubelet gave up on) and
waits out the crash back-off before the next attempt.

The pod's address is a loopback address of its own (``127.X.Y.Z``, the
``podIP``) and vLLM's ``--port``: a client reaches a pod as it would in a
cluster, at ``podIP:port``. The socket is bound when the pod starts and
listens only once vLLM serves, so until then connections are refused, like
a starting vLLM's; Prometheus lists the target from the start and sees it
down meanwhile, as it would with Kubernetes service discovery. (A Service
cannot select such pods: EndpointSlices refuse loopback addresses.)

A deleted pod stops as a kubelet stops it: the vLLM container's preStop
hook sleeps first (a sleep is the hook people give vLLM: the time endpoints
take to stop sending it requests), then SIGTERM; a vLLM started with
``--shutdown-timeout`` refuses new requests and lets those in flight finish
for up to that long, one without aborts them; whatever is left at the end of
the grace period is killed. The sleep is scaled like the probes (a fixed
wait); the drain and the grace period are not: they wait for requests, which
run in wall-clock time.

``torch.compile`` caches are per node: an attempt that got past compiling a
token budget makes the next start of that budget on that node warm (a cache
on a host path, as production deployments mount one).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from aiohttp import web
from kubernetes.client.exceptions import ApiException

from vllm_autotuner.knobs import WATCHER_KILL_SECONDS, CommandLineError, Sigterm, find_vllm_container
from vllm_autotuner.rollout.drain import pre_stop_sleep, sigterm_fate
from vllm_autotuner.sim.engine import Engine
from vllm_autotuner.sim.kubelet import (
    ContainerStatus,
    PodStatus,
    crash_backoff,
    grace_period,
    plan_attempt,
    rfc3339,
    termination_message,
)
from vllm_autotuner.sim.podlaunch import LaunchError, VllmLaunch, serving_port, vllm_launch
from vllm_autotuner.sim.profiles import Profile
from vllm_autotuner.sim.serving import ServedEngine, app_runner
from vllm_autotuner.sim.startup import check_startup

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 0.5
"""How long the HTTP server waits for open responses when its pod goes."""
DRAIN_POLL_S = 0.05
"""How often a draining vLLM is looked at for requests still in flight (the serving tick)."""


@dataclass
class SimNode:
    """A node the fleet registered, as its pods need it."""

    name: str
    profile: Profile
    host_ip: str
    compiled: set[int] = field(default_factory=set)
    """Token budgets ``torch.compile`` has cached on this node."""


class AddressPool:
    """Loopback addresses for pods: ``127.<octet>.Y.Z``, never handed out twice.

    A fresh address per pod means no socket ever meets a previous pod's
    connections in TIME_WAIT; one that another process holds (a second fleet
    on the machine) is skipped, because binding it fails.
    """

    def __init__(self, octet: int) -> None:
        self._octet = octet
        self._next = 256  # 127.octet.0.* is for the nodes' host addresses

    def host_address(self, index: int) -> str:
        return f"127.{self._octet}.0.{index + 1}"

    def take(self, port: int | None) -> tuple[str, socket.socket | None]:
        """A new address, and with ``port`` a TCP socket bound to it, not yet listening."""
        while self._next < 65536:
            index = self._next
            self._next += 1
            if index % 256 in (0, 255):  # no .0 or .255: they read like network and broadcast addresses
                continue
            address = f"127.{self._octet}.{index // 256}.{index % 256}"
            if port is None:
                return address, None
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((address, port))
            except OSError:
                sock.close()
                continue
            return address, sock
        raise RuntimeError(f"no loopback addresses left in 127.{self._octet}.0.0/16; restart the fleet")


class FleetContext:
    """What the pod runners share: the API, the nodes, addresses, targets and the tick."""

    def __init__(self, *, call: Callable[..., Awaitable[Any]], core: Any, nodes: dict[str, SimNode],
                 addresses: AddressPool, set_target: Callable[[dict[str, Any], str, str], None],
                 drop_target: Callable[[str], None], time_scale: float, seed: int) -> None:
        self.call = call
        """Runs a blocking API function in a worker thread, with retries."""
        self.core = core
        self.nodes = nodes
        self.addresses = addresses
        self.set_target = set_target
        """(pod, address:port, container name)"""
        self.drop_target = drop_target
        """(pod uid)"""
        self.time_scale = time_scale
        self.seed = seed
        self.engines: set[ServedEngine] = set()
        """The serving engines, which the fleet advances every tick."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, holding on to it (the loop does not)
        and logging its failure."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed", what, exc_info=t.exception())

        task.add_done_callback(done)
        return task


class PodRunner:
    """The kubelet's work for one pod."""

    def __init__(self, ctx: FleetContext, pod: dict[str, Any]) -> None:
        self.ctx = ctx
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.node = ctx.nodes[pod["spec"]["nodeName"]]
        self.task: asyncio.Task[None] | None = None
        self.terminating = False
        self._sock: socket.socket | None = None
        self._server: web.AppRunner | None = None
        self._served: ServedEngine | None = None
        self._sigterm: Sigterm | None = Sigterm.REACHES  # what a SIGTERM does to the vLLM it runs (``VllmLaunch``)
        self.status: PodStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def seen(self, pod: dict[str, Any]) -> None:
        """The latest version of the pod object (others' conditions, deletion).

        A Ready condition that is not the one this kubelet wrote (the node
        lifecycle controller marks the pods of a node it lost touch with not
        Ready) is put right, as the kubelet's status manager does.
        """
        self.pod = pod
        if self.status is None:
            return
        conditions = (pod.get("status") or {}).get("conditions") or []
        self.status.others = conditions
        ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
        ours = str(all(c.ready for c in self.status.containers))
        if ready not in (None, ours) and not self.terminating:
            self.ctx.spawn(self._write_status(), f"status of {self.key}")

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Start the containers and keep the vLLM one going until cancelled."""
        spec = self.pod["spec"]
        try:
            vllm = find_vllm_container(spec)
        except CommandLineError as exc:
            log.info("%s: no vLLM container to simulate (%s); its containers just run", self.key, exc)
            vllm = None
        launch: VllmLaunch | LaunchError | None = None
        if vllm is not None:
            try:
                launch = vllm_launch(vllm, self.node.profile)
            except LaunchError as exc:
                launch = exc
        port = None if vllm is None else launch.port if isinstance(launch, VllmLaunch) else serving_port(vllm)
        address, self._sock = self.ctx.addresses.take(port)
        now = _now()
        previous = {c["name"]: c for c in (self.pod.get("status") or {}).get("containerStatuses") or []}
        containers = []
        for container in spec["containers"]:
            status = ContainerStatus(container["name"], container.get("image", ""))
            if container["name"] in previous:  # the fleet restarted: the container restarts too
                status.restart_count = previous[container["name"]].get("restartCount", 0) + 1
            if container is not vllm:
                status.run(_container_id(), now)
                status.started = status.ready = True
            containers.append(status)
        status = self.pod.get("status") or {}
        self.status = PodStatus(self.node.host_ip, address, _parse_time(status.get("startTime")) or now,
                                containers, others=status.get("conditions") or [])
        if vllm is None:
            await self._write_status()
            await asyncio.Event().wait()  # runs until the pod goes
        # Listed from the start, as Kubernetes service discovery lists a pod: down until vLLM serves.
        self.ctx.set_target(self.pod, f"{address}:{port}", vllm["name"])
        await self._run_vllm(vllm, next(c for c in containers if c.name == vllm["name"]), launch)

    async def _run_vllm(self, spec: dict[str, Any], container: ContainerStatus,
                        launch: VllmLaunch | LaunchError | None) -> None:
        profile, scale, loop = self.node.profile, self.ctx.time_scale, asyncio.get_running_loop()
        failures, first = 0, True
        while True:
            if not first:
                container.restart_count += 1
            first = False
            began = loop.time()
            container.run(_container_id(), _now())
            if isinstance(launch, LaunchError):
                serves, exits, code, error = None, profile.startup.process_s * scale, launch.exit_code, str(launch)
                compiled_after, tokens = None, None
            else:
                assert launch is not None
                tokens_cached = self._resolved_tokens(launch) in self.node.compiled
                outcome = check_startup(profile, launch.config, compile_cached=tokens_cached, time_scale=scale)
                serves = outcome.seconds if outcome.ok else None
                exits, code, error = (None, 0, "") if outcome.ok else (outcome.seconds, 1, outcome.error or "")
                times = profile.startup
                compile_s = times.compile_warm_s if tokens_cached else times.compile_cold_s
                compiled_after = None if outcome.memory is None else (times.process_s + times.load_s + compile_s) * scale
                tokens = outcome.config.max_num_batched_tokens
            plan = plan_attempt(spec, serves, exits, code, scale)
            await self._write_status()
            self._event("Normal", "Started", f"Started container {container.name}", container.name)
            milestones = [(plan.started_after, 0, "started"), (plan.serving_after, 1, "serving"),
                          (plan.ready_after, 2, "ready"), (plan.exit_after, 3, "exit")]
            for at, _, what in sorted(m for m in milestones if m[0] is not None):
                await asyncio.sleep(max(0.0, began + at - loop.time()))
                if what == "started":
                    container.started = True
                    await self._write_status()
                elif what == "serving":
                    assert isinstance(launch, VllmLaunch) and tokens is not None
                    self.node.compiled.add(tokens)
                    await self._serve(launch)
                elif what == "ready":
                    container.ready = True
                    log.info("%s: Ready after %.1fs", self.key, loop.time() - began)
                    await self._write_status()
            if plan.exit_after is None:
                await asyncio.Event().wait()  # serves until the pod goes
            if tokens is not None and compiled_after is not None and plan.exit_after >= compiled_after:
                self.node.compiled.add(tokens)
            ran = loop.time() - began
            failures = 1 if ran >= 600 * scale else failures + 1  # kubelet resets back-off after 10 min
            if plan.killed_by:
                probe = f"{plan.killed_by.capitalize()} probe"
                self._event("Warning", "Unhealthy", f"{probe} failed: connection refused", container.name)
                self._event("Normal", "Killing",
                            f"Container {container.name} failed {plan.killed_by} probe, will be restarted",
                            container.name)
                message = ""
            else:
                message = termination_message(spec, error)
            why = f"{plan.killed_by} probe" if plan.killed_by else (error.splitlines() or [""])[-1]
            log.info("%s: container exited with %d after %.1fs (%s)", self.key, plan.exit_code, ran, why)
            terminated = container.exit(plan.exit_code, message, _now())
            await self._write_status()
            delay = crash_backoff(failures, scale)
            container.back_off(terminated, delay, self.name)
            await self._write_status()
            self._event("Warning", "BackOff", f"Back-off restarting failed container {container.name} in pod "
                                              f"{self.name}_{self.namespace}({self.uid})", container.name)
            await asyncio.sleep(delay)

    def _resolved_tokens(self, launch: VllmLaunch) -> int:
        return launch.config.resolve(self.node.profile).max_num_batched_tokens

    async def _serve(self, launch: VllmLaunch) -> None:
        seed = zlib.crc32(f"{self.ctx.seed}/{self.key}".encode())
        engine = Engine(self.node.profile, launch.config, seed=seed)
        self._sigterm = launch.sigterm
        self._served = ServedEngine(engine, launch.served_model_name, limits=launch.limits,
                                    sleep_mode=launch.sleep_mode, adapters=launch.lora_modules,
                                    shutdown_timeout=launch.shutdown_timeout)
        self._server = app_runner(self._served, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._server.setup()
        assert self._sock is not None
        await web.SockSite(self._server, self._sock, shutdown_timeout=SHUTDOWN_TIMEOUT_S).start()
        self.ctx.engines.add(self._served)

    async def stop(self) -> None:
        """The containers stop (the pod is going, or the fleet is): no more
        serving, no more attempts. Writes nothing to the API."""
        task, served, server, sock = self.task, self._served, self._server, self._sock
        self.task = self._served = self._server = self._sock = None  # a second stop() finds nothing to do
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if served is not None:
            self.ctx.engines.discard(served)
            served.abort_all()
        if server is not None:
            await server.cleanup()  # closes the socket too
        elif sock is not None:
            sock.close()

    async def terminate(self) -> None:
        """The pod was deleted: stop its containers as the kubelet and vLLM do (:meth:`_drain`), report them
        terminated, and remove the pod object as the kubelet does once they have exited."""
        self.terminating = True
        await self._drain()
        await self.stop()
        self.ctx.drop_target(self.uid)
        if self.status is not None:
            now = _now()
            for container in self.status.containers:
                if "running" in container.state:
                    self._event("Normal", "Killing", f"Stopping container {container.name}", container.name)
                    container.exit(0, "", now)
            await self._write_status()
        try:
            # In the body: with a body, the apiserver ignores the query's gracePeriodSeconds.
            await self.ctx.call(self.ctx.core.delete_namespaced_pod, self.name, self.namespace,
                                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except Exception as exc:  # noqa: BLE001 - gone already, or another uid: nothing left to do
            log.warning("%s: final delete: %s", self.key, exc)
        log.info("%s: terminated", self.key)

    async def _drain(self) -> None:
        """From the deletion to SIGKILL: the vLLM container's preStop sleep (scaled; another hook is not run), then
        SIGTERM, after which a vLLM with ``--shutdown-timeout`` serves what is in flight until it is done or the
        timeout passes (one without stops at once); all within the pod's grace period. A vLLM the SIGTERM does not
        reach (its shell's child) serves on, new requests too, until the SIGKILL at the end of the grace period; one
        killed with its shell (behind an init, or in a pod that shares its process namespace) stops at once, and one
        under runuser or su after ``WATCHER_KILL_SECONDS`` at most."""
        loop = asyncio.get_running_loop()
        kill_at = loop.time() + grace_period(self.pod)
        try:
            pause = (pre_stop_sleep(find_vllm_container(self.pod["spec"])) or 0.0) * self.ctx.time_scale
        except CommandLineError:
            pause = 0.0
        if pause > 0:
            await asyncio.sleep(min(pause, kill_at - loop.time()))
        served = self._served
        fate = sigterm_fate(self.pod["spec"], self._sigterm)
        if served is not None and fate is Sigterm.IGNORED:
            log.info("%s: the container's first process (a shell, conda run or hatch run) ignores the SIGTERM: vLLM "
                     "serves on until the SIGKILL", self.key)
            await asyncio.sleep(max(kill_at - loop.time(), 0.0))
            return
        if served is None or served.shutdown_timeout <= 0 or fate is Sigterm.KILLS:
            return
        served.shutting_down = True
        drain = min(served.shutdown_timeout, WATCHER_KILL_SECONDS if fate is Sigterm.CUT_SHORT else math.inf)
        end = min(kill_at, loop.time() + drain)
        log.info("%s: draining %d requests in flight for %g s (--shutdown-timeout %g)", self.key, served.in_flight,
                 drain, served.shutdown_timeout)
        while served.in_flight and loop.time() < end:
            await asyncio.sleep(DRAIN_POLL_S)

    # ------------------------------------------------------------ API writes

    async def _write_status(self) -> None:
        assert self.status is not None
        body = {"status": self.status.render(_now())}
        try:
            await self.ctx.call(self.ctx.core.patch_namespaced_pod_status, self.name, self.namespace, body,
                                _content_type="application/merge-patch+json")
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; the next change writes all again
            log.warning("%s: status update failed: %s", self.key, exc)

    def _event(self, kind: str, reason: str, message: str, container: str) -> None:
        """Record an Event about a container of the pod as the kubelet does (fire and forget)."""
        now = rfc3339(_now())
        body = {
            "metadata": {"name": f"{self.name}.{uuid.uuid4().hex[:16]}", "namespace": self.namespace},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": self.namespace, "name": self.name,
                               "uid": self.uid, "fieldPath": f"spec.containers{{{container}}}"},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "kubelet", "host": self.node.name},
            "reportingComponent": "kubelet", "reportingInstance": self.node.name,
        }
        self.ctx.spawn(self._record_event(body), f"event {reason} of {self.key}")

    async def _record_event(self, body: dict[str, Any]) -> None:
        try:
            await self.ctx.call(self.ctx.core.create_namespaced_event, self.namespace, body)
        except ApiException as exc:  # e.g. the namespace is being deleted: the kubelet drops such events too
            log.debug("%s: event not recorded: %s %s", self.key, exc.status, exc.reason)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _parse_time(text: str | None) -> datetime | None:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) if text else None


def _container_id() -> str:
    return f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
