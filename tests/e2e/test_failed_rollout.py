"""A config that cannot start is rolled back, remembered as failed, and never tried again.

On the simulated L4 (24 GB) a 24576-token budget reserves so much
activation memory that the KV cache cannot hold one max-length request,
and vLLM exits at start-up with that error, as a real one does. A schedule
preset asks for exactly that config, so the operator must roll it out, see
the new pod crash-loop, put the old config back well within the
progressDeadline, record the config and vLLM's reason in
status.failedConfigs, raise and then clear ``Degraded``, and hold from then
on although the schedule keeps asking. The Deployment uses maxSurge 0, as
GPU pools without a spare GPU do, so the failing pod replaces the old one
and the rollback is what brings service back.
"""

from __future__ import annotations

import pytest
from tests.e2e.conftest import Operators
from tests.e2e.world import World, knob_args, knobs_of, open_window, parse_time, tuning_spec
from tests.support import L4, Cluster, expected_startup, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, TOO_BIG = (2048, 64), (24576, 256)
PROGRESS_DEADLINE = 60


def test_a_config_that_cannot_start_is_rolled_back_recorded_and_never_tried_again(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    assert expected_startup(L4, knob_args(*START)).ok
    assert "KV cache" in expected_startup(L4, knob_args(*TOO_BIG)).error
    world = World(cluster_with_crd, namespace)
    world.create_deployment(L4, knob_args(*START), replicas=1,
                            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    world.create_tuning(tuning_spec(
        world.name, rollout={"progressDeadline": f"{PROGRESS_DEADLINE}s"},
        schedules=[open_window("Europe/Berlin", {"maxNumBatchedTokens": TOO_BIG[0], "maxNumSeqs": TOO_BIG[1]})]))
    operator = operators.start()

    degraded = world.wait_condition("Degraded", "True", "RolloutFailed", 120)
    assert "crash-looping" in degraded["message"] and "KV cache" in degraded["message"], degraded
    recovered = world.wait_condition("Degraded", "False", "RecoveredByRollback", 120)
    assert "KV cache" in recovered["message"]
    world.wait_rolled_out(knob_args(*START), 60)

    status = world.status()
    (failed,) = status["failedConfigs"]
    assert (failed["maxNumBatchedTokens"], failed["maxNumSeqs"]) == TOO_BIG and "KV cache" in failed["reason"]
    rollback = status["lastRollout"]
    assert rollback["source"] == "Rollback" and rollback["phase"] == "Succeeded"
    assert (rollback["from"]["maxNumBatchedTokens"], rollback["to"]["maxNumBatchedTokens"]) == (TOO_BIG[0], START[0])
    change = next(h for h in world.history() if h["action"] == "Change")
    rolled_back = next(h for h in world.history() if h["action"] == "Rollback")
    assert (parse_time(rolled_back["time"]) - parse_time(change["time"])).total_seconds() <= PROGRESS_DEADLINE
    assert [e.type for e in world.events("RolloutFailed")] == ["Warning"]
    assert len(world.events("RolledBack")) == 1 and len(world.events("VllmKnobsRolledBack", kind="Deployment")) == 1

    # The schedule still asks for the preset; the operator holds, evaluation after evaluation.
    wait_for(lambda: "not retried" in world.history()[-1]["reason"], 60, "a hold that refuses to retry the config")
    holds = operator.metric("vllm_autotuner_decisions_total", reason="NoBetterConfig")
    wait_for(lambda: operator.metric("vllm_autotuner_decisions_total", reason="NoBetterConfig") >= holds + 3, 60,
             "three more evaluations")
    assert world.deployment().metadata.generation == 3  # created, patched, rolled back: nothing since
    assert knobs_of(world.template_args()) == START
    assert world.status()["failedConfigs"] == status["failedConfigs"]
    assert world.has_condition("Degraded", "False", "RecoveredByRollback")
