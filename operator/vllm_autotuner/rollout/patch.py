"""Pure builders of the Deployment patch that changes the knobs.

A knob change must touch nothing but the knob tokens of the vLLM container
and a few annotations, so a person's or a GitOps tool's other edits survive.
A rollback of our own change puts back the previous ReplicaSet's pod
template exactly, as ``kubectl rollout undo`` does, when our change is all
that differs (``undo_patch``): the Deployment controller then scales that
ReplicaSet back up, so pods still running the old config are not restarted
(a new template, if only in its annotations, is a new ReplicaSet and a
restart of every pod). Its annotations go on the Deployment itself.
The patch is a strategic-merge patch keyed by container name (only that
container's ``command``/``args`` are replaced, rebuilt from the live object
by ``knobs.set_knobs``), and it carries the ``resourceVersion`` the args were
read at: the API server answers 409 Conflict if anyone changed the Deployment
in between, and the caller re-reads and rebuilds instead of overwriting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import copy
import json
import math

from vllm_autotuner import FIELD_MANAGER
from vllm_autotuner.api import GROUP, Knobs, KnobSource
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.knobs import CommandLineError, EngineArgs, find_vllm_container, set_knobs

#: Pod-template annotations written with every change: which config, why, by whom.
KNOBS_ANNOTATION = f"{GROUP}/knobs"
REASON_ANNOTATION = f"{GROUP}/reason"
TUNING_ANNOTATION = f"{GROUP}/tuning"
SOURCE_ANNOTATION = f"{GROUP}/source"
#: When the operator wrote them (the evaluation's clock, as the status's times are). It lives in the pod template
#: with the others, so ``kubectl rollout undo`` or a GitOps revert puts back an old time with old knobs.
WRITTEN_AT_ANNOTATION = f"{GROUP}/written-at"
#: On the rollback of a rollout judged failed or unable to start its pods, that verdict (RolloutFailed,
#: RolloutBlocked), and beside it what went wrong (the vLLM error, why no pod started; none before chart 0.5.56,
#: and apart, as an operator before it reads the verdict whole); absent on other writes. A status write lost
#: after the rollback is recovered from them: a config whose pods found no GPU is not recorded as failed, and one
#: that failed is recorded with its error.
VERDICT_ANNOTATION = f"{GROUP}/verdict"
VERDICT_MESSAGE_ANNOTATION = f"{GROUP}/verdict-message"
#: On a change the decision core measured a baseline for, that baseline, as JSON: the regime, the attainment and
#: the requests per second per pod of the window before it (``Rollout.regime``, ``baselineAttainment``,
#: ``baselineRequestRate``). A status write lost after the change (an operator restarted, a write the apiserver
#: committed after its timeout) is recovered with it, and the rollout checked for a regression all the same.
BASELINE_ANNOTATION = f"{GROUP}/baseline"
#: Longest reason kept in the annotation; the full text is in status and Events.
REASON_LIMIT = 512
#: Longest baseline annotation read back (ours is under 200 characters), and longest regime name in it (a tier's).
BASELINE_LIMIT = 1024
REGIME_LIMIT = 63


def knobs_annotation(knobs: Knobs) -> str:
    return f"maxNumBatchedTokens={knobs.max_num_batched_tokens},maxNumSeqs={knobs.max_num_seqs}"


_STAMP = (KNOBS_ANNOTATION, REASON_ANNOTATION, TUNING_ANNOTATION, SOURCE_ANNOTATION, WRITTEN_AT_ANNOTATION,
          VERDICT_ANNOTATION, VERDICT_MESSAGE_ANNOTATION, BASELINE_ANNOTATION)
#: The fields of the vLLM container a knob change rewrites.
_COMMAND = ("command", "args")
#: The label the Deployment controller adds to a ReplicaSet's copy of the pod template.
TEMPLATE_HASH_LABEL = "pod-template-hash"


def split_verdict(text: str) -> tuple[str, str]:
    """A verdict as written ``<reason>: <what went wrong>`` (as a rollout awaiting its verdict keeps it while its
    rollback cannot be written, and as a rollback's annotations read back: ``written_reason``): the reason
    (RolloutFailed, RolloutBlocked) and what went wrong, empty where unknown."""
    reason, _, message = text.partition(": ")
    return reason, message


def _stamp(knobs: Knobs, reason: str, tuning: str, source: str, at: datetime, verdict: str | None,
           baseline: str | None = None) -> dict[str, str | None]:
    """The annotations of a write of ours: which config, why, by whom, when, after which verdict (``split_verdict``'s
    text) and against which baseline (None removes one a write before left)."""
    judged, why = split_verdict(verdict or "")
    return dict(zip(_STAMP, (knobs_annotation(knobs), reason[:REASON_LIMIT], tuning, source, utc_timestamp(at),
                             judged or None, why[:REASON_LIMIT] or None, baseline), strict=True))


def baseline_annotation(regime: str | None, attainment: float | None, request_rate: float | None) -> str | None:
    """``BASELINE_ANNOTATION``'s value for a change with this baseline; None without one."""
    if attainment is None:
        return None
    baseline = {"regime": regime, "baselineAttainment": round(attainment, 6),
                "baselineRequestRate": None if request_rate is None else round(request_rate, 6)}
    return json.dumps(baseline, separators=(",", ":"))


def _patch(deployment: dict[str, Any], container: str, command: dict[str, Any], template_annotations: dict[str, Any],
           annotations: dict[str, str | None] | None = None) -> dict[str, Any]:
    """A strategic-merge patch of the vLLM container's ``command``/``args`` (None deletes one) and of annotations,
    conditional on the resourceVersion read."""
    metadata: dict[str, Any] = {"resourceVersion": deployment["metadata"]["resourceVersion"]}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"template": {"metadata": {"annotations": template_annotations},
                                                        "spec": {"containers": [{"name": container, **command}]}}}}


def knob_patch(deployment: dict[str, Any], container_name: str | None, knobs: Knobs, reason: str, tuning: str,
               source: str, at: datetime, verdict: str | None = None, baseline: str | None = None) -> dict[str, Any]:
    """The strategic-merge patch that sets ``knobs`` on the live ``deployment``, written at ``at`` (after
    ``verdict``, for a rollback of a rollout judged so; against ``baseline``, ``baseline_annotation``'s).

    Raises ``knobs.CommandLineError`` when the vLLM container or its flags cannot be read.
    """
    container = find_vllm_container(deployment["spec"]["template"]["spec"], container_name)
    updated = set_knobs(container, knobs)
    command = {key: updated[key] for key in _COMMAND if key in updated}
    return _patch(deployment, container["name"], command, _stamp(knobs, reason, tuning, source, at, verdict, baseline))


def undo_patch(deployment: dict[str, Any], container_name: str | None, previous: dict[str, Any], knobs: Knobs,
               reason: str, tuning: str, at: datetime, verdict: str | None = None) -> dict[str, Any] | None:
    """The patch that rolls ``deployment`` back to ``previous``, a ReplicaSet's pod template that ran ``knobs``,
    exactly (its knob flags and annotations back), stamped on the Deployment's own annotations; None unless the
    live template is ``previous`` with its knobs set by ``knob_patch`` (anything else changed since, by anyone,
    is not ours to put back)."""
    before = _without(previous, "labels", (TEMPLATE_HASH_LABEL,))
    live = deployment["spec"]["template"]
    try:
        old = find_vllm_container(before["spec"], container_name)
        new = find_vllm_container(live["spec"], container_name)
        was, now = EngineArgs.from_container(old), EngineArgs.from_container(new)
    except CommandLineError:
        return None
    if was.max_num_batched_tokens not in (None, knobs.max_num_batched_tokens) or was.max_num_seqs not in (
            None, knobs.max_num_seqs) or now.max_num_batched_tokens is None or now.max_num_seqs is None:
        return None  # a knob the old template sets (one it leaves to vLLM ran as the status knew) is not ``knobs``
    forward = set_knobs(old, Knobs(max_num_batched_tokens=now.max_num_batched_tokens, max_num_seqs=now.max_num_seqs))
    redone = copy.deepcopy(before)
    find_vllm_container(redone["spec"], container_name).update(
        {key: value for key, value in forward.items() if key in _COMMAND})
    if _without(redone, "annotations", _STAMP) != _without(live, "annotations", _STAMP):
        return None
    command = {key: old.get(key) for key in _COMMAND if key in old or key in new}
    restored = (before.get("metadata") or {}).get("annotations") or {}
    return _patch(deployment, new["name"], command, {key: restored.get(key) for key in _STAMP},
                  _stamp(knobs, reason, tuning, KnobSource.ROLLBACK, at, verdict))


def _without(template: dict[str, Any], field: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``template`` without ``keys`` in its metadata's ``field`` (labels or annotations; a map left
    empty counts as none, as the apiserver's comparison of templates does)."""
    out = copy.deepcopy(template)
    metadata = out.setdefault("metadata", {})
    kept = {k: v for k, v in (metadata.pop(field, None) or {}).items() if k not in keys}
    if kept:
        metadata[field] = kept
    return out


def template_engine_args(deployment: dict[str, Any], container_name: str | None) -> EngineArgs:
    """The engine flags in the Deployment's pod template (what new pods will run with)."""
    container = find_vllm_container(deployment["spec"]["template"]["spec"], container_name)
    return EngineArgs.from_container(container)


def _written_at(annotations: dict[str, str]) -> datetime | None:
    try:
        written_at = datetime.fromisoformat(annotations.get(WRITTEN_AT_ANNOTATION, ""))
    except ValueError:
        return None
    return written_at if written_at.tzinfo is not None else None


def _last_stamp(deployment: dict[str, Any]) -> dict[str, str]:
    """The annotations of our latest write: the pod template's (a change), or the Deployment's own (an undo)
    when they are newer."""
    stamps = [deployment["spec"]["template"].get("metadata", {}).get("annotations") or {},
              deployment["metadata"].get("annotations") or {}]
    dated = [(at, stamp) for stamp in stamps if (at := _written_at(stamp)) is not None]
    return max(dated, key=lambda pair: pair[0])[1] if dated else stamps[0]


def last_written(deployment: dict[str, Any]) -> datetime | None:
    """When the operator last wrote ``deployment`` (a change or an undo), the start of its rollout; None when
    nothing it wrote carries a time."""
    return _written_at(_last_stamp(deployment))


def unrecorded_write(deployment: dict[str, Any], knobs: Knobs, tuning: str, after: datetime) -> datetime | None:
    """When VllmTuning ``tuning`` wrote the template's knobs, if that was after ``after``, the latest change its
    status knows of: a patch whose status write was lost (the operator restarted in between). None otherwise.

    Anything else is a person's change: knobs or a tuning other than the annotations say, and also our own
    annotations with a time not after ``after``, which is an old template put back (``kubectl rollout undo``,
    a GitOps revert, an old manifest applied again). Annotations without a time, written by an operator
    before it stamped its writes, cannot tell the two apart and count as a person's: adopting our own lost
    write as Manual costs one cooldown, while resuming a person's undo as ours would fight it.
    """
    annotations = _last_stamp(deployment)
    if annotations.get(KNOBS_ANNOTATION) != knobs_annotation(knobs) or annotations.get(TUNING_ANNOTATION) != tuning:
        return None
    written_at = _written_at(annotations)
    return written_at if written_at is not None and written_at > after else None


def written_baseline(deployment: dict[str, Any]) -> dict[str, Any]:
    """The baseline the operator annotated its last change with, as ``decision.with_rollout``'s keyword arguments
    (``regime``, ``baseline_attainment``, ``baseline_request_rate``); none where it has none, or one that does not
    read as such (edited by hand: longer than ours can be, not JSON, numbers out of range, a regime name longer
    than a tier's)."""
    raw = _last_stamp(deployment).get(BASELINE_ANNOTATION) or "null"
    if len(raw) > BASELINE_LIMIT:
        return {}
    try:
        found = json.loads(raw)
        if not isinstance(found, dict):
            return {}
        regime, attainment, rate = (found.get(key) for key in ("regime", "baselineAttainment", "baselineRequestRate"))
        numbers = (attainment,) if rate is None else (attainment, rate)
        if any(isinstance(n, bool) or not isinstance(n, int | float) for n in numbers):
            return {}
        attainment, rate = float(attainment), None if rate is None else float(rate)
    except (ValueError, RecursionError, OverflowError):
        return {}
    if not (regime is None or isinstance(regime, str) and len(regime) <= REGIME_LIMIT):
        return {}
    if not 0 <= attainment <= 1 or (rate is not None and not 0 <= rate < math.inf):
        return {}
    return {"regime": regime, "baseline_attainment": attainment, "baseline_request_rate": rate}


def written_reason(deployment: dict[str, Any]) -> tuple[str, str, str]:
    """(source, reason, verdict) the operator annotated its last change with; the verdict, ``<reason>: <what went
    wrong>`` (``split_verdict``; the reason alone when written before chart 0.5.56), is empty but on the rollback of
    a rollout judged failed or blocked."""
    annotations = _last_stamp(deployment)
    verdict, why = annotations.get(VERDICT_ANNOTATION) or "", annotations.get(VERDICT_MESSAGE_ANNOTATION) or ""
    return (annotations.get(SOURCE_ANNOTATION, ""), annotations.get(REASON_ANNOTATION, ""),
            f"{verdict}: {why}" if verdict and why else verdict)


#: A container's fields that hold vLLM's command line, as ``metadata.managedFields`` names them.
_COMMAND_LINE = ("f:args", "f:command")


def _command_lines(entry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Of a managedFields entry, the pod template's containers whose args or command it owns, cut to those."""
    fields: Any = entry.get("fieldsV1") or {}
    for step in ("f:spec", "f:template", "f:spec", "f:containers"):
        fields = (fields.get(step) or {}) if isinstance(fields, Mapping) else {}
    owned = {key: {name: {} for name in _COMMAND_LINE if name in held} for key, held in fields.items()
             if isinstance(held, Mapping)}
    return {key: names for key, names in owned.items() if names}


def command_line_owners(managed_fields: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The ``metadata.managedFields`` entries that own a pod-template container's args or command, each cut to
    that, its manager, operation and time: all of a Deployment's write history the operator reads
    (``command_line_writer``), and what the cache keeps of it."""
    return [{**{k: entry[k] for k in ("manager", "operation", "time") if k in entry},
             "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": containers}}}}}
            for entry in managed_fields or [] if (containers := _command_lines(entry))]


def command_line_writer(deployment: Mapping[str, Any], container: str) -> str | None:
    """Who last wrote the vLLM container's command line, as the apiserver records it in ``metadata.managedFields``:
    the field manager that owns its args or command, the newest if several (``kubectl-edit``, ``kubectl``
    for an undo, ``argocd-controller``), with "(server-side apply)" for an Apply, whose next apply puts back what
    it applied (Flux's ``kustomize-controller``, ``kubectl apply --server-side``). None when that is the operator
    itself or no entry says (a write history that was dropped)."""
    key = f"k:{json.dumps({'name': container}, separators=(',', ':'))}"
    owners = [entry for entry in command_line_owners((deployment.get("metadata") or {}).get("managedFields"))
              if key in entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]]
    if not owners:
        return None
    newest = max(owners, key=lambda entry: entry.get("time") or "")
    if newest.get("manager") in (None, "", FIELD_MANAGER):
        return None
    return newest["manager"] + (" (server-side apply)" if newest.get("operation") == "Apply" else "")
