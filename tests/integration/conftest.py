"""Fixtures of the packaging tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vllm_autotuner.sim import localenv

INSTALL = localenv.ROOT / "hack" / "install-operator.sh"


@pytest.fixture(scope="session")
def operator_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the operator installed the way the image's build stage installs it."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    result = subprocess.run([str(INSTALL), str(venv)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"{INSTALL.name} exited {result.returncode}:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return venv
