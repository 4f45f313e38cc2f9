"""Builders for the decision-core tests: a spec, a status and a usable window, each overridable."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from vllm_autotuner.api import CurrentKnobs, Knobs, VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy import Observation

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def knobs(tokens: int, seqs: int) -> Knobs:
    return Knobs(max_num_batched_tokens=tokens, max_num_seqs=seqs)


def spec(**fields: Any) -> VllmTuningSpec:
    return VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, **fields})


def status(
    tokens: int = 8192, seqs: int = 1024, since: datetime = T0 - timedelta(hours=2), **fields: Any
) -> VllmTuningStatus:
    current = CurrentKnobs(
        max_num_batched_tokens=tokens, max_num_seqs=seqs, since=utc_timestamp(since), source="Initial"
    )
    # a measured, cheap rollout (one minute of the fleet's goodput), so tests of other rules are not about its price
    return VllmTuningStatus(current=current, **{"restart_cost_seconds": 60.0, **fields})


def long_prompt_window(
    state: VllmTuningStatus, the_spec: VllmTuningSpec, now: datetime = T0, **fields: Any
) -> Observation:
    """A 5-minute window of RAG-like traffic (4k prompts, 128 outputs) on 4 pods whose ITL breaches at 8192 tokens."""
    assert state.current is not None
    rate = 13.0
    base = Observation(
        window_start=now - timedelta(minutes=5),
        window_end=now,
        config=state.current.knobs,
        pods=4,
        data_age_seconds=10.0,
        slo=the_spec.slo,
        requests=rate * 300,
        request_rate=rate,
        prompt_tokens_rate=rate * 4000,
        generation_tokens_rate=rate * 128,
        ttft_seconds=0.9,
        itl_seconds=0.19,
        e2e_seconds=12.0,
        queue_seconds=0.1,
        itl_mean_seconds=0.09,
        ttft_within_slo=0.99,
        itl_within_slo=0.93,
        running=20.0,
        waiting=0.5,
        kv_cache_usage=0.2,
        preemption_rate=0.0,
        mean_prompt_tokens=4000.0,
        mean_generation_tokens=128.0,
        step_tokens_mean=3200.0,
        step_tokens_quantile=7800.0,
        steps_per_second=160.0,
    )
    return dataclasses.replace(base, **fields)


def shifted(observation: Observation, seconds: float) -> Observation:
    """The same window, ``seconds`` later."""
    delta = timedelta(seconds=seconds)
    return dataclasses.replace(
        observation, window_start=observation.window_start + delta, window_end=observation.window_end + delta
    )


def quiet(now: datetime) -> Observation:
    """A fresh 5-minute window of 4 pods that served no request (a quiet night), under several configs: it shows
    the pods as they are, but nothing for the traffic policy to go by."""
    return Observation(window_start=now - timedelta(minutes=5), window_end=now, pods=4, data_age_seconds=10.0,
                       requests=0.0, request_rate=0.0)
