"""The operator's limit of rollouts at once (``--max-concurrent-rollouts``), handed out first come, first served.

Every change is a rolling restart whose surge pod needs a spare GPU, so
changes of many tunings that fall due together (schedule windows opening at
the same minute, the changes a freeze held once it ends) must not all start
at once. The decision core is told what holds the slots (naming it in the
hold) and holds the change (reason RolloutSlots) when none is left. A slot
is held by a rollout of a tuned Deployment in progress, the operator's or
anyone's (a ``kubectl rollout restart``, an image bump: its surge pods need
spare GPUs too; seen in the Deployment as soon as it starts and no longer
once it ends, not at its tuning's next evaluation), and also by a change that has waited longer for
one: the tunings of a tick are evaluated in the same order every tick, so
without the queue a slot freed would go to the same tuning each time, and
one behind several others could wait for ever.

A change's place in the queue is its status' ``slotWaitSince``, which the
decision core keeps through holds for missing data, so the queue outlives
the process: a tuning this process has not evaluated yet (it just started,
or took over as leader) counts by its status, the rollout of ours it shows
and the wait its last decision records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from vllm_autotuner.api.status import RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy.observation import HoldReason

Key = tuple[str, str]


class RolloutSlots:
    """Per tuning: whether its rollout is in progress, and since when a change of it waits for a slot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self._seen: dict[Key, tuple[bool, datetime | None]] = {}

    def holders(
        self,
        key: Key,
        since: str | None,
        tunings: Mapping[Key, dict[str, Any]],
        target_rolling: Callable[[dict[str, Any]], bool],
    ) -> list[str]:
        """What holds a slot outside ``key`` among ``tunings`` (the VllmTuning objects by key), one string each, for
        ``decide``'s ``slot_holders``: the other tunings' rollouts in progress, and their changes that have waited
        longer than ``key``'s (waiting since ``since``, its status' ``slotWaitSince``; the same second goes by
        name). ``target_rolling`` says whether a rollout of a tuning's target Deployment runs now, anyone's, by
        what the caller last saw of the Deployment (seen at once, not at that tuning's next evaluation). None
        without a limit."""
        if not self.limit:
            return []
        place = (_moment(since), key)
        held = []
        for other, body in sorted(tunings.items()):
            if other == key:
                continue
            seen = self._seen.get(other)
            # not evaluated by this process yet: its status says (read raw, for every tuning)
            rolling, queued = seen if seen is not None else _from_status(body.get("status") or {})
            if rolling or target_rolling(body):
                held.append(f"{other[0]}/{other[1]} (rolling out)")
            elif queued is not None and (place[0] is None or (queued, other) < place):
                held.append(f"{other[0]}/{other[1]} (waiting since {utc_timestamp(queued)})")
        return held

    def record(self, key: Key, *, rolling: bool, waiting_since: str | None) -> None:
        """What an evaluation of ``key`` left: the operator's rollout of it in progress or not (anyone else's is
        ``holders``' ``target_rolling``), and since when its change waits for a slot (None: it does not wait now,
        whatever its status keeps for its place)."""
        self._seen[key] = (rolling, _moment(waiting_since))

    def forget(self, key: Key) -> None:
        """Drop a deleted tuning."""
        self._seen.pop(key, None)


def _from_status(status: Mapping[str, Any]) -> tuple[bool, datetime | None]:
    """Rolling out (our rollout in progress) and waiting since, from a VllmTuning's raw status."""
    rolling = (status.get("lastRollout") or {}).get("phase") == RolloutPhase.IN_PROGRESS
    last = (status.get("history") or [{}])[0]
    waiting = last.get("hold") == HoldReason.NO_SLOT
    return rolling, _moment(status.get("slotWaitSince")) if waiting else None


def _moment(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:  # not a time the operator wrote: no place in the queue
        return None
