"""``vllm-autotuner sim fleet``: simulated GPU nodes and their kubelet.

The local control plane has no kubelets and no GPUs. This process registers
GPU Nodes (``nvidia.com/gpu`` capacity and the labels NVIDIA's GPU Feature
Discovery puts on real ones) and does the kubelet's work for them, so that
Deployments of vLLM schedule, start, crash-loop and roll exactly where and
as they would on a real GPU pool:

* **Nodes stay Ready** the way a kubelet keeps them Ready: a Lease in
  ``kube-node-lease`` renewed every 10 s (a quarter of its 40 s duration)
  and the node status re-posted every 5 minutes, the kubelet's defaults, so
  the real node-lifecycle controller never taints or evicts them.
* **Pods bound to its nodes** are run by :class:`~.podrunner.PodRunner`:
  the vLLM container's command line is read as vLLM reads it, the start-up
  is simulated for the node's GPU profile, and the pod becomes Ready after
  the simulated start-up, or crash-loops with vLLM's error. Each running
  engine serves vLLM's HTTP API and ``/metrics`` at ``podIP:port`` (a
  loopback address per pod), and is advanced to the wall clock every tick.
* **Prometheus finds the pods** through a file-SD targets file (rewritten
  atomically on every change) whose labels are those Kubernetes service
  discovery would give, relabelled by the configuration
  :mod:`~.localenv` generates into ``namespace``, ``pod``, ``container`` and
  the pod's labels.

Stopping (SIGTERM or SIGINT): like a machine that goes away, the fleet stops
serving and reports its nodes NotReady (``KubeletNotReady``) once, then
exits. Nodes and pods stay in the API, as in a cluster whose GPU nodes went
down: the node-lifecycle controller marks the pods not Ready and, after the
usual five minutes, evicts them. Started again with the same names, the
fleet re-registers the nodes and restarts the pods it finds on them.

Everything runs in one asyncio loop; the blocking Kubernetes client runs in
worker threads (one more for the pod watch). CPU use is a few percent of a
core when idle.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import random
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from vllm_autotuner.sim.kubelet import rfc3339
from vllm_autotuner.sim.localenv import file_sd_target, wait_until, write_targets
from vllm_autotuner.sim.podlaunch import GPU_RESOURCE
from vllm_autotuner.sim.podrunner import AddressPool, FleetContext, PodRunner, SimNode
from vllm_autotuner.sim.profiles import Profile, get_profile

log = logging.getLogger(__name__)

PROFILE_LABEL = "sim.vllm-autotuner.io/profile"
FLEET_LABEL = "sim.vllm-autotuner.io/fleet"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
LEASE_RENEW_S = LEASE_DURATION_S / 4
STATUS_REPORT_S = 300
HEARTBEAT_THREADS = 8
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
CPU_PER_GPU, MEMORY_GIB_PER_GPU = 24, 240
"""Host resources per GPU, as cloud GPU machines have (an 8x H100 machine: ~200 vCPUs, ~2 TiB)."""
WATCH_TIMEOUT_S = 300
DEFAULT_POOL = "llama3-8b-h100:4"
MiB = 1024**2
API_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class Pool:
    """Identical nodes: ``count`` nodes of ``gpus_per_node`` GPUs of one profile."""

    profile: Profile
    count: int
    gpus_per_node: int

    @classmethod
    def parse(cls, text: str) -> Pool:
        """``PROFILE[:NODES[:GPUS_PER_NODE]]``; GPUs per node default to the
        profile's tensor-parallel size (one replica per node)."""
        name, *rest = text.split(":")
        try:
            profile = get_profile(name)
        except KeyError as exc:
            raise argparse.ArgumentTypeError(str(exc.args[0])) from None
        try:
            numbers = [int(n) for n in rest]
        except ValueError:
            numbers = []
        if len(rest) > 2 or len(numbers) != len(rest) or any(n < 1 for n in numbers):
            raise argparse.ArgumentTypeError(f"{text!r}: write PROFILE[:NODES[:GPUS_PER_NODE]], e.g. "
                                             "llama3-8b-h100:2 or llama3-70b-h100-tp4:1:8")
        count = numbers[0] if numbers else 1
        gpus = numbers[1] if len(numbers) > 1 else profile.tp
        return cls(profile, count, gpus)


def node_names(prefix: str, pools: list[Pool]) -> list[tuple[str, Pool]]:
    """Node names, ``PREFIX-PROFILE-I``, with the pool of each."""
    return [(f"{prefix}-{pool.profile.name}-{i}", pool) for pool in pools for i in range(pool.count)]


def node_labels(name: str, pool: Pool, fleet: str) -> dict[str, str]:
    """A GPU node's labels: the well-known ones and GPU Feature Discovery's."""
    gpu = pool.profile.gpu
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        GFD_PRODUCT: gpu.name.replace(" ", "-"),
        GFD_MEMORY: str(round(gpu.memory_bytes / MiB)),
        GFD_COUNT: str(pool.gpus_per_node),
        PROFILE_LABEL: pool.profile.name,
        FLEET_LABEL: fleet,
    }


def node_status(name: str, pool: Pool, host_ip: str, kubelet_version: str, ready: tuple[bool, datetime],
                now: datetime) -> dict[str, Any]:
    """The status a kubelet posts: resources, conditions with this heartbeat,
    addresses and node info. ``ready`` is (Ready, since when)."""
    gpus = pool.gpus_per_node
    resources = {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_GIB_PER_GPU * gpus}Gi", "pods": "110",
                 "ephemeral-storage": "1000Gi", GPU_RESOURCE: str(gpus)}
    is_ready, since = ready
    heartbeat, since_text = rfc3339(now), rfc3339(since)

    def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": str(status), "reason": reason, "message": message,
                "lastHeartbeatTime": heartbeat, "lastTransitionTime": since_text}

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", is_ready, "KubeletReady" if is_ready else "KubeletNotReady",
                      "kubelet is posting ready status" if is_ready else
                      "the simulated GPU fleet stopped; run `vllm-autotuner sim fleet` again to bring it back"),
        ],
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": f"simulated {pool.profile.gpu.name} node (vllm-autotuner sim fleet)",
            "containerRuntimeVersion": "sim://vllm-autotuner", "kubeletVersion": kubelet_version,
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }


def lease(name: str, node_uid: str, now: datetime) -> dict[str, Any]:
    """A node's Lease as the kubelet keeps it (owned by the Node, so it goes with it)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": micro_time(now)},
    }


def micro_time(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def scrape_target(pod: dict[str, Any], address: str, container: str) -> dict[str, Any]:
    """The targets-file entry of a pod's vLLM at ``address``."""
    meta = pod["metadata"]
    return file_sd_target(address, meta["namespace"], meta["name"], meta.get("labels") or {}, container=container)


async def api_call(fn: Callable[..., Any], *args: Any, executor: Executor | None = None, **kwargs: Any) -> Any:
    """Run a blocking Kubernetes client call in a worker thread (of ``executor``;
    default: the loop's), retrying what may pass (throttling, server errors, a
    refused connection)."""
    loop = asyncio.get_running_loop()
    for attempt in range(API_ATTEMPTS):
        try:
            return await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))
        except ApiException as exc:
            if exc.status not in (429, 500, 502, 503, 504) or attempt == API_ATTEMPTS - 1:
                raise
        except (OSError, urllib3.exceptions.HTTPError):  # connection refused or reset
            if attempt == API_ATTEMPTS - 1:
                raise
        await asyncio.sleep(0.25 * 2**attempt)
    raise AssertionError("unreachable")


class SimulatedFleet:
    """The nodes, their pods and the targets file, in one asyncio loop."""

    def __init__(self, api: kubernetes.client.ApiClient, pools: list[Pool], *, targets_file: Path,
                 prefix: str = "sim", time_scale: float = 1.0, tick: float = 0.05, seed: int = 0,
                 runner: type[PodRunner] = PodRunner) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.coordination = kubernetes.client.CoordinationV1Api(api)
        self.version = kubernetes.client.VersionApi(api)
        self.prefix = prefix
        self.targets_file = targets_file
        self.tick = tick
        self.addresses = AddressPool(random.randrange(64, 255))
        self.pools = node_names(prefix, pools)
        self.nodes = {name: SimNode(name, pool.profile, self.addresses.host_address(i))
                      for i, (name, pool) in enumerate(self.pools)}
        self._targets: dict[str, dict[str, Any]] = {}
        self.ctx = FleetContext(call=api_call, core=self.core, nodes=self.nodes, addresses=self.addresses,
                                set_target=self._set_target, drop_target=self._drop_target,
                                time_scale=time_scale, seed=seed)
        self.runner = runner
        """What runs a pod (the scale benchmark swaps in one without an engine)."""
        self.runners: dict[str, PodRunner] = {}
        self._node_uids: dict[str, str] = {}
        self._ready_since: dict[str, datetime] = {}
        self._kubelet_version = ""
        # Heartbeats have threads of their own: queued behind the status writes of a thousand starting
        # pods in the loop's pool, they came too late and the node lifecycle controller took the nodes
        # (and so their pods) for dead.
        self._heartbeat_threads = ThreadPoolExecutor(HEARTBEAT_THREADS, thread_name_prefix="heartbeats")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------ main loop

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], None] = lambda: None) -> None:
        """Register the nodes, run until ``stop`` is set, then go NotReady."""
        self._loop = asyncio.get_running_loop()
        self._kubelet_version = (await api_call(self.version.get_code)).git_version
        write_targets(self.targets_file, [])
        for name, pool in self.pools:
            await self._register(name, pool)
        background = [asyncio.ensure_future(c) for c in (self._heartbeats(), self._ticks())]
        watcher = threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True)
        watcher.start()
        await asyncio.to_thread(wait_until, self._untainted, 120, "the node lifecycle controller to lift the "
                                "not-ready taint of the fleet's nodes (is kube-controller-manager running?)", 0.5)
        log.info("nodes Ready: %s", ", ".join(self.nodes))
        on_ready()
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
        self._stopping.set()
        for task in [stopped, *background]:
            task.cancel()
        await asyncio.gather(*(runner.stop() for runner in list(self.runners.values())), return_exceptions=True)
        now = datetime.now(timezone.utc)
        for name, pool in self.pools:
            try:
                await api_call(self.core.patch_node_status, name, {"status": node_status(
                    name, pool, self.nodes[name].host_ip, self._kubelet_version, (False, now), now)})
            except Exception as exc:  # noqa: BLE001 - the apiserver may be gone already; nothing more to do
                log.warning("could not report %s NotReady: %s", name, exc)
        self._heartbeat_threads.shutdown(wait=False)
        log.info("stopped; nodes reported NotReady")
        for task in background:  # a heartbeat or tick loop that died is a bug: fail loudly
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def _register(self, name: str, pool: Pool) -> None:
        """Create the Node, or take over an existing one of that name, Ready from now."""
        now = datetime.now(timezone.utc)
        self._ready_since[name] = now
        labels = node_labels(name, pool, self.prefix)
        status = node_status(name, pool, self.nodes[name].host_ip, self._kubelet_version, (True, now), now)
        try:
            node = await api_call(self.core.create_node, {"metadata": {"name": name, "labels": labels},
                                                          "status": status})
        except ApiException as exc:
            if exc.status != 409:
                raise
            node = await api_call(self.core.patch_node, name, {"metadata": {"labels": labels}})
            await api_call(self.core.patch_node_status, name, {"status": status})
        self._node_uids[name] = node.metadata.uid
        await self._renew_lease(name)
        log.info("registered node %s (%s, %d GPU)", name, pool.profile.name, pool.gpus_per_node)

    def _untainted(self) -> bool:
        for name in self.nodes:
            taints = self.core.read_node(name).spec.taints or []
            if any(t.key == TAINT_NOT_READY for t in taints):
                return False
        return True

    async def _heartbeats(self) -> None:
        """Lease renewals every 10 s; a full status report every 5 minutes. Nodes renew
        side by side, as their kubelets do: one after another, a slow API server makes
        the last node's renewal come later than its lease lasts."""
        loop = asyncio.get_running_loop()
        last_report = loop.time()
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            report = loop.time() - last_report >= STATUS_REPORT_S
            if report:
                last_report = loop.time()
            await asyncio.gather(*(self._heartbeat(name, pool, report) for name, pool in self.pools))

    async def _heartbeat(self, name: str, pool: Pool, report: bool) -> None:
        try:
            await self._renew_lease(name)
            if report:
                now = datetime.now(timezone.utc)
                await api_call(self.core.patch_node_status, name, {"status": node_status(
                    name, pool, self.nodes[name].host_ip, self._kubelet_version,
                    (True, self._ready_since[name]), now)}, executor=self._heartbeat_threads)
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat must not end the heartbeats
            log.warning("heartbeat of %s failed (will retry): %s", name, exc)

    async def _renew_lease(self, name: str) -> None:
        body = lease(name, self._node_uids[name], datetime.now(timezone.utc))
        try:
            await api_call(self.coordination.patch_namespaced_lease, name, NODE_LEASE_NAMESPACE,
                           {"spec": body["spec"]}, executor=self._heartbeat_threads)
        except ApiException as exc:
            if exc.status != 404:
                raise
            await api_call(self.coordination.create_namespaced_lease, NODE_LEASE_NAMESPACE, body,
                           executor=self._heartbeat_threads)

    async def _ticks(self) -> None:
        """Advance every serving engine to the wall clock."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            deadline = max(deadline + self.tick, loop.time())
            await asyncio.sleep(deadline - loop.time())
            for served in list(self.ctx.engines):
                served.tick()

    # ------------------------------------------------------------ pods

    def _watch_pods(self) -> None:
        """List and watch the pods bound to any node (thread); hand the events to the loop."""
        selector = "spec.nodeName!="
        while not self._stopping.is_set():
            try:
                listing = json.loads(self.core.list_pod_for_all_namespaces(
                    field_selector=selector, _preload_content=False).data)
                version = listing["metadata"]["resourceVersion"]
                self._post("SYNC", listing["items"])
                while not self._stopping.is_set():
                    response = self.core.list_pod_for_all_namespaces(
                        field_selector=selector, watch=True, resource_version=version,
                        allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S, _preload_content=False)
                    for line in iter_resp_lines(response):
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise _WatchExpired(event["object"].get("message", "watch error"))
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._post(event["type"], event["object"])
            except _WatchExpired as exc:
                log.info("pod watch restarts from a fresh list: %s", exc)
            except Exception as exc:  # noqa: BLE001 - the apiserver may be restarting; list again
                if self._stopping.is_set():
                    return
                log.warning("pod watch failed, listing again in 1s: %s", exc)
                self._stopping.wait(1)

    def _post(self, kind: str, obj: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_pod_event, kind, obj)

    def _on_pod_event(self, kind: str, obj: Any) -> None:
        if self._stopping.is_set():
            return
        if kind == "SYNC":
            present = {pod["metadata"]["uid"] for pod in obj}
            for uid in set(self.runners) - present:
                self._forget(uid)
            for pod in obj:
                self._on_pod(pod)
        elif kind == "DELETED":
            self._forget(obj["metadata"]["uid"])
        else:
            self._on_pod(obj)

    def _on_pod(self, pod: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
        if pod["metadata"].get("deletionTimestamp"):
            if runner is None:
                runner = self.runners[uid] = self.runner(self.ctx, pod)
            if not runner.terminating:
                self.ctx.spawn(runner.terminate(), f"terminate {runner.key}")
            return
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        if runner is None:
            runner = self.runners[uid] = self.runner(self.ctx, pod)
            runner.task = self.ctx.spawn(runner.run(), f"run {runner.key}")
        else:
            runner.seen(pod)

    def _forget(self, uid: str) -> None:
        runner = self.runners.pop(uid, None)
        if runner is not None:
            self._drop_target(uid)
            self.ctx.spawn(runner.stop(), f"stop {runner.key}")

    # ------------------------------------------------------------ targets

    def _set_target(self, pod: dict[str, Any], address: str, container: str) -> None:
        self._targets[pod["metadata"]["uid"]] = scrape_target(pod, address, container)
        write_targets(self.targets_file, self._targets.values())

    def _drop_target(self, uid: str) -> None:
        if self._targets.pop(uid, None) is not None:
            write_targets(self.targets_file, self._targets.values())


class _WatchExpired(Exception):
    """The watch's resource version is too old (410): list again."""


def main(args: argparse.Namespace, runner: type[PodRunner] = PodRunner) -> int:
    """Run the fleet until SIGTERM or SIGINT. Prints ``READY`` once its nodes are Ready.

    ``runner`` runs each pod (default: the simulated vLLM start-up and engine).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.kubeconfig:
        print("sim fleet: no kubeconfig: pass --kubeconfig or set KUBECONFIG (`vllm-autotuner sim up` writes "
              "one)", file=sys.stderr)
        return 2
    if args.targets_file is None:
        print("sim fleet: no targets file: pass --targets-file or set FLEET_TARGETS (Prometheus reads it)",
              file=sys.stderr)
        return 2
    if args.time_scale <= 0 or args.tick <= 0:
        print("sim fleet: --time-scale and --tick must be positive", file=sys.stderr)
        return 2
    try:
        pools = [Pool.parse(text) for text in args.pools or [DEFAULT_POOL]]
    except argparse.ArgumentTypeError as exc:
        print(f"sim fleet: --pool {exc}", file=sys.stderr)
        return 2
    api = kubernetes.config.new_client_from_config(config_file=args.kubeconfig)
    fleet = SimulatedFleet(api, pools, targets_file=args.targets_file,
                  prefix=args.name_prefix, time_scale=args.time_scale, tick=args.tick, seed=args.seed,
                  runner=runner)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await fleet.run(stop, on_ready=lambda: print("READY " + " ".join(fleet.nodes), flush=True))

    asyncio.run(run())
    return 0
