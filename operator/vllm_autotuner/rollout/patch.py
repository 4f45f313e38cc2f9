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

from datetime import datetime
from typing import Any

from vllm_autotuner.api import GROUP, Knobs
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.knobs import EngineArgs, find_vllm_container, set_knobs

#: Pod-template annotations written with every change: which config, why, by whom.
KNOBS_ANNOTATION = f"{GROUP}/knobs"
REASON_ANNOTATION = f"{GROUP}/reason"
TUNING_ANNOTATION = f"{GROUP}/tuning"
SOURCE_ANNOTATION = f"{GROUP}/source"
#: When the operator wrote them (the evaluation's clock, as the status's times are). It lives in the pod template
#: with the others, so ``kubectl rollout undo`` or a GitOps revert puts back an old time with old knobs.
WRITTEN_AT_ANNOTATION = f"{GROUP}/written-at"
#: Longest reason kept in the annotation; the full text is in status and Events.
REASON_LIMIT = 512


def knobs_annotation(knobs: Knobs) -> str:
    return f"maxNumBatchedTokens={knobs.max_num_batched_tokens},maxNumSeqs={knobs.max_num_seqs}"


def knob_patch(deployment: dict[str, Any], container_name: str | None, knobs: Knobs, reason: str, tuning: str,
               source: str, at: datetime) -> dict[str, Any]:
    """The strategic-merge patch that sets ``knobs`` on the live ``deployment``, written at ``at``.

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
                        WRITTEN_AT_ANNOTATION: utc_timestamp(at),
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


def unrecorded_write(deployment: dict[str, Any], knobs: Knobs, tuning: str, after: datetime) -> datetime | None:
    """When VllmTuning ``tuning`` wrote the template's knobs, if that was after ``after``, the latest change its
    status knows of: a patch whose status write was lost (the operator restarted in between). None otherwise.

    Anything else is a person's change: knobs or a tuning other than the annotations say, and also our own
    annotations with a time not after ``after``, which is an old template put back (``kubectl rollout undo``,
    a GitOps revert, an old manifest applied again). Annotations without a time, written by an operator
    before it stamped its writes, cannot tell the two apart and count as a person's: adopting our own lost
    write as Manual costs one cooldown, while resuming a person's undo as ours would fight it.
    """
    annotations = _annotations(deployment)
    if annotations.get(KNOBS_ANNOTATION) != knobs_annotation(knobs) or annotations.get(TUNING_ANNOTATION) != tuning:
        return None
    try:
        written_at = datetime.fromisoformat(annotations.get(WRITTEN_AT_ANNOTATION, ""))
    except ValueError:
        return None
    return written_at if written_at.tzinfo is not None and written_at > after else None


def written_reason(deployment: dict[str, Any]) -> tuple[str, str]:
    """(source, reason) the operator annotated its last change with."""
    annotations = _annotations(deployment)
    return annotations.get(SOURCE_ANNOTATION, ""), annotations.get(REASON_ANNOTATION, "")
