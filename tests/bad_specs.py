"""VllmTuning specs that admission must refuse, with the field and the words it names.

Shared by the test of the CRD on a real apiserver (``tests/integration/test_crd.py``), which checks the
apiserver's answer, and by the unit test of the spec models, which must refuse each of them too: a spec built or
read outside admission (``vllm-autotuner recommend -f``, the simulator) is held to the same rules.
"""

from __future__ import annotations

import pytest


def target(**spec: object) -> dict:
    """A spec for the Deployment `llama` with the given fields added."""
    return {"targetRef": {"name": "llama"}, **spec}



BAD_SPECS = [
    pytest.param(target(bounds={"maxNumBatchedTokens": {"min": 8192, "max": 4096}}),
                 "spec.bounds.maxNumBatchedTokens", "min must be <= max", id="tokens-min-above-max"),
    pytest.param(target(bounds={"maxNumSeqs": {"min": 512, "max": 64}}),
                 "spec.bounds.maxNumSeqs", "min must be <= max", id="seqs-min-above-max"),
    pytest.param(target(bounds={"maxNumSeqs": {"min": 0}}),
                 "spec.bounds.maxNumSeqs.min", "greater than or equal to 1", id="seqs-zero"),
    pytest.param(target(bounds={"maxNumBatchedTokens": {"max": -4096}}),
                 "spec.bounds.maxNumBatchedTokens.max", "greater than or equal to 1", id="tokens-negative"),
    pytest.param(target(bounds={"maxNumBatchedTokens": {"min": 64, "max": 8192}, "maxNumSeqs": {"min": 128}}),
                 "spec.bounds.maxNumBatchedTokens.min", "must be >= maxNumSeqs.min", id="tokens-min-below-seqs-min"),
    pytest.param(target(mode="Sometimes"), "spec.mode", 'Unsupported value: "Sometimes"', id="unknown-mode"),
    pytest.param(target(traffic={"window": "five minutes"}), "spec.traffic.window", "should match", id="bad-duration"),
    pytest.param(target(traffic={"window": "0s"}), "spec.traffic.window", "must be at least 2s", id="zero-window"),
    pytest.param(target(prometheus={"timeout": "0ms"}), "spec.prometheus.timeout", "must be at least 100ms",
                 id="zero-query-timeout"),
    pytest.param(target(prometheus={"queryOffset": "2m"}), "spec.prometheus.queryOffset", "must be at most 1m",
                 id="query-offset-past-the-staleness-limit"),
    pytest.param(target(rollout={"progressDeadline": "5s"}), "spec.rollout.progressDeadline",
                 "must be at least 10s", id="progress-deadline-too-short"),
    pytest.param(target(rollout={"cooldown": "-15m"}), "spec.rollout.cooldown", "should match", id="negative-duration"),
    pytest.param(target(schedules=[{"name": "night", "timeZone": "Central European Time", "start": "0 22 * * *",
                                    "end": "0 6 * * *", "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]),
                 "spec.schedules[0].timeZone", "should match", id="bad-time-zone"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 ? * *", "end": "0 6 * * *",
                                    "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]),
                 "spec.schedules[0].start", "should match", id="cron-question-mark"),
    pytest.param(target(bounds={"maxNumSeqs": {"max": 4}}),
                 "spec.bounds.maxNumSeqs", "a min left out is its default", id="seqs-max-below-the-default-min"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 * *", "end": "0 6 * * *",
                                    "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]),
                 "spec.schedules[0].start", "should match", id="bad-cron"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 * * *", "end": "0 22 * * *",
                                    "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]),
                 "spec.schedules[0].end", "start and end must differ", id="empty-schedule-window"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 * * *", "end": "0 6 * * *"}]),
                 "spec.schedules[0]", "either knobs", id="schedule-without-knobs-or-overrides"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 * * *", "end": "0 6 * * *",
                                    "knobs": {"maxNumBatchedTokens": 32, "maxNumSeqs": 64}}]),
                 "spec.schedules[0].knobs", "maxNumBatchedTokens must be >= maxNumSeqs", id="schedule-tokens-below-seqs"),
    pytest.param(target(schedules=[{"name": "night", "start": "0 22 * * *", "end": "0 6 * * *",
                                    "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}] * 2),
                 "spec.schedules[1]", "Duplicate value", id="duplicate-schedule-names"),
    pytest.param(target(rollout={"freezes": [{"name": "peak", "start": "0 9 * * *", "end": "0 9 * * *"}]}),
                 "spec.rollout.freezes[0].end", "start and end must differ", id="empty-freeze"),
    pytest.param(target(rollout={"freezes": [{"name": "peak", "start": "0 9 * * *", "end": "0 17 * * *"}] * 2}),
                 "spec.rollout.freezes[1]", "Duplicate value", id="duplicate-freeze-names"),
    pytest.param(target(rollout={"freezes": [{"name": "peak", "start": "0 9 * * *"}]}),
                 "spec.rollout.freezes[0].end", "Required value", id="freeze-without-end"),
    pytest.param(target(traffic={"strategy": "Tiers"}),
                 "spec.traffic.tiers", "strategy Tiers needs at least one entry", id="tiers-without-tiers"),
    pytest.param(target(traffic={"strategy": "Tiers", "tiers": [{"name": "chat"}]}),
                 "spec.traffic.tiers[0].knobs", "Required value", id="tier-without-knobs"),
    pytest.param(target(rollout={"maxRolloutsPerDay": "eight"}),
                 "spec.rollout.maxRolloutsPerDay", "must be of type integer", id="wrong-type"),
    pytest.param(target(slo={"ttft": {"seconds": 2, "quantile": 1.5}}),
                 "spec.slo.ttft.quantile", "should be less than 1", id="quantile-above-one"),
    pytest.param({"mode": "Auto"}, "spec.targetRef", "Required value", id="missing-target"),
    pytest.param({"targetRef": {"name": "llama", "kind": "StatefulSet"}},
                 "spec.targetRef.kind", 'Unsupported value: "StatefulSet"', id="target-not-a-deployment"),
    pytest.param({"targetRef": {"name": "Llama_3"}}, "spec.targetRef.name", "should match", id="bad-target-name"),
    pytest.param(target(prometheus={"url": "prometheus:9090"}), "spec.prometheus.url", "should match", id="bad-url"),
    pytest.param(target(prometheus={"labelMatchers": {"app.kubernetes.io/name": "vllm"}}),
                 "spec.prometheus.labelMatchers", "keys must be Prometheus label names", id="bad-label-name"),
    pytest.param(target(prometheus={"bearerTokenSecretRef": {"name": "p", "key": "token"},
                                    "basicAuth": {"username": {"name": "p", "key": "user"},
                                                  "password": {"name": "p", "key": "password"}}}),
                 "spec.prometheus", "set bearerTokenSecretRef or basicAuth, not both", id="two-credentials"),
    pytest.param(target(prometheus={"basicAuth": {"username": {"name": "p", "key": "user"}}}),
                 "spec.prometheus.basicAuth.password", "Required value", id="basic-auth-without-password"),
    pytest.param(target(prometheus={"headers": {"authorization": "Bearer x"}}),
                 "spec.prometheus.headers", "credentials go in bearerTokenSecretRef or basicAuth",
                 id="authorization-header"),
    pytest.param(target(prometheus={"headers": {"X-Scope-OrgID: a": "b"}}),
                 "spec.prometheus.headers", "keys must be HTTP header names", id="bad-header-name"),
    pytest.param(target(prometheus={"headers": {"X-Scope-OrgID": "a\r\nX-Admin: 1"}}),
                 "spec.prometheus.headers.X-Scope-OrgID", "should match", id="header-value-on-two-lines"),
    pytest.param(target(traffic={"strategy": "Tiers", "tiers": [
        {"name": "chat", "match": {"maxPromptTokens": 2000},
         "knobs": {"maxNumBatchedTokens": 16384, "maxNumSeqs": 512}},
        {"name": "chat", "match": {"minPromptTokens": 2000},
         "knobs": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256}}]}),
                 "spec.traffic.tiers[1]", "Duplicate value", id="duplicate-tier-names"),
    pytest.param(target(traffic={"strategy": "Tiers", "tiers": [
        {"name": "busy", "match": {"minRequestRate": 10, "maxRequestRate": 5},
         "knobs": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 256}}]}),
                 "spec.traffic.tiers[0].match.maxRequestRate", "minRequestRate must be below maxRequestRate",
                 id="tier-that-nothing-matches"),
    pytest.param(target(traffic={"strategy": "Tiers", "tiers": [
        {"name": "chat", "knobs": {"maxNumBatchedTokens": 128, "maxNumSeqs": 256}}]}),
                 "spec.traffic.tiers[0].knobs", "maxNumBatchedTokens must be >= maxNumSeqs",
                 id="tier-tokens-below-seqs"),
    pytest.param(target(rollout={"settleTime": "100000000h"}), "spec.rollout.settleTime", "should match",
                 id="duration-past-any-clock"),
]
