"""The operator's limit of rollouts at once (``--max-concurrent-rollouts``), handed out first come, first served.

Every change is a rolling restart whose surge pod needs a spare GPU, so
changes of many tunings that fall due together (schedule windows opening at
the same minute, the changes a freeze held once it ends) must not all start
at once. The decision core is told how many slots other tunings hold and
holds the change (reason RolloutSlots) when none is left. A slot is held by
a rollout of a tuned Deployment in progress, the operator's or anyone's (a
``kubectl rollout restart``, an image bump: its surge pods need spare GPUs
too), and also by a change that has waited longer for one: the tunings of a
tick are evaluated in the same order every tick, so without the queue a slot
freed would go to the same tuning each time, and one behind several others
could wait for ever.

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

Key = tuple[str, str]


class RolloutSlots:
    """Per tuning: whether its rollout is in progress, and since when a change of it waits for a slot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self._rolling: dict[Key, bool] = {}
        self._waiting: dict[Key, datetime] = {}

    def taken(self, key: Key, tunings: Mapping[Key, dict[str, Any]]) -> int:
        """Slots held by tunings other than ``key`` among ``tunings`` (the VllmTuning objects by key): their rollouts
        in progress, and their changes that have waited longer than ``key``'s. 0 without a limit."""
        if not self.limit:
            return 0
        since = self._waiting.get(key)
        count = 0
        for other, body in tunings.items():
            if other == key:
                continue
            rolling = self._rolling.get(other)
            if rolling is None:  # not evaluated by this process yet: its status says (read raw, for every tuning)
                rolling = ((body.get("status") or {}).get("lastRollout") or {}).get("phase") == RolloutPhase.IN_PROGRESS
            queued = self._waiting.get(other)
            count += rolling or (queued is not None and (since is None or queued < since))
        return count

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
