"""Slicing one batched window into a tuning's Observation."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from vllm_autotuner.api import SLO, CurrentKnobs, Knobs, LatencyTarget, VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.observe.queries import PodMatch
from vllm_autotuner.observe.window import WindowData, observe_target, target_pods
from vllm_autotuner.policy import HoldReason, hold_reason

SLO_ = SLO(ttft=LatencyTarget(quantile=0.9, seconds=0.5), itl=LatencyTarget(quantile=0.9, seconds=0.05))
KNOBS = Knobs(max_num_batched_tokens=2048, max_num_seqs=64)
A, B, OTHER = ("llm", "llama-abc-1"), ("llm", "llama-abc-2"), ("llm", "llama-old-1")


def window(pods=(A, B)) -> WindowData:
    data = WindowData(at=1000.0, window_seconds=100.0)
    per_pod = {
        "requests": 2.0,
        "completed": 2.0,
        "prompt_tokens": 1000.0,
        "generation_tokens": 500.0,
        "preemptions": 0.0,
        "prompt_len_sum": 1000.0,
        "prompt_len_count": 2.0,
        "output_len_sum": 500.0,
        "output_len_count": 2.0,
        "step_tokens_sum": 3000.0,
        "steps": 30.0,
        "itl_sum": 1.5,
        "itl_count": 50.0,
        "running": 10.0,
        "waiting": 1.0,
        "kv_usage": 0.5,
        "last_seen": 998.0,
    }
    for key, value in per_pod.items():
        data.values[key] = {pod: value for pod in (*pods, OTHER)}
    ttft = {0.25: 0.0, 0.5: 1.0, 1.0: 2.0, math.inf: 2.0}  # per pod: half <= 0.5 s, all <= 1 s
    itl = {0.025: 25.0, 0.05: 45.0, 0.1: 50.0, math.inf: 50.0}
    steps = {128: 10.0, 256: 30.0, math.inf: 30.0}
    for key, buckets in (("ttft", ttft), ("itl", itl), ("e2e", ttft), ("queue", ttft), ("step_tokens", steps)):
        data.buckets[key] = {pod: dict(buckets) for pod in (*pods, OTHER)}
    return data


def test_sums_rates_and_averages_gauges_over_the_current_pods_only():
    obs, why = observe_target(window(), "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert why is None and obs is not None
    assert obs.pods == 2
    assert obs.request_rate == 4.0 and obs.requests == 400.0  # two pods, not three
    assert obs.generation_tokens_rate == 1000.0
    assert obs.running == 10.0 and obs.kv_cache_usage == 0.5  # per pod
    assert obs.mean_prompt_tokens == 500.0 and obs.mean_generation_tokens == 250.0
    assert obs.step_tokens_mean == 100.0 and obs.itl_mean_seconds == pytest.approx(0.03)
    assert obs.data_age_seconds == 2.0 and obs.config == KNOBS and obs.slo == SLO_
    # p90 of TTFT: rank 3.6 of 4 in (0.5, 1.0] -> 0.5 + 0.5 * (1.6 / 2)
    assert obs.ttft_seconds == pytest.approx(0.9)
    assert obs.ttft_within_slo == pytest.approx(0.5)
    assert obs.itl_within_slo == pytest.approx(0.9)  # 45 of 50 gaps within the 50 ms target
    assert obs.step_tokens_quantile == pytest.approx(128 + 128 * (17 / 20))


def test_requests_refused_at_admission_are_load_in_no_latency_field():
    data = window()
    data.values["requests"] = {pod: 3.0 for pod in (A, B)}  # fetch_window's sum: 2 finished and 1 refused a second
    data.values["refused"] = {pod: 1.0 for pod in (A, B)}
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.refused_rate == 2.0 and obs.request_rate == 6.0
    assert obs.requests == 400.0  # the sample count: completed requests only
    # the histograms' answered requests alone: the decision core counts the refused ones as misses
    assert obs.ttft_within_slo == pytest.approx(0.5) and obs.ttft_seconds == pytest.approx(0.9)


# vLLM's vllm:iteration_tokens_total buckets (vllm-metrics.txt): they end at 16384
STEP_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, math.inf)


def steps_of(tokens: float) -> dict[float, float]:
    """Cumulative bucket rates of 10 steps per second, all of ``tokens`` tokens."""
    return {float(b): 10.0 if tokens <= b else 0.0 for b in STEP_BOUNDS}


@pytest.mark.parametrize(("budget", "tokens", "expected"), [
    (32768, 32768, 32768.0),  # full steps past the last bucket: the budget, not Prometheus's 16384
    (24576, 20000, 24576.0),  # past the last bucket, under a budget above it: taken as full
    (2048, 20000, 2048.0),  # a chunked prompt counted whole in the step that finished it: no step computes more
    (2048, 1500, 1024 + 1024 * 0.9),  # inside the buckets and under the budget: Prometheus's answer
    (1536, 1500, 1536.0),  # interpolated past the budget (1945.6): the budget
    (16384, 20000, 16384.0),  # past the last bucket at a budget that is its bound: full steps
])
def test_step_tokens_quantile_is_at_most_the_budget_and_the_budget_past_the_last_bucket(budget, tokens, expected):
    data = window()
    data.buckets["step_tokens"] = {pod: steps_of(tokens) for pod in (A, B)}
    knobs = Knobs(max_num_batched_tokens=budget, max_num_seqs=64)
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, knobs, SLO_, False)
    assert obs is not None and obs.step_tokens_quantile == pytest.approx(expected)


def test_prompt_tokens_served_from_the_prefix_cache_are_no_tokens_a_step_computes():
    """vLLM counts a prompt whole in its step's tokens, the share the prefix cache served too: with
    vllm:prompt_tokens_cached_total, the mean step is less those tokens, and a prompt past the budget whose computed
    part fits is one step of that part, not full ones."""
    data = window()
    steps = {float(b): 8.0 * (b >= 64) + 2.0 * (b >= 4096) for b in STEP_BOUNDS}
    data.buckets["step_tokens"] = {pod: steps for pod in (A, B)}  # per pod: 8 decode steps, 2 prompts of 2048-4096
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.cached_prompt_tokens_rate is None
    assert obs.step_tokens_mean == 100.0 and obs.step_tokens_quantile == 2048.0  # the prompts taken as computed
    data.values["cached_prompt_tokens"] = {pod: 750.0 for pod in (A, B)}  # of 1000 prompt tokens a second
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.cached_prompt_tokens_rate == 1500.0
    assert obs.step_tokens_mean == 75.0  # (3000 - 750) / 30
    assert obs.step_tokens_quantile == pytest.approx(768.0)  # a quarter of the prompts' 3072, in (512, 1024]


@pytest.mark.parametrize("cached", [3500.0, math.nan])
def test_cached_prompt_tokens_past_the_prompt_tokens_or_nan_are_at_most_the_prompt_tokens_or_unknown(cached):
    """Counted with the prompt tokens, the cached ones are at most them: more (series that disagree) are capped, so
    the mean step keeps its generated tokens; NaN is no count at all."""
    data = window()
    data.values["cached_prompt_tokens"] = {pod: cached for pod in (A, B)}
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None
    if math.isnan(cached):
        assert obs.cached_prompt_tokens_rate is None and obs.step_tokens_mean == 100.0
    else:
        assert obs.cached_prompt_tokens_rate == 2000.0 and obs.step_tokens_mean == pytest.approx(2000 / 30)


def test_without_a_config_the_step_tokens_quantile_is_prometheus_s():
    data = window()
    data.buckets["step_tokens"] = {pod: steps_of(32768) for pod in (A, B)}
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, None, SLO_, False)
    assert obs is not None and obs.step_tokens_quantile == 16384.0


def test_missing_pods_or_partial_data_is_not_an_observation():
    obs, why = observe_target(window(), "llm", PodMatch(("mistral-",)), 1, KNOBS, SLO_, False)
    assert obs is None and "no vLLM series" in why
    obs, why = observe_target(window(pods=(A,)), "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is None and "only 1 of 2 Ready pods" in why


def test_a_family_missing_for_one_pod_is_none_not_zero():
    data = window()
    del data.values["preemptions"][B]
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.preemption_rate is None


@pytest.mark.parametrize(("family", "fields"), [
    ("ttft", ("ttft_seconds", "ttft_within_slo")), ("itl", ("itl_seconds", "itl_within_slo")),
    ("e2e", ("e2e_seconds",)), ("queue", ("queue_seconds",)), ("step_tokens", ("step_tokens_quantile",)),
])
@pytest.mark.parametrize("rows", [None, {0.25: 0.0, 0.5: 0.0, 1.0: 0.0}])  # no rows at all, or no +Inf bucket
def test_a_histogram_missing_for_one_pod_is_none_not_the_other_pods(family, fields, rows):
    # B's requests all took over a second (a breach): the buckets of A alone would show a healthy window
    data = window()
    data.buckets["ttft"][B] = data.buckets["e2e"][B] = data.buckets["queue"][B] = {0.5: 0.0, 1.0: 0.0, math.inf: 2.0}
    if rows is None:
        del data.buckets[family][B]
    else:
        data.buckets[family][B] = rows
    obs, why = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert why is None and obs is not None
    assert [getattr(obs, name) for name in fields] == [None] * len(fields)
    assert obs.request_rate == 4.0  # the other families are still there


def test_without_the_ttft_or_itl_buckets_of_every_pod_the_decision_core_holds_for_missing_data():
    data = window()
    del data.buckets["itl"][B]
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "traffic": {"window": "100s"}})
    state = VllmTuningStatus(current=CurrentKnobs(max_num_batched_tokens=2048, max_num_seqs=64, source="Initial",
                                                  since=utc_timestamp(datetime.fromtimestamp(0, UTC))))
    assert hold_reason(spec, SLO_, state, obs, datetime.fromtimestamp(data.at, UTC)) == (
        HoldReason.NO_DATA, "no data for itl_seconds")


def test_started_at_is_the_newest_server_start_among_the_current_pods():
    data = window()
    data.values["started"] = {A: 700.0, B: 905.0, OTHER: 990.0}  # the other ReplicaSet's pod does not count
    obs, _ = observe_target(data, "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.started_at == datetime.fromtimestamp(905.0, UTC)


def test_started_at_is_none_without_created_series():
    obs, _ = observe_target(window(), "llm", PodMatch(("llama-abc-",)), 2, KNOBS, SLO_, False)
    assert obs is not None and obs.started_at is None


def test_during_our_rollout_the_window_takes_every_replicaset_with_what_reports():
    data = window(pods=(A,))  # one new pod reports so far; the old ReplicaSet's pod still serves
    obs, why = observe_target(data, "llm", PodMatch(("llama-abc-", "llama-old-")), 0, None, SLO_, True)
    assert why is None and obs is not None
    assert obs.pods == 2 and obs.request_rate == 4.0 and obs.rollout_in_progress and obs.config is None


def test_pods_named_exactly_are_taken_alone_where_a_cut_prefix_would_take_other_revisions_and_deployments():
    # A 57-character Deployment name: every pod of it, of any revision, and of Deployment `<name>-canary` is named
    # `<name>-xxxxx` (the generateName is cut to 58 characters); only the current revision's pods by name are its own
    name = "llama-3-1-70b-instruct-chat-production-europe-west4-green"
    current, old, canary = (("llm", f"{name}-{s}") for s in ("x2x4q", "b7m5z", "c4n1y"))
    data = window(pods=(current, old, canary))
    match = PodMatch(names=(current[1],))
    assert target_pods(data, "llm", match) == [current]
    obs, why = observe_target(data, "llm", match, 1, KNOBS, SLO_, False)
    assert why is None and obs is not None and obs.pods == 1 and obs.request_rate == 2.0
    # names and prefixes together: a rollout from a ReplicaSet named in full to one whose name is cut
    assert target_pods(data, "llm", PodMatch(("llama-old-",), (current[1],))) == sorted([current, OTHER])


def test_the_hold_without_series_names_the_pods_looked_for():
    match = PodMatch(("llama-new-",), ("llama-x2x4q", "llama-k9j2w"))
    obs, why = observe_target(window(), "llm", match, 1, KNOBS, SLO_, False)
    assert obs is None
    assert why.startswith("no vLLM series for pods llama-x2x4q, llama-k9j2w, llama-new-* in namespace llm")
    _, why = observe_target(window(), "llm", PodMatch(), 0, None, SLO_, True)
    assert why.startswith("no vLLM series for pods (none listed) in namespace llm")
