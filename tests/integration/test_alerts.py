"""The chart's alerts, evaluated by Prometheus' own rule engine (``promtool test rules``) on series shaped like the
operator's metrics (``tests/unit/test_packaging.py`` checks that they name only metrics the operator exports)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.support import ALERTS, CHART, Helm, alert_rules

from vllm_autotuner.policy.guardrails import CUT_SHARE_WARNED
from vllm_autotuner.sim.localenv import PROMETHEUS

pytestmark = pytest.mark.integration

PROMTOOL = PROMETHEUS.with_name("promtool")  # Debian's prometheus package ships both
TUNING = 'namespace="team-a",tuning="chat"'


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.exists(), f"{PROMTOOL} missing: run `make setup` (it installs Debian's prometheus package)"
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=120, check=False)


def rule(alert: str) -> dict:
    (found,) = [r for r in alert_rules() if r["alert"] == alert]
    return found


def fires(alert: str, at: str, *labels: dict[str, str], value: str = "") -> dict:
    """A check that ``alert`` fires at ``at`` once per label set in ``labels`` (none: it does not fire), with its
    annotations' templates filled in from those labels (a template naming a label the alert lacks fails here) and
    ``value`` for ``$value``."""
    def filled(text: str, found: dict[str, str]) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: found[m.group(1)], text)
        return re.sub(r"\{\{ \$value \| humanize\w* \}\}", value, text)

    written = rule(alert)
    return {"alertname": alert, "eval_time": at, "exp_alerts": [
        {"exp_labels": {**written["labels"], **found},
         "exp_annotations": {k: filled(v, found) for k, v in written["annotations"].items()}} for found in labels]}


def case(series: dict[str, str], *checks: dict) -> dict:
    return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": list(checks)}


CASES = [
    # no operator series at all, then one replica scraped
    case({"up": "1x30"}, fires("VllmAutotunerAbsent", "11m", {})),
    case({"vllm_autotuner_leader": "0x30"}, fires("VllmAutotunerAbsent", "11m")),
    # two replicas, neither the leader; one the leader
    case({'vllm_autotuner_leader{namespace="ops",pod="a"}': "0x30",
          'vllm_autotuner_leader{namespace="ops",pod="b"}': "0x30"},
         fires("VllmAutotunerNoLeader", "4m"), fires("VllmAutotunerNoLeader", "6m", {"namespace": "ops"})),
    case({'vllm_autotuner_leader{namespace="ops",pod="a"}': "0x30",
          'vllm_autotuner_leader{namespace="ops",pod="b"}': "1x30"},
         fires("VllmAutotunerNoLeader", "20m")),
    # two releases, in namespaces ops-a and ops-b: the one that leads does not hide the other
    case({'vllm_autotuner_leader{namespace="ops-a",pod="a"}': "1x30",
          'vllm_autotuner_leader{namespace="ops-b",pod="b"}': "0x30"},
         fires("VllmAutotunerNoLeader", "6m", {"namespace": "ops-b"})),
    # observation windows failing for good; errors that stopped
    case({'vllm_autotuner_prometheus_query_errors_total{kind="connection"}': "0+1x40"},
         fires("VllmAutotunerPrometheusErrors", "10m"),
         fires("VllmAutotunerPrometheusErrors", "30m", {"kind": "connection"})),
    case({'vllm_autotuner_prometheus_query_errors_total{kind="connection"}': "0+1x5 5x40"},
         fires("VllmAutotunerPrometheusErrors", "30m")),
    # a failed rollout fires for the hour after it; succeeded ones never
    case({f'vllm_autotuner_rollouts_total{{{TUNING},outcome="Failed"}}': "0x10 1x100",
          f'vllm_autotuner_rollouts_total{{{TUNING},outcome="Succeeded"}}': "0+1x100"},
         fires("VllmTuningRolloutFailed", "9m"),
         fires("VllmTuningRolloutFailed", "20m", {"namespace": "team-a", "tuning": "chat", "outcome": "Failed"}),
         fires("VllmTuningRolloutFailed", "80m")),
    # ... and one counted before the series was ever scraped (born at 1, created at 10m) too, for the hour after it
    case({f'vllm_autotuner_rollouts_total{{{TUNING},outcome="Blocked"}}': "_x10 1x100",
          f'vllm_autotuner_rollouts_created{{{TUNING},outcome="Blocked"}}': "_x10 600x100"},
         fires("VllmTuningRolloutFailed", "9m"),
         fires("VllmTuningRolloutFailed", "20m", {"namespace": "team-a", "tuning": "chat", "outcome": "Blocked"}),
         fires("VllmTuningRolloutFailed", "69m", {"namespace": "team-a", "tuning": "chat", "outcome": "Blocked"}),
         fires("VllmTuningRolloutFailed", "80m")),
    # an old count is no new failure: not after a gap in the scrapes, nor in a Prometheus without its history
    case({f'vllm_autotuner_rollouts_total{{{TUNING},outcome="Failed"}}': "1x60 _x10 1x130",
          f'vllm_autotuner_rollouts_created{{{TUNING},outcome="Failed"}}': "0x60 _x10 0x130"},
         fires("VllmTuningRolloutFailed", "75m"), fires("VllmTuningRolloutFailed", "128m")),
    case({f'vllm_autotuner_rollouts_total{{{TUNING},outcome="Failed"}}': "2x60",
          f'vllm_autotuner_rollouts_created{{{TUNING},outcome="Failed"}}': "-86400x60"},
         fires("VllmTuningRolloutFailed", "30m")),
    case({f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="ChangesReverted"}}': "0x10 1x30"},
         fires("VllmTuningChangesReverted", "9m"),
         fires("VllmTuningChangesReverted", "12m", {"namespace": "team-a", "tuning": "chat"})),
    # a controlled target of one tuning, the changes of another put back: each alert names its own
    case({f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="TargetControlled"}}': "0x10 1x30",
          'vllm_autotuner_decisions_total{namespace="team-a",tuning="rag",action="Hold",reason="ChangesReverted"}':
              "0x10 1x30"},
         fires("VllmTuningTargetControlled", "9m"),
         fires("VllmTuningTargetControlled", "12m", {"namespace": "team-a", "tuning": "chat"}),
         fires("VllmTuningChangesReverted", "12m", {"namespace": "team-a", "tuning": "rag"})),
    # every decision for an hour held for missing data; another tuning's data came back
    case({f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="NoData"}}': "0+2x120",
          'vllm_autotuner_decisions_total{namespace="team-a",tuning="rag",action="Hold",reason="StaleData"}':
              "0+2x120",
          'vllm_autotuner_decisions_total{namespace="team-a",tuning="rag",action="Hold",reason="Cooldown"}':
              "0x30 0+2x90"},
         fires("VllmTuningBlind", "20m"),
         fires("VllmTuningBlind", "100m", {"namespace": "team-a", "tuning": "chat"})),
    # pods that abort what they run as they stop, for 15 minutes; another tuning's drain 45 s; a third's fixed at 10m
    case({f"vllm_autotuner_drain_seconds{{{TUNING}}}": "0x30",
          'vllm_autotuner_drain_seconds{namespace="team-a",tuning="rag"}': "45x30",
          'vllm_autotuner_drain_seconds{namespace="team-b",tuning="chat"}': "0x10 30x20"},
         fires("VllmTuningRestartsCutRequests", "14m"),
         fires("VllmTuningRestartsCutRequests", "16m", {"namespace": "team-a", "tuning": "chat"})),
    # a 10 s drain cutting 61% of requests that run 20 s, for 30 minutes; a 45 s drain cutting 3%; pods that abort
    # (the alert above says so); a drain raised at 20m from 10 to 60 s
    case({f"vllm_autotuner_drain_seconds{{{TUNING}}}": "10x40",
          f"vllm_autotuner_restart_cut_ratio{{{TUNING}}}": "0.61x40",
          'vllm_autotuner_drain_seconds{namespace="team-a",tuning="rag"}': "45x40",
          'vllm_autotuner_restart_cut_ratio{namespace="team-a",tuning="rag"}': "0.03x40",
          'vllm_autotuner_drain_seconds{namespace="team-b",tuning="chat"}': "0x40",
          'vllm_autotuner_restart_cut_ratio{namespace="team-b",tuning="chat"}': "1x40",
          'vllm_autotuner_drain_seconds{namespace="team-c",tuning="chat"}': "10x20 60x20",
          'vllm_autotuner_restart_cut_ratio{namespace="team-c",tuning="chat"}': "0.61x20 0.05x20"},
         fires("VllmTuningDrainTooShort", "29m"),
         fires("VllmTuningDrainTooShort", "31m", {"namespace": "team-a", "tuning": "chat"}, value="61%")),
    # a change has waited for a slot since 10m (600 s); another's wait ended at 30m (its series dropped)
    case({f"vllm_autotuner_rollout_slot_wait_since_seconds{{{TUNING}}}": "_x10 600x110",
          f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="RolloutSlots"}}': "_x10 0+2x110",
          'vllm_autotuner_rollout_slot_wait_since_seconds{namespace="team-a",tuning="rag"}': "0x30"},
         fires("VllmTuningWaitsForRolloutSlot", "69m"),
         fires("VllmTuningWaitsForRolloutSlot", "71m", {"namespace": "team-a", "tuning": "chat"}, value="1h 1m 0s")),
    # a waiting change keeps its place through 80 minutes without data (its decisions hold NoData): it does not
    # wait for a slot meanwhile, so no alert, until it does again; its wait then counts from its place
    case({f"vllm_autotuner_rollout_slot_wait_since_seconds{{{TUNING}}}": "600x130",
          f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="RolloutSlots"}}': "0+2x20 40x80 40+2x30",
          f'vllm_autotuner_decisions_total{{{TUNING},action="Hold",reason="NoData"}}': "0x20 0+2x80 160x30"},
         fires("VllmTuningWaitsForRolloutSlot", "95m"),
         fires("VllmTuningWaitsForRolloutSlot", "115m", {"namespace": "team-a", "tuning": "chat"}, value="1h 45m 0s")),
    # evaluation periods of 10 to 30 s (p90 28 s), then of under a second
    case({'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops",le="10"}': "0x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops",le="30"}': "0+2x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops",le="+Inf"}': "0+2x60"},
         fires("VllmAutotunerEvaluationsSlow", "10m"),
         fires("VllmAutotunerEvaluationsSlow", "40m", {"namespace": "ops"}, value="28s")),
    case({'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops",le="1"}': "0+2x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops",le="+Inf"}': "0+2x60"},
         fires("VllmAutotunerEvaluationsSlow", "40m")),
    # the same slow periods in one release's namespace, beside a quick release's: that one is named
    case({'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops-a",le="10"}': "0x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops-a",le="30"}': "0+2x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops-a",le="+Inf"}': "0+2x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops-b",le="1"}': "0+20x60",
          'vllm_autotuner_evaluation_period_duration_seconds_bucket{namespace="ops-b",le="+Inf"}': "0+20x60"},
         fires("VllmAutotunerEvaluationsSlow", "40m", {"namespace": "ops-a"}, value="28s")),
]


def test_the_drain_alert_warns_from_the_share_the_operators_advice_does() -> None:
    assert f"(vllm_autotuner_restart_cut_ratio) > {CUT_SHARE_WARNED} and" in rule("VllmTuningDrainTooShort")["expr"]


def test_promtool_accepts_the_rules() -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_each_alert_fires_when_it_should_and_not_otherwise(tmp_path: Path) -> None:
    alerts = {r["alert"] for r in alert_rules()}
    tested = {check["alertname"] for c in CASES for check in c["alert_rule_test"] if check["exp_alerts"]}
    assert tested == alerts  # every alert is shown to fire somewhere
    tests = tmp_path / "alerts_test.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": CASES}))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_chart_renders_the_rules_as_a_prometheus_rule_when_asked(helm: Helm, tmp_path: Path) -> None:
    objects = helm.template("rel", str(CHART), "-n", "ops", "--set", "prometheusRule.enabled=true",
                            "--set", "prometheusRule.labels.release=kube-prometheus-stack")
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "ops"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert "PrometheusRule" not in {o["kind"] for o in helm.template("rel", str(CHART))}
    # the rule file as it is (the annotations' {{ $labels }} left to Prometheus), but for the release's absence
    rendered = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert [{**r, "expr": "?"} for r in rendered] == [{**r, "expr": "?"} for r in alert_rules()]
    assert [r["expr"] for r in rendered if r["expr"] != rule_of(rendered, r["alert"], alert_rules())] == [
        'absent(vllm_autotuner_leader{namespace="ops"})']
    # on Prometheus' rule engine: a release leading in another namespace does not hide this one's absence
    rules, tests = tmp_path / "rendered.yaml", tmp_path / "rendered_test.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    absent = fires("VllmAutotunerAbsent", "11m", {"namespace": "ops"})
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        case({'vllm_autotuner_leader{namespace="other"}': "1x30"}, absent),
        case({'vllm_autotuner_leader{namespace="ops"}': "1x30"}, fires("VllmAutotunerAbsent", "11m"))]}))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr


def rule_of(rules: list[dict], alert: str, written: list[dict]) -> str:
    """The expression of ``alert`` in ``written`` (the rule file), to compare with ``rules``' (the chart's)."""
    (found,) = [r["expr"] for r in written if r["alert"] == alert]
    return found
