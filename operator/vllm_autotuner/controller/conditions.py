"""Kubernetes-shaped conditions, set the way kubectl and other controllers expect (pure).

A condition's lastTransitionTime moves only when its status changes; reason
and message may change freely. Keeping this in one pure function means every
place that reports a condition gets those semantics right.
"""

from __future__ import annotations

from datetime import datetime

from vllm_autotuner.api import Condition, ConditionStatus, ConditionType
from vllm_autotuner.api.types import utc_timestamp

#: The order conditions are listed in status.
ORDER = [ConditionType.READY, ConditionType.METRICS_AVAILABLE, ConditionType.PROGRESSING, ConditionType.DEGRADED]


def set_condition(
    conditions: list[Condition],
    type_: ConditionType,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The conditions with one of them set; ``status`` None means Unknown."""
    value = ConditionStatus.UNKNOWN if status is None else (ConditionStatus.TRUE if status else ConditionStatus.FALSE)
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous is not None and previous.status == value else utc_timestamp(now)
    updated = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )
    others = [c for c in conditions if c.type != type_]
    merged = [*others, updated]
    return sorted(merged, key=lambda c: ORDER.index(c.type) if c.type in ORDER else len(ORDER))


def condition(conditions: list[Condition], type_: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
