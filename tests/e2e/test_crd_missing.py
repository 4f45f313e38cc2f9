"""The operator started before its CRD, or on an older one: it says so and exits, so that its pod restarts until
the CRD is there, and as new as the operator.

kopf resolves the VllmTuning resource once, at start-up (the operator may not
watch CRDs); started without the CRD it would never watch a VllmTuning while
/healthz said ok. On a CRD older than the operator (``helm upgrade`` never
upgrades a chart's crds/) the apiserver would drop the fields the CRD lacks
from every status write. A control plane of its own, without the CRD or with
an older one, shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
import yaml
from tests.support import CRD_FILE, CRD_NAME, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e


def _exit_of_the_operator(control_plane: localenv.ControlPlane, log: Path) -> int:
    """Run the operator on ``control_plane`` until it exits (within a minute), its output into ``log``."""
    args = [sys.executable, "-m", "vllm_autotuner.cli", "run", "--prometheus-url=http://127.0.0.1:9",
            "--namespace=default", "--http-host=127.0.0.1", f"--http-port={localenv.free_port()}",
            "--lease-namespace=default"]
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, KUBECONFIG=str(control_plane.kubeconfig)))
    try:
        wait_for(lambda: process.poll() is not None, 60, "the operator to exit")
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode


def test_the_operator_exits_with_what_to_do_when_the_crd_is_not_installed(tmp_path: Path) -> None:
    control_plane = localenv.start_control_plane(tmp_path / "testenv")
    try:
        log = tmp_path / "operator.log"
        assert _exit_of_the_operator(control_plane, log) == 2, log.read_text()
        assert "install the CRD first" in log.read_text()
    finally:
        control_plane.stop()


def test_the_operator_exits_with_what_to_do_when_the_crd_is_older_than_it(tmp_path: Path) -> None:
    older = yaml.safe_load(CRD_FILE.read_text())
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["learned"]
    control_plane = localenv.start_control_plane(tmp_path / "testenv")
    try:
        with kubernetes.config.new_client_from_config(str(control_plane.kubeconfig)) as api:
            extensions = kubernetes.client.ApiextensionsV1Api(api)
            extensions.create_custom_resource_definition(older)
            wait_for(lambda: any(c.type == "Established" and c.status == "True"
                                 for c in extensions.read_custom_resource_definition(CRD_NAME).status.conditions
                                 or []), 60, f"CRD {CRD_NAME} to be Established")
        log = tmp_path / "operator.log"
        assert _exit_of_the_operator(control_plane, log) == 2, log.read_text()
        said = log.read_text()
        assert f"the installed CRD {CRD_NAME} is older than this operator: it lacks status.learned," in said, said
        assert "kubectl apply --server-side --force-conflicts -f charts/vllm-autotuner/crds/" in said
    finally:
        control_plane.stop()
