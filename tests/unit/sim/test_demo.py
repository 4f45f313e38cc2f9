"""The demo's pure parts: the compressed day, the objects it creates, the goodput arithmetic and the live view."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest

from vllm_autotuner.api import Knobs, VllmTuningSpec
from vllm_autotuner.knobs import EngineArgs, find_vllm_container
from vllm_autotuner.observe.quantile import histogram_fraction_below
from vllm_autotuner.sim.demo import plan, report
from vllm_autotuner.sim.demo.live import Latency, LiveView
from vllm_autotuner.sim.demo.plan import STATIC, TUNED, DemoDay
from vllm_autotuner.sim.demo.run import template_knobs

# 2026-03-02 10:00:17 UTC: not on a minute, so the window's rounding shows.
START = datetime(2026, 3, 2, 10, 0, 17, tzinfo=UTC).timestamp()


@pytest.fixture
def day() -> DemoDay:
    return DemoDay.plan(START, 600.0)


def test_the_clock_runs_24_hours_from_six_in_the_morning(day: DemoDay) -> None:
    assert day.hour == 25.0
    assert day.clock(START) == "06:00" and day.clock(START + 150) == "12:00" and day.clock(day.end - 1) == "05:57"
    assert day.at(day.hours(START + 123.4)) == pytest.approx(START + 123.4)
    assert [day.phase(day.at(h)) for h in (6, 10, 12, 20, 23, 5 + 24)] == [
        "morning ramp", "chat peak", "RAG", "evening", "night", "night"]


def test_the_night_window_opens_and_closes_on_whole_minutes_near_midnight_and_four(day: DemoDay) -> None:
    opens, closes = day.window
    assert opens % 60 == 0 and closes % 60 == 0
    assert abs(opens - day.at(24)) <= 30 and abs(closes - day.at(28)) <= 30
    spec = day.spec()
    (night,) = spec.schedules
    assert night.start == f"{datetime.fromtimestamp(opens, UTC).minute} {datetime.fromtimestamp(opens, UTC).hour} * * *"
    assert night.end == f"{datetime.fromtimestamp(closes, UTC).minute} {datetime.fromtimestamp(closes, UTC).hour} * * *"


def test_a_short_day_still_has_a_window_of_a_minute_and_a_shorter_one_is_refused() -> None:
    day = DemoDay.plan(START, 180.0)
    assert day.window[1] - day.window[0] >= 60 and day.batch_span()[1] <= 180
    with pytest.raises(ValueError, match="3m"):
        DemoDay.plan(START, 179.0)


def test_the_tuning_scales_its_clock_to_the_simulated_hour(day: DemoDay) -> None:
    spec = VllmTuningSpec.model_validate(day.tuning()["spec"])
    assert spec.target_ref.name == TUNED
    assert (spec.traffic.window, spec.traffic.evaluation_interval) == ("6.3s", "1.3s")  # a quarter hour, 1/20
    assert (spec.rollout.cooldown, spec.rollout.settle_time) == ("25s", "1.3s")
    assert spec.slo.itl.seconds == 0.075 and spec.schedules[0].slo.itl.seconds == 0.25
    assert DemoDay.plan(START, 180.0).spec().traffic.window == "6s"  # at least enough for the night's requests


def test_both_deployments_get_the_same_requests_and_the_traffic_follows_the_plan(day: DemoDay) -> None:
    first, second = day.scenario().generate(7), day.scenario().generate(7)
    assert np.array_equal(first.arrival, second.arrival) and np.array_equal(first.prompt_tokens, second.prompt_tokens)
    arrival, kind = first.arrival, first.request_class
    rag = arrival[kind == "rag"]
    assert rag.min() >= day.at(12) - START and rag.max() < day.at(18) - START
    assert len(rag) == pytest.approx(plan.RAG_RATE * plan.REPLICAS * 6 * day.hour, rel=0.1)
    batch = arrival[kind == "summarization"]
    lo, hi = day.batch_span()
    assert batch.min() >= lo and batch.max() < hi
    peak = (arrival >= day.at(10) - START) & (arrival < day.at(12) - START) & (kind == "chat")
    assert peak.sum() == pytest.approx(14 * plan.REPLICAS * 2 * day.hour, rel=0.1)
    assert day.offered(day.at(13)) == {"chat": 1.0, "rag": 9.6, "batch": 0.0}
    assert day.offered(day.at(26))["batch"] == plan.BATCH_RATE * plan.REPLICAS


def test_the_deployments_are_the_example_with_vllms_defaults_on_the_demos_nodes() -> None:
    deployment = plan.vllm_deployment(STATIC)
    template = deployment["spec"]["template"]
    args = EngineArgs.from_container(find_vllm_container(template["spec"]))
    assert args.max_num_batched_tokens is None and args.max_num_seqs is None
    assert template_knobs(template) == Knobs(max_num_batched_tokens=8192, max_num_seqs=1024)  # an H100's defaults
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert template["spec"]["nodeSelector"]["sim.vllm-autotuner.io/fleet"] == plan.FLEET_PREFIX
    assert deployment["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": STATIC}
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == STATIC  # what report.selector matches


# --- goodput arithmetic ---------------------------------------------------------------------------


def test_the_slo_is_the_nights_only_while_its_window_is_open(day: DemoDay) -> None:
    spec = day.spec()
    opens, closes = day.window
    assert report.slo_at(spec, opens - 5) == spec.slo  # within the pre-roll: still the day's
    assert report.slo_at(spec, opens + 5) == spec.schedules[0].slo
    assert report.slo_at(spec, closes + 5) == spec.slo


def test_step_attainment_is_the_share_within_ttft_times_the_share_of_streams_within_itl(day: DemoDay) -> None:
    slo = day.spec().slo
    ttft = {0.5: 80.0, 1.0: 90.0, 2.5: 100.0, math.inf: 100.0}
    itl = {0.05: 50.0, 0.075: 97.0, 0.1: 99.0, math.inf: 100.0}  # 3 % of gaps over 75 ms
    within_ttft = histogram_fraction_below(2.0, [0.5, 1.0, 2.5, math.inf], [80, 90, 100, 100])
    # 40-token answers: 39 gaps, at p95 one may be slow
    streams = sum(math.comb(39, k) * 0.03**k * 0.97 ** (39 - k) for k in range(2))
    assert report.step_attainment(slo, ttft, itl, 40.0) == pytest.approx(within_ttft * streams)
    assert math.isnan(report.step_attainment(slo, {}, itl, 40.0))
    assert math.isnan(report.step_attainment(slo, ttft, itl, math.nan))


def test_the_knobs_that_served_a_step_are_those_of_the_busiest_replicaset() -> None:
    old, new = Knobs(max_num_batched_tokens=8192, max_num_seqs=512), Knobs(max_num_batched_tokens=2048, max_num_seqs=512)
    pods = {"a-1": old, "a-2": old, "b-1": new}
    rates = {"a-1": [5.0, 3.0, 0.0, 0.0], "a-2": [5.0, 0.0, 0.0, 0.0], "b-1": [0.0, 4.0, 8.0, 0.0]}
    assert report.serving_knobs(rates, pods, 4) == [old, new, new, new]  # an idle step keeps the last


def steps(goodput: list[float], generation: list[float]) -> report.Steps:
    n = len(goodput)
    return report.Steps(times=[10.0 * (i + 1) for i in range(n)], generation=generation, requests=[1.0] * n,
                        attainment=[g / t for g, t in zip(goodput, generation, strict=True)], goodput=goodput,
                        ttft_p95=[0.1] * n, itl_p95=[0.05] * n, slo_met=[g > 50 for g in goodput], knobs=[None] * n)


def test_a_period_scores_the_steps_whose_middle_it_holds() -> None:
    scored = report.period("p", 10.0, 30.0, {TUNED: steps([10, 100, 60], [100, 100, 100]),
                                             STATIC: steps([99, 50, 30], [100, 100, 100])}, 10.0)
    assert scored.goodput == {TUNED: 80.0, STATIC: 40.0}  # the steps (10, 20] and (20, 30]
    assert scored.attainment == {TUNED: 0.8, STATIC: 0.4}
    assert scored.slo_met == {TUNED: 1.0, STATIC: 0.0}
    assert scored.ratio == 2.0


# --- live view ------------------------------------------------------------------------------------


def record(time: str, action: str, reason: str, tokens: int = 8192) -> dict:
    return {"time": time, "action": action, "maxNumBatchedTokens": tokens, "maxNumSeqs": 512, "reason": reason}


def test_the_live_view_tells_each_change_and_rollout_once(day: DemoDay) -> None:
    view = LiveView(day, width=200)
    status = {"history": [record("2026-03-02T10:03:00Z", "Change", "regime r8: smaller budget", 2048),
                          record("2026-03-02T10:02:55Z", "Hold", "cooldown")]}
    lines = view.new_decisions(status)
    assert len(lines) == 1 and ">>> operator: Change to 2048/512: regime r8: smaller budget" in lines[0]
    assert view.new_decisions(status) == []
    status["lastRollout"] = {"startedAt": "2026-03-02T10:03:00Z", "finishedAt": "2026-03-02T10:03:12Z",
                             "phase": "Succeeded", "to": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 512}}
    (line,) = view.new_decisions(status)
    assert "rollout to 2048/512 Succeeded after 12s" in line
    assert view.new_decisions(status) == []
    assert [d.action for d in view.decisions] == ["Hold", "Change"]


def test_an_hour_line_marks_a_missed_slo_and_tells_a_new_reason_once(day: DemoDay) -> None:
    view = LiveView(day, width=300)
    view.new_decisions({"history": [record("2026-03-02T10:03:00Z", "Hold", "no config expected to do better")]})
    slo = day.spec().slo
    knobs = {TUNED: Knobs(max_num_batched_tokens=2048, max_num_seqs=512), STATIC: None}
    latency = {TUNED: Latency(0.4, 0.07), STATIC: Latency(0.4, 0.2)}
    first = view.hour_line(day.at(13), knobs, latency, slo).splitlines()
    assert first[0].startswith("13:00 RAG") and "tuned   2048/512" in first[0] and "ok" in first[0]
    assert "MISS" in first[0].split("|")[2]
    assert first[1].strip() == "operator: Hold: no config expected to do better"
    assert len(view.hour_line(day.at(14), knobs, latency, slo).splitlines()) == 1
