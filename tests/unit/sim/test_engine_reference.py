"""The fast engine against the literal V1 scheduling loop (reference.py).

Same requests, same step-cost model, no noise: every request must get its
first token and finish at the same instant, be preempted as often, see
the same longest inter-token gap and as many gaps over each slow-gap
threshold; every request whose client's first-token timeout passes is
aborted by both. The configs cover chunked prefill on and off, budgets
below and above the prompt sizes, KV caches small enough to preempt
hundreds of times, and overloads where clients give up (on requests
waiting, preempted, or part way through a chunked prefill).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tests.unit.sim.helpers import noiseless, random_requests
from tests.unit.sim.reference import run_reference
from vllm_autotuner.sim.engine import Engine, EngineConfig

#: Slow-gap thresholds (s): short enough that decode steps cross them, off the cost model's round numbers.
SLOW = (0.0123, 0.0377, 0.1011)

CASES = [
    # (profile, config, arrival rate, seed)
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64), 40, 1),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128), 80, 2),
    (
        "llama3-8b-h100",
        EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256, enable_chunked_prefill=False),
        50,
        3,
    ),
    (
        "llama3-8b-l4",
        EngineConfig(max_num_batched_tokens=512, max_num_seqs=256, max_model_len=4096, gpu_memory_utilization=0.8),
        40,
        4,
    ),
    (
        "llama3-8b-l4",
        EngineConfig(
            max_num_batched_tokens=4096,
            max_num_seqs=200,
            max_model_len=4096,
            gpu_memory_utilization=0.8,
            enable_chunked_prefill=False,
        ),
        50,
        5,
    ),
    (
        "llama3-8b-l4",
        EngineConfig(max_num_batched_tokens=300, max_num_seqs=300, max_model_len=4096, gpu_memory_utilization=0.77),
        50,
        6,
    ),
    ("llama3-70b-h100-tp4", EngineConfig(max_num_batched_tokens=1024, max_num_seqs=96), 30, 7),
]
#: Overloads whose clients give up after a few seconds without a first token: (profile, config, rate, seed, timeout).
TIMEOUT_CASES = [
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64), 50, 8, 1.5),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=4096, max_num_seqs=32, max_model_len=4096,
                                    enable_chunked_prefill=False), 30, 9, 1.0),
    (CASES[5][0], CASES[5][1], 2, 10, 6.0),  # preempts: requests that have their first token wait on
]
#: Requests for LoRA adapters (and the base model), more adapters than a batch takes:
#: (profile, config, rate, seed, timeout, adapters).
LORA_CASES = [
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64, max_loras=1), 40, 11, math.inf, 3),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=2048, max_num_seqs=32, max_loras=2), 60, 12, math.inf, 4),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256, enable_chunked_prefill=False,
                                    max_loras=2), 50, 13, math.inf, 5),
    (CASES[5][0], dataclasses.replace(CASES[5][1], max_loras=1), 50, 14, math.inf, 2),  # preempts
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64, max_loras=1), 50, 15, 1.5, 3),
]


@pytest.mark.parametrize(("profile", "config", "rate", "seed", "timeout", "adapters"),
                         [(*case, math.inf, 0) for case in CASES] + [(*case, 0) for case in TIMEOUT_CASES]
                         + LORA_CASES)  # fmt: skip
def test_engine_matches_literal_scheduler(
    profile: str, config: EngineConfig, rate: float, seed: int, timeout: float, adapters: int
) -> None:
    engine = Engine(noiseless(profile), config, seed=0, slow_gap_seconds=SLOW)
    requests = random_requests(500, rate, seed, timeout=timeout, adapters=adapters)
    for request in requests:
        engine.submit(request)
    # Advance in uneven windows: window edges must not change the outcome.
    finished, timed_out = [], []
    t = 0.0
    while len(finished) + len(timed_out) < len(requests):
        t += 0.37
        finished += engine.advance(t)
        timed_out += engine.timed_out
    cfg = engine.config
    ref = run_reference(
        engine.cost,
        requests,
        budget=cfg.max_num_batched_tokens,
        max_seqs=cfg.max_num_seqs,
        num_blocks=engine.num_gpu_blocks,
        chunked=cfg.enable_chunked_prefill,
        max_loras=cfg.max_loras,
    )
    assert sorted(timed_out) == sorted(ref.timed_out)
    if adapters:
        assert ref.deferred > 20, "no request waited for its adapter: the LoRA rule was not exercised"
    assert sorted([f.rid for f in finished] + timed_out) == list(range(len(requests)))
    if timeout < math.inf:
        assert len(timed_out) > 20, "no client gave up: the aborts were not exercised"
        if config.enable_chunked_prefill and not adapters:  # with adapters, the deferred give up first
            assert ref.timed_out_prefilling > 0, "no client gave up on a chunked prefill"
    slow_seen = 0
    for f in finished:
        assert f.first_token_time == pytest.approx(ref.first_token[f.rid], rel=1e-9)
        assert f.finish_time == pytest.approx(ref.finish[f.rid], rel=1e-9)
        assert f.preemptions == ref.preemptions[f.rid]
        assert f.max_itl == pytest.approx(ref.max_gap[f.rid], rel=1e-9, abs=1e-12)
        assert f.slow_gaps == tuple(sum(gap > t for gap in ref.gaps[f.rid]) for t in SLOW)
        slow_seen += sum(f.slow_gaps)
    assert slow_seen > 0, "no gap exceeded a threshold: the counts were not exercised"
    snap = engine.snapshot()
    tokens = snap.histograms["vllm:iteration_tokens_total"]
    assert tokens.cumulative == tuple(sum(v <= b for v in ref.iteration_tokens) for b in tokens.bounds)
    assert tokens.sum == sum(ref.iteration_tokens)
    assert snap.counters["num_preemptions"] == ref.preempted


def test_some_cases_preempt() -> None:
    """The cases above would prove little about preemption if none occurred."""
    engine = Engine(noiseless("llama3-8b-l4"), CASES[5][1], seed=0)
    for request in random_requests(500, 50, 6):
        engine.submit(request)
    engine.advance(1e9)
    assert engine.snapshot().counters["num_preemptions"] > 100


#: Clients that go away: (profile, config, rate, seed, mean prompt, mean seconds from arrival to abort,
#: where the aborted requests were).
ABORT_CASES = [
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64), 40, 1, 512, 1.0,
     {"waiting", "decoding"}),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=128, max_num_seqs=64), 10, 11, 2000, 1.0,
     {"waiting", "prefilling", "decoding"}),  # 2k-token prompts in 128-token chunks
    (*CASES[4][:2], 50, 5, 512, 3.0, {"waiting", "preempted", "decoding"}),  # chunked prefill off, preempts
]  # fmt: skip


@pytest.mark.parametrize(("profile", "config", "rate", "seed", "prompt", "after", "where"), ABORT_CASES)
def test_engine_aborts_like_literal_scheduler(
    profile: str, config: EngineConfig, rate: float, seed: int, prompt: float, after: float, where: set[str]
) -> None:
    """Requests aborted between two steps (waiting, preempted, mid-prefill, mid-decode) leave both schedulers
    alike: every other request is served at the same instants."""
    engine = Engine(noiseless(profile), config, seed=0)
    requests = random_requests(500, rate, seed, prompt=prompt)
    for request in requests:
        engine.submit(request)
    rng = np.random.default_rng(seed)
    window = 0.37
    windows = {rid: math.ceil((r.arrival + rng.exponential(after)) / window)
               for rid, r in enumerate(requests) if rng.random() < 0.3}  # fmt: skip
    finished, aborted = [], []
    k = 0
    while len(finished) + len(aborted) < len(requests):
        k += 1
        finished += engine.advance(k * window)
        aborted += [rid for rid, w in windows.items() if w == k and engine.abort(rid)]
    cfg = engine.config
    ref = run_reference(engine.cost, requests, budget=cfg.max_num_batched_tokens, max_seqs=cfg.max_num_seqs,
                        num_blocks=engine.num_gpu_blocks, chunked=cfg.enable_chunked_prefill,
                        aborts={rid: w * window for rid, w in windows.items()})
    assert set(ref.aborted) == where
    assert sorted(aborted) == sorted(rid for rids in ref.aborted.values() for rid in rids)
    assert sorted([f.rid for f in finished] + aborted) == list(range(len(requests)))
    for f in finished:
        assert f.first_token_time == pytest.approx(ref.first_token[f.rid], rel=1e-9)
        assert f.finish_time == pytest.approx(ref.finish[f.rid], rel=1e-9)
        assert f.preemptions == ref.preemptions[f.rid]
    assert engine.snapshot().histograms["vllm:iteration_tokens_total"].count == len(ref.iteration_tokens)
    assert engine.kv_usage == 0, "an aborted request's blocks were not all freed, or freed twice"
