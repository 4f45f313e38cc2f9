"""What the tests of the chart, the plain manifests and the operator's RBAC share.

The README's install commands are read from the README itself, so the
commands users copy are the ones the tests run.
"""

from __future__ import annotations

import copy
import shlex

import yaml

from vllm_autotuner.sim import localenv

README = localenv.ROOT / "README.md"
DEPLOY = localenv.ROOT / "deploy"
#: Release name and namespace the README's commands install into.
INSTALLED = "vllm-autotuner"
#: Labels Helm adds for its own bookkeeping; the plain manifests leave them out.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def readme_command(program: str) -> list[str]:
    """The arguments of the one ``program ...`` line in the README's Install section.

    Arguments that name a path in the repository are made absolute, so the
    command runs from any working directory.
    """
    section = README.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    (line,) = [line for line in section.splitlines() if line.startswith(f"{program} ")]
    return [str(localenv.ROOT / arg) if "/" in arg and (localenv.ROOT / arg).exists() else arg
            for arg in shlex.split(line)[1:]]


def without_helm_labels(obj: dict) -> dict:
    """``obj`` without Helm's bookkeeping labels (on the object and on a pod template)."""
    obj = copy.deepcopy(obj)
    templates = [obj.get("spec", {}).get("template", {})]
    for meta in (obj["metadata"], *(t.get("metadata", {}) for t in templates)):
        for label in HELM_LABELS:
            meta.get("labels", {}).pop(label, None)
    return obj


def as_yaml(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects)


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
