"""The fleet's pure parts: pools, node and lease objects, scrape targets, pod
addresses, and how ``sim load`` finds a Deployment's pods."""

from __future__ import annotations

import argparse
import socket
from datetime import datetime, timezone

import pytest

from vllm_autotuner.sim.fleet import (
    FLEET_LABEL,
    GFD_MEMORY,
    GFD_PRODUCT,
    PROFILE_LABEL,
    Pool,
    lease,
    node_labels,
    node_names,
    node_status,
    scrape_target,
)
from vllm_autotuner.sim.load import build_scenario, endpoints
from vllm_autotuner.sim.podrunner import AddressPool

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def test_pools_parse_with_defaults_and_say_what_is_wrong():
    assert Pool.parse("llama3-8b-h100").count == 1 and Pool.parse("llama3-8b-h100").gpus_per_node == 1
    tp4 = Pool.parse("llama3-70b-h100-tp4:2")
    assert (tp4.count, tp4.gpus_per_node) == (2, 4)
    assert Pool.parse("llama3-8b-l4:3:8").gpus_per_node == 8
    with pytest.raises(argparse.ArgumentTypeError, match="unknown profile 'h100'; known: "):
        Pool.parse("h100:2")
    for bad in ("llama3-8b-l4:x", "llama3-8b-l4:0", "llama3-8b-l4:1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"PROFILE\[:NODES\[:GPUS_PER_NODE\]\]"):
            Pool.parse(bad)


def test_nodes_look_like_gpu_feature_discovery_labelled_gpu_nodes():
    pools = [Pool.parse("llama3-8b-h100:2"), Pool.parse("llama3-8b-a100")]
    names = node_names("sim", pools)
    assert [n for n, _ in names] == ["sim-llama3-8b-h100-0", "sim-llama3-8b-h100-1", "sim-llama3-8b-a100-0"]
    labels = node_labels("sim-llama3-8b-a100-0", pools[1], "sim")
    assert labels[GFD_PRODUCT] == "NVIDIA-A100-SXM4-80GB"
    assert labels[GFD_MEMORY] == "81091"  # MiB: the memory the profile (and torch) see on an 80 GB A100
    assert labels[PROFILE_LABEL] == "llama3-8b-a100" and labels[FLEET_LABEL] == "sim"
    assert labels["kubernetes.io/hostname"] == "sim-llama3-8b-a100-0"

    status = node_status("n", Pool.parse("llama3-8b-l4:1:4"), "127.5.0.1", "v1.35.4", (True, NOW), NOW)
    assert status["capacity"]["nvidia.com/gpu"] == status["allocatable"]["nvidia.com/gpu"] == "4"
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert status["nodeInfo"]["kubeletVersion"] == "v1.35.4"
    assert {"type": "InternalIP", "address": "127.5.0.1"} in status["addresses"]
    down = node_status("n", Pool.parse("llama3-8b-l4"), "127.5.0.1", "v1", (False, NOW), NOW)
    ready = {c["type"]: c for c in down["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    assert "vllm-autotuner sim fleet" in ready["message"]


def test_lease_is_owned_by_its_node():
    body = lease("sim-x-0", "uid-1", NOW)
    assert body["metadata"]["namespace"] == "kube-node-lease"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "sim-x-0", "uid": "uid-1"}
    ]
    assert body["spec"] == {
        "holderIdentity": "sim-x-0",
        "leaseDurationSeconds": 40,
        "renewTime": "2025-06-01T12:00:00.000000Z",
    }


def test_scrape_target_carries_what_kubernetes_service_discovery_would():
    pod = {
        "metadata": {
            "namespace": "llm",
            "name": "llama-7d9f-x2x4q",
            "labels": {"app": "llama", "app.kubernetes.io/name": "vllm", "pod-template-hash": "7d9f"},
        }
    }
    assert scrape_target(pod, "127.9.1.1:8000", "vllm") == {
        "targets": ["127.9.1.1:8000"],
        "labels": {
            "__meta_kubernetes_namespace": "llm",
            "__meta_kubernetes_pod_name": "llama-7d9f-x2x4q",
            "__meta_kubernetes_pod_container_name": "vllm",
            "__meta_kubernetes_pod_label_app": "llama",
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "vllm",
            "__meta_kubernetes_pod_label_pod_template_hash": "7d9f",
        },
    }


def test_addresses_are_fresh_and_skip_taken_ones():
    pool = AddressPool(201)
    assert pool.host_address(0) == "127.201.0.1"
    first, sock = pool.take(None)
    assert first == "127.201.1.1" and sock is None
    squatter = socket.socket()
    squatter.bind(("127.201.1.2", 0))
    port = squatter.getsockname()[1]
    try:
        address, sock = pool.take(port)
        assert address == "127.201.1.3" and sock is not None and sock.getsockname() == (address, port)
        sock.close()
    finally:
        squatter.close()
    taken = [pool.take(None)[0] for _ in range(260)]
    assert len(set(taken)) == 260 and not any(a.endswith((".0", ".255")) for a in taken)


def pod(name, ip, ready=True, args=("--port", "8001"), deleting=False):
    return {
        "metadata": {"name": name, **({"deletionTimestamp": "2025-01-01T00:00:00Z"} if deleting else {})},
        "spec": {"containers": [{"name": "vllm", "command": ["vllm", "serve", "m"], "args": list(args)}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_load_uses_ready_loopback_pods_at_vllms_port():
    urls, warnings = endpoints(
        [
            pod("b", "127.9.1.2"),
            pod("a", "127.9.1.1", args=()),
            pod("c", "127.9.1.3", ready=False),
            pod("d", "127.9.1.4", deleting=True),
            pod("e", "10.0.0.5"),
            pod("f", None),
        ]
    )
    assert urls == ["http://127.9.1.1:8000", "http://127.9.1.2:8001"]
    assert warnings == ["e: podIP 10.0.0.5 is not a loopback address; sim load drives only the simulated fleet's pods"]


def test_scenarios_take_the_main_rate():
    steady = build_scenario("steady", 2.0, "rag", hours=1).generate(0)
    assert 6000 < len(steady) < 8400 and steady.prompt_tokens.mean() > 3000
    for name in ("bursty", "chat-rag-shift", "diurnal"):
        assert build_scenario(name, 1.0, "chat", hours=24).duration == 24 * 3600
    with pytest.raises(ValueError, match="unknown scenario"):
        build_scenario("flat", 1.0, "chat", hours=1)
