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
and the rollback is what brings service back. With that rollback refused by
admission (a ValidatingAdmissionPolicy, as an admission webhook down or a
Role edited would refuse it), the operator records the failed config at
once, retries the rollback at each evaluation and says each thing once. The
chart's alert on failed rollouts fires for the tuning's first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.e2e.world import World, knob_args, knobs_of, open_window, parse_time, tuning_spec
from tests.support import L4, Cluster, NotYet, Operators, alert_watcher, expected_startup, vllm_deployment, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, TOO_BIG = (2048, 64), (24576, 256)
PROGRESS_DEADLINE = 60


def test_a_config_that_cannot_start_is_rolled_back_recorded_and_never_tried_again(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path) -> None:
    assert expected_startup(L4, knob_args(*START)).ok
    assert "KV cache" in expected_startup(L4, knob_args(*TOO_BIG)).error
    world = World(cluster_with_crd, namespace)
    world.create_deployment(L4, knob_args(*START), replicas=1,
                            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    world.create_tuning(tuning_spec(
        world.name, rollout={"progressDeadline": f"{PROGRESS_DEADLINE}s"},
        schedules=[open_window("Europe/Berlin", {"maxNumBatchedTokens": TOO_BIG[0], "maxNumSeqs": TOO_BIG[1]})]))
    operator = operators.start()

    with alert_watcher(tmp_path / "watcher", operator.url) as watcher:
        degraded = world.wait_condition("Degraded", "True", "RolloutFailed", 120)
        assert "crash-looping" in degraded["message"] and "KV cache" in degraded["message"], degraded
        # the tuning's first failed rollout is an increase the chart's alert sees
        (alert,) = wait_for(lambda: watcher.active().get("VllmTuningRolloutFailed") or NotYet("no alert"), 30,
                            "VllmTuningRolloutFailed to fire")
    assert alert["state"] == "firing" and (alert["labels"]["namespace"], alert["labels"]["tuning"],
                                           alert["labels"]["outcome"]) == (namespace, world.name, "Failed"), alert
    recovered = world.wait_condition("Degraded", "False", "RecoveredByRollback", 120)
    assert "KV cache" in recovered["message"]
    world.wait_rolled_out(knob_args(*START), 60)

    status = world.status()
    (failed,) = status["failedConfigs"]
    assert (failed["maxNumBatchedTokens"], failed["maxNumSeqs"]) == TOO_BIG and "KV cache" in failed["reason"]
    rollback = status["lastRollout"]
    assert rollback["source"] == "Rollback" and rollback["phase"] == "Succeeded"
    # judged against the template its patch's answer held, which every watched copy of it matched (not overtaken)
    assert rollback["templateDigest"].startswith(f"{rollback['deploymentGeneration']}:"), rollback
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


def _args_hold(obj: str, value: int) -> str:
    return f"{obj}.spec.template.spec.containers.exists(c, has(c.args) && c.args.exists(a, a == '{value}'))"


@contextmanager
def rollbacks_refused(cluster: Cluster, namespace: str, name: str) -> Iterator[client.AdmissionregistrationV1Api]:
    """A ValidatingAdmissionPolicy, bound to ``namespace``, that refuses any update of a Deployment from
    ``TOO_BIG`` back to ``START``: the operator's rollback, and nothing the Deployment controller writes.
    Yields once the apiserver enforces it (a dry-run of that update on a probe Deployment is refused)."""
    api = client.AdmissionregistrationV1Api(cluster.api)
    apps = client.AppsV1Api(cluster.api)
    policy = f"refuse-rollback-{namespace}"
    api.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                         "operations": ["UPDATE"], "resources": ["deployments"]}]},
                 "validations": [{"expression": f"!({_args_hold('oldObject', TOO_BIG[0])} && "
                                                f"{_args_hold('object', START[0])})",
                                  "message": "rollbacks are refused by this test's policy"}]}})
    api.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}})
    probe = f"{name}-probe"
    apps.create_namespaced_deployment(namespace, vllm_deployment(probe, L4, knob_args(*TOO_BIG), replicas=0))

    def refused() -> bool | NotYet:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": knob_args(*START)}]}}}}
        try:
            apps.patch_namespaced_deployment(probe, namespace, patch, dry_run="All")
        except ApiException as exc:
            return exc.status == 422 or NotYet(f"refused with {exc.status}")
        return NotYet("the dry-run rollback of the probe was admitted")

    try:
        wait_for(refused, 30, "the apiserver to enforce the policy")
        yield api
    finally:
        for delete in (api.delete_validating_admission_policy_binding, api.delete_validating_admission_policy):
            try:
                delete(policy)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_a_rollback_the_api_refuses_is_retried_and_each_thing_said_once(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(L4, knob_args(*START), replicas=1,
                            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    with rollbacks_refused(cluster_with_crd, namespace, world.name) as admission:
        world.create_tuning(tuning_spec(
            world.name, rollout={"progressDeadline": f"{PROGRESS_DEADLINE}s"},
            schedules=[open_window("Europe/Berlin", {"maxNumBatchedTokens": TOO_BIG[0], "maxNumSeqs": TOO_BIG[1]})]))
        operator = operators.start()

        world.wait_condition("Degraded", "True", "RolloutFailed", 120)
        refusal = wait_for(lambda: world.events("PatchFailed"), 60, "the rollback's refusal")
        assert "rollbacks are refused by this test's policy" in refusal[0].message, refusal[0].message  # the why
        evaluations = operator.metric("vllm_autotuner_evaluation_duration_seconds_count")
        wait_for(lambda: operator.metric("vllm_autotuner_evaluation_duration_seconds_count") >= evaluations + 3, 60,
                 "three more evaluations, each retrying the rollback")

        # refused at every evaluation: the config already recorded as failed, each thing said and counted once
        assert knobs_of(world.template_args()) == TOO_BIG
        (failed,) = world.status()["failedConfigs"]
        assert (failed["maxNumBatchedTokens"], failed["maxNumSeqs"]) == TOO_BIG and "KV cache" in failed["reason"]
        assert len(world.events("RolloutFailed")) == 1 and len(world.events("PatchFailed")) == 1
        assert operator.metric("vllm_autotuner_rollouts_total", outcome="Failed") == 1
        admission.delete_validating_admission_policy_binding(f"refuse-rollback-{namespace}")

        world.wait_condition("Degraded", "False", "RecoveredByRollback", 120)
        world.wait_rolled_out(knob_args(*START), 60)
    assert len(world.events("RolloutFailed")) == 1 and len(world.events("RolledBack")) == 1
    assert world.status()["lastRollout"]["source"] == "Rollback"
