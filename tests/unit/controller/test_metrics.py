"""The operator's per-tuning series: set from a tuning's status, and gone with the tuning."""

from __future__ import annotations

from prometheus_client import generate_latest

from vllm_autotuner.api import DecisionAction
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.policy.observation import HoldReason


def series_of(metrics: OperatorMetrics, tuning: str) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line.split("{")[0] for line in text.splitlines() if f'tuning="{tuning}"' in line]


def test_a_deleted_tunings_series_go_and_another_tunings_stay() -> None:
    metrics = OperatorMetrics()
    for tuning in ("chat", "rag"):
        metrics.watch("llm", tuning)
        metrics.knobs.labels("llm", tuning, "max_num_seqs").set(256)
        metrics.slot_wait("llm", tuning, "2024-05-01T12:00:00Z")
        metrics.drain("llm", tuning, 0, 1.0)
        metrics.decisions.labels("llm", tuning, DecisionAction.HOLD, HoldReason.COOLDOWN).inc()
        metrics.decisions.labels("llm", tuning, DecisionAction.CHANGE, "").inc()
    assert {"vllm_autotuner_decisions_total", "vllm_autotuner_drain_seconds", "vllm_autotuner_restart_cut_ratio",
            "vllm_autotuner_rollout_slot_wait_since_seconds", "vllm_autotuner_knob",
            "vllm_autotuner_rollouts_total"} <= set(series_of(metrics, "chat"))
    metrics.forget("llm", "chat")
    assert series_of(metrics, "chat") == []
    assert {"vllm_autotuner_drain_seconds", "vllm_autotuner_decisions_total"} <= set(series_of(metrics, "rag"))


def test_a_drain_not_read_yet_exports_no_series_rather_than_a_stale_one() -> None:
    metrics = OperatorMetrics()
    metrics.drain("llm", "chat", 45, None)  # no request measured running yet: no share
    assert series_of(metrics, "chat") == ["vllm_autotuner_drain_seconds"]
    assert 'vllm_autotuner_drain_seconds{namespace="llm",tuning="chat"} 45.0' in (
        generate_latest(metrics.registry).decode())
    metrics.drain("llm", "chat", 45, 0.25)
    assert 'vllm_autotuner_restart_cut_ratio{namespace="llm",tuning="chat"} 0.25' in (
        generate_latest(metrics.registry).decode())
    metrics.drain("llm", "chat", None, None)
    assert series_of(metrics, "chat") == []
