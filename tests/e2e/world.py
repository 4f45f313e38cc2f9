"""What an end-to-end test looks at and drives: one vLLM Deployment, its VllmTuning, traffic, Prometheus.

Assertions are made on real objects only: the Deployment, its ReplicaSets
and Pods, the VllmTuning's status, the Events in the namespace, and what
the test's own PromQL says, never on the operator's internals. Every wait
polls with a deadline (``tests.support.wait_for``); the deadlines are
generous because the tests share a loaded two-core machine with others.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import kubernetes
from prometheus_api_client import PrometheusConnect
from tests.support import Cluster, NotYet, is_ready, vllm_deployment, wait_for

from vllm_autotuner.api import GROUP, PLURAL, VERSION
from vllm_autotuner.sim import localenv

REVISION = "deployment.kubernetes.io/revision"
WINDOW = "20s"
"""The observation window of every test's VllmTuning (and of the tests' own PromQL that checks it)."""


def knob_args(tokens: int, seqs: int) -> list[str]:
    return ["--max-num-batched-tokens", str(tokens), "--max-num-seqs", str(seqs)]


def knobs_of(args: list[str]) -> tuple[int, int]:
    """(tokens, seqs) of a container's args as ``knob_args`` writes them (the operator keeps the spelling)."""
    return int(args[args.index("--max-num-batched-tokens") + 1]), int(args[args.index("--max-num-seqs") + 1])


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in, dicts recursively."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def tuning_spec(target: str, **overrides: Any) -> dict[str, Any]:
    """A VllmTuning spec with the short time constants these tests run on, and ``overrides`` merged in.

    A ``WINDOW`` of samples scraped every second is enough for the quantiles
    at the request rates the tests send; a 5 s evaluation interval and settle
    time keep the loop fast while the fleet starts pods in seconds
    (``FLEET_TIME_SCALE``).
    """
    base = {
        "targetRef": {"name": target},
        "slo": {"ttft": {"quantile": 0.95, "seconds": 1.0}, "itl": {"quantile": 0.95, "seconds": 0.05}},
        "traffic": {"window": WINDOW, "evaluationInterval": "5s", "minRequests": 20},
        "rollout": {"cooldown": "60s", "settleTime": "5s", "progressDeadline": "90s"},
    }
    return merged(base, overrides)


def daily_cron(moment: datetime, zone: str) -> str:
    """A cron expression that fires once a day, at ``moment``'s minute as a clock in ``zone`` shows it."""
    local = moment.astimezone(ZoneInfo(zone))
    return f"{local.minute} {local.hour} * * *"


def open_window(zone: str, knobs: dict[str, int], name: str = "preset") -> dict[str, Any]:
    """A schedule whose window opened two minutes ago and closes in an hour: its preset is wanted now."""
    now = datetime.now(timezone.utc)
    return {"name": name, "timeZone": zone, "start": daily_cron(now - timedelta(minutes=2), zone),
            "end": daily_cron(now + timedelta(hours=1), zone), "knobs": knobs}


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass
class World:
    """The test namespace as the test sees it: a Deployment called ``name`` and its VllmTuning of the same name."""

    cluster: Cluster
    namespace: str
    name: str = "llama"
    apps: kubernetes.client.AppsV1Api = field(init=False)
    core: kubernetes.client.CoreV1Api = field(init=False)
    custom: kubernetes.client.CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        self.apps = kubernetes.client.AppsV1Api(self.cluster.api)
        self.core = kubernetes.client.CoreV1Api(self.cluster.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.cluster.api)

    # --- the Deployment ---------------------------------------------------------------------

    def create_deployment(self, profile: str, args: list[str], replicas: int = 2, env: dict[str, str] | None = None,
                          **spec: Any) -> kubernetes.client.V1Deployment:
        """Create the vLLM Deployment (``spec`` merged into its spec) and wait until all its pods are Ready."""
        body = vllm_deployment(self.name, profile, args, replicas, env)
        body["spec"].update(spec)
        self.apps.create_namespaced_deployment(self.namespace, body)
        self.wait_rolled_out(args, 120)
        return self.deployment()

    def deployment(self) -> kubernetes.client.V1Deployment:
        return self.apps.read_namespaced_deployment(self.name, self.namespace)

    def template_args(self) -> list[str]:
        return self.deployment().spec.template.spec.containers[0].args

    def args_owners(self) -> list[tuple[str, str]]:
        """The field managers that own the vLLM container's args, with their operation, as the apiserver records
        them in the Deployment's managedFields."""
        deployment = self.deployment()
        container = f'k:{{"name":"{deployment.spec.template.spec.containers[0].name}"}}'
        return [(entry.manager, entry.operation) for entry in deployment.metadata.managed_fields or []
                if "f:args" in (entry.fields_v1 or {}).get("f:spec", {}).get("f:template", {}).get("f:spec", {})
                .get("f:containers", {}).get(container, {})]

    def replicasets(self) -> list[kubernetes.client.V1ReplicaSet]:
        """The Deployment's ReplicaSets, oldest revision first."""
        uid = self.deployment().metadata.uid
        owned = [rs for rs in self.apps.list_namespaced_replica_set(self.namespace).items
                 if any(ref.uid == uid for ref in rs.metadata.owner_references or [])]
        return sorted(owned, key=lambda rs: int(rs.metadata.annotations.get(REVISION, "0")))

    def pods(self) -> list[kubernetes.client.V1Pod]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=f"app={self.name}").items

    def rolled_out(self, args: list[str]) -> list[kubernetes.client.V1Pod] | NotYet:
        """The pods, when the rollout to ``args`` is complete: the Deployment caught up, every pod Ready with them."""
        deployment = self.deployment()
        status, replicas = deployment.status, deployment.spec.replicas
        pods = self.pods()
        done = (status.observed_generation == deployment.metadata.generation
                and status.updated_replicas == status.ready_replicas == status.replicas == replicas
                and len(pods) == replicas
                and all(is_ready(p) and not p.metadata.deletion_timestamp and p.spec.containers[0].args == args
                        for p in pods))
        if done:
            return pods
        return NotYet(f"generation {deployment.metadata.generation} observed {status.observed_generation}, "
                      f"{status.updated_replicas} updated, {status.ready_replicas} ready of {replicas}; pods "
                      f"{[(p.metadata.name, is_ready(p), p.spec.containers[0].args) for p in pods]}")

    def wait_rolled_out(self, args: list[str], timeout: float) -> list[kubernetes.client.V1Pod]:
        return wait_for(lambda: self.rolled_out(args), timeout, f"every pod of {self.name} Ready with {args}")

    # --- the VllmTuning ---------------------------------------------------------------------

    def create_tuning(self, spec: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VllmTuning", "metadata": {"name": self.name},
                "spec": spec}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def patch_tuning(self, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": spec})

    def status(self) -> dict[str, Any]:
        tuning = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        return tuning.get("status") or {}

    def condition(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status().get("conditions", []) if c["type"] == type_), None)

    def has_condition(self, type_: str, status: str, reason: str | None = None) -> dict[str, Any] | NotYet:
        found = self.condition(type_)
        if found and found["status"] == status and (reason is None or found["reason"] == reason):
            return found
        return NotYet(f"{type_} is {found}")

    def wait_condition(self, type_: str, status: str, reason: str | None, timeout: float) -> dict[str, Any]:
        return wait_for(lambda: self.has_condition(type_, status, reason), timeout,
                        f"condition {type_}={status}" + (f" ({reason})" if reason else ""))

    def events(self, reason: str | None = None, kind: str = "VllmTuning") -> list[kubernetes.client.CoreV1Event]:
        """Events about the tuning (or, with kind Deployment, the Deployment), oldest first."""
        found = [e for e in self.core.list_namespaced_event(self.namespace).items
                 if e.involved_object.kind == kind and e.involved_object.name == self.name
                 and (reason is None or e.reason == reason)]
        return sorted(found, key=lambda e: e.first_timestamp or e.event_time)

    def history(self) -> list[dict[str, Any]]:
        """status.history, oldest first."""
        return list(reversed(self.status().get("history", [])))


class Load:
    """``vllm-autotuner sim load`` against the Deployment, in the background until ``stop``."""

    def __init__(self, world: World, workdir: Path, rate: float, mix: str = "chat", seed: int = 0) -> None:
        self.log = workdir / f"load-{mix}-{rate:g}.log"
        args = [sys.executable, "-m", "vllm_autotuner.cli", "sim", "load", f"--kubeconfig={world.cluster.kubeconfig}",
                f"--namespace={world.namespace}", f"--deployment={world.name}", "--scenario=steady", f"--mix={mix}",
                f"--rate={rate:g}", "--duration=3600", "--progress=10", "--drain=1", f"--seed={seed}"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=30)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def promql(url: str, query: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant query, now or at Unix time ``at``: (labels, value) per series."""
    params = {"time": f"{at:.3f}"} if at is not None else None
    return [(row["metric"], float(row["value"][1])) for row in PrometheusConnect(url).custom_query(query, params)]


def fleet_targets_of(prometheus: localenv.Prometheus, namespace: str) -> list[dict[str, Any]]:
    """The fleet's file-SD entries for the pods of ``namespace``."""
    entries = json.loads(prometheus.fleet_targets_file.read_text() or "[]")
    return [e for e in entries if e["labels"].get("__meta_kubernetes_namespace") == namespace]
