"""The operator's limit of rollouts at once (``--max-concurrent-rollouts``), handed out first come, first served.

Every change is a rolling restart whose surge pod needs a spare GPU, so
changes of many tunings that fall due together (schedule windows opening at
the same minute, the changes a freeze held once it ends) must not all start
at once. The decision core is told what holds the slots (naming it in the
hold) and holds the change (reason RolloutSlots) when none is left. A slot
is held by a rollout of a tuned Deployment in progress, the operator's or
anyone's (a ``kubectl rollout restart``, an image bump: its surge pods need
spare GPUs too), and also by a change that has waited longer for one: the
tunings of a tick are evaluated in the same order every tick, so without the
queue a slot freed would go to the same tuning each time, and one behind
several others could wait for ever.

What this knows is what this process saw. A tuning it has not evaluated yet
(it just started, or took over as leader) counts by the rollout of ours its
status shows; the queue starts empty then, and the first tick's order serves
the waiting changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from vllm_autotuner.api.status import RolloutPhase
from vllm_autotuner.api.types import utc_timestamp

Key = tuple[str, str]


class RolloutSlots:
    """Per tuning: whether its rollout is in progress, and since when a change of it waits for a slot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self._rolling: dict[Key, bool] = {}
        self._waiting: dict[Key, datetime] = {}

    def holders(self, key: Key, tunings: Mapping[Key, dict[str, Any]]) -> list[str]:
        """What holds a slot outside ``key`` among ``tunings`` (the VllmTuning objects by key), one string each, for
        ``decide``'s ``slot_holders``: the other tunings' rollouts in progress, and their changes that have waited
        longer than ``key``'s. None without a limit."""
        if not self.limit:
            return []
        since = self._waiting.get(key)
        held = []
        for other, body in sorted(tunings.items()):
            if other == key:
                continue
            rolling = self._rolling.get(other)
            if rolling is None:  # not evaluated by this process yet: its status says (read raw, for every tuning)
                rolling = ((body.get("status") or {}).get("lastRollout") or {}).get("phase") == RolloutPhase.IN_PROGRESS
            queued = self._waiting.get(other)
            if rolling:
                held.append(f"{other[0]}/{other[1]} (rolling out)")
            elif queued is not None and (since is None or queued < since):
                held.append(f"{other[0]}/{other[1]} (waiting since {utc_timestamp(queued)})")
        return held

    def record(self, key: Key, now: datetime, *, rolling: bool, waiting: bool) -> None:
        """What an evaluation of ``key`` at ``now`` left: its rollout in progress or not, its change waiting for a
        slot or not (a change that stops waiting, for whatever reason, leaves the queue)."""
        self._rolling[key] = rolling
        if waiting:
            self._waiting.setdefault(key, now)
        else:
            self._waiting.pop(key, None)

    def forget(self, key: Key) -> None:
        """Drop a deleted tuning."""
        self._rolling.pop(key, None)
        self._waiting.pop(key, None)
