"""The kubelet's side of the fleet: probe timelines, back-off and pod status shapes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from vllm_autotuner.sim.kubelet import (
    PROBE_KILL_EXIT,
    ContainerStatus,
    PodStatus,
    crash_backoff,
    grace_period,
    image_id,
    plan_attempt,
    termination_message,
)

HEALTH = {"httpGet": {"path": "/health", "port": 8000}}


def probe(**fields):
    return {**HEALTH, **fields}


def test_no_probes_started_and_ready_at_once_even_before_vllm_serves():
    plan = plan_attempt({}, serves_after=100.0, exits_after=None, exit_code=0, time_scale=1)
    assert (plan.started_after, plan.serving_after, plan.ready_after, plan.exit_after) == (0.0, 100.0, 0.0, None)


def test_readiness_turns_ready_at_the_first_probe_after_vllm_serves():
    spec = {"readinessProbe": probe(initialDelaySeconds=5, periodSeconds=10)}
    plan = plan_attempt(spec, serves_after=100.0, exits_after=None, exit_code=0, time_scale=1)
    assert plan.ready_after == 105.0
    scaled = plan_attempt(spec, serves_after=5.0, exits_after=None, exit_code=0, time_scale=0.05)
    assert scaled.ready_after == pytest.approx(5.25)  # probes every 0.5 s from 0.25 s


def test_startup_probe_gates_started_and_readiness():
    spec = {"startupProbe": probe(periodSeconds=10, failureThreshold=30), "readinessProbe": probe(periodSeconds=5)}
    plan = plan_attempt(spec, serves_after=101.0, exits_after=None, exit_code=0, time_scale=1)
    assert plan.started_after == 110.0 and plan.ready_after == 110.0 and plan.killed_by is None


@pytest.mark.parametrize("readiness", [{}, {"readinessProbe": probe()}])
def test_a_tight_startup_probe_kills_a_slow_start(readiness):
    spec = {"startupProbe": probe(periodSeconds=10, failureThreshold=6), **readiness}
    plan = plan_attempt(spec, serves_after=100.0, exits_after=None, exit_code=0, time_scale=1)
    assert plan.killed_by == "startup" and plan.exit_after == 50.0 and plan.exit_code == PROBE_KILL_EXIT
    assert plan.started_after is plan.serving_after is plan.ready_after is None


def test_liveness_without_startup_probe_kills_during_start_up():
    spec = {"livenessProbe": probe(initialDelaySeconds=30, periodSeconds=10, failureThreshold=3)}
    plan = plan_attempt(spec, serves_after=100.0, exits_after=None, exit_code=0, time_scale=1)
    assert plan.killed_by == "liveness" and plan.exit_after == 50.0
    patient = {"livenessProbe": probe(initialDelaySeconds=120)}
    assert plan_attempt(patient, serves_after=100.0, exits_after=None, exit_code=0, time_scale=1).killed_by is None


def test_a_vllm_error_before_the_probe_gives_up_is_a_crash():
    spec = {"startupProbe": probe(periodSeconds=10, failureThreshold=30), "readinessProbe": probe()}
    plan = plan_attempt(spec, serves_after=None, exits_after=125.0, exit_code=1, time_scale=1)
    assert (plan.exit_after, plan.exit_code, plan.killed_by) == (125.0, 1, None)
    assert plan.started_after is plan.ready_after is None


def test_crash_backoff_doubles_to_five_minutes():
    assert [crash_backoff(n, 1) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert crash_backoff(2, 0.05) == pytest.approx(1.0)


def test_termination_message_only_with_fallback_to_logs():
    error = "ValueError: no memory\nRuntimeError: Engine core initialization failed."
    assert termination_message({}, error) == ""
    assert termination_message({"terminationMessagePolicy": "File"}, error) == ""
    assert termination_message({"terminationMessagePolicy": "FallbackToLogsOnError"}, error) == error
    long = "\n".join(f"line {i}" for i in range(500))
    kept = termination_message({"terminationMessagePolicy": "FallbackToLogsOnError"}, long)
    assert kept.splitlines()[-1] == "line 499" and len(kept.splitlines()) == 80


def test_crash_loop_status_shape():
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    vllm = ContainerStatus("vllm", "vllm/vllm-openai:v0.11.0")
    sidecar = ContainerStatus("proxy", "envoy:1")
    sidecar.run("containerd://b", t0)
    sidecar.started = sidecar.ready = True
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}
    pod = PodStatus("127.9.0.1", "127.9.1.1", t0, [vllm, sidecar], others=[scheduled])
    vllm.run("containerd://a", t0)
    first = pod.render(t0)
    assert first["phase"] == "Running" and first["podIP"] == "127.9.1.1"
    assert first["podIPs"] == [{"ip": "127.9.1.1"}] and first["hostIP"] == "127.9.0.1"
    ready = {c["type"]: c for c in first["conditions"]}
    assert ready["Ready"]["status"] == "False"
    assert ready["Ready"]["message"] == "containers with unready status: [vllm]"
    assert ready["PodScheduled"] == scheduled

    t1 = t0 + timedelta(seconds=6)
    terminated = vllm.exit(1, "ValueError: no memory", t1)
    vllm.back_off(terminated, 10, "llama-abc")
    status = next(c for c in pod.render(t1)["containerStatuses"] if c["name"] == "vllm")
    assert status["state"] == {
        "waiting": {
            "reason": "CrashLoopBackOff",
            "message": "back-off 10s restarting failed container=vllm pod=llama-abc",
        }
    }
    assert status["lastState"]["terminated"] == {
        "exitCode": 1,
        "reason": "Error",
        "message": "ValueError: no memory",
        "startedAt": "2025-01-01T00:00:00Z",
        "finishedAt": "2025-01-01T00:00:06Z",
        "containerID": "containerd://a",
    }
    assert status["ready"] is False and status["started"] is False
    assert status["imageID"] == image_id("vllm/vllm-openai:v0.11.0")
    assert status["imageID"].startswith("vllm/vllm-openai@sha256:")

    t2 = t1 + timedelta(seconds=10)
    vllm.restart_count += 1
    vllm.run("containerd://c", t2)
    vllm.started = vllm.ready = True
    rendered = pod.render(t2)
    conditions = {c["type"]: c for c in rendered["conditions"]}
    assert (
        conditions["Ready"]["status"] == "True" and conditions["Ready"]["lastTransitionTime"] == "2025-01-01T00:00:16Z"
    )
    assert conditions["Initialized"]["lastTransitionTime"] == "2025-01-01T00:00:00Z"  # never changed
    status = next(c for c in rendered["containerStatuses"] if c["name"] == "vllm")
    assert status["restartCount"] == 1 and "running" in status["state"] and "terminated" in status["lastState"]


@pytest.mark.parametrize(("seconds", "text"), [(0.5, "500ms"), (2.5, "2.5s"), (80, "1m20s"), (300, "5m0s")])
def test_backoff_message_durations_read_like_go(seconds, text):
    container = ContainerStatus("vllm", "img")
    container.back_off({}, seconds, "p")
    assert container.state["waiting"]["message"].startswith(f"back-off {text} ")


def test_the_grace_period_is_the_deletions_else_the_specs_else_thirty_seconds():
    spec = {"terminationGracePeriodSeconds": 90}
    assert grace_period({"metadata": {}, "spec": {}}) == 30
    assert grace_period({"metadata": {}, "spec": spec}) == 90
    assert grace_period({"metadata": {"deletionGracePeriodSeconds": 0}, "spec": spec}) == 0  # a forced delete
