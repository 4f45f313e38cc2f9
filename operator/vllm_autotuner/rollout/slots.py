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
then), by a tuned Deployment's pods that are still terminating, paused or
not (``draining``: a rollout's old pods drain their requests in flight on
their GPUs for up to their grace period, minutes for vLLM, after it is
complete and judged so), and also by a change that has waited longer for
one: the tunings of a tick are evaluated in the same order every tick, so
without the queue a slot freed would go to the same tuning each time, and
one behind several others could wait for ever.

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
from datetime import datetime, timedelta
from typing import Any

from vllm_autotuner.api.status import RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy.observation import HoldReason
from vllm_autotuner.rollout.drain import termination_grace
from vllm_autotuner.rollout.progress import template_rolling

Key = tuple[str, str]
Deployment = dict[str, Any]

#: Time past an old pod's grace period for the kubelet to kill it and delete the pod object, whose GPU the scheduler
#: counts as taken until then (``draining``, where the Deployment does not count its terminating pods).
DRAIN_MARGIN_S = 30


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
        now: datetime,
    ) -> list[str]:
        """What holds a slot of ``key``'s pool among ``tunings`` (the VllmTuning objects by key), one string each,
        for ``decide``'s ``slot_holders``: the other tunings' rollouts in progress, their Deployments' pods still
        terminating after one (``draining``, at ``now``), and their changes that have
        waited longer than ``key``'s (waiting since ``since``, its status' ``slotWaitSince``; the same second goes
        by name). ``target`` gives a tuning's target Deployment as the caller last saw it (None: not seen): a
        rollout of it runs, anyone's, as soon as the Deployment shows it, not at that tuning's next evaluation,
        and its pod template says the pool. Tunings of another pool are passed over; one whose pool is unknown
        shares every pool. Those whose Deployment is paused (``kubectl rollout pause``, for hours or days) with
        no pod waiting for a GPU or holding a spare one (``_parked``) are passed over too: the Deployment controller
        starts no pod of theirs, whether of our rollout, someone else's or a change waiting for a slot (not made
        while paused), until it is resumed; unless their pods still terminate, which hold their GPUs paused or not.
        None without a limit."""
        if not self.limit:
            return []
        place = (_moment(since), key)
        pool = node_pool(target(tunings[key]), self.pool_label) if key in tunings else None
        held = []
        for other, body in sorted(tunings.items()):
            if other == key:
                continue
            deployment = target(body)
            drains = deployment is not None and draining(deployment, now)
            if deployment is not None and _parked(deployment) and not drains:
                continue  # starts no pod until resumed, then holds one again (its place in the queue kept)
            theirs = node_pool(deployment, self.pool_label)
            if pool is not None and theirs is not None and theirs != pool:
                continue
            seen = self._seen.get(other)
            # not evaluated by this process yet: its status says (read raw, for every tuning)
            rolling, queued = seen if seen is not None else _from_status(body.get("status") or {})
            if rolling or (deployment is not None and template_rolling(deployment)):
                held.append(f"{other[0]}/{other[1]} (rolling out)")
            elif drains:
                held.append(f"{other[0]}/{other[1]} (pods terminating)")
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


def draining(deployment: Deployment, now: datetime) -> bool:
    """Whether pods of the Deployment may still be terminating (``deletionTimestamp`` set, not gone): a rollout's
    old pods drain their requests in flight on their GPUs for up to their terminationGracePeriodSeconds after the
    Deployment controller has declared it complete (it counts no terminating pod in ``status.replicas``), and the
    next rollout's surge pod would find no spare GPU meanwhile. Told by ``status.terminatingReplicas`` where the
    apiserver reports it (Kubernetes 1.35 on; 1.33 and 1.34 with the DeploymentReplicaSetTerminatingReplicas feature
    gate), but for a count of none under ``revisionHistoryLimit: 0``: the controller deletes the old ReplicaSet as
    soon as the rollout is complete, its pods still terminating, and counts them no more. Elsewhere the pods, which
    the operator does not watch, are bounded from the rollout's end: the last old pod was deleted by the time its
    Progressing condition turned ``NewReplicaSetAvailable``, and is gone within the pod template's grace period and
    ``DRAIN_MARGIN_S`` after. That holds the slot for the whole grace period even where the pods went sooner (a vLLM
    that aborts its requests exits in seconds): it errs towards a slot held too long, not a surge pod sent for a GPU
    still taken, but for old pods whose grace period the rollout itself shortened (the old template's is not kept),
    and for pods the condition does not date, which only the count tells: those of a later scale-down or deletion
    (a scale-up or a lost pod keeps the reason and its time too), and those of a paused Deployment
    (``DeploymentPaused``, whose time bounds nothing: a paused controller still scales the old ReplicaSet down once
    the new one is fully available)."""
    status = deployment.get("status") or {}
    counted = status.get("terminatingReplicas")
    if counted is not None and (int(counted) > 0 or deployment["spec"].get("revisionHistoryLimit") != 0):
        return int(counted) > 0
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "NewReplicaSetAvailable":
            ended = _moment(condition.get("lastUpdateTime"))
            grace = termination_grace(deployment["spec"].get("template", {}).get("spec") or {})
            return ended is not None and now < ended + timedelta(seconds=grace + DRAIN_MARGIN_S)
    return False


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
