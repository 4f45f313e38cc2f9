"""The operator started before its CRD: it says so and exits, so that its pod restarts until the CRD is there.

kopf resolves the VllmTuning resource once, at start-up (the operator may not
watch CRDs); started without the CRD it would never watch a VllmTuning while
/healthz said ok. A control plane of its own, without the CRD, shows it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support import wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e


def test_the_operator_exits_with_what_to_do_when_the_crd_is_not_installed(tmp_path: Path) -> None:
    control_plane = localenv.start_control_plane(tmp_path / "testenv")
    try:
        log = tmp_path / "operator.log"
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
        assert process.returncode == 2, log.read_text()
        assert "install the CRD first" in log.read_text()
    finally:
        control_plane.stop()
