"""Which pods count as reporting (fresh by the decision core's staleness limit), what counts as a sample, and how
one query's rows become a pod's histogram."""

from __future__ import annotations

import pytest

from tests.unit.test_window import KNOBS, OTHER, SLO_, A, B, window
from vllm_autotuner.observe.client import Sample
from vllm_autotuner.observe.queries import PodMatch, Selector
from vllm_autotuner.observe.window import fetch_window, observe_target

CURRENT = PodMatch(("llama-abc-",))
LIMIT = 90.0  # ``stale_after`` of a spec with the default 30 s evaluation interval
GONE = ("llm", "llama-abc-3")


def test_a_ready_pod_whose_scrapes_stopped_minutes_ago_makes_the_window_partial():
    # its series are still in the window (Prometheus answers an instant query up to 5 minutes back), so it counted
    data = window()
    data.values["last_seen"][B] = data.at - 300
    obs, why = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False, stale_after_seconds=LIMIT)
    assert obs is None
    assert why.startswith("only 1 of 2 Ready pods reported in the last 90s: partial data; last sample from "
                          "llama-abc-2 300s ago")
    assert "scrape target" in why
    # at the limit a pod still counts: the decision core's rule holds a window only past it
    data.values["last_seen"][B] = data.at - LIMIT
    obs, why = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False, stale_after_seconds=LIMIT)
    assert why is None and obs is not None and obs.data_age_seconds == LIMIT


def test_a_pod_gone_in_a_scale_down_does_not_hold_the_window_and_its_requests_still_count():
    data = window(pods=(A, B, GONE))
    data.values["last_seen"][GONE] = data.at - 200  # deleted: no Ready pod any more (2 Ready)
    obs, why = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False, stale_after_seconds=LIMIT)
    assert why is None and obs is not None
    assert obs.pods == 3 and obs.request_rate == 6.0
    assert obs.data_age_seconds == 2.0  # that of the two freshest pods, not of the one gone


def test_old_revision_pods_deleted_during_our_restart_do_not_hold_its_windows():
    data = window(pods=(A,))
    data.values["last_seen"][OTHER] = data.at - 250  # the old revision's pod, deleted minutes ago
    both = PodMatch(("llama-abc-", "llama-old-"))
    obs, why = observe_target(data, "llm", both, 0, None, SLO_, True, stale_after_seconds=LIMIT)
    assert why is None and obs is not None
    assert obs.pods == 2 and obs.data_age_seconds == 2.0  # the freshest pod's, as no pod is counted Ready


def test_the_data_age_is_that_of_the_last_to_report_of_as_many_pods_as_are_ready():
    data = window()
    data.values["last_seen"][B] = data.at - 60
    obs, _ = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False, stale_after_seconds=LIMIT)
    assert obs is not None and obs.data_age_seconds == 60.0
    obs, _ = observe_target(data, "llm", CURRENT, 1, KNOBS, SLO_, False, stale_after_seconds=LIMIT)
    assert obs is not None and obs.data_age_seconds == 2.0


def test_the_sample_count_is_the_completed_requests_and_the_rate_every_finished_one():
    data = window()
    data.values["completed"] = {A: 1.5, B: 1.0, OTHER: 2.0}  # the rest aborted or failed
    obs, _ = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert obs is not None
    assert obs.request_rate == 4.0  # the load: every finished request
    assert obs.requests == pytest.approx(250.0)  # 2.5 completed per second over the 100 s window


def test_pods_whose_engine_slept_in_the_window_are_counted_and_unknown_without_the_gauge():
    data = window()
    obs, _ = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert obs is not None and obs.asleep_pods is None  # a vLLM without vllm:engine_sleep_state
    data.values["awake"] = {A: 1.0, B: 0.75, OTHER: 0.0}  # B slept through a quarter of the window
    obs, _ = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert obs is not None and obs.asleep_pods == 1
    data.values["awake"][B] = 1.0
    obs, _ = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert obs is not None and obs.asleep_pods == 0


def test_a_window_where_one_pod_has_no_sleep_gauge_and_the_others_do_is_refused():
    # B's series of vllm:engine_sleep_state are gone (a relabelling, a lost scrape): asleep or not, it is unknown, and
    # counting it awake would let a change restart it
    data = window()
    data.values["awake"] = {A: 1.0, OTHER: 1.0}
    obs, why = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert obs is None
    assert why.startswith("no vllm:engine_sleep_state series for pods llama-abc-2 while the window's other pods have")
    assert "a restart would wake them" in why
    # no pod of the tuning has it (an older vLLM), whatever other tunings' pods have: not known to sleep, as before
    data.values["awake"] = {OTHER: 0.0}
    obs, why = observe_target(data, "llm", CURRENT, 2, KNOBS, SLO_, False)
    assert why is None and obs is not None and obs.asleep_pods is None


class _Prometheus:
    """Answers the requests family with one row per finished reason, as vLLM exports them; nothing else."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def query(self, promql: str, at: float) -> list[Sample]:
        self.asked.append(promql)
        if "vllm:request_success_total" not in promql:
            return []
        rates = {"stop": 0.5, "length": 1.0, "abort": 2.0, "error": 4.0, "repetition": 0.25}
        return [Sample({"namespace": "llm", "pod": "llama-abc-1", "finished_reason": reason}, rate)
                for reason, rate in rates.items()]


def test_one_query_answers_every_finished_request_and_the_completed_ones():
    prometheus = _Prometheus()
    data = fetch_window(prometheus, Selector(), 300, 1000.0)  # type: ignore[arg-type]
    assert data.values["requests"] == {A: 7.75}
    assert data.values["completed"] == {A: 1.75}  # stop, length and repetition
    (asked,) = [q for q in prometheus.asked if "vllm:request_success_total" in q]
    assert "sum by (namespace, pod, finished_reason)" in asked


class _Upgraded(_Prometheus):
    """Answers the TTFT buckets of one pod as Prometheus does across its 2 -> 3 upgrade: the same bound in the
    window under vLLM's spelling ("1.0") and under Prometheus 3's ("1"), two series."""

    def query(self, promql: str, at: float) -> list[Sample]:
        if "vllm:time_to_first_token_seconds_bucket" not in promql:
            return []
        pod = {"namespace": "llm", "pod": "llama-abc-1"}
        rates = (("0.5", 0.3), ("1.0", 0.2), ("1", 0.3), ("+Inf", 1.0))
        return [Sample({**pod, "le": le}, rate) for le, rate in rates]


def test_one_bucket_bound_spelled_two_ways_is_one_bucket_of_both():
    data = fetch_window(_Upgraded(), Selector(), 300, 1000.0)  # type: ignore[arg-type]
    assert data.buckets["ttft"] == {A: {0.5: 0.3, 1.0: 0.5, float("inf"): 1.0}}
