"""The reconciler counts a Ready pod as reporting only while its samples are fresh by the decision core's limit."""

from __future__ import annotations

from datetime import timedelta

from tests.unit.controller.test_reconcile_rollout import NEW, NOW, Windows, evaluate, window


def test_a_ready_pod_that_stopped_being_scraped_holds_the_window_as_partial() -> None:
    wedged = ("llm", "llama-7f8b-p4q7z")
    data = window((NEW, wedged))
    data.values["last_seen"][wedged] = NOW.timestamp() - 240  # within Prometheus's 5-minute lookback
    report = evaluate(Windows(data), finished=timedelta(minutes=6))  # 2 Ready pods of the current revision
    available = next(c for c in report.state.conditions if c.type == "MetricsAvailable")
    assert available.status == "False" and available.reason == "NoData"
    # the limit is the spec's: three 30 s evaluation intervals, at least 90 s
    assert available.message.startswith("only 1 of 2 Ready pods reported in the last 90s: partial data; "
                                        "last sample from llama-7f8b-p4q7z 240s ago")
    assert report.decision.hold == "NoData"
