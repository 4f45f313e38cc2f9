"""The simulated GPU fleet on the real control plane and the real Prometheus.

The operator's end-to-end tests stand on this: vLLM Deployments schedule onto
the fleet's GPU nodes, turn Ready only after the simulated start-up,
crash-loop with vLLM's own error when the token budget does not fit the GPU,
roll to new arguments, serve OpenAI traffic, and Prometheus scrapes every pod
as it would a real vLLM. The nodes must stay Ready under the real
node-lifecycle controller all the while. Every wait polls with a deadline.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_client.parser import text_string_to_metric_families
from tests.support import (
    FLEET_TIME_SCALE,
    H100,
    HEALTH,
    L4,
    MODEL,
    Cluster,
    NotYet,
    call_vllm,
    expected_startup,
    is_ready,
    vllm_deployment,
    wait_for,
)

from vllm_autotuner.api import SLO
from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.observe.queries import PodMatch, Selector
from vllm_autotuner.observe.window import fetch_window, observe_target
from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.fleet import FLEET_LABEL, LEASE_DURATION_S, LEASE_RENEW_S, NODE_LEASE_NAMESPACE

pytestmark = pytest.mark.integration

REFERENCE_SCRAPE = localenv.ROOT / "tests" / "unit" / "sim" / "data" / "vllm-metrics.txt"


class Api:
    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.core = kubernetes.client.CoreV1Api(cluster.api)
        self.apps = kubernetes.client.AppsV1Api(cluster.api)
        self.namespace = namespace

    def create(self, deployment: dict[str, Any]) -> None:
        self.apps.create_namespaced_deployment(self.namespace, deployment)

    def pods(self, app: str) -> list[kubernetes.client.V1Pod]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=f"app={app}").items

    def ready_pods(self, app: str, count: int) -> list[kubernetes.client.V1Pod]:
        pods = [p for p in self.pods(app) if not p.metadata.deletion_timestamp and is_ready(p)]
        return pods if len(pods) == count == len(self.pods(app)) else []


def condition(obj: Any, kind: str) -> Any:
    """A pod's or node's condition of type ``kind``."""
    return next(c for c in obj.status.conditions if c.type == kind)


def query(prometheus: localenv.Prometheus, promql: str) -> list[dict[str, Any]]:
    return PrometheusConnect(prometheus.url).custom_query(promql)


def reference_series_names() -> set[str]:
    """Every ``vllm:`` series name of a real vLLM's scrape."""
    names = set()
    for family in text_string_to_metric_families(REFERENCE_SCRAPE.read_text()):
        names |= {s.name for s in family.samples if s.name.startswith("vllm:")}
    return names


def test_two_replicas_turn_ready_after_the_simulated_start_up_and_are_scraped(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    api = Api(cluster, namespace)
    args = ["--max-num-batched-tokens", "8192", "--max-num-seqs", "256"]
    api.create(vllm_deployment("llama", H100, args))
    pods = wait_for(lambda: api.ready_pods("llama", 2), 90, "both vLLM pods to turn Ready")

    assert len({p.spec.node_name for p in pods}) == 2 and {p.spec.node_name for p in pods} <= set(fleet.nodes)
    assert all(ipaddress.ip_address(p.status.pod_ip).is_loopback for p in pods)
    assert len({p.status.pod_ip for p in pods}) == 2
    startup = expected_startup(H100, args)
    assert startup.ok
    for pod in pods:
        (status,) = pod.status.container_statuses
        assert status.started and status.ready and status.restart_count == 0
        took = (condition(pod, "Ready").last_transition_time - status.state.running.started_at).total_seconds()
        # Whole seconds on both ends; the probes add at most 0.5 s (scaled periods).
        assert startup.seconds - 1 <= took <= startup.seconds + 2, (pod.metadata.name, took, startup.seconds)

    names = {p.metadata.name for p in pods}

    def scraped() -> dict[str, set[str]] | NotYet:
        found: dict[str, set[str]] = {name: set() for name in names}
        for sample in query(prometheus, f'count by (__name__, pod) ({{namespace="{namespace}", '
                                        f'__name__=~"vllm:.+", container="vllm", app="llama"}})'):
            found.setdefault(sample["metric"]["pod"], set()).add(sample["metric"]["__name__"])
        missing = {name: sorted(reference_series_names() - found[name]) for name in names}
        return found if not any(missing.values()) else NotYet(f"missing series: {missing}")

    found = wait_for(scraped, 60, "Prometheus to have every vLLM series of both pods")
    assert set(found) == names

    def up() -> list[tuple[str, str]]:  # one scrape of the two can time out on a loaded machine; the next succeeds
        samples = query(prometheus, f'up{{namespace="{namespace}"}}')
        targets = sorted((s["metric"]["pod"], s["value"][1]) for s in samples)
        assert targets == sorted((n, "1") for n in names), targets
        return targets

    wait_for(up, 10, "both pods' scrape targets to be up")


def test_infeasible_budget_crash_loops_with_vllms_error(cluster: Cluster, namespace: str,
                                                         fleet: localenv.Fleet) -> None:
    api = Api(cluster, namespace)
    args = ["--max-num-batched-tokens", "24576", "--max-num-seqs", "256"]
    startup = expected_startup(L4, args)
    assert startup.error is not None and "KV cache is needed" in startup.error
    api.create(vllm_deployment("tight", L4, args, replicas=1))

    def crash_looping() -> kubernetes.client.V1ContainerStatus | None:
        pods = api.pods("tight")
        statuses = pods[0].status.container_statuses if pods else None
        status = statuses[0] if statuses else None
        if status and status.restart_count >= 2 and status.state.waiting \
                and status.state.waiting.reason == "CrashLoopBackOff":
            return status
        return None

    status = wait_for(crash_looping, 90, "the pod to be in CrashLoopBackOff after two restarts")
    terminated = status.last_state.terminated
    assert (terminated.exit_code, terminated.reason) == (1, "Error")
    assert terminated.message == startup.error
    assert not status.ready and not status.started
    assert "back-off" in status.state.waiting.message
    (pod,) = api.pods("tight")
    assert pod.status.phase == "Running" and condition(pod, "Ready").status == "False"
    events = api.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod.metadata.name}")
    assert {"Started", "BackOff"} <= {e.reason for e in events.items if e.source.component == "kubelet"}


def test_a_startup_probe_shorter_than_the_start_up_gets_the_container_killed(cluster: Cluster, namespace: str,
                                                                            fleet: localenv.Fleet) -> None:
    api = Api(cluster, namespace)
    deployment = vllm_deployment("impatient", H100, ["--max-num-batched-tokens", "8192"], replicas=1)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["startupProbe"] = {**HEALTH, "periodSeconds": 10, "failureThreshold": 3}  # gives up after 20 s
    assert expected_startup(H100, container["args"]).seconds > 20 * FLEET_TIME_SCALE
    api.create(deployment)

    def killed_twice() -> kubernetes.client.V1Pod | None:
        pods = api.pods("impatient")
        statuses = pods[0].status.container_statuses if pods else None
        return pods[0] if statuses and statuses[0].restart_count >= 2 and statuses[0].last_state.terminated else None

    pod = wait_for(killed_twice, 60, "the kubelet to kill and restart the container twice")
    terminated = pod.status.container_statuses[0].last_state.terminated
    assert (terminated.exit_code, terminated.reason) == (143, "Error")
    events = api.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod.metadata.name}")
    messages = {e.reason: e.message for e in events.items}
    assert messages["Killing"] == "Container vllm failed startup probe, will be restarted"
    assert messages["Unhealthy"].startswith("Startup probe failed")


def test_rolling_update_replaces_the_pods_and_the_new_ones_serve_the_new_config(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    api = Api(cluster, namespace)
    old_args = ["--max-num-batched-tokens", "8192", "--max-num-seqs", "256"]
    new_args = ["--max-num-batched-tokens", "16384", "--max-num-seqs", "512"]
    api.create(vllm_deployment("llama", H100, old_args))
    old = {p.metadata.name for p in wait_for(lambda: api.ready_pods("llama", 2), 90, "the first pods")}

    api.apps.patch_namespaced_deployment("llama", namespace, {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "args": new_args}]}}}})

    def rolled() -> list[kubernetes.client.V1Pod]:
        pods = api.ready_pods("llama", 2)
        return pods if pods and not {p.metadata.name for p in pods} & old else []

    new = wait_for(rolled, 120, "the rollout to replace both pods with Ready new ones")
    assert all(p.spec.containers[0].args == new_args for p in new)

    def counted() -> kubernetes.client.V1DeploymentStatus:
        # The Deployment's status follows the pods through two controllers: the old pod can be gone a moment
        # before readyReplicas drops from 3.
        status = api.apps.read_namespaced_deployment("llama", namespace).status
        assert status.updated_replicas == status.ready_replicas == 2, status
        return status

    wait_for(counted, 30, "the Deployment to count the two new pods, updated and Ready")

    old_blocks, new_blocks = (expected_startup(H100, a).memory.num_gpu_blocks for a in (old_args, new_args))
    assert old_blocks != new_blocks  # the bigger budget reserves more activation memory

    def cache_info() -> dict[str, str]:
        samples = query(prometheus, f'vllm:cache_config_info{{namespace="{namespace}"}}')
        by_pod = {s["metric"]["pod"]: s["metric"]["num_gpu_blocks"] for s in samples}
        return by_pod if set(by_pod) >= {p.metadata.name for p in new} else {}

    by_pod = wait_for(cache_info, 60, "Prometheus to scrape the new pods' cache config")
    assert {by_pod[p.metadata.name] for p in new} == {str(new_blocks)}
    assert {by_pod[name] for name in old if name in by_pod} <= {str(old_blocks)}


def sim_load(cluster: Cluster, namespace: str, deployment: str, *flags: str,
             timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``vllm-autotuner sim load`` of steady chat against ``deployment`` with ``flags``: the finished process and
    its JSON summary (its last line)."""
    result = subprocess.run(
        [sys.executable, "-m", "vllm_autotuner.cli", "sim", "load", f"--kubeconfig={cluster.kubeconfig}",
         f"--namespace={namespace}", f"--deployment={deployment}", "--scenario=steady", "--mix=chat", *flags],
        capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result, json.loads(result.stdout.splitlines()[-1])


def test_load_sends_requests_that_both_pods_serve_and_prometheus_counts(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    api = Api(cluster, namespace)
    api.create(vllm_deployment("llama", H100, ["--max-num-batched-tokens", "4096"]))
    pods = {p.metadata.name for p in wait_for(lambda: api.ready_pods("llama", 2), 90, "both pods")}
    result, summary = sim_load(cluster, namespace, "llama", "--rate=4", "--duration=10", "--progress=2")
    assert summary["ok"] == summary["sent"] > 10 and summary["errors"] == {}
    assert len(summary["per_pod"]) == 2 and min(summary["per_pod"].values()) >= summary["ok"] // 2
    assert "sent" in result.stdout.splitlines()[1]  # progress lines while it runs

    def counted() -> dict[str, float]:
        samples = query(prometheus, f'sum by (pod) (vllm:request_success_total{{namespace="{namespace}"}})')
        by_pod = {s["metric"]["pod"]: float(s["value"][1]) for s in samples}
        return by_pod if set(by_pod) == pods and sum(by_pod.values()) == summary["ok"] else {}

    by_pod = wait_for(counted, 60, f"Prometheus to count the {summary['ok']} requests on both pods")
    assert min(by_pod.values()) > 0


def test_streamed_load_times_the_first_token_as_the_pod_made_it(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    """``sim load --stream`` times what a chat client sees. Its mean time to the first token is the pod's own (the
    sum over the count of ``vllm:time_to_first_token_seconds``, exact) plus the HTTP round trip and at most a
    serving tick, and its time per output token is about the pod's mean inter-token latency; a client that took
    the first token's time at the end of the answer, or counted whole answers, would be seconds off."""
    api = Api(cluster, namespace)
    api.create(vllm_deployment("streamed", H100, [], replicas=1))
    wait_for(lambda: api.ready_pods("streamed", 1), 90, "the pod")
    _, summary = sim_load(cluster, namespace, "streamed", "--rate=4", "--duration=10", "--progress=5", "--stream")
    assert summary["ok"] == summary["sent"] > 10 and summary["errors"] == {}
    assert 0 < summary["ttft_p50_s"] <= summary["ttft_p95_s"] < summary["e2e_p50_s"]

    def pod_means() -> dict[str, float]:
        figures = {}
        for family in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            sums = query(prometheus, f'sum(vllm:{family}_sum{{namespace="{namespace}"}})')
            counts = query(prometheus, f'sum(vllm:{family}_count{{namespace="{namespace}"}})')
            if not sums or not counts:
                return {}
            figures[family] = float(sums[0]["value"][1]) / float(counts[0]["value"][1])
            figures[f"{family} count"] = float(counts[0]["value"][1])
        return figures if figures["time_to_first_token_seconds count"] == summary["ok"] else {}

    pod = wait_for(pod_means, 60, f"Prometheus to count the first tokens of the {summary['ok']} requests")
    assert pod["time_to_first_token_seconds"] - 0.01 <= summary["ttft_mean_s"]
    assert summary["ttft_mean_s"] <= pod["time_to_first_token_seconds"] + 0.15, (summary, pod)
    assert abs(summary["tpot_mean_s"] / pod["inter_token_latency_seconds"] - 1) < 0.25, (summary, pod)


def test_requests_whose_clients_give_up_are_aborted(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    """``sim load``'s clients give up after ``--timeout``; the pod aborts what they left, as vLLM does: nothing
    runs on for nobody, and Prometheus counts only the answered requests."""
    api = Api(cluster, namespace)
    api.create(vllm_deployment("one-seq", H100, ["--max-num-seqs", "1"], replicas=1))
    wait_for(lambda: api.ready_pods("one-seq", 1), 90, "the pod")
    _, summary = sim_load(cluster, namespace, "one-seq", "--rate=4", "--duration=15", "--timeout=4", "--progress=5")
    # One request at a time, about two seconds each: most of the 60 wait longer than their clients do.
    assert summary["errors"].get("gave up after 4s", 0) > summary["sent"] // 2
    assert summary["ok"] + summary["errors"]["gave up after 4s"] == summary["sent"]

    # A request the pod finishes in the instant its client gives up is counted by the pod and not by the client (vLLM
    # has the same race: the step that finishes it can run before the disconnect is seen). Under load that instant
    # is a tick or two wide, so up to ``raced`` such requests are allowed; a pod that let an abandoned request run on,
    # or counted aborted ones, counts several more.
    raced = 2

    def settled() -> dict[str, float]:
        promql = (f'sum(vllm:num_requests_running{{namespace="{namespace}"}}) + '
                  f'sum(vllm:num_requests_waiting{{namespace="{namespace}"}})')  # fmt: skip
        unserved = query(prometheus, promql)
        counted = query(prometheus, f'sum(vllm:request_success_total{{namespace="{namespace}"}})')
        values = {"unserved": float(unserved[0]["value"][1]), "counted": float(counted[0]["value"][1])}
        assert values["unserved"] == 0 and summary["ok"] <= values["counted"] <= summary["ok"] + raced, values
        return values

    # Without the aborts the pod would work through its queue for over a minute more.
    wait_for(settled, 20, f"the pod to be idle with the {summary['ok']} answered requests counted")


def test_a_queue_limit_refuses_requests_that_the_window_counts_as_load_in_no_latency_field(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    """vLLM's ``--max-num-queued-reqs`` refuses what comes past it with 503 before the engine sees it, so no
    latency histogram has those requests. Prometheus counts them (``vllm:admission_rejections_total``), and the
    operator's window counts them as load, apart from the answered requests' latencies: the decision core counts
    them as misses, so that a queue limit that keeps the waiting short does not make an overload look served."""
    api = Api(cluster, namespace)
    api.create(vllm_deployment("limited", H100, ["--max-num-seqs", "1", "--max-num-queued-reqs", "2"], replicas=1))
    (pod,) = wait_for(lambda: api.ready_pods("limited", 1), 90, "the pod")
    _, summary = sim_load(cluster, namespace, "limited", "--rate=4", "--duration=15", "--progress=5")
    # one request at a time, about two seconds each, and two in flight at most: most of the 60 are refused
    refused = summary["errors"].get("HTTP 503", 0)
    assert refused > summary["sent"] // 2 and summary["ok"] + refused == summary["sent"], summary

    client = PrometheusClient(Connection(url=prometheus.url))
    promql = f'sum(vllm:admission_rejections_total{{namespace="{namespace}",reason="max_num_queued_reqs"}})'
    wait_for(lambda: [r for r in client.query(promql, time.time()) if r.value == refused], 30,
             f"Prometheus to count the {refused} refused requests")
    name = pod.metadata.name
    obs, why = observe_target(fetch_window(client, Selector(), 120, time.time()), namespace, PodMatch(names=(name,)),
                              1, None, SLO(), False)
    assert why is None and obs is not None, why
    assert obs.refused_rate is not None and obs.request_rate is not None and obs.requests is not None
    served = obs.requests / 120  # completed requests per second
    assert obs.refused_rate > served > 0 and obs.request_rate == pytest.approx(obs.refused_rate + served)
    # the latency fields are the answered requests' (a refused one has no first token: its TTFT would lie past every
    # bucket, and the p95 of all requests at 2560 s); the decision core counts the refused ones as misses
    assert obs.ttft_seconds is not None and obs.ttft_seconds < 60


def test_requests_deferred_for_a_lora_adapter_are_not_the_waiting_the_window_counts(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    """With ``--max-loras 1``, requests for a second adapter wait while the first adapter's run: vLLM counts them
    waiting, but deferred, not waiting for room in the batch (vllm:num_requests_waiting_by_reason). Other knobs
    would not start them sooner, so the operator's window leaves them out of its waiting requests."""
    api = Api(cluster, namespace)
    args = ["--enable-lora", "--max-loras", "1", "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat",
            "--max-num-seqs", "8"]
    api.create(vllm_deployment("adapters", H100, args, replicas=1))
    (pod,) = wait_for(lambda: api.ready_pods("adapters", 1), 90, "the pod")
    _, summary = sim_load(cluster, namespace, "adapters", "--rate=2", "--duration=15", "--progress=5", "--model=sql",
                          "--model=chat", timeout=180)
    assert summary["ok"] == summary["sent"], summary

    client = PrometheusClient(Connection(url=prometheus.url))
    name = pod.metadata.name
    pod_labels = f'namespace="{namespace}",pod="{name}"'
    deferred = f'max_over_time(vllm:num_requests_waiting_by_reason{{{pod_labels},reason="deferred"}}[120s])'
    wait_for(lambda: [r for r in client.query(deferred, time.time()) if r.value > 0], 30,
             "Prometheus to see requests deferred for their adapter")
    at = time.time()
    obs, why = observe_target(fetch_window(client, Selector(), 120, at), namespace, PodMatch(names=(name,)),
                              1, None, SLO(), False)
    assert why is None and obs is not None and obs.waiting is not None, why
    (total,) = client.query(f"avg_over_time(vllm:num_requests_waiting{{{pod_labels}}}[120s])", at)
    (capacity,) = client.query(
        f'avg_over_time(vllm:num_requests_waiting_by_reason{{{pod_labels},reason="capacity"}}[120s])', at)
    assert obs.waiting == pytest.approx(capacity.value) and total.value > obs.waiting, (total, capacity, obs.waiting)
    # the adapters by name, as the Gateway API inference extension's endpoint picker reads them for LoRA affinity:
    # one series per combination seen, its value the Unix time it was last seen
    lora = client.query(f'last_over_time(vllm:lora_requests_info{{{pod_labels},waiting_lora_adapters!=""}}[120s])', at)
    assert lora, "no vllm:lora_requests_info series with an adapter waiting"
    # Prometheus drops a label whose value is empty: no adapter running is no running_lora_adapters label
    seen = [(s.labels.get("running_lora_adapters", ""), set(s.labels["waiting_lora_adapters"].split(",")))
            for s in lora]
    assert all(running in {"", "sql", "chat"} and waiting <= {"sql", "chat"} for running, waiting in seen), seen
    assert any(running and waiting - {running} for running, waiting in seen), f"no adapter deferred for another: {seen}"
    assert all(s.labels["max_lora"] == "1" and at - 180 < s.value <= at for s in lora), lora


def _complete(pod: kubernetes.client.V1Pod, max_tokens: int) -> tuple[int, int] | str:
    """POST a completion of ``max_tokens`` tokens to the pod's vLLM: its HTTP status and the tokens it answered, or
    why no answer came (the connection closed)."""
    body = json.dumps({"prompt": [1] * 100, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://{pod.status.pod_ip}:8000/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())["usage"]["completion_tokens"]
    except urllib.error.HTTPError as exc:
        return exc.code, 0
    except OSError as exc:
        return str(exc)


def _running(pod: kubernetes.client.V1Pod) -> float:
    """The pod's ``vllm:num_requests_running``, from its /metrics."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8000/metrics", timeout=5) as response:
        text = response.read().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:num_requests_running")
    return family.samples[0].value


def test_a_deleted_pod_finishes_its_requests_with_a_shutdown_timeout_and_aborts_them_without(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet
) -> None:
    """Every rolling restart deletes pods with requests in flight. On SIGTERM vLLM aborts them, unless it was
    started with --shutdown-timeout: then it refuses new requests and serves those in flight to the end, after the
    preStop sleep that gives endpoints the time to stop sending it requests, within the pod's grace period. A vLLM
    that dash runs as its child never gets the SIGTERM (dash, the container's first process, ignores it): it takes
    new requests on, its --shutdown-timeout never starts, and it serves until the SIGKILL. In a pod that shares its
    process namespace (as behind tini) dash is not the first process: it dies of the SIGTERM, and vLLM with it.
    runuser passes the SIGTERM on and kills vLLM 2 s later, whatever its --shutdown-timeout."""
    api = Api(cluster, namespace)
    drains = vllm_deployment("drains", H100, ["--shutdown-timeout", "60"], replicas=1)
    pod_spec = drains["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 90
    pod_spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "1"]}}}
    api.create(drains)
    api.create(vllm_deployment("aborts", H100, [], replicas=1))
    ignores = vllm_deployment("ignores", H100, [], replicas=1)
    pod_spec = ignores["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 30
    pod_spec["containers"][0]["command"] = ["dash", "-c", f"vllm serve {MODEL} --shutdown-timeout 5"]
    api.create(ignores)
    shares = vllm_deployment("shares", H100, [], replicas=1)  # the fleet's fourth H100
    pod_spec = shares["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 60
    pod_spec["shareProcessNamespace"] = True
    pod_spec["containers"][0]["command"] = ["dash", "-c", f"vllm serve {MODEL} --shutdown-timeout 30"]
    api.create(shares)
    switches = vllm_deployment("switches", L4, [], replicas=1)  # the fleet's L4: its H100s are taken
    pod_spec = switches["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 90
    pod_spec["containers"][0]["command"] = ["runuser", "-u", "vllm", "--", "vllm", "serve", MODEL,
                                            "--shutdown-timeout", "60"]
    api.create(switches)
    (draining,) = wait_for(lambda: api.ready_pods("drains", 1), 90, "the draining pod")
    (aborting,) = wait_for(lambda: api.ready_pods("aborts", 1), 90, "the aborting pod")
    (ignoring,) = wait_for(lambda: api.ready_pods("ignores", 1), 90, "the pod whose shell ignores the SIGTERM")
    (sharing,) = wait_for(lambda: api.ready_pods("shares", 1), 90, "the pod that shares its process namespace")
    (switching,) = wait_for(lambda: api.ready_pods("switches", 1), 90, "the pod that runs vLLM under runuser")
    outcomes: dict[str, tuple[int, int] | str] = {}

    def send(pod: kubernetes.client.V1Pod, tokens: int = 1000) -> threading.Thread:
        thread = threading.Thread(target=lambda: outcomes.__setitem__(pod.metadata.name, _complete(pod, tokens)))
        thread.start()
        return thread

    pods = (draining, aborting, ignoring, sharing, switching)
    # about 7 s each, one at a time on a simulated H100, and 14 s on the L4: all well within a 60 s drain
    threads = [send(pod) for pod in pods[:-1]] + [send(switching, 250)]
    wait_for(lambda: all(_running(pod) == 1 for pod in pods), 10, "the requests running")
    for pod in pods:
        api.core.delete_namespaced_pod(pod.metadata.name, namespace)
    # past the preStop sleep the draining vLLM refuses what comes, while its first request runs on
    wait_for(lambda: _complete(draining, 1) == (503, 0), 5, "the draining pod to refuse a new request")
    assert _complete(ignoring, 1) == (200, 1)  # never told to stop: it serves what comes
    for thread in threads:
        thread.join(60)
    assert outcomes[draining.metadata.name] == (200, 1000), outcomes
    assert outcomes[aborting.metadata.name] != (200, 1000), outcomes
    assert outcomes[sharing.metadata.name] != (200, 1000), outcomes  # its 30 s --shutdown-timeout notwithstanding
    assert outcomes[switching.metadata.name] != (200, 250), outcomes  # killed 2 s into its 60 s drain
    # past its 5 s --shutdown-timeout, which never started, within the 30 s grace period
    assert outcomes[ignoring.metadata.name] == (200, 1000), outcomes
    wait_for(lambda: not [p for p in api.pods("drains") if p.metadata.name == draining.metadata.name], 30,
             "the drained pod to go")
    # not the 60 s of its grace period: it is gone with its shell
    wait_for(lambda: not [p for p in api.pods("shares") if p.metadata.name == sharing.metadata.name], 30,
             "the pod whose shell took vLLM down to go")
    wait_for(lambda: not [p for p in api.pods("switches") if p.metadata.name == switching.metadata.name], 30,
             "the pod whose vLLM runuser killed to go")
    # and its GPU is free once the kubelet's SIGKILL ends the grace period
    wait_for(lambda: not [p for p in api.pods("ignores") if p.metadata.name == ignoring.metadata.name], 40,
             "the pod whose shell ignores the SIGTERM to go")


def test_a_pod_whose_engine_sleeps_is_counted_asleep_until_a_whole_window_finds_it_awake(
    cluster: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus
) -> None:
    """vLLM's sleep mode (``--enable-sleep-mode``, with ``VLLM_SERVER_DEV_MODE=1`` for its routes) frees a pod's
    GPU memory while the pod stays Ready. The window counts such pods from ``vllm:engine_sleep_state``, so that
    the decision core starts no change, which would start new pods awake, until a whole window finds them awake."""
    api = Api(cluster, namespace)
    api.create(vllm_deployment("sleepy", H100, ["--enable-sleep-mode"], 1, {"VLLM_SERVER_DEV_MODE": "1"}))
    (pod,) = wait_for(lambda: api.ready_pods("sleepy", 1), 90, "the pod")
    client = PrometheusClient(Connection(url=prometheus.url))
    window = 10.0

    def asleep(expected: int) -> Callable[[], bool | NotYet]:
        def check() -> bool | NotYet:
            obs, why = observe_target(fetch_window(client, Selector(), window, time.time()), namespace,
                                      PodMatch(names=(pod.metadata.name,)), 1, None, SLO(), False)
            counted = None if obs is None else obs.asleep_pods
            return counted == expected or NotYet(f"{counted} pods asleep ({why})")
        return check

    wait_for(asleep(0), 30, "a window with the engine awake")
    call_vllm(pod, "/sleep?level=1")
    wait_for(asleep(1), 30, "the window to count the sleeping engine")
    assert api.ready_pods("sleepy", 1)  # it stays Ready: nothing but its metrics says it sleeps
    # woken in two parts, as an RL trainer loads new weights: with the weights back, it still sleeps
    call_vllm(pod, "/wake_up?tags=weights")

    def sleep_state() -> dict[str, float]:
        samples = query(prometheus, f'vllm:engine_sleep_state{{namespace="{namespace}"}}')
        state = {s["metric"]["sleep_state"]: float(s["value"][1]) for s in samples}
        return state if state.get("weights_offloaded") == 0 else {}

    assert wait_for(sleep_state, 30, "Prometheus to scrape the weights back") == {
        "awake": 0, "weights_offloaded": 0, "discard_all": 0}
    assert asleep(1)() is True
    call_vllm(pod, "/wake_up?tags=kv_cache")
    assert call_vllm(pod, "/is_sleeping", "GET") == {"is_sleeping": False}
    woke = time.time()
    wait_for(asleep(0), 30, "a whole window with the engine awake again")
    assert time.time() - woke >= window - 2  # not before the window no longer reaches into the sleep (2 s: scrapes)


def test_a_stopped_fleet_reports_its_nodes_not_ready(cluster: Cluster, tmp_path) -> None:
    core = kubernetes.client.CoreV1Api(cluster.api)
    fleet = localenv.start_fleet(tmp_path, cluster.kubeconfig, tmp_path / "targets.json",
                                 pools=("llama3-8b-l4:1",), name_prefix="stopping")
    (name,) = fleet.nodes
    try:
        assert condition(core.read_node(name), "Ready").status == "True"
        fleet.stop()
        assert fleet.process is not None and fleet.process.returncode == 0
        ready = condition(core.read_node(name), "Ready")
        assert (ready.status, ready.reason) == ("False", "KubeletNotReady")
    finally:
        fleet.stop()
        core.delete_node(name)


def test_sim_up_runs_a_fleet_and_sim_down_stops_everything(tmp_path) -> None:
    localenv.up(tmp_path)
    try:
        env = dict(shlex.split(line)[0].split("=", 1) for line in (tmp_path / "env").read_text().splitlines())
        recorded = [localenv.Server(name, int(pid), Path(log)) for name, pid, log in
                    (line.split(" ", 2) for line in (tmp_path / "pids").read_text().splitlines())]
        assert [server.name for server in recorded] == ["testenv", "prometheus", "fleet"]
        assert Path(env["FLEET_TARGETS"]) == tmp_path / "prometheus" / "targets.d" / "fleet.json"
        api = kubernetes.config.new_client_from_config(config_file=env["KUBECONFIG"])
        nodes = kubernetes.client.CoreV1Api(api).list_node(label_selector=f"{FLEET_LABEL}=sim").items
        api.close()
        expected = [f"sim-{profile}-{i}" for profile, n in (p.split(":") for p in localenv.FLEET_POOLS)
                    for i in range(int(n))]
        assert sorted(n.metadata.name for n in nodes) == sorted(expected)
        assert all(condition(n, "Ready").status == "True" for n in nodes)
    finally:
        localenv.down(tmp_path)
    assert not any(server.alive() for server in recorded)
    assert not (tmp_path / "pids").exists()


def test_nodes_stay_ready_over_several_lease_durations(cluster: Cluster, fleet: localenv.Fleet) -> None:
    """Last in this module: by now the fleet has run a while under the real
    node-lifecycle controller; watch it until three lease durations have passed."""
    core = kubernetes.client.CoreV1Api(cluster.api)
    coordination = kubernetes.client.CoordinationV1Api(cluster.api)
    registered = {name: core.read_node(name).metadata.creation_timestamp for name in fleet.nodes}

    def healthy_for_long_enough() -> bool:
        now = datetime.now(timezone.utc)
        for name in fleet.nodes:
            node = core.read_node(name)
            ready = condition(node, "Ready")
            if ready.status != "True" or node.spec.taints:
                pytest.fail(f"{name} went unhealthy: Ready={ready.status} ({ready.reason}), taints {node.spec.taints}")
            renewed = coordination.read_namespaced_lease(name, NODE_LEASE_NAMESPACE).spec.renew_time
            assert (now - renewed).total_seconds() < 2 * LEASE_RENEW_S + 2, f"{name}'s lease is not being renewed"
        return all((now - t).total_seconds() > 3 * LEASE_DURATION_S for t in registered.values())

    wait_for(healthy_for_long_enough, 3 * LEASE_DURATION_S + 30, "three lease durations of healthy nodes")
    for name, created in registered.items():
        # Never NotReady since registration: the Ready condition never changed.
        since = condition(core.read_node(name), "Ready").last_transition_time
        assert abs((since - created).total_seconds()) <= 1
