"""The benchmark's objects on the local cluster: N vLLM Deployments, each with a VllmTuning.

Every Deployment runs one vLLM pod on the stand-in fleet
(:mod:`bench.scale.fleet`), in namespaces of at most
:data:`NAMESPACE_SIZE`. Nine in ten serve chat comfortably within the SLO:
the Adaptive policy models the alternatives and holds because no change
would pay for its restart (real observations, real decisions). Every tenth
serves more chat than its small knobs can take, so requests queue and TTFT
is far over the SLO: once the regime has lasted a window, the operator
raises the knobs through a real rolling update. Observation, decision,
patch, rollout tracking and the status writes of every path are exercised,
not only holds.

A thousand objects of each kind take minutes through the API server's rate
limits, so they are created, deleted and waited for by a pool of worker
threads, with progress lines.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException

from bench.scale.fleet import TRAFFIC_ANNOTATION
from bench.scale.traffic import Traffic
from vllm_autotuner.api import (
    GROUP,
    PLURAL,
    VERSION,
    Knobs,
    RolloutSpec,
    TargetRef,
    TrafficSpec,
    VllmTuning,
    VllmTuningSpec,
)
from vllm_autotuner.rollout.progress import rollout_in_progress

NAMESPACE_SIZE = 100
WORKERS = 16
"""Concurrent API requests while setting up (the API server's own limits decide the pace)."""
PROFILE = "llama3-8b-h100"
GPUS_PER_NODE = 64
"""GPUs of one stand-in node. Larger than real GPU machines: the operator never looks at nodes (the knobs
are on the command line), and fewer nodes are fewer leases for the stand-in kubelet to renew."""
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
IMAGE = "vllm/vllm-openai:v0.11.0"
PROGRESS_EVERY_S = 5.0

CHAT = Traffic("chat", 18.0)
"""Chat at about 60 % of an H100 replica's capacity: with the knobs below, p95 TTFT 0.06 s and ITL 25 ms."""
CHAT_KNOBS = Knobs(max_num_batched_tokens=2048, max_num_seqs=128)
BUSY = Traffic("chat", 25.0)
"""More chat than 64 sequences of 1024 tokens serve: requests queue, p95 TTFT is minutes (SLO: 2 s)."""
BUSY_KNOBS = Knobs(max_num_batched_tokens=1024, max_num_seqs=64)
BUSY_EVERY = 10

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """The clock of a run: the tunings' interval, window and settle time, and Prometheus's scrape interval."""

    evaluation_interval: float
    window: float
    settle: float
    scrape_interval: float


@dataclass(frozen=True)
class Target:
    """One vLLM Deployment of the benchmark and the knobs it starts with."""

    namespace: str
    name: str
    traffic: Traffic
    knobs: Knobs


def targets(count: int) -> list[Target]:
    """``count`` Deployments, ``vllm-0000`` on, in namespaces ``bench-00`` on."""
    out = []
    for i in range(count):
        busy = i % BUSY_EVERY == 0
        out.append(Target(f"bench-{i // NAMESPACE_SIZE:02d}", f"vllm-{i:04d}", BUSY if busy else CHAT,
                          BUSY_KNOBS if busy else CHAT_KNOBS))
    return out


def nodes_for(pods: int) -> int:
    """Stand-in GPU nodes for ``pods`` one-GPU pods, with room for the surge pods of rollouts."""
    return math.ceil(pods * 1.25 / GPUS_PER_NODE) + 1


def deployment(target: Target) -> dict[str, Any]:
    """A one-replica vLLM Deployment as a platform team writes one."""
    health = {"httpGet": {"path": "/health", "port": 8000}}
    labels = {"app": target.name, "app.kubernetes.io/name": "vllm"}
    container = {
        "name": "vllm",
        "image": IMAGE,
        "command": ["vllm", "serve", MODEL],
        "args": ["--max-num-batched-tokens", str(target.knobs.max_num_batched_tokens),
                 "--max-num-seqs", str(target.knobs.max_num_seqs)],
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 60},
        "readinessProbe": {**health, "periodSeconds": 5},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": target.name, "namespace": target.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": target.name}},
            "template": {
                "metadata": {"labels": labels, "annotations": {TRAFFIC_ANNOTATION: str(target.traffic)}},
                "spec": {"containers": [container]},
            },
        },
    }


def tuning(target: Target, timing: Timing) -> dict[str, Any]:
    """The target's VllmTuning: the defaults (Adaptive, Auto, default SLO) but for the clock of the run."""
    spec = VllmTuningSpec(
        target_ref=TargetRef(name=target.name),
        traffic=TrafficSpec(window=f"{timing.window:g}s", evaluation_interval=f"{timing.evaluation_interval:g}s"),
        rollout=RolloutSpec(settle_time=f"{timing.settle:g}s"),
    )
    body = VllmTuning(metadata={"name": target.name, "namespace": target.namespace}, spec=spec).to_object()
    del body["status"]
    return body


def each(fn: Callable[[T], object], items: Iterable[T], what: str, say: Callable[[str], None]) -> None:
    """Run ``fn`` on every item from a pool of workers, saying how far it got; the first error is raised."""
    items = list(items)
    done, last = 0, time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        for future in as_completed([pool.submit(fn, item) for item in items]):
            future.result()
            done += 1
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                say(f"{what}: {done}/{len(items)}")
                last = time.monotonic()
    say(f"{what}: {len(items)}/{len(items)} done")


def _as_created(live: dict[str, Any], target: Target) -> bool:
    """Whether a Deployment still has the args and pod annotations it was created with
    (the operator patches the first and adds to the second)."""
    created, now = deployment(target)["spec"]["template"], live["spec"]["template"]
    return (now["metadata"].get("annotations") == created["metadata"]["annotations"]
            and now["spec"]["containers"][0].get("args") == created["spec"]["containers"][0]["args"])


class BenchCluster:
    """The benchmark's Deployments and VllmTunings, through one API client."""

    def __init__(self, api: kubernetes.client.ApiClient, count: int, timing: Timing,
                 say: Callable[[str], None]) -> None:
        self.api = api
        self.apps = kubernetes.client.AppsV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.targets = targets(count)
        self.namespaces = sorted({t.namespace for t in self.targets})
        self.timing = timing
        self.say = say

    def create_deployments(self) -> None:
        for namespace in self.namespaces:
            self.core.create_namespace({"metadata": {"name": namespace}})
        each(lambda t: self.apps.create_namespaced_deployment(t.namespace, deployment(t)), self.targets,
             f"creating {len(self.targets)} Deployments", self.say)

    def create_tunings(self) -> None:
        each(lambda t: self.custom.create_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL,
                                                                    tuning(t, self.timing)),
             self.targets, f"creating {len(self.targets)} VllmTunings", self.say)

    def delete_tunings(self) -> None:
        for namespace in self.namespaces:
            self.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        self.say(f"deleted the {len(self.targets)} VllmTunings")

    def _deployments(self) -> dict[tuple[str, str], dict[str, Any]]:
        found = {}
        for namespace in self.namespaces:
            listing = json.loads(self.apps.list_namespaced_deployment(namespace, _preload_content=False).data)
            found.update({(namespace, d["metadata"]["name"]): d for d in listing["items"]})
        return found

    def reset_deployments(self) -> int:
        """Put back the pod template of every Deployment the operator changed; returns how many."""
        live = self._deployments()
        changed = [t for t in self.targets if not _as_created(live[(t.namespace, t.name)], t)]

        def reset(target: Target) -> None:
            while True:
                current = self.apps.read_namespaced_deployment(target.name, target.namespace)
                body = deployment(target)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                try:
                    self.apps.replace_namespaced_deployment(target.name, target.namespace, body)
                    return
                except ApiException as exc:
                    if exc.status != 409:
                        raise

        each(reset, changed, f"resetting {len(changed)} Deployments the operator changed", self.say)
        return len(changed)

    def wait_rolled_out(self, timeout: float) -> None:
        """Until every Deployment's rollout is complete (all replicas updated and Ready)."""
        deadline, last = time.monotonic() + timeout, 0.0
        while True:
            live = self._deployments()
            pending = [key for key, d in live.items() if rollout_in_progress(d)]
            missing = len(self.targets) - len(live)
            if not pending and not missing:
                self.say(f"all {len(self.targets)} Deployments rolled out, pods Ready")
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending) + missing} Deployments not rolled out after {timeout:g}s, "
                                   f"e.g. {pending[:3]}")
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                self.say(f"waiting for rollouts: {len(self.targets) - len(pending) - missing}/{len(self.targets)} "
                         "Deployments with all pods Ready")
                last = time.monotonic()
            time.sleep(2.0)
