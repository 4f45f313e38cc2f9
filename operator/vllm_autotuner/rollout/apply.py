"""Apply a knob change to a Deployment safely: conditional write, retry on conflict, never mid-rollout.

The patch carries the resourceVersion it was built from; a 409 means the
Deployment changed underneath (a person, GitOps, the HPA), so it is re-read
and the patch rebuilt from the fresh object rather than forced, unless the
Deployment was re-created, paused or resumed, or what changed is the vLLM
container itself: the decision was made from its command
line, and a person's or a GitOps tool's edit of it is theirs to keep, for the
next evaluation to read and adopt (a write over it would count as no revert
and would fight them unseen). A Deployment that is rolling for any reason is
left alone: one rollout at a time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from vllm_autotuner.api import Knobs
from vllm_autotuner.knobs import CommandLineError, find_vllm_container
from vllm_autotuner.rollout.patch import knob_patch, undo_patch
from vllm_autotuner.rollout.progress import rollout_in_progress

ATTEMPTS = 3


class DeploymentApi(Protocol):
    """The two calls this needs (``controller.kube.Kube`` provides them). Both return the Deployment as the
    apiserver serves it, as the watches see it: a rollback re-read after a conflict compares its pod template field
    by field with a ReplicaSet's (``patch.undo_patch``)."""

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any]: ...

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...


class RolloutBusy(Exception):
    """The Deployment is already rolling out, or its vLLM container changed since it was read; nothing was
    patched."""


class ConflictUnread(Exception):
    """The patch was refused (409: the Deployment changed since it was read) and the Deployment could not be read
    again to build it anew; nothing was patched (unlike a patch that got no answer, which may have landed)."""


def apply_knobs(kube: DeploymentApi, deployment: dict[str, Any], container: str | None, knobs: Knobs, reason: str,
                tuning: str, source: str, at: datetime, during_rollout: bool = False,
                previous: dict[str, Any] | None = None, verdict: str | None = None,
                baseline: str | None = None) -> dict[str, Any]:
    """Patch ``deployment`` (as last seen) to ``knobs`` at ``at``; returns the patched Deployment.

    ``during_rollout`` is for rolling back our own failed rollout, which is by
    definition still in progress. ``previous``, for a rollback, is the pod
    template of the ReplicaSet our change replaced: put back exactly when
    our change is all that differs (``patch.undo_patch``); ``verdict``, the
    judgement of the rollout it rolls back (RolloutFailed, RolloutBlocked),
    is annotated with it (``patch.VERDICT_ANNOTATION``); ``baseline``, a
    change's regression baseline (``patch.baseline_annotation``), too. Raises
    RolloutBusy, ConflictUnread, CommandLineError (args unreadable), or
    ApiException or HTTPError from the patch.
    """
    namespace, name = deployment["metadata"]["namespace"], deployment["metadata"]["name"]
    current = deployment
    for attempt in range(ATTEMPTS):
        if rollout_in_progress(current) and not during_rollout:
            raise RolloutBusy(f"Deployment {namespace}/{name} is already rolling out; not patching")
        if current is not deployment and (changed := _changed(deployment, current, container)):
            raise RolloutBusy(f"Deployment {namespace}/{name} {changed} since it was read; not patching: the next "
                              f"evaluation reads the change")
        try:
            undo = undo_patch(current, container, previous, knobs, reason, tuning, at, verdict) if previous else None
            patch = undo or knob_patch(current, container, knobs, reason, tuning, source, at, verdict, baseline)
            return kube.patch_deployment(namespace, name, patch)
        except ApiException as exc:
            if exc.status != 409 or attempt == ATTEMPTS - 1:
                raise
            try:
                current = kube.read_deployment(namespace, name)
            except (ApiException, HTTPError) as unread:
                why = f"{unread.status} {unread.reason}" if isinstance(unread, ApiException) else str(unread)
                raise ConflictUnread(f"Deployment {namespace}/{name} changed while it was patched (409 Conflict) and "
                                     f"could not be read again ({why}); nothing was patched: the next evaluation "
                                     f"reads it and decides again") from unread
    raise AssertionError("unreachable")


def _changed(read: dict[str, Any], now: dict[str, Any], container: str | None) -> str:
    """What changed since ``read`` (the Deployment the decision was made from) in ``now`` that the decision
    depends on, in words; empty when nothing did."""
    if now["metadata"].get("uid") != read["metadata"].get("uid"):
        return "was re-created"
    if bool(now["spec"].get("paused")) != bool(read["spec"].get("paused")):
        return "was paused" if now["spec"].get("paused") else "was resumed"
    if _vllm_container(now, container) != _vllm_container(read, container):
        return "had its vLLM container changed"
    return ""


def _vllm_container(deployment: dict[str, Any], container: str | None) -> dict[str, Any] | None:
    """The vLLM container of the Deployment's pod template (None when it cannot be found: ``knob_patch`` says
    why)."""
    try:
        return find_vllm_container(deployment["spec"]["template"]["spec"], container)
    except CommandLineError:
        return None
