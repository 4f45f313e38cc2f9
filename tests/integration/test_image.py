"""The image's install command, run on a clean virtualenv: the operator and nothing else.

No container engine runs here, so this runs what the Dockerfile's build stage
runs (hack/install-operator.sh) and then the entry point; tests/unit checks
that the Dockerfile does run that script. The operator started from this
virtualenv is also the one tests/integration/test_operator_rbac.py runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from tests.support import CRD_FILE

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration


def run(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)


def normalized(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_entry_point_and_the_crd_command_run(operator_venv: Path) -> None:
    help_ = run(operator_venv, "vllm-autotuner", "run", "--help")
    assert help_.returncode == 0, help_.stderr
    for flag in ("--prometheus-url", "--namespace", "--lease-name", "--no-leader-election", "--log-format"):
        assert flag in help_.stdout
    crd = run(operator_venv, "vllm-autotuner", "crd")
    assert crd.returncode == 0 and crd.stdout == CRD_FILE.read_text()


def test_only_the_runtime_dependencies_are_installed(operator_venv: Path) -> None:
    project = tomllib.loads((localenv.ROOT / "pyproject.toml").read_text())["project"]
    listed = run(operator_venv, "pip", "list", "--format=json")
    installed = {normalized(p["name"]) for p in json.loads(listed.stdout)}
    assert {normalized(r) for r in project["dependencies"]} <= installed
    extras = {normalized(r) for group in project["optional-dependencies"].values() for r in group} - {"vllm-autotuner"}
    assert extras & installed == set(), "the image must not carry the sim or test extras"
    assert run(operator_venv, "python", "-c", "import numpy").returncode != 0
