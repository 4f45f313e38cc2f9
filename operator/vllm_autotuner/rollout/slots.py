"""The operator's limit of rollouts at once (``--max-concurrent-rollouts``), handed out first come, first served.

Every change is a rolling restart whose surge pod needs a spare GPU, so
changes of many tunings that fall due together (schedule windows opening at
the same minute, the changes a freeze held once it ends) must not all start
at once. The decision core is told what holds the slots (naming it in the
hold) and holds the change (reason RolloutSlots) when none is left. A slot
is held by a rollout of a tuned Deployment in progress, the operator's or
anyone's (a ``kubectl rollout restart``, an image bump: its surge pods need
spare GPUs too; seen in the Deployment as soon as it starts and no longer
once it ends, not at its tuning's next evaluation; not while the Deployment
is paused with no surge pod and none unavailable, as no pod of it starts
then), and also by a change that has
waited longer for one: the tunings of a tick are evaluated in the same order
every tick, so without the queue a slot freed would go to the same tuning
each time, and one behind several others could wait for ever.

Spare GPUs belong to a node pool: with ``--rollout-pool-label`` (the node
label that names a pool: ``cloud.google.com/gke-nodepool``,
``karpenter.sh/nodepool``, ``nvidia.com/gpu.product``), the limit holds per
pool, read from each target's pod template (``node_pool``), and the
rollouts and waiting changes of another pool hold nothing. A template that
does not pin its pods to one pool shares the slots of every pool.

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
from vllm_autotuner.rollout.progress import template_rolling

Key = tuple[str, str]
Deployment = dict[str, Any]


def node_pool(deployment: Mapping[str, Any] | None, label: str) -> str | None:
    """The node pool a Deployment's pods are held to: the value of ``label`` in its pod template's
    ``nodeSelector``, else the one value that every term of its required node affinity allows (``In`` a single
    value). None when the label is empty, or the pods may run in more than one pool or in any."""
    if not label or deployment is None:
        return None
    pod = deployment.get("spec", {}).get("template", {}).get("spec") or {}
    if label in (pod.get("nodeSelector") or {}):
        return str(pod["nodeSelector"][label])
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    allowed = set()
    for term in required.get("nodeSelectorTerms") or []:  # terms are ORed: each must name the same one pool
        values = [e.get("values") or [] for e in term.get("matchExpressions") or []
                  if e.get("key") == label and e.get("operator") == "In"]
        if len(values) != 1 or len(values[0]) != 1:
            return None
        allowed.add(str(values[0][0]))
    return allowed.pop() if len(allowed) == 1 else None


class RolloutSlots:
    """Per tuning: whether the operator's rollout of it is in progress, and since when a change of it waits for a
    slot; the limit per node pool when ``pool_label`` names the node label of the pools."""

    def __init__(self, limit: int, pool_label: str = "") -> None:
        self.limit = limit  # 0: no limit
        self.pool_label = pool_label  # "": one pool
        self._seen: dict[Key, tuple[bool, datetime | None]] = {}

    def holders(
        self,
        key: Key,
        since: str | None,
        tunings: Mapping[Key, dict[str, Any]],
        target: Callable[[dict[str, Any]], Deployment | None],
    ) -> list[str]:
        """What holds a slot of ``key``'s pool among ``tunings`` (the VllmTuning objects by key), one string each,
        for ``decide``'s ``slot_holders``: the other tunings' rollouts in progress, and their changes that have
        waited longer than ``key``'s (waiting since ``since``, its status' ``slotWaitSince``; the same second goes
        by name). ``target`` gives a tuning's target Deployment as the caller last saw it (None: not seen): a
        rollout of it runs, anyone's, as soon as the Deployment shows it, not at that tuning's next evaluation,
        and its pod template says the pool. Tunings of another pool are passed over; one whose pool is unknown
        shares every pool. Those whose Deployment is paused (``kubectl rollout pause``, for hours or days) with
        no pod waiting for a GPU or holding a spare one (``_parked``) are passed over too: the Deployment controller
        starts no pod of theirs, whether of our rollout, someone else's or a change waiting for a slot (not made
        while paused), until it is resumed. None without a limit."""
        if not self.limit:
            return []
        place = (_moment(since), key)
        pool = node_pool(target(tunings[key]), self.pool_label) if key in tunings else None
        held = []
        for other, body in sorted(tunings.items()):
            if other == key:
                continue
            deployment = target(body)
            if deployment is not None and _parked(deployment):
                continue  # starts no pod until resumed, then holds one again (its place in the queue kept)
            theirs = node_pool(deployment, self.pool_label)
            if pool is not None and theirs is not None and theirs != pool:
                continue
            seen = self._seen.get(other)
            # not evaluated by this process yet: its status says (read raw, for every tuning)
            rolling, queued = seen if seen is not None else _from_status(body.get("status") or {})
            if rolling or (deployment is not None and template_rolling(deployment)):
                held.append(f"{other[0]}/{other[1]} (rolling out)")
            elif queued is not None and (place[0] is None or (queued, other) < place):
                held.append(f"{other[0]}/{other[1]} (waiting since {utc_timestamp(queued)})")
        return held

    def record(self, key: Key, *, rolling: bool, waiting_since: str | None) -> None:
        """What an evaluation of ``key`` left: the operator's rollout of it in progress or not (anyone else's is
        read by ``holders`` from the Deployment), and since when its change waits for a slot (None: it does not
        wait now, whatever its status keeps for its place)."""
        self._seen[key] = (rolling, _moment(waiting_since))

    def forget(self, key: Key) -> None:
        """Drop a deleted tuning."""
        self._seen.pop(key, None)


def _parked(deployment: Deployment) -> bool:
    """Paused, with no pod beyond its replicas and none unavailable. A pause mid-rollout keeps the pods already
    created: a surge pod runs on a spare GPU, and a pod not yet available (Pending, loading) holds or takes the next
    GPU that frees; those still hold the slot while paused."""
    spec, status = deployment["spec"], deployment.get("status") or {}
    replicas = spec.get("replicas", 1)
    return bool(spec.get("paused")) and status.get("replicas", 0) <= replicas and status.get(
        "availableReplicas", 0) >= replicas


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
