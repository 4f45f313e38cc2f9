"""Helpers for the tests that run against the real servers.

Those servers work asynchronously (controllers, the scheduler, Prometheus
scrapes), so a test waits for a condition with :func:`wait_for`, never with a
fixed sleep: it is as fast as the servers allow and, when it fails, says what
it waited for and what it last saw.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest

from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.fleet import FLEET_LABEL, PROFILE_LABEL
from vllm_autotuner.sim.podlaunch import vllm_launch
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.startup import StartupOutcome, check_startup

T = TypeVar("T")

CRD_NAME = "vllmtunings.autotuner.vllm-tuning.io"
CRD_FILE = localenv.ROOT / "crds" / f"{CRD_NAME}.yaml"
FLEET_POOLS = ("llama3-8b-h100:4", "llama3-8b-l4:1")
"""The session fleet's nodes: H100s for rollouts with a surge pod, an L4 for
budgets that do not fit its memory."""
FLEET_TIME_SCALE = 0.05
"""A vLLM start-up of 100 s takes 5 s."""
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
H100, L4 = "llama3-8b-h100", "llama3-8b-l4"
HEALTH = {"httpGet": {"path": "/health", "port": 8000}}


def wait_for(predicate: Callable[[], T], timeout: float, description: str) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    On timeout the test fails with ``description`` and the last value (or
    exception) the predicate produced.
    """
    try:
        return localenv.wait_until(predicate, timeout, description)
    except TimeoutError as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclass
class Cluster:
    """The session's control plane, as a test sees it."""

    kubeconfig: Path
    api: kubernetes.client.ApiClient

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run the project's ``bin/kubectl`` (never one found on PATH) against this cluster.

        With ``check`` a non-zero exit fails the test, showing stderr.
        """
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), KUBERC="off")
        result = subprocess.run([str(localenv.KUBECTL), *args], env=env, input=stdin,
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}", pytrace=False)
        return result


class NotYet(str):
    """A falsy answer for ``wait_for`` that says what is still missing (shown on timeout)."""

    def __bool__(self) -> bool:
        return False


def vllm_container(args: list[str]) -> dict[str, Any]:
    """A vLLM container as a platform team writes one: probes on /health, one GPU."""
    return {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve", MODEL],
        "args": args,
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": {**HEALTH, "periodSeconds": 10, "failureThreshold": 60},
        "readinessProbe": {**HEALTH, "periodSeconds": 5},
        "livenessProbe": {**HEALTH, "periodSeconds": 10},
    }


def vllm_deployment(name: str, profile: str, args: list[str], replicas: int = 2) -> dict[str, Any]:
    """A vLLM Deployment pinned to the fleet's nodes of ``profile``."""
    labels = {"app": name, "app.kubernetes.io/name": "vllm"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {PROFILE_LABEL: profile, FLEET_LABEL: "sim"},
                    "containers": [vllm_container(args)],
                },
            },
        },
    }


def expected_startup(profile: str, args: list[str]) -> StartupOutcome:
    """What the fleet should make of these args on this profile."""
    p = get_profile(profile)
    return check_startup(p, vllm_launch(vllm_container(args), p).config, time_scale=FLEET_TIME_SCALE)


def is_ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
