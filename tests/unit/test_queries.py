"""PromQL built for the vLLM families: shape, quoting, fallbacks."""

from __future__ import annotations

import re

import pytest

from vllm_autotuner.observe.queries import (
    FAMILIES,
    FAMILY,
    REFUSED,
    Kind,
    PodMatch,
    Selector,
    completed_requests,
    family_query,
    pod_matchers,
    quote,
    reach,
    refused_requests,
)


def test_batched_counter_groups_by_namespace_and_pod_with_user_matchers():
    q = family_query(FAMILY["prompt_tokens"], Selector(matchers=(("cluster", "prod"),)), 300)
    assert q == ('(sum by (namespace, pod) (max by (namespace, pod, engine, model_name, reason) ('
                 'rate(vllm:prompt_tokens_total{cluster="prod"}[300s]))))')


def test_requests_are_grouped_by_finished_reason_in_the_same_query_with_those_refused_at_admission():
    # the load counts every finished request and every refused one, the sample count the completed ones: one query
    # answers all three, the refusals (which have no finished_reason) labelled as such
    q = family_query(FAMILY["requests"], Selector(matchers=(("cluster", "prod"),)), 300)
    assert q == ('(sum by (namespace, pod, finished_reason) (max by (namespace, pod, finished_reason, engine, '
                 'model_name, reason) (rate(vllm:request_success_total{cluster="prod"}[300s]))))'
                 ' or (label_replace(sum by (namespace, pod) (max by (namespace, pod, engine, model_name, reason) '
                 '(rate(vllm:admission_rejections_total{cluster="prod"}[300s]))), "finished_reason", "refused", '
                 '"", ""))')
    assert len(FAMILIES) == 24  # the query count per period the README states


def test_the_engines_sleep_state_is_the_share_of_the_window_each_pod_was_awake():
    # vllm:engine_sleep_state has a series per state (awake, weights_offloaded, discard_all), each 0 or 1: the
    # awake one's mean over the window is below 1 for a pod whose engine slept in it; after the user's matchers
    selector = Selector(matchers=(("cluster", "prod"),))
    extra = pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))
    assert family_query(FAMILY["awake"], selector, 300, extra) == (
        '(sum by (namespace, pod) (avg by (namespace, pod, engine, model_name, reason) (avg_over_time('
        'vllm:engine_sleep_state{cluster="prod",namespace="llm",pod=~"(llama-abc-.*)",sleep_state="awake"}[300s]))))'
    )


def test_waiting_is_for_room_in_the_batch_and_every_waiting_request_from_an_older_vllm():
    # requests vLLM defers (a LoRA slot, a KV transfer) are not waiting for what the knobs give; the older gauge,
    # without the reason label, answers for the pods the newer one leaves without an answer
    selector = Selector(matchers=(("cluster", "prod"),))
    extra = pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))
    assert family_query(FAMILY["waiting"], selector, 300, extra) == (
        '(sum by (namespace, pod) (avg by (namespace, pod, engine, model_name, reason) (avg_over_time('
        'vllm:num_requests_waiting_by_reason{cluster="prod",namespace="llm",pod=~"(llama-abc-.*)",reason="capacity"}'
        '[300s])))) or (sum by (namespace, pod) (avg by (namespace, pod, engine, model_name, reason) (avg_over_time('
        'vllm:num_requests_waiting{cluster="prod",namespace="llm",pod=~"(llama-abc-.*)"}[300s]))))'
    )


def test_each_series_of_a_pod_counts_once_where_a_family_sums():
    # a pod scraped by two jobs (a chart's kubernetes-pods and kubernetes-service-endpoints, overlapping PodMonitors)
    # has each series twice, differing in job and instance alone: summed by pod, every rate and gauge would double
    # while the quantiles stay the same. The copies' largest rate (a copy with a gap has less of the increase) or
    # their gauges' mean goes into each sum, batched and per tuning alike.
    selector = Selector(namespace_label="kubernetes_namespace", pod_label="kubernetes_pod_name")
    for extra in ((), pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))):
        for family in FAMILIES:
            sums = re.findall(r"sum by \(([^)]*)\) \((\w+ by \([^)]*\))?", family_query(family, selector, 300, extra))
            assert bool(sums) == (family.kind in (Kind.RATE, Kind.BUCKETS, Kind.AVERAGE)), family.key
            copies = "avg" if family.kind is Kind.AVERAGE else "max"
            expected = [f"{copies} by ({by}, engine, model_name, reason)" for by, _ in sums]
            assert [inner for _, inner in sums] == expected, family.key


def test_aborted_and_failed_requests_are_no_samples():
    # vLLM's finished reasons (vllm/v1/engine FINISH_REASON_STRINGS); abort and error end without a whole request
    rates = {"stop": 1.0, "length": 2.0, "abort": 4.0, "error": 8.0, "repetition": 16.0}
    assert completed_requests(rates) == 19.0
    assert completed_requests({**rates, REFUSED: 32.0}) == 19.0 and refused_requests({**rates, REFUSED: 32.0}) == 32.0
    assert refused_requests(rates) == 0.0  # a vLLM without queue limits has no such counter
    assert completed_requests({"": 3.0}) == 3.0  # a label relabelled away: counted, as before reasons were told apart


def test_batched_histogram_keeps_le_and_falls_back_to_the_old_name():
    q = family_query(FAMILY["itl"], Selector(namespace_label="kubernetes_namespace", pod_label="pod_name"), 60)
    assert q == (
        "(sum by (kubernetes_namespace, pod_name, le) (max by (kubernetes_namespace, pod_name, le, engine, model_name,"
        " reason) (rate(vllm:inter_token_latency_seconds_bucket[60s]))))"
        " or (sum by (kubernetes_namespace, pod_name, le) (max by (kubernetes_namespace, pod_name, le, engine,"
        " model_name, reason) (rate(vllm:time_per_output_token_seconds_bucket[60s]))))"
    )


def test_per_target_query_filters_to_the_current_replicaset():
    selector = Selector()
    extra = pod_matchers(selector, "llm", PodMatch(("llama-7d9f8c.v2-",)))
    q = family_query(FAMILY["kv_usage"], selector, 300, extra)
    assert q.startswith(
        '(sum by (namespace, pod) (avg by (namespace, pod, engine, model_name, reason) (avg_over_time('
        'vllm:kv_cache_usage_perc{namespace="llm",pod=~"(llama-7d9f8c\\\\.v2-.*)"}[300s]))))'
    )
    assert " or (sum by (namespace, pod) (avg by (namespace, pod, engine, model_name, reason) (avg_over_time(" in q
    assert "vllm:gpu_cache_usage_perc{" in q


def test_quoting_and_label_validation():
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    with pytest.raises(ValueError, match="invalid Prometheus label name"):
        Selector(matchers=(("bad-label", "x"),))


def test_server_start_is_the_newest_created_gauge_or_counter_reset_or_a_series_begun_less_than_two_windows_ago():
    # without `_created` (prometheus-client's multiprocess mode, vLLM with --api-server-count > 1) a restart must
    # still show: a container restarted in place as the newest step where a counter is below its newest earlier
    # sample, a new pod as the first sample of a series that began after the first of 60 steps over the window
    # and the one before it, in the same query (one query per family, whatever the tunings)
    selector = Selector(matchers=(("cluster", "prod"),))
    q = family_query(FAMILY["started"], selector, 300)
    counter = 'vllm:prompt_tokens_total{cluster="prod"}'
    assert q == (
        '(max by (namespace, pod) (vllm:prompt_tokens_created{cluster="prod"}))'
        f" or (max by (namespace, pod) (max_over_time((timestamp({counter})"
        f" and {counter} < last_over_time({counter}[600s] offset 10s))[600s:10s])))"
        ' or (min by (namespace, pod) (min_over_time(timestamp(vllm:num_requests_running{cluster="prod"})[600s:10s]))'
        " > time() - 590)"
    )
    extra = pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))
    pods = '{cluster="prod",namespace="llm",pod=~"(llama-abc-.*)"}'
    counter = f"vllm:prompt_tokens_total{pods}"
    assert family_query(FAMILY["started"], selector, 300, extra) == (
        f"(max by (namespace, pod) (vllm:prompt_tokens_created{pods}))"
        f" or (max by (namespace, pod) (max_over_time((timestamp({counter})"
        f" and {counter} < last_over_time({counter}[600s] offset 10s))[600s:10s])))"
        f" or (min by (namespace, pod) (min_over_time(timestamp(vllm:num_requests_running{pods})[600s:10s]))"
        " > time() - 590)"
    )
    assert "[2s:1s])) > time() - 1)" in family_query(FAMILY["started"], selector, 1)


def test_server_starts_are_looked_for_over_the_settle_time_before_the_window_when_longer_than_a_window():
    # a restart less than the settle time before the window holds it, so the query must reach that far back
    assert (reach(300, 120), reach(300, 300), reach(300, 900), reach(10)) == (600, 600, 1200, 20)
    q = family_query(FAMILY["started"], Selector(), 300, reach_seconds=reach(300, 900))
    assert "[1200s] offset 10s))[1200s:10s]" in q and "[1200s:10s])) > time() - 1190)" in q
    assert "600s" not in q


def test_newest_sample_of_a_pod_whose_scrapes_fail_is_kept_while_its_target_is_there():
    # the instant query misses a pod at its first failed scrape (stale markers); its newest sample in the window
    # still answers while its target reports `up == 0`, which carries the target's namespace and pod labels but
    # not the spec's other matchers (labels of the vLLM series alone)
    selector = Selector(matchers=(("model_name", "llama"),), namespace_label="kubernetes_namespace",
                        pod_label="pod_name")
    q = family_query(FAMILY["last_seen"], selector, 300)
    gauge = 'vllm:num_requests_running{model_name="llama"}'
    assert q == (
        f"(max by (kubernetes_namespace, pod_name) (timestamp({gauge})))"
        f" or (max by (kubernetes_namespace, pod_name) (max_over_time(timestamp({gauge})[300s:10s]))"
        " and on (kubernetes_namespace, pod_name) (up == 0))"
    )
    extra = pod_matchers(selector, "llm", PodMatch(("llama-abc-",)))
    assert family_query(FAMILY["last_seen"], selector, 300, extra).endswith(
        ' and on (kubernetes_namespace, pod_name) (up{kubernetes_namespace="llm",pod_name=~"(llama-abc-.*)"} == 0))'
    )
    namespaced = Selector(matchers=(("model_name", "llama"), ("namespace", "llm")))
    assert family_query(FAMILY["last_seen"], namespaced, 300).endswith(
        ' and on (namespace, pod) (up{namespace="llm"} == 0))')


def test_per_target_query_during_a_rollout_takes_every_replicaset():
    extra = pod_matchers(Selector(), "llm", PodMatch(("llama-abc-", "llama-def-")))
    assert extra == (("namespace", "=", "llm"), ("pod", "=~", "(llama-abc-.*|llama-def-.*)"))


def test_per_target_query_names_pods_exactly_where_their_prefix_is_ambiguous():
    # Prometheus anchors a regex at both ends: an exact name matches that pod alone, a prefix needs its `.*`
    match = PodMatch(prefixes=("llama.v2-7d9f8c-",), names=("llama.v3-x2x4q", "llama.v3-k9j2w"))
    extra = pod_matchers(Selector(), "llm", match)
    assert extra == (("namespace", "=", "llm"),
                     ("pod", "=~", "(llama\\.v3-x2x4q|llama\\.v3-k9j2w|llama\\.v2-7d9f8c-.*)"))
