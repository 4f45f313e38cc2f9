"""Pure builders of the Deployment patch that changes the knobs.

A knob change must touch nothing but the knob tokens of the vLLM container
and a few annotations, so a person's or a GitOps tool's other edits survive.
The patch is a strategic-merge patch keyed by container name (only that
container's ``command``/``args`` are replaced, rebuilt from the live object
by ``knobs.set_knobs``), and it carries the ``resourceVersion`` the args were
read at: the API server answers 409 Conflict if anyone changed the Deployment
in between, and the caller re-reads and rebuilds instead of overwriting.
"""

from __future__ import annotations

from typing import Any

from vllm_autotuner.api import GROUP, Knobs
from vllm_autotuner.knobs import EngineArgs, find_vllm_container, set_knobs

#: Pod-template annotations written with every change: which config, why, by whom.
KNOBS_ANNOTATION = f"{GROUP}/knobs"
REASON_ANNOTATION = f"{GROUP}/reason"
TUNING_ANNOTATION = f"{GROUP}/tuning"
SOURCE_ANNOTATION = f"{GROUP}/source"
#: Longest reason kept in the annotation; the full text is in status and Events.
REASON_LIMIT = 512


def knobs_annotation(knobs: Knobs) -> str:
    return f"maxNumBatchedTokens={knobs.max_num_batched_tokens},maxNumSeqs={knobs.max_num_seqs}"


def knob_patch(deployment: dict[str, Any], container_name: str | None, knobs: Knobs, reason: str, tuning: str,
               source: str) -> dict[str, Any]:
    """The strategic-merge patch that sets ``knobs`` on the live ``deployment``.

    Raises ``knobs.CommandLineError`` when the vLLM container or its flags cannot be read.
    """
    template = deployment["spec"]["template"]
    container = find_vllm_container(template["spec"], container_name)
    updated = set_knobs(container, knobs)
    patched_container: dict[str, Any] = {"name": container["name"]}
    for key in ("command", "args"):
        if key in updated:
            patched_container[key] = updated[key]
    return {
        "metadata": {"resourceVersion": deployment["metadata"]["resourceVersion"]},
        "spec": {
            "template": {
                "metadata": {
                    "annotations": {
                        KNOBS_ANNOTATION: knobs_annotation(knobs),
                        REASON_ANNOTATION: reason[:REASON_LIMIT],
                        TUNING_ANNOTATION: tuning,
                        SOURCE_ANNOTATION: source,
                    }
                },
                "spec": {"containers": [patched_container]},
            }
        },
    }


def template_engine_args(deployment: dict[str, Any], container_name: str | None) -> EngineArgs:
    """The engine flags in the Deployment's pod template (what new pods will run with)."""
    container = find_vllm_container(deployment["spec"]["template"]["spec"], container_name)
    return EngineArgs.from_container(container)


def _annotations(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"].get("metadata", {}).get("annotations") or {}


def written_by_operator(deployment: dict[str, Any], knobs: Knobs, tuning: str) -> bool:
    """Whether the template's knobs are the ones VllmTuning ``tuning`` last wrote (else a person, or another
    tuning, changed them)."""
    annotations = _annotations(deployment)
    return annotations.get(KNOBS_ANNOTATION) == knobs_annotation(knobs) and annotations.get(TUNING_ANNOTATION) == tuning


def written_reason(deployment: dict[str, Any]) -> tuple[str, str]:
    """(source, reason) the operator annotated its last change with."""
    annotations = _annotations(deployment)
    return annotations.get(SOURCE_ANNOTATION, ""), annotations.get(REASON_ANNOTATION, "")
