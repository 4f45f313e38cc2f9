"""A time-of-day window: its preset is live when the window opens, and the traffic policy resumes when it closes.

The window is written as a platform team writes one, cron expressions in
an IANA time zone, here computed from the clock so that it opens within a
minute or two of the test starting. Asia/Kolkata is five and a half hours
from UTC, so a schedule read in UTC, or in a whole-hour offset, would open
at the wrong time and the test would see it. Pre-roll means the rolling
restart happens before the window opens: the new pods must be Ready when
it does, not start then. A change freeze open at the same time holds the
preset back until it is lifted, and so does an engine asleep until it wakes.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from tests.e2e.world import World, daily_cron, knob_args, knobs_of, open_window, parse_time, tuning_spec
from tests.support import H100, Cluster, NotYet, Operators, call_vllm, wait_for

from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

ZONE = "Asia/Kolkata"
#: A 2-replica rolling update on the simulated H100s takes 12 to 18 s; the pre-roll leaves room for a slow one
PRE_ROLL = timedelta(seconds=45)
BEFORE, PRESET = (2048, 64), (8192, 128)


def ready_since(pod) -> datetime:  # noqa: ANN001 - a V1Pod
    return next(c.last_transition_time for c in pod.status.conditions if c.type == "Ready")


def test_a_schedule_preset_is_live_at_the_window_start_and_the_traffic_policy_resumes_at_its_end(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*BEFORE), replicas=2)
    # The first minute boundary at least 5 s past the pre-roll: time for the operator to start before it.
    opens = (datetime.now(timezone.utc) + PRE_ROLL + timedelta(seconds=5 + 59)).replace(second=0, microsecond=0)
    closes = opens + timedelta(minutes=1)
    world.create_tuning(tuning_spec(world.name, schedules=[{
        "name": "batch", "timeZone": ZONE, "start": daily_cron(opens, ZONE), "end": daily_cron(closes, ZONE),
        "preRoll": f"{PRE_ROLL.seconds}s",
        "knobs": {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}}]))
    operators.start()

    deadline = (opens - datetime.now(timezone.utc)).total_seconds() + 30
    pods = world.wait_rolled_out(knob_args(*PRESET), deadline)
    status = world.status()
    rollout = status["lastRollout"]
    assert rollout["source"] == "Schedule" and "pre-roll" in rollout["reason"], rollout
    assert opens - PRE_ROLL <= parse_time(rollout["startedAt"]) < opens, (rollout["startedAt"], opens)
    assert max(ready_since(p) for p in pods) <= opens, [(p.metadata.name, ready_since(p)) for p in pods]
    in_window = wait_for(lambda: world.status().get("current", {}).get("source") == "Schedule" and world.status(),
                         30, "the preset recorded as live")
    assert in_window["activeSchedule"] == "batch"
    assert in_window["resumeKnobs"] == {"maxNumBatchedTokens": BEFORE[0], "maxNumSeqs": BEFORE[1]}

    deadline = (closes - datetime.now(timezone.utc)).total_seconds() + 60
    world.wait_rolled_out(knob_args(*BEFORE), deadline)
    back = wait_for(lambda: (r := world.status()["lastRollout"])["phase"] == "Succeeded"
                    and r["to"]["maxNumBatchedTokens"] == BEFORE[0] and r, 60, "the restoring rollout recorded")
    assert parse_time(back["startedAt"]) >= closes and "traffic policy resumes" in back["reason"], back
    finished = parse_time(back["finishedAt"])

    # Decisions are the traffic policy's again: no traffic here, so it holds for want of a usable window.
    def traffic_decision() -> dict | None:
        latest = world.history()[-1]
        return latest if parse_time(latest["time"]) > finished else None

    decision = wait_for(traffic_decision, 30, "a decision after the window closed")
    status = world.status()
    assert decision["action"] == "Hold" and "schedule" not in decision["reason"], decision
    assert status.get("activeSchedule") is None and status.get("resumeKnobs") is None
    assert len(world.replicasets()) == 3 and world.deployment().metadata.generation == 3


def test_a_change_freeze_holds_the_windows_preset_until_it_is_lifted(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*BEFORE), replicas=1)
    preset = {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}
    window = open_window(ZONE, preset)
    freeze = {key: window[key] for key in ("timeZone", "start", "end")} | {"name": "launch"}  # open as long
    world.create_tuning(tuning_spec(world.name, schedules=[window], rollout={"freezes": [freeze]}))
    operators.start()

    def held() -> dict | NotYet:
        status = world.status()
        found = [h for h in status.get("history", []) if "change freeze launch until" in h["reason"]]
        return status if found else NotYet(f"history {status.get('history')}")

    status = wait_for(held, 60, "a hold for the change freeze")
    assert knobs_of(world.template_args()) == BEFORE and status.get("lastRollout") is None
    assert {k: status["recommendation"][k] for k in preset} == preset  # what it would do, shown meanwhile
    header, row = cluster_with_crd.kubectl("get", "vlt", world.name, "-n", namespace).stdout.splitlines()
    assert row.split()[header.split().index("HOLDING")] == "ChangeFreeze", (header, row)  # in `kubectl get` too
    # lifted (a merge patch replaces the list): the window's preset rolls out
    world.patch_tuning({"rollout": {"freezes": []}})
    world.wait_rolled_out(knob_args(*PRESET), 90)


def test_a_windows_preset_waits_while_the_engine_sleeps_and_rolls_out_once_a_window_finds_it_awake(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus,
        operators: Operators) -> None:
    # vLLM's sleep mode frees the GPU memory of a pod that stays Ready (for a training step, another model): a
    # rolling restart would start new pods awake, taking it back
    world = World(cluster_with_crd, namespace)
    args = [*knob_args(*BEFORE), "--enable-sleep-mode"]
    world.create_deployment(H100, args, replicas=1, env={"VLLM_SERVER_DEV_MODE": "1"})
    (pod,) = world.pods()
    call_vllm(pod, "/sleep?level=1")
    # in Prometheus before the operator starts, and before the end of its first window (queryOffset: 2 s earlier)
    asleep = f'vllm:engine_sleep_state{{namespace="{namespace}",sleep_state="awake"}} == 0'
    client = PrometheusClient(Connection(url=prometheus.url))
    wait_for(lambda: client.query(asleep, time.time() - 3), 30, "Prometheus to have scraped the engine asleep")
    preset = {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}
    world.create_tuning(tuning_spec(world.name, schedules=[open_window(ZONE, preset)]))
    operator = operators.start()

    def holds() -> float:
        return operator.metric("vllm_autotuner_decisions_total", reason="EngineAsleep")

    wait_for(lambda: holds() >= 3, 90, "three holds for the sleeping engine")  # the history keeps one of a kind
    status = world.status()
    (hold,) = status["history"]
    assert hold["hold"] == "EngineAsleep" and hold["reason"].startswith("1 of 1 pods' vLLM engines slept"), hold
    assert knobs_of(world.template_args()) == BEFORE and status.get("lastRollout") is None
    assert [p.metadata.name for p in world.pods()] == [pod.metadata.name]  # still the pod that sleeps
    header, row = cluster_with_crd.kubectl("get", "vlt", world.name, "-n", namespace).stdout.splitlines()
    assert row.split()[header.split().index("HOLDING")] == "EngineAsleep", (header, row)
    call_vllm(pod, "/wake_up")
    woke = datetime.now(timezone.utc)
    world.wait_rolled_out([*knob_args(*PRESET), "--enable-sleep-mode"], 90)
    rollout = world.status()["lastRollout"]
    assert rollout["source"] == "Schedule" and parse_time(rollout["startedAt"]) > woke, (rollout, woke)
