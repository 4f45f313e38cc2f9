"""The operator's own /metrics: what it decided, what it rolled out, how it is doing.

Platform teams alert on these (rollouts failing, Prometheus unreachable,
evaluations slowing down) and graph the knobs next to vLLM's latency, so
names and labels are part of the interface and live in one registry here.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vllm_autotuner.api import DecisionAction
from vllm_autotuner.policy.observation import HoldReason


#: The outcomes ``rollouts`` counts (a measured regression's rollback is a decision, counted in ``decisions``).
ROLLOUT_OUTCOMES = ("Succeeded", "Failed", "Blocked")


class OperatorMetrics:
    """All operator metrics, in their own registry (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "vllm_autotuner_decisions", "Decisions made, by outcome (Hold, Change, Rollback) and hold reason.",
            ["namespace", "tuning", "action", "reason"], registry=r)
        self.rollouts = Counter(
            "vllm_autotuner_rollouts", "Rollouts finished, by outcome (Succeeded, Failed, Blocked).",
            ["namespace", "tuning", "outcome"], registry=r)
        self.evaluation_seconds = Histogram(
            "vllm_autotuner_evaluation_duration_seconds", "Time to observe, decide and act for one tuning.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.period_seconds = Histogram(
            "vllm_autotuner_evaluation_period_duration_seconds",
            "Time to evaluate every tuning due at one tick (queries included).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.prometheus_queries = Counter(
            "vllm_autotuner_prometheus_queries", "PromQL queries sent.", registry=r)
        self.prometheus_errors = Counter(
            "vllm_autotuner_prometheus_query_errors", "Failed observation windows, by error kind.",
            ["kind"], registry=r)
        self.api_calls = Counter(
            "vllm_autotuner_kubernetes_api_calls", "Kubernetes API requests made outside the watches.",
            ["verb", "resource"], registry=r)
        self.api_call_seconds = Histogram(
            "vllm_autotuner_kubernetes_api_call_duration_seconds",
            "Time the Kubernetes API took to answer those requests, refusals and timeouts included.",
            ["verb", "resource"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15), registry=r)
        self.knobs = Gauge(
            "vllm_autotuner_knob", "Knob value the target runs with now.",
            ["namespace", "tuning", "knob"], registry=r)
        self.recommended = Gauge(
            "vllm_autotuner_recommended_knob", "Knob value the policy recommends.",
            ["namespace", "tuning", "knob"], registry=r)
        self.slot_wait_since = Gauge(
            "vllm_autotuner_rollout_slot_wait_since_seconds",
            "Unix time since when a change of the tuning has waited for a rollout slot (--max-concurrent-rollouts); "
            "absent while none waits.",
            ["namespace", "tuning"], registry=r)
        self.drain_seconds = Gauge(
            "vllm_autotuner_drain_seconds",
            "How long the target's pods let the requests they run finish as they stop (status.drainSeconds: "
            "vLLM's --shutdown-timeout within the grace period); 0: vLLM aborts them on SIGTERM.",
            ["namespace", "tuning"], registry=r)
        self.restart_cut_ratio = Gauge(
            "vllm_autotuner_restart_cut_ratio",
            "Share of its requests in flight each pod a rolling restart stops would cut, at the last usable window's "
            "mean request time: exp(-drain seconds / request seconds); absent while either is unknown.",
            ["namespace", "tuning"], registry=r)
        self.tunings = Gauge("vllm_autotuner_tunings", "VllmTunings watched.", registry=r)
        self.leader = Gauge("vllm_autotuner_leader", "1 while this replica is the leader.", registry=r)

    def watch(self, namespace: str, tuning: str) -> None:
        """Export a new tuning's rollout counts, at 0: an alert on ``increase()`` then sees its first rollout
        fail (a series first scraped at 1 shows no increase)."""
        for outcome in ROLLOUT_OUTCOMES:
            self.rollouts.labels(namespace, tuning, outcome)

    def forget(self, namespace: str, tuning: str) -> None:
        """Drop a deleted tuning's labelled series so they do not linger as stale values."""
        knobs = [("max_num_batched_tokens",), ("max_num_seqs",)]
        for metric, labels in ((self.knobs, knobs), (self.recommended, knobs),
                               (self.rollouts, [(outcome,) for outcome in ROLLOUT_OUTCOMES]),
                               (self.decisions, [(action, hold) for action in DecisionAction
                                                 for hold in ("", *HoldReason)])):
            for label in labels:
                try:
                    metric.remove(namespace, tuning, *label)
                except KeyError:
                    pass
        self.slot_wait(namespace, tuning, None)
        self.drain(namespace, tuning, None, None)

    def slot_wait(self, namespace: str, tuning: str, since: str | None) -> None:
        """Export since when the tuning's change waits for a rollout slot (RFC 3339), or drop the series (None)."""
        _set_or_drop(self.slot_wait_since, namespace, tuning,
                     None if since is None else datetime.fromisoformat(since).timestamp())

    def drain(self, namespace: str, tuning: str, seconds: float | None, cut: float | None) -> None:
        """Export how long the target's pods drain as they stop, and the share of their requests in flight that
        cuts (``policy.guardrails.cut_share``), or drop each series (None: not known)."""
        _set_or_drop(self.drain_seconds, namespace, tuning, seconds)
        _set_or_drop(self.restart_cut_ratio, namespace, tuning, cut)


def _set_or_drop(gauge: Gauge, namespace: str, tuning: str, value: float | None) -> None:
    """Set a tuning's series of ``gauge``, or drop it when there is no value (rather than export a stale one)."""
    if value is not None:
        gauge.labels(namespace, tuning).set(value)
        return
    try:
        gauge.remove(namespace, tuning)
    except KeyError:
        pass
