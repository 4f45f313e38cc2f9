"""The engine's API and the behaviours the reference scheduler does not cover
(prefix caching, the clock, validation of submitted requests, the deferred gauge)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.unit.sim.helpers import noiseless, random_requests
from vllm_autotuner.sim.engine import Engine, EngineConfig, FinishedRequest, Request
from vllm_autotuner.sim.metricstate import MetricsSnapshot
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.workload import LengthDist, Mix, RequestClass, steady

TEMPLATED = Mix(
    "templated-rag",
    (RequestClass("rag", LengthDist(3000, 0.2, 2200, 4000), LengthDist(64, 0.3, 16, 128),
                  prefix_tokens=2048, prefix_variants=4),),
)  # fmt: skip


def _templated_run(prefix_caching: bool, profile: str = "llama3-8b-h100", seconds: float = 600) -> Engine:
    engine = Engine(get_profile(profile), EngineConfig(enable_prefix_caching=prefix_caching), seed=0)
    for request in steady(4, TEMPLATED, hours=1).generate(0).requests(0, seconds):
        engine.submit(request)
    engine.advance(seconds)
    return engine


def test_prefix_caching_reuses_shared_prefixes() -> None:
    cached, uncached = _templated_run(True).snapshot(), _templated_run(False).snapshot()
    assert cached.counters["prefix_cache_hits"] > 0.5 * cached.counters["prefix_cache_queries"] * 2048 / 3000
    assert cached.counters["prompt_tokens_cached"] == cached.counters["prefix_cache_hits"] > 0
    assert uncached.counters["prefix_cache_queries"] == uncached.counters["prefix_cache_hits"] == 0
    assert cached.counters["prompt_tokens"] == pytest.approx(uncached.counters["prompt_tokens"], rel=0.01)
    ttft = "vllm:time_to_first_token_seconds"
    assert cached.histograms[ttft].mean() < 0.6 * uncached.histograms[ttft].mean()
    computed = "vllm:request_prefill_kv_computed_tokens"
    assert cached.histograms[computed].sum < 0.5 * uncached.histograms[computed].sum


def test_prefix_cache_under_memory_pressure_stays_within_the_cache() -> None:
    engine = Engine(get_profile("llama3-8b-l4"), EngineConfig(max_num_seqs=64), seed=0)
    for request in steady(0.6, TEMPLATED, hours=1).generate(1).requests(0, 900):
        engine.submit(request)
    for t in range(30, 901, 30):
        engine.advance(t)
        assert 0.0 <= engine.kv_usage <= 1.0
    snap = engine.snapshot()
    assert snap.counters["prefix_cache_hits"] > 0
    assert snap.counters["request_success"] > 100


def _preempting_shared_prefixes() -> tuple[int, MetricsSnapshot]:
    """Requests, many with one of four shared prefixes, on a GPU short of KV cache: how many, and the metrics after
    all of them."""
    shared = [dataclasses.replace(r, prefix_id=r.prompt_tokens % 4, prefix_tokens=512) if r.prompt_tokens > 600 else r
              for r in random_requests(400, 40, 4, prompt=1500, output=300)]
    engine = Engine(get_profile("llama3-8b-l4"), EngineConfig(max_num_seqs=48, enable_prefix_caching=True), seed=0)
    for request in shared:
        engine.submit(request)
    engine.advance(math.inf)
    return len(shared), engine.snapshot()


def test_a_preempted_requests_readmission_is_no_prefix_cache_query() -> None:
    """vLLM counts the prefix-cache lookups of a preempted request's re-admission apart and exports them nowhere: its
    queries and hits are its prompts' first admissions, the hits the cached prompt tokens (as its HELP says)."""
    count, snap = _preempting_shared_prefixes()
    counters = snap.counters
    assert counters["num_preemptions"] > 0 and counters["request_success"] == count
    assert counters["prefix_cache_queries"] == counters["prompt_tokens"]
    assert counters["prefix_cache_hits"] == counters["prompt_tokens_cached"] > 0


def test_iteration_tokens_counts_a_chunked_prompt_once_with_its_first_token() -> None:
    """vLLM observes ``vllm:iteration_tokens_total`` once per step that outputs a token: the whole prompt of each
    request whose first token it is, plus the tokens sampled. The chunks before that output nothing and are not
    observed: a 6000-token prompt at a 2048-token budget is one observation of 6001, then one per decode."""
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(max_num_batched_tokens=2048, max_num_seqs=8), seed=0)
    engine.submit(Request(0.0, 6000, 10))
    engine.advance(math.inf)
    tokens = engine.snapshot().histograms["vllm:iteration_tokens_total"]
    assert tokens.count == 10 and tokens.sum == 6000 + 10
    assert tokens.count - tokens.cumulative[tokens.bounds.index(4096.0)] == 1  # the prompt's step, above 4096


def test_iteration_tokens_sum_is_prompt_and_generation_tokens_under_preemption_and_prefix_caching() -> None:
    """As in vLLM (and the reference scrape: 1787 = 416 + 1371), the histogram's sum is the prompt tokens (cached ones
    included, a preempted request's recomputation not) plus the generation tokens."""
    _, snap = _preempting_shared_prefixes()
    counters = snap.counters
    assert counters["num_preemptions"] > 0 and counters["prompt_tokens_cached"] > 0
    tokens = snap.histograms["vllm:iteration_tokens_total"]
    assert tokens.sum == counters["prompt_tokens"] + counters["generation_tokens"]


def test_submit_rejects_what_vllm_rejects() -> None:
    engine = Engine(get_profile("llama3-8b-h100"), EngineConfig(max_model_len=4096), seed=0)
    with pytest.raises(ValueError, match="maximum context length is 4096 tokens"):
        engine.submit(Request(0.0, 4000, 200))
    with pytest.raises(ValueError, match="prefix_tokens must be shorter"):
        engine.submit(Request(0.0, 100, 10, prefix_id=1, prefix_tokens=100))
    engine.submit(Request(5.0, 100, 10))
    with pytest.raises(ValueError, match="arrival order"):
        engine.submit(Request(4.0, 100, 10))


def test_idle_clock_jumps_and_advance_returns_each_request_once() -> None:
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0)
    assert engine.advance(10.0) == [] and engine.now == 10.0
    rid = engine.submit(Request(100.0, 256, 32))
    assert engine.advance(50.0) == [] and engine.now == 50.0
    assert engine.num_waiting == 0  # not arrived yet
    (done,) = engine.advance(200.0)
    assert done.rid == rid and done.arrival == 100.0
    assert done.queue_time == 0.0
    assert 0 < done.ttft < 0.1 and done.output_tokens == 32
    assert done.mean_itl == pytest.approx((done.finish_time - done.first_token_time) / 31)
    assert engine.advance(300.0) == [] and engine.now == 300.0


def test_steps_are_atomic_at_window_edges() -> None:
    engine = Engine(get_profile("llama3-8b-h100"), EngineConfig(), seed=0)
    for request in random_requests(200, 20, 0):
        engine.submit(request)
    for edge in (0.5, 1.0, 1.5, 2.0):
        engine.advance(edge)
        assert edge <= engine.now < edge + 0.5  # at most one step past the edge


#: Engines and traffic whose decode spans meet every kind of event: (profile, config, requests).
NOISY_RUNS = [
    ("llama3-8b-a100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64),
     random_requests(600, 8, 3, prompt=800, output=200)),
    ("llama3-8b-l4", EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128),  # first-token deadlines, preemption
     random_requests(500, 6, 7, prompt=800, output=400, timeout=3.0)),
    ("llama3-8b-h100", EngineConfig(max_num_batched_tokens=512, max_num_seqs=64, max_loras=1),  # deferred arrivals
     random_requests(400, 30, 11, adapters=3)),
]  # fmt: skip


def _outcomes(window: float, profile: str, config: EngineConfig, requests: list[Request]) -> dict[int, float]:
    """A noisy engine fed as the benchmark's fleet feeds it: each window's arrivals submitted, then run to its end;
    when each request finished (-1: its client gave up)."""
    engine = Engine(get_profile(profile), config, seed=1)
    done: dict[int, float] = {}
    t, i = 0.0, 0
    while len(done) < len(requests):
        t += window
        while i < len(requests) and requests[i].arrival < t:
            engine.submit(requests[i])
            i += 1
        done.update((f.rid, f.finish_time) for f in engine.advance(t))
        done.update((rid, -1.0) for rid in engine.timed_out)
    return done


@pytest.mark.parametrize(("profile", "config", "requests"), NOISY_RUNS)
def test_step_noise_does_not_depend_on_the_windows(profile, config, requests) -> None:
    """A decode span cut by a window's end goes on with its noise draw, unless an event in the step across the end
    (a deadline, an admissible arrival) would have ended it: a static run in 300 s windows and a run that restarts
    pods in 15 s windows see the same engine (they differed by up to 0.27% of goodput)."""
    coarse = _outcomes(300.0, profile, config, requests)
    for window in (15.0, 0.37):
        fine = _outcomes(window, profile, config, requests)
        assert fine.keys() == coarse.keys()
        assert max(abs(fine[rid] - coarse[rid]) for rid in coarse) < 1e-9


@pytest.mark.parametrize(("config", "late"), [
    (EngineConfig(max_num_batched_tokens=2048, max_num_seqs=4), Request(0.0, 500, 5, first_token_timeout=5.0)),
    (EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64, max_loras=1), Request(5.0, 500, 5, lora="b")),
])  # fmt: skip
def test_a_span_cut_just_before_an_event_draws_afresh_after_it(config, late) -> None:
    """A call that ends within a decode step during which a deadline passes (a request waiting for a slot gives up)
    or a request arrives that then waits (for its LoRA adapter): a single call's span ends at that event and the
    next draws anew, so the continued span must too."""
    early = [Request(0.0, 500, 2000, lora="a" if config.max_loras else None) for _ in range(4)]

    def finish_times(cut: float | None) -> dict[int, float]:
        engine = Engine(get_profile("llama3-8b-a100"), config, seed=3)
        for request in early + ([late] if late.arrival == 0 else []):
            engine.submit(request)
        done = {f.rid: f.finish_time for f in engine.advance(cut)} if cut is not None else {}
        if late.arrival > 0:
            engine.submit(late)
        done.update((f.rid, f.finish_time) for f in engine.advance(1000.0))
        return done

    whole, cut = finish_times(None), finish_times(5.0 - 1e-9)
    assert whole.keys() == cut.keys() and max(abs(whole[rid] - cut[rid]) for rid in whole) < 1e-9


def test_unfinished_lists_what_a_shutdown_drops() -> None:
    engine = Engine(get_profile("llama3-8b-h100"), EngineConfig(), seed=0)
    requests = random_requests(300, 50, 2)
    for request in requests:
        engine.submit(request)
    finished = engine.advance(3.0)
    left = engine.unfinished()
    assert finished and left
    assert len(finished) + len(left) == len(requests)
    done = {f.rid for f in finished}
    assert left == [r for i, r in enumerate(requests) if i not in done]


def test_advance_to_infinity_drains_everything() -> None:
    engine = Engine(get_profile("llama3-8b-a100"), EngineConfig(), seed=0)
    requests = random_requests(500, 100, 3)
    for request in requests:
        engine.submit(request)
    assert len(engine.advance(float("inf"))) == len(requests)
    snap = engine.snapshot()
    assert snap.gauges.num_requests_running == snap.gauges.num_requests_waiting == 0
    assert snap.gauges.kv_cache_usage_perc == 0.0


def test_tokens_generated_follows_one_request_token_by_token() -> None:
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0)
    rid = engine.submit(Request(0.0, 2000, 400))
    counts: list[tuple[float, int | None]] = []
    done: list[FinishedRequest] = []
    t = 0.0
    while not done:
        t += 0.05
        done = engine.advance(t)
        counts.append((engine.now, engine.tokens_generated(rid)))
    (finished,) = done
    assert counts[-1][1] is None  # finished: nothing running under that id
    for now, count in counts[:-1]:
        if now < finished.first_token_time:
            assert count == 0
        else:  # one token at the first-token time, then one per decode step
            assert count == pytest.approx(1 + (now - finished.first_token_time) / finished.mean_itl, abs=1.5)


def test_tokens_generated_never_goes_back_under_preemption() -> None:
    engine = Engine(get_profile("llama3-8b-l4"), EngineConfig(max_num_seqs=48), seed=0)
    requests = random_requests(400, 40, 4, prompt=1500, output=300)
    rids = [engine.submit(r) for r in requests]
    sent = dict.fromkeys(rids, 0)
    finished: set[int] = set()
    t = 0.0
    while len(finished) < len(rids):
        t += 0.05
        finished.update(done.rid for done in engine.advance(t))
        for rid in set(rids) - finished:
            count = engine.tokens_generated(rid)
            if count is not None:  # None: waiting, and what was sent stays sent
                assert sent[rid] <= count < requests[rid].output_tokens
                sent[rid] = count
    assert engine.snapshot().counters["num_preemptions"] > 0  # the case this test is about happened


def test_a_client_that_gives_up_leaves_no_trace_in_the_metrics() -> None:
    """vLLM V1 aborts a request whose client went away and records nothing for it: the waiting gauge drops."""
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(max_num_seqs=1), seed=0)
    long = engine.submit(Request(0.0, 256, 2000))  # about 2000 steps: the only slot is busy for seconds
    gave_up = engine.submit(Request(0.1, 256, 16, first_token_timeout=1.0))
    assert engine.advance(1.05) == [] and engine.timed_out == []
    assert engine.num_waiting == 1
    assert engine.advance(1.2) == [] and engine.timed_out == [gave_up]
    assert engine.num_waiting == 0
    assert engine.tokens_generated(gave_up) is None
    assert engine.unfinished() == [Request(0.0, 256, 2000)]
    (done,) = engine.advance(float("inf"))
    assert done.rid == long and engine.timed_out == []
    snap = engine.snapshot()
    assert snap.counters["request_success"] == 1
    assert snap.histograms["vllm:time_to_first_token_seconds"].count == 1
    assert snap.histograms["vllm:request_queue_time_seconds"].count == 1


def test_the_timeout_is_for_the_first_token_only() -> None:
    """A request streaming longer than its client's timeout is not aborted: its client is reading tokens."""
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0)
    rid = engine.submit(Request(0.0, 256, 2000, first_token_timeout=1.0))
    (done,) = engine.advance(float("inf"))
    assert done.rid == rid and done.e2e > 5.0 and engine.timed_out == []


def test_submit_rejects_a_timeout_that_is_not_positive() -> None:
    engine = Engine(get_profile("llama3-8b-h100"), EngineConfig(), seed=0)
    for timeout in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="first_token_timeout must be positive"):
            engine.submit(Request(0.0, 100, 10, first_token_timeout=timeout))


def test_abort_frees_a_streaming_request_and_records_nothing() -> None:
    """A client that closes the connection mid-stream: vLLM aborts the request, frees its KV blocks and counts
    no finished request; one not arrived yet is dropped as well; a second abort finds nothing."""
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0)
    streaming = engine.submit(Request(0.0, 2000, 2000))
    later = engine.submit(Request(10.0, 100, 10, first_token_timeout=5.0))
    busy = engine.submit(Request(12.0, 100, 2000))  # still running when ``later``'s deadline passes
    engine.advance(1.0)
    assert 0 < engine.tokens_generated(streaming) < 2000 and engine.kv_usage > 0
    assert engine.abort(streaming) and engine.abort(later)
    assert engine.num_running == 0 and engine.kv_usage == 0 and engine.unfinished() == [Request(12.0, 100, 2000)]
    assert not engine.abort(streaming)
    (done,) = engine.advance(float("inf"))
    assert done.rid == busy and done.finish_time > 15.0
    assert engine.timed_out == []  # ``later``'s deadline passed: skipped, not aborted twice
    snap = engine.snapshot()
    assert snap.counters["request_success"] == 1
    assert snap.histograms["vllm:e2e_request_latency_seconds"].count == 1
    assert snap.histograms["vllm:time_to_first_token_seconds"].count == 2  # the aborted one's came before


def test_abort_of_a_finished_request_finds_nothing() -> None:
    engine = Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0)
    rid = engine.submit(Request(0.0, 100, 10))
    (done,) = engine.advance(float("inf"))
    assert done.rid == rid and not engine.abort(rid)
    assert engine.snapshot().counters["request_success"] == 1


def test_requests_for_one_lora_adapter_too_many_wait_deferred_while_later_ones_pass_them() -> None:
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64, max_loras=1)
    engine = Engine(noiseless("llama3-8b-h100"), config)
    long_a = engine.submit(Request(0.0, 100, 400, lora="a"))
    bs = [engine.submit(Request(0.001, 100, 10, lora="b")) for _ in range(3)]
    short_a = engine.submit(Request(0.002, 100, 10, lora="a"))
    base = engine.submit(Request(0.003, 100, 10))  # the base model takes no adapter's place
    done = {f.rid: f for f in engine.advance(0.5)}
    assert set(done) == {short_a, base}  # past the three for b, which wait behind the first request's adapter
    gauges = engine.snapshot().gauges
    assert (gauges.num_requests_running, gauges.num_requests_waiting, gauges.num_requests_deferred) == (1, 3, 3)
    assert (gauges.running_lora_adapters, gauges.waiting_lora_adapters) == (("a",), ("b",))
    done |= {f.rid: f for f in engine.advance(math.inf)}
    assert min(done[b].first_token_time for b in bs) > done[long_a].finish_time
    gauges = engine.snapshot().gauges
    assert (gauges.num_requests_deferred, gauges.running_lora_adapters, gauges.waiting_lora_adapters) == (0, (), ())
