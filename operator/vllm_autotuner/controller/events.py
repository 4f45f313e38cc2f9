"""Event reasons, as named constants (sample-controller style), and the Event builder.

Reasons are part of the operator's interface: people filter on them
(``kubectl get events --field-selector reason=RolloutFailed``) and alerts are
written against them, so they are defined once here and never spelled inline.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from vllm_autotuner.api.types import utc_timestamp

COMPONENT = "vllm-autotuner"

# On the VllmTuning
RECOMMENDATION = "Recommendation"  # a change is recommended (Recommend mode, or before acting)
ROLLOUT_STARTED = "RolloutStarted"
ROLLOUT_SUCCEEDED = "RolloutSucceeded"
ROLLOUT_UNVERIFIED = "RolloutUnverified"  # written while the Deployment is scaled to zero: judged at scale-up
ROLLOUT_FAILED = "RolloutFailed"
ROLLOUT_BLOCKED = "RolloutBlocked"  # no new pod started vLLM (no free GPU, no image...): rolled back, not blamed
BLOCK_LIFTED = "RolloutUnblocked"  # the strategy now stops a pod first: changes need not wait out the block
ROLLOUT_OVERTAKEN = "RolloutOvertaken"  # someone else changed the template during ours: no verdict on our knobs
ROLLED_BACK = "RolledBack"
REGRESSION = "RegressionDetected"
MANUAL_CHANGE = "ManualChangeAdopted"
RESTART_LOSES_REQUESTS = "RestartLosesRequests"  # a rollout's pods abort (or refuse) requests as they stop
CHANGES_REVERTED = "ChangesReverted"  # our changes put back twice in a day: the operator only recommends
TARGET_CONTROLLED = "TargetControlled"  # another object controls the Deployment: the operator only recommends
TARGET_NOT_FOUND = "TargetNotFound"
INVALID_TARGET = "InvalidTarget"
TARGET_PAUSED = "TargetPaused"
WATCH_BEHIND = "WatchBehind"  # the Deployment as watched predates our own write: nothing is judged until it is seen
TARGET_CONFLICT = "TargetConflict"
INVALID_SPEC = "InvalidSpec"
STATUS_UNREADABLE = "StatusUnreadable"  # written by a newer operator, or edited: nothing changes until it reads
METRICS_UNAVAILABLE = "MetricsUnavailable"
PATCH_FAILED = "PatchFailed"

# On the target Deployment (rollouts only)
KNOBS_CHANGED = "VllmKnobsChanged"
KNOBS_ROLLED_BACK = "VllmKnobsRolledBack"

NORMAL = "Normal"
WARNING = "Warning"


def event_body(involved: dict[str, Any], reason: str, message: str, type_: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (an object with apiVersion, kind and metadata)."""
    meta = involved["metadata"]
    stamp = utc_timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def sameness(body: dict[str, Any]) -> tuple[Any, ...]:
    """What makes an Event (an ``event_body``) the same as another: the object it is about (its uid, not the version
    read) and what it says; not when it was sent."""
    involved = body["involvedObject"]
    return (involved["kind"], involved["namespace"], involved["name"], involved["uid"], body["reason"],
            body["message"], body["type"])
