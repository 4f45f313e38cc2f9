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
from typing import TypeVar

import kubernetes
import pytest

from vllm_autotuner.sim import localenv

T = TypeVar("T")

CRD_NAME = "vllmtunings.autotuner.vllm-tuning.io"
CRD_FILE = localenv.ROOT / "crds" / f"{CRD_NAME}.yaml"
FLEET_POOLS = ("llama3-8b-h100:4", "llama3-8b-l4:1")
"""The session fleet's nodes: H100s for rollouts with a surge pod, an L4 for
budgets that do not fit its memory."""
FLEET_TIME_SCALE = 0.05
"""A vLLM start-up of 100 s takes 5 s."""


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
