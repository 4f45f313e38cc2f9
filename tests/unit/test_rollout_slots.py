"""The operator's rollout slots: rollouts in progress hold them; waiting changes are served first come, first served."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vllm_autotuner.rollout.slots import DRAIN_MARGIN_S, RolloutSlots, node_pool

A, B, C, D = ("ns", "a"), ("ns", "b"), ("ns", "c"), ("ns", "d")
T0, T1, T2 = "2024-05-01T12:00:00Z", "2024-05-01T12:01:00Z", "2024-05-01T12:02:00Z"
NOW = datetime(2024, 5, 1, 12, 5, tzinfo=UTC)  # when the slots are counted


def tunings(*keys, in_progress=(), statuses=None):
    statuses = statuses or {}
    return {k: {"status": {"lastRollout": {"phase": "InProgress"}} if k in in_progress else statuses.get(k, {})}
            for k in keys}


def idle(tuning):
    """No tuning's target Deployment seen: none rolls out, and none is pinned to a pool."""
    return None


def deployment(rolling=False, node_selector=None, affinity=None, paused=False):
    """A 2-replica Deployment, its rollout complete or not, its pods pinned to nodes as given, paused or not."""
    pod = {"nodeSelector": node_selector or {}, **({"affinity": affinity} if affinity else {})}
    return {"metadata": {"generation": 1},
            "spec": {"replicas": 2, "template": {"spec": pod}, **({"paused": True} if paused else {})},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 1 if rolling else 2,
                       "availableReplicas": 2}}


POOL = "karpenter.sh/nodepool"


def waiting_status(since, hold="RolloutSlots"):
    """A raw status as the operator writes it: the last decision's hold word, and the change's place in the queue."""
    return {"slotWaitSince": since, "history": [{"time": since, "action": "Hold", "hold": hold}]}


def test_without_a_limit_no_slot_is_ever_held():
    slots = RolloutSlots(0)
    slots.record(A, rolling=True, waiting_since=None)
    assert slots.holders(B, None, tunings(A, B, in_progress=[A]), idle, NOW) == []


def test_rollouts_of_other_tunings_hold_slots_by_what_was_seen_else_by_their_status():
    slots = RolloutSlots(2)
    everyone = tunings(A, B, C, in_progress=[B, C])
    slots.record(A, rolling=True, waiting_since=None)
    slots.record(B, rolling=False, waiting_since=None)  # finished since its status was read
    assert slots.holders(A, None, everyone, idle, NOW) == ["ns/c (rolling out)"]  # by its status; not A's own
    assert slots.holders(C, None, everyone, idle, NOW) == ["ns/a (rolling out)"]
    assert slots.holders(A, None, tunings(A, B), idle, NOW) == []  # C deleted: gone from the cache, it holds nothing


def test_someone_elses_rollout_of_a_tuned_deployment_holds_a_slot_before_its_tuning_is_evaluated_again():
    slots = RolloutSlots(1)
    everyone = {A: {"spec": {"targetRef": {"name": "chat"}}}, B: {"spec": {"targetRef": {"name": "rag"}}}}
    slots.record(A, rolling=False, waiting_since=None)  # evaluated before `kubectl rollout restart deploy/chat`

    def chat_rolls_out(tuning):
        return deployment(rolling=tuning["spec"]["targetRef"]["name"] == "chat")

    assert slots.holders(B, None, everyone, chat_rolls_out, NOW) == ["ns/a (rolling out)"]
    assert slots.holders(A, None, everyone, chat_rolls_out, NOW) == []


def test_a_pod_lost_or_added_after_a_rollout_completed_holds_no_slot():
    """A pod an autoscaler added that finds no GPU, or one lost with its node: the Deployment controller keeps
    NewReplicaSetAvailable, and the other tunings of the pool do not wait for it. The reason a pause leaves until
    the controller's next sync after it is resumed tells nothing: the replicas do."""
    slots = RolloutSlots(1)
    everyone = {A: {"spec": {"targetRef": {"name": "chat"}}}, B: {"spec": {"targetRef": {"name": "rag"}}}}
    slots.record(A, rolling=False, waiting_since=None)

    def short(reason):
        def target(tuning):
            chat = deployment()
            if tuning["spec"]["targetRef"]["name"] == "chat":
                chat["status"].update(availableReplicas=1, conditions=[{"type": "Progressing", "reason": reason}])
            return chat
        return target

    assert slots.holders(B, None, everyone, short("NewReplicaSetAvailable"), NOW) == []
    # resumed, 1 of 2 up
    assert slots.holders(B, None, everyone, short("DeploymentPaused"), NOW) == ["ns/a (rolling out)"]
    assert slots.holders(B, None, everyone, short("ReplicaSetUpdated"), NOW) == ["ns/a (rolling out)"]


def completed(**status):
    """A 2-replica Deployment whose rollout the Deployment controller has declared complete at T0, its old pods given
    a 300 s grace period to drain in."""
    done = deployment()
    done["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 300
    done["status"].update(conditions=[{"type": "Progressing", "reason": "NewReplicaSetAvailable",
                                       "lastUpdateTime": T0}], **status)
    return done


@pytest.mark.parametrize("paused", [False, True])
def test_a_completed_rollouts_old_pod_holds_the_slot_while_it_terminates(paused):
    """The rollout is complete (and judged Succeeded: ``rollout_state`` does not wait), but its old pod drains its
    requests on its GPU for up to its grace period: the next rollout of the pool would find no spare GPU until it is
    gone. Paused meanwhile, it drains all the same. Where the apiserver counts the Deployment's terminating pods."""
    everyone = {k: {"spec": {"targetRef": {"name": k[1]}}, "status": {}} for k in (A, B)}
    slots = RolloutSlots(1)
    slots.record(A, rolling=False, waiting_since=None)  # our rollout of it succeeded
    terminating = 1

    def target(tuning):
        chat = completed(terminatingReplicas=terminating)
        chat["spec"]["paused"] = paused
        return chat

    assert slots.holders(B, None, everyone, target, NOW) == ["ns/a (pods terminating)"]
    terminating = 0  # the old pod is gone
    assert slots.holders(B, None, everyone, target, NOW) == []


def test_where_terminating_pods_are_not_counted_the_slot_is_held_for_the_grace_period_after_the_rollout():
    """Before Kubernetes 1.35 (the DeploymentReplicaSetTerminatingReplicas feature gate off) the Deployment does not
    say, and the pods are not watched: the last old pod was deleted by the time the rollout was declared complete,
    and is gone within its grace period and a margin of it. A count of 0, where there is one, frees it at once."""
    everyone = {k: {"spec": {"targetRef": {"name": k[1]}}, "status": {}} for k in (A, B)}
    start = datetime.fromisoformat(T0)
    slots = RolloutSlots(1)

    def target(tuning):
        return completed()

    assert slots.holders(B, None, everyone, target, start + timedelta(seconds=299)) == ["ns/a (pods terminating)"]
    assert slots.holders(B, None, everyone, target, start + timedelta(seconds=300 + DRAIN_MARGIN_S)) == []
    assert slots.holders(B, None, everyone, lambda _: completed(terminatingReplicas=0), start) == []


def test_under_a_revision_history_limit_of_0_a_count_of_none_does_not_free_the_slot():
    """``revisionHistoryLimit: 0``: the Deployment controller deletes the old ReplicaSet as soon as the rollout is
    complete, its pods still terminating, and ``terminatingReplicas`` counts them no more (0): the grace period after
    the rollout holds the slot, as where nothing is counted. A count of some still holds it past that."""
    everyone = {k: {"spec": {"targetRef": {"name": k[1]}}, "status": {}} for k in (A, B)}
    start = datetime.fromisoformat(T0)
    slots = RolloutSlots(1)

    def target(terminating):
        def of(tuning):
            done = completed(terminatingReplicas=terminating)
            done["spec"]["revisionHistoryLimit"] = 0
            return done
        return of

    assert slots.holders(B, None, everyone, target(0), start + timedelta(seconds=299)) == ["ns/a (pods terminating)"]
    assert slots.holders(B, None, everyone, target(0), start + timedelta(seconds=300 + DRAIN_MARGIN_S)) == []
    assert slots.holders(B, None, everyone, target(1), start + timedelta(seconds=300 + DRAIN_MARGIN_S)) == [
        "ns/a (pods terminating)"]


def test_a_paused_deployment_holds_no_slot_until_it_is_resumed():
    """`kubectl rollout pause` during a rollout, ours or anyone's: the Deployment controller starts no pod of it for
    as long as it stays paused (hours, days), and the other tunings of the pool do not wait meanwhile; nor for a
    change of it waiting for a slot, which is not made while paused. Resumed, it rolls again and holds its slot, and
    the waiting change has kept its place."""
    everyone = {k: {"spec": {"targetRef": {"name": k[1]}}, "status": status} for k, status in (
        (A, {"lastRollout": {"phase": "InProgress"}}), (B, {}), (C, waiting_status(T0)), (D, {}))}
    paused = {"a", "c", "d"}

    def target(tuning):
        name = tuning["spec"]["targetRef"]["name"]
        halted = deployment(rolling=name in ("a", "d"), paused=name in paused)  # d: someone else's rollout
        halted["status"]["conditions"] = [{"type": "Progressing", "reason": "DeploymentPaused"}]
        return halted

    slots = RolloutSlots(1)  # a new process: each tuning counts by its status
    assert slots.holders(B, T1, everyone, target, NOW) == []
    slots.record(A, rolling=True, waiting_since=None)  # seen rolling out by this process
    slots.record(C, rolling=False, waiting_since=T0)
    assert slots.holders(B, T1, everyone, target, NOW) == []
    paused.clear()  # `kubectl rollout resume`: the condition says DeploymentPaused until the controller's next sync
    resumed = ["ns/a (rolling out)", "ns/c (waiting since 2024-05-01T12:00:00Z)", "ns/d (rolling out)"]
    assert slots.holders(B, T1, everyone, target, NOW) == resumed
    assert RolloutSlots(1).holders(B, T1, everyone, target, NOW) == resumed


@pytest.mark.parametrize("replicas, updated, available", [(3, 1, 2), (2, 1, 1), (2, 2, 1), (2, 2, 0)])
def test_a_deployment_paused_with_a_surge_pod_or_one_unavailable_still_holds_its_slot(replicas, updated, available):
    """Paused mid-rollout, the pods already created stay: a surge pod on its spare GPU (3 pods for 2 replicas), or
    a pod not yet available (Pending: it takes the next GPU that frees), the last new pod too (maxSurge 0, Recreate:
    ``updatedReplicas`` counts it). Another rollout of the pool would find no spare GPU, so the slot stays held."""
    everyone = {k: {"spec": {"targetRef": {"name": k[1]}}, "status": {}} for k in (A, B)}

    def target(tuning):
        halted = deployment(rolling=True, paused=True)
        halted["status"].update(replicas=replicas, updatedReplicas=updated, availableReplicas=available)
        return halted

    assert RolloutSlots(1).holders(B, T1, everyone, target, NOW) == ["ns/a (rolling out)"]


def test_a_change_that_waited_longer_goes_first_whatever_the_order_of_evaluation():
    slots = RolloutSlots(1)
    everyone = tunings(A, B, C)
    slots.record(A, rolling=True, waiting_since=None)
    slots.record(C, rolling=False, waiting_since=T0)  # waits first
    slots.record(B, rolling=False, waiting_since=T1)
    slots.record(A, rolling=False, waiting_since=None)  # the rollout is complete
    # B, evaluated first, waits
    assert slots.holders(B, T1, everyone, idle, NOW) == ["ns/c (waiting since 2024-05-01T12:00:00Z)"]
    assert slots.holders(C, T0, everyone, idle, NOW) == []
    slots.record(C, rolling=True, waiting_since=None)  # C took it
    assert slots.holders(B, T1, everyone, idle, NOW) == ["ns/c (rolling out)"]
    slots.record(C, rolling=False, waiting_since=None)
    assert slots.holders(B, T1, everyone, idle, NOW) == []


def test_changes_that_began_waiting_in_the_same_second_go_by_name():
    slots = RolloutSlots(1)
    everyone = tunings(A, B)
    slots.record(A, rolling=False, waiting_since=T0)
    slots.record(B, rolling=False, waiting_since=T0)
    assert slots.holders(A, T0, everyone, idle, NOW) == []
    assert slots.holders(B, T0, everyone, idle, NOW) == ["ns/a (waiting since 2024-05-01T12:00:00Z)"]


def test_a_change_that_stops_waiting_or_a_deleted_tuning_leaves_the_queue():
    slots = RolloutSlots(1)
    everyone = tunings(A, B, C)
    slots.record(A, rolling=False, waiting_since=T0)
    slots.record(B, rolling=False, waiting_since=T1)
    assert len(slots.holders(B, T1, everyone, idle, NOW)) == 1
    slots.record(A, rolling=False, waiting_since=None)  # e.g. a freeze opened, Paused, or a data gap
    assert slots.holders(B, T1, everyone, idle, NOW) == []
    slots.record(A, rolling=False, waiting_since=T2)  # back, and its place was not kept: behind B now
    assert slots.holders(B, T1, everyone, idle, NOW) == []
    assert slots.holders(A, T2, everyone, idle, NOW) == ["ns/b (waiting since 2024-05-01T12:01:00Z)"]
    slots.forget(B)
    assert slots.holders(A, T2, everyone, idle, NOW) == []


def test_after_a_restart_or_a_leader_change_the_queue_is_read_from_the_statuses():
    slots = RolloutSlots(1)  # a new process: nothing seen yet
    everyone = tunings(A, B, C, statuses={
        A: waiting_status(T1),
        B: waiting_status(T0, hold="NoData"),  # its place is kept through a data gap, but it does not wait now
        C: waiting_status(T2),
    })
    assert slots.holders(C, T2, everyone, idle, NOW) == ["ns/a (waiting since 2024-05-01T12:01:00Z)"]
    assert slots.holders(A, T1, everyone, idle, NOW) == []  # the earliest waiting change goes first
    # B's data is back and it still wants its change: it goes before A, whose change came later
    assert slots.holders(B, T0, everyone, idle, NOW) == []
    assert slots.holders(A, T1, tunings(A, B, statuses={B: waiting_status(T0)}), idle, NOW) == [
        "ns/b (waiting since 2024-05-01T12:00:00Z)"]
    assert slots.holders(A, T1, tunings(A, B, statuses={B: waiting_status("not a time")}), idle, NOW) == []


def required(*terms):
    """Required node affinity with these nodeSelectorTerms, each a list of (key, operator, values)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": k, "operator": op, "values": v} for k, op, v in term]} for term in terms]}}}


@pytest.mark.parametrize(("target", "pool"), [
    (deployment(node_selector={POOL: "h100"}), "h100"),
    (deployment(affinity=required([(POOL, "In", ["h100"]), ("zone", "In", ["a", "b"])])), "h100"),
    (deployment(affinity=required([(POOL, "In", ["h100"])], [(POOL, "In", ["h100"])])), "h100"),
    (deployment(affinity=required([(POOL, "In", ["h100", "a100"])])), None),  # either pool
    (deployment(affinity=required([(POOL, "In", ["h100"])], [(POOL, "In", ["a100"])])), None),  # either term
    (deployment(affinity=required([(POOL, "In", ["h100"])], [("zone", "In", ["a"])])), None),  # any pool in zone a
    (deployment(affinity=required([(POOL, "NotIn", ["l4"])])), None),
    (deployment(node_selector={"nvidia.com/gpu.product": "H100"}), None),  # pinned by another label
    (None, None),
])
def test_the_pool_is_the_one_value_the_pod_template_pins_its_pods_to(target, pool):
    assert node_pool(target, POOL) == pool


def test_with_a_pool_label_the_limit_holds_per_pool_and_an_unpinned_target_shares_every_pool():
    slots = RolloutSlots(1, POOL)
    targets = {"a": deployment(rolling=True, node_selector={POOL: "h100"}), "b": deployment(node_selector={POOL: "l4"}),
               "c": deployment(node_selector={POOL: "h100"}), "d": deployment()}
    everyone = {(ns, name): {"spec": {"targetRef": {"name": name}}} for ns, name in (A, B, C, ("ns", "d"))}

    def target(tuning):
        return targets[tuning["spec"]["targetRef"]["name"]]

    slots.record(A, rolling=True, waiting_since=None)
    assert slots.holders(B, None, everyone, target, NOW) == []  # another pool's surge pods take no GPU of b's
    assert slots.holders(C, None, everyone, target, NOW) == ["ns/a (rolling out)"]
    assert slots.holders(("ns", "d"), None, everyone, target, NOW) == ["ns/a (rolling out)"]  # d's pods may go anywhere
    slots.record(("ns", "d"), rolling=False, waiting_since=T0)
    assert slots.holders(B, T1, everyone, target, NOW) == ["ns/d (waiting since 2024-05-01T12:00:00Z)"]
    assert RolloutSlots(1).holders(B, None, everyone, target, NOW) == ["ns/a (rolling out)"]  # no label: one pool
