"""The operator's limit of rollouts at once: a change waits for a slot.

Every change is a rolling restart, and under Kubernetes' default strategy
each starts a surge pod that needs a spare GPU. Changes of many tunings
that fall due together (two schedule windows opening, a change freeze
ending) would all surge at once. With ``--max-concurrent-rollouts 1`` the
second tuning's change holds (reason RolloutSlots) until the first rollout
is complete and its old pods, which hold their GPUs while they drain, are
gone, then runs. A rollout someone else started on a tuned Deployment holds
a slot just as well. The change that has waited longest goes first, also
after the operator restarted: its place is in its status.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from tests.e2e.world import World, knob_args, knobs_of, open_window, tuning_spec
from tests.support import FLEET_TIME_SCALE, H100, L4, Cluster, NotYet, Operators, vllm_deployment, wait_for

from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.fleet import PROFILE_LABEL

pytestmark = pytest.mark.e2e

BEFORE, PRESET = (2048, 64), (8192, 128)
PRE_STOP_S = 800
"""A preStop sleep the fleet scales to 40 s (``FLEET_TIME_SCALE``): long enough for a tuning to be evaluated while
a pod drains, on a loaded machine."""


def stuck_rollout(world: World) -> None:
    """A rollout someone else started (a template edit that is no knob change) whose new pod finds no node; returns
    once the operator has evaluated the tuning during it."""
    stuck = {"spec": {"template": {"spec": {"nodeSelector": {"example.com/pool": "none-such"}}}}}
    world.apps.patch_namespaced_deployment(world.name, world.namespace, stuck)

    def seen_rolling() -> dict | NotYet:
        newest = (world.status().get("history") or [{}])[0]
        return newest if newest.get("hold") == "RolloutInProgress" else NotYet(f"{newest}")

    wait_for(seen_rolling, 60, f"the operator to see the rollout of {world.name}")


def waiting_since(world: World) -> str | NotYet:
    """slotWaitSince while the newest decision waits for a rollout slot."""
    status = world.status()
    newest = (status.get("history") or [{}])[0]
    since = status.get("slotWaitSince")
    return since if newest.get("hold") == "RolloutSlots" and since else NotYet(f"{newest}, slotWaitSince {since}")


def test_with_one_rollout_slot_the_second_tunings_change_waits_for_the_first_rollout(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    worlds = [World(cluster_with_crd, namespace, name) for name in ("first", "second")]
    window = open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})
    for world in worlds:
        world.create_deployment(H100, knob_args(*BEFORE), replicas=1)  # two of the four H100s: two spare
        world.create_tuning(tuning_spec(world.name, schedules=[window]))  # both want the preset at once
    operator = operators.start("operator", None, "--max-concurrent-rollouts=1")
    for world in worlds:
        world.wait_rolled_out(knob_args(*PRESET), 120)


    def judged() -> list[dict] | NotYet:
        found = [w.status().get("lastRollout") or {} for w in worlds]
        return found if all(r.get("phase") == "Succeeded" for r in found) else NotYet(f"rollouts {found}")

    first, second = sorted(wait_for(judged, 30, "both rollouts judged a success"), key=lambda r: r["startedAt"])
    rollouts = [first, second]
    assert datetime.fromisoformat(second["startedAt"]) >= datetime.fromisoformat(first["finishedAt"]), rollouts
    waited, went = sorted(worlds, key=lambda w: w.status()["lastRollout"] != second)
    held = f"a rollout slot, all 1 of --max-concurrent-rollouts held by {namespace}/{went.name} (rolling out)"
    assert any(held in h["reason"] for h in waited.history()), waited.history()
    assert operator.metric("vllm_autotuner_decisions_total", reason="RolloutSlots") >= 1


def slow_to_stop(name: str) -> dict:
    """The pod template of a Deployment whose pods take long to stop: a preStop sleep (what people give vLLM for the
    endpoints to stop sending it requests), within a grace period that covers it; the simulated kubelet honours it."""
    template = vllm_deployment(name, H100, knob_args(*BEFORE), replicas=1)["spec"]["template"]
    template["spec"]["terminationGracePeriodSeconds"] = PRE_STOP_S + 60
    template["spec"]["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": PRE_STOP_S}}}
    return template


def test_a_rollouts_old_pod_still_terminating_holds_the_slot_until_it_is_gone(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    """The Deployment controller declares the first rollout complete, and the operator judges it a success, while the
    old pod still drains on its GPU; the second change, due meanwhile, waits for it (seen in the Deployment's
    terminatingReplicas), or its surge pod would find no GPU in a full pool."""
    first, second = World(cluster_with_crd, namespace, "first"), World(cluster_with_crd, namespace, "second")
    first.create_deployment(H100, knob_args(*BEFORE), replicas=1, template=slow_to_stop(first.name))
    second.create_deployment(H100, knob_args(*BEFORE), replicas=1)  # two of the four H100s: room for a surge pod
    for world in (first, second):
        world.create_tuning(tuning_spec(world.name))
    operators.start("operator", None, "--max-concurrent-rollouts=1")
    preset = [open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})]
    first.patch_tuning({"schedules": preset})

    def complete_and_draining() -> str | NotYet:
        status = first.deployment().status
        old = [p.metadata.name for p in first.pods() if p.metadata.deletion_timestamp]
        done = status.updated_replicas == status.available_replicas == status.replicas == 1
        return old[0] if done and old and status.terminating_replicas else NotYet(f"{status}, terminating {old}")

    old = wait_for(complete_and_draining, 90, "the first rollout complete, its old pod still terminating")
    second.patch_tuning({"schedules": preset})  # due now, while the old pod holds its GPU

    def held() -> list[str] | NotYet:
        reasons = [h["reason"] for h in second.history()]
        return reasons if any(f"held by {namespace}/{first.name} (pods terminating)" in r for r in reasons) else (
            NotYet(f"{reasons}, first's lastRollout {first.status().get('lastRollout')}"))

    wait_for(held, 30, "the second preset to wait for the slot the terminating pod holds")

    meanwhile = []  # the second's knobs while the old pod still terminated

    def gone() -> bool | NotYet:
        knobs = knobs_of(second.template_args())  # read first: a change seen here came before the pod seen below
        if old in {p.metadata.name for p in first.pods()}:
            meanwhile.append(knobs)
            return NotYet(f"{old} still terminating")
        return True

    wait_for(gone, 2 * PRE_STOP_S * FLEET_TIME_SCALE + 30, f"{old} gone")
    assert set(meanwhile) <= {BEFORE}, f"the second rollout started while {old} still terminated: {meanwhile}"
    second.wait_rolled_out(knob_args(*PRESET), 90)


def test_someone_elses_rollout_of_a_tuned_deployment_holds_the_slot(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    other, tuned = World(cluster_with_crd, namespace, "other"), World(cluster_with_crd, namespace, "tuned")
    for world in (other, tuned):
        world.create_deployment(H100, knob_args(*BEFORE), replicas=1)
        world.create_tuning(tuning_spec(world.name))
    operators.start("operator", None, "--max-concurrent-rollouts=1")
    stuck_rollout(other)
    tuned.patch_tuning({"schedules": [open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0],
                                                                    "maxNumSeqs": PRESET[1]})]})

    def waiting() -> list[str] | NotYet:
        reasons = [h["reason"] for h in tuned.history()]
        held = f"held by {namespace}/{other.name} (rolling out)"
        return reasons if any(held in r for r in reasons) else NotYet(f"{reasons}")

    wait_for(waiting, 60, "the preset to wait for the slot the other rollout holds")
    assert knobs_of(tuned.template_args()) == BEFORE and tuned.status().get("lastRollout") is None
    cluster_with_crd.kubectl("rollout", "undo", f"deployment/{other.name}", "-n", namespace)  # they give up
    tuned.wait_rolled_out(knob_args(*PRESET), 90)


def test_with_a_pool_label_a_rollout_in_another_node_pool_holds_no_slot(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    other, tuned = World(cluster_with_crd, namespace, "other"), World(cluster_with_crd, namespace, "tuned")
    other.create_deployment(L4, knob_args(*BEFORE), replicas=1)
    tuned.create_deployment(H100, knob_args(*BEFORE), replicas=1)
    for world in (other, tuned):
        world.create_tuning(tuning_spec(world.name))
    operators.start("operator", None, "--max-concurrent-rollouts=1", f"--rollout-pool-label={PROFILE_LABEL}")
    stuck_rollout(other)  # on the L4s
    tuned.patch_tuning({"schedules": [open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0],
                                                                    "maxNumSeqs": PRESET[1]})]})
    tuned.wait_rolled_out(knob_args(*PRESET), 90)
    assert not any("held by" in h["reason"] for h in tuned.history()), tuned.history()
    assert other.status()["history"][0]["hold"] == "RolloutInProgress"  # theirs still runs


def test_the_change_that_waited_longest_goes_first_after_the_operator_restarted(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    other, early, late = (World(cluster_with_crd, namespace, name) for name in ("other", "waits-first", "a-later"))
    for world in (other, early, late):
        world.create_deployment(H100, knob_args(*BEFORE), replicas=1)  # three of the four H100s: one spare
        world.create_tuning(tuning_spec(world.name))
    first = operators.start("first", None, "--max-concurrent-rollouts=1")
    stuck_rollout(other)
    preset = [open_window("Europe/Berlin", {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]})]
    early.patch_tuning({"schedules": preset})
    places = {early.name: wait_for(lambda: waiting_since(early), 60, "the first preset to wait for the slot")}
    late.patch_tuning({"schedules": preset})
    places[late.name] = wait_for(lambda: waiting_since(late), 60, "the second preset to wait too")
    assert datetime.fromisoformat(places[early.name]) < datetime.fromisoformat(places[late.name]), places
    assert first.stop() == 0
    last_seen = {w.name: w.status()["history"][0]["time"] for w in (early, late)}

    second = operators.start("second", None, "--max-concurrent-rollouts=1")
    for world in (early, late):
        def waits_again(world: World = world) -> str | NotYet:
            newest = world.status()["history"][0]
            fresh = datetime.fromisoformat(newest["time"]) > datetime.fromisoformat(last_seen[world.name])
            return waiting_since(world) if fresh else NotYet(f"{newest}")

        # the restarted operator keeps each change's place rather than queueing them anew
        assert wait_for(waits_again, 60, f"{world.name} to wait under the restarted operator") == places[world.name]
        waited = second.metric("vllm_autotuner_rollout_slot_wait_since_seconds", tuning=world.name)
        assert waited == datetime.fromisoformat(places[world.name]).timestamp()  # what the alert reads
    cluster_with_crd.kubectl("rollout", "undo", f"deployment/{other.name}", "-n", namespace)  # the slot is free
    for world in (early, late):
        world.wait_rolled_out(knob_args(*PRESET), 120)

    def judged() -> list[dict] | NotYet:
        found = [w.status().get("lastRollout") or {} for w in (early, late)]
        return found if all(r.get("phase") == "Succeeded" for r in found) else NotYet(f"rollouts {found}")

    early_rollout, late_rollout = wait_for(judged, 30, "both rollouts judged a success")
    assert datetime.fromisoformat(late_rollout["startedAt"]) >= datetime.fromisoformat(early_rollout["finishedAt"]), (
        f"the change that waited first should have rolled out first: {early_rollout}, {late_rollout}")
    assert "slotWaitSince" not in early.status() and "slotWaitSince" not in late.status()
    assert "vllm_autotuner_rollout_slot_wait_since_seconds" not in second.metrics()
