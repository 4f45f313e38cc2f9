"""Prometheus goes away mid-run: the operator says so, patches nothing, and carries on when it is back.

The test runs a Prometheus of its own (the session's is shared by every
test) that scrapes the test's pods, and points the operator at it. The
traffic is the overload of the chat test, so the operator has a reason to
change the knobs. The tuning starts in Recommend mode, which shows that
reason (a recommendation in status) without acting on it; then Prometheus
stops and, during the outage, the tuning is switched to Auto. From then on
the operator would act on any data it had: acting blind on the recommendation
or the last numbers seen, or on a failed query read as zeros, would show as a
patch during the outage. The change must wait until Prometheus is back.
(The policy acts on its first usable window when the SLOs are badly
breached, so an outage timed "before it acts" would be a race.)

A second test points the operator at a Prometheus that never answers, and
has another Prometheus scrape the operator as the chart's ServiceMonitor
does and evaluate the chart's alerts: the two alerts for it go pending,
named and described from the operator's own series, and, since the test's
pods abort what they run as they stop, the one for that; no other. Its
tuning has a schedule window open, whose preset needs no traffic: blind,
it is not written either, only recommended.
"""

from __future__ import annotations

import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_traffic import settled_window
from tests.e2e.world import Load, World, fleet_targets_of, knob_args, knobs_of, open_window, parse_time, tuning_spec
from tests.support import H100, Cluster, NotYet, Operators, alert_rules, alert_watcher, wait_for

from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e


def test_prometheus_stopped_mid_run_means_metrics_unavailable_and_no_patch_until_it_returns(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, prometheus: localenv.Prometheus,
        operators: Operators, tmp_path: Path) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(512, 16), replicas=2)
    workdir = tmp_path / "prometheus"
    own = localenv.start_prometheus(workdir)
    try:
        localenv.write_targets(own.targets_file, fleet_targets_of(prometheus, namespace))
        world.create_tuning(tuning_spec(world.name, mode="Recommend"))
        operator = operators.start(prometheus_url=own.url)
        with Load(world, tmp_path, rate=18):
            wait_for(lambda: settled_window(world, (512, 16)), 150, "a first usable window")
            wanted = wait_for(lambda: world.status().get("recommendation"), 60, "a recommendation from the traffic")
            assert wanted["maxNumSeqs"] > 16, wanted
            own.stop()

            unavailable = world.wait_condition("MetricsAvailable", "False", "PrometheusUnreachable", 60)
            assert own.url in unavailable["message"]
            assert [e.type for e in world.events("MetricsUnavailable")] == ["Warning"]
            errors = operator.metric("vllm_autotuner_prometheus_query_errors_total", kind="PrometheusUnreachable")
            assert errors >= 1
            world.patch_tuning({"mode": "Auto"})
            wait_for(lambda: operator.metric("vllm_autotuner_prometheus_query_errors_total") >= errors + 3, 60,
                     "three more evaluations without Prometheus")
            status = world.status()
            assert "lastRollout" not in status and world.deployment().metadata.generation == 1
            assert world.has_condition("Ready", "True", "Tuning")
            assert operator.alive() and operator.healthy()

            own = localenv.start_prometheus(workdir, port=int(own.url.rsplit(":", 1)[1]))
            back = datetime.now(timezone.utc)
            localenv.write_targets(own.targets_file, fleet_targets_of(prometheus, namespace))
            world.wait_condition("MetricsAvailable", "True", "WindowObserved", 90)
            rollout = wait_for(lambda: world.status().get("lastRollout"), 120, "the change the traffic called for")
    finally:
        own.stop()
    assert parse_time(rollout["startedAt"]) >= back and rollout["source"] == "Traffic", rollout
    assert rollout["to"]["maxNumSeqs"] > 16


def test_an_operator_that_cannot_reach_prometheus_raises_its_alerts_and_no_other_and_writes_no_preset(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(512, 16), replicas=1)
    world.wait_rolled_out(knob_args(512, 16), 60)  # no rollout in progress: its decisions hold for want of data
    preset = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 64}
    world.create_tuning(tuning_spec(world.name, schedules=[open_window("UTC", preset)]))
    # a port bound here and never listened on: connections are refused at once, and no other socket can take it
    # meanwhile (one that did, even as its own source port, made a query hang until its timeout, past the wait)
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    request.addfinalizer(refusing.close)
    operator = operators.start(prometheus_url=f"http://127.0.0.1:{refusing.getsockname()[1]}")
    expected = {"VllmAutotunerPrometheusErrors", "VllmTuningBlind", "VllmTuningRestartsCutRequests"}
    with alert_watcher(tmp_path / "watcher", operator.url) as watcher:

        def active() -> dict[str, list[dict[str, Any]]] | NotYet:
            found = watcher.active()
            return found if set(found) == expected else NotYet(f"active alerts {sorted(found)}")

        found = wait_for(active, 60, f"exactly {sorted(expected)} to be active")
        rules = [r for group in watcher.api("rules")["groups"] for r in group["rules"]]
        written = {r["alert"] for r in alert_rules()}
        assert {r["name"] for r in rules} == written and all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules]
    (errors,) = found["VllmAutotunerPrometheusErrors"]
    assert errors["state"] == "pending" and errors["labels"]["kind"] == "PrometheusUnreachable", errors
    assert "(PrometheusUnreachable)" in errors["annotations"]["summary"], errors
    (blind,) = found["VllmTuningBlind"]
    assert blind["state"] == "pending", blind
    assert (blind["labels"]["namespace"], blind["labels"]["tuning"]) == (namespace, world.name), blind
    assert f"kubectl describe vlt {world.name} -n {namespace}" in blind["annotations"]["description"], blind
    # the pods have no --shutdown-timeout: read from the template, whatever Prometheus does
    (cut,) = found["VllmTuningRestartsCutRequests"]
    assert cut["state"] == "pending" and (cut["labels"]["namespace"], cut["labels"]["tuning"]) == (
        namespace, world.name), cut
    assert "--shutdown-timeout=N" in cut["annotations"]["description"], cut
    # evaluations held until the alerts went pending, the preset's window open all along: never written
    status = world.status()
    assert "lastRollout" not in status and world.deployment().metadata.generation == 1, status.get("lastRollout")
    assert knobs_of(world.template_args()) == (512, 16)
    held = status["history"][0]
    assert held["hold"] == "NoData" and "waits for a fresh window" in held["reason"], held
    assert {k: status["recommendation"][k] for k in preset} == preset, status["recommendation"]
