"""The step-time model reproduces the public vLLM measurements its
efficiency factors were fitted on (sources in ``sim/profiles.py``).

Tolerances: +-10 % for single decode-step times (the measurements are medians
of steady decode), +-15 % for whole-benchmark throughput and median TPOT
(those also depend on the prompt/output length distribution, which is
ShareGPT-like here, not ShareGPT itself).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.unit.sim.helpers import noiseless
from vllm_autotuner.sim.engine import Engine, EngineConfig, Request, StepCost
from vllm_autotuner.sim.profiles import A100_40GB
from vllm_autotuner.sim.workload import SHAREGPT, steady


@pytest.mark.parametrize(
    ("profile", "published_ms"),
    [
        # Lambda vllm-benchmark prompt_10: median ITL of a 10-step block / 10.
        ("llama3-8b-h100", 7.23),
        ("llama3-8b-a100", 11.49),
    ],
)
def test_small_batch_decode_step(profile: str, published_ms: float) -> None:
    # 10 short ShareGPT prompts decoding, ~500 tokens of context each.
    step = StepCost(noiseless(profile)).decode_seconds(10, 10 * 500)
    assert step * 1e3 == pytest.approx(published_ms, rel=0.10)


def test_single_request_decode_on_a100_40gb() -> None:
    # Musgrave's sweep: 1024-token prompt, 128 outputs, ~75 tok/s at C=1.
    profile = dataclasses.replace(noiseless("llama3-8b-a100"), gpu=A100_40GB)
    tokens_per_s = 1 / StepCost(profile).decode_seconds(1, 1024 + 64)
    assert tokens_per_s == pytest.approx(75, rel=0.10)


def _sharegpt_offline(profile: str, prompts: int = 3000) -> tuple[float, float]:
    """Lambda's benchmark_v0.md setup: all prompts at once, max-num-seqs 256,
    max-seq-len 2048, chunked prefill off (budget 2048, vLLM 0.6's default
    then). Returns output tokens/s and the median per-request TPOT."""
    engine = Engine(
        noiseless(profile),
        EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=2048, enable_chunked_prefill=False),
    )
    work = steady(1.0, SHAREGPT, hours=2).generate(seed=11, max_model_len=2048)
    for prompt, output in zip(work.prompt_tokens[:prompts], work.output_tokens[:prompts], strict=True):
        engine.submit(Request(0.0, int(prompt), int(output)))
    finished = engine.advance(1e9)
    assert len(finished) == prompts
    duration = max(f.finish_time for f in finished)
    tpot = [f.mean_itl for f in finished if f.output_tokens > 1]
    return sum(f.output_tokens for f in finished) / duration, float(np.median(tpot))


@pytest.mark.parametrize(
    ("profile", "tokens_per_s", "tpot_ms"),
    [
        ("llama3-8b-h100", 8088.35, 25.57),  # Llama 3.1 8B, tp=1, v0.6.0
        ("llama3-70b-h100-tp4", 3542.88, 61.10),  # Llama 3.1 70B, tp=4, v0.6.0
    ],
)
def test_saturated_sharegpt_throughput(profile: str, tokens_per_s: float, tpot_ms: float) -> None:
    throughput, tpot = _sharegpt_offline(profile)
    assert throughput == pytest.approx(tokens_per_s, rel=0.15)
    assert tpot * 1e3 == pytest.approx(tpot_ms, rel=0.15)


def test_sharegpt_mix_has_the_published_means() -> None:
    work = steady(2.0, SHAREGPT, hours=4).generate(seed=1)
    assert work.prompt_tokens.mean() == pytest.approx(217, rel=0.03)
    assert work.output_tokens.mean() == pytest.approx(198, rel=0.03)
