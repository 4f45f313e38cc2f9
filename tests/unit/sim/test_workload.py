"""Workload generation: reproducible, the rates and lengths asked for, phases
that tile the day."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_autotuner.sim.engine import Engine, EngineConfig, Request
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.workload import (
    CHAT,
    CLIENT_TIMEOUT_S,
    HOUR,
    MIXES,
    RAG,
    Diurnal,
    LengthDist,
    Mix,
    OnOff,
    Phase,
    Poisson,
    RequestClass,
    Scenario,
    Stream,
    bursty,
    chat_rag_shift,
    diurnal_with_batch_window,
    steady,
    step_change,
)


def test_same_seed_same_workload_other_seed_differs() -> None:
    a, b, c = (diurnal_with_batch_window(10, 2).generate(seed) for seed in (1, 1, 2))
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival[:100], c.arrival[:100])


@pytest.mark.parametrize(("name", "prompt", "output"), [("chat", 512, 256), ("rag", 4096, 128),
                                                         ("code", 1500, 400), ("summarization", 3000, 300)])  # fmt: skip
def test_mix_means(name: str, prompt: float, output: float) -> None:
    work = steady(5, MIXES[name], hours=2).generate(0)
    assert work.prompt_tokens.mean() == pytest.approx(prompt, rel=0.05)
    assert work.output_tokens.mean() == pytest.approx(output, rel=0.05)
    assert (work.prompt_tokens + work.output_tokens <= 8192).all()


def test_requests_fit_a_smaller_max_model_len() -> None:
    work = steady(5, RAG, hours=1).generate(0, max_model_len=6000)
    assert (work.prompt_tokens + work.output_tokens <= 6000).all()
    assert (work.output_tokens >= 1).all()


def test_a_shared_prefix_stays_shorter_than_a_prompt_cut_to_a_smaller_max_model_len() -> None:
    """A prefix the cut prompt no longer exceeds is cut too: the engine takes every request."""
    long_prefix = Mix("system", (RequestClass("system", LengthDist(4096, 0.3, 3328, 7680), LengthDist(64, 0.5, 8, 256),
                                              prefix_tokens=3072, prefix_variants=2),))
    work = steady(2, long_prefix, hours=0.1).generate(0, max_model_len=3000)
    assert (work.prefix_id >= 0).all() and (work.prefix_tokens < work.prompt_tokens).all()
    engine = Engine(get_profile("llama3-8b-a100"), EngineConfig(max_model_len=3000), seed=0)
    for request in work.requests():
        engine.submit(request)


def test_poisson_rate_and_sorted_arrivals() -> None:
    work = steady(7, CHAT, hours=2).generate(3)
    assert len(work) == pytest.approx(7 * 2 * HOUR, rel=0.02)
    assert (np.diff(work.arrival) >= 0).all()
    assert work.arrival.min() >= 0 and work.arrival.max() < 2 * HOUR


def test_diurnal_curve_peaks_in_the_afternoon() -> None:
    process = Diurnal(peak=20, trough=2, peak_hour=14)
    times = process.sample(np.random.default_rng(0), 0, 24 * HOUR)
    per_hour = np.histogram(times, bins=24, range=(0, 24 * HOUR))[0] / HOUR
    assert int(np.argmax(per_hour)) in (13, 14)
    assert int(np.argmin(per_hour)) in (1, 2)
    assert per_hour[13:15].mean() == pytest.approx(20, rel=0.05)
    assert per_hour[1:3].mean() == pytest.approx(2, rel=0.15)


def test_on_off_traffic_is_burstier_than_poisson() -> None:
    rng = np.random.default_rng(0)
    on_off = OnOff(rate_on=30, rate_off=2, mean_on_s=60, mean_off_s=240).sample(rng, 0, 12 * HOUR)
    poisson = Poisson(len(on_off) / (12 * HOUR)).sample(rng, 0, 12 * HOUR)

    def dispersion(times: np.ndarray) -> float:  # variance / mean of per-minute counts; 1 for Poisson
        counts = np.histogram(times, bins=12 * 60, range=(0, 12 * HOUR))[0]
        return counts.var() / counts.mean()

    assert dispersion(poisson) == pytest.approx(1, abs=0.2)
    assert dispersion(on_off) > 5


def test_step_changes_hold_their_rates() -> None:
    work = step_change([(0, 2), (8, 10), (20, 4)]).generate(0)
    for start, end, rate in ((0, 8, 2), (8, 20, 10), (20, 24, 4)):
        n = ((work.arrival >= start * HOUR) & (work.arrival < end * HOUR)).sum()
        assert n / ((end - start) * HOUR) == pytest.approx(rate, rel=0.05)


def test_shift_scenario_switches_mix_and_phases_tile_the_day() -> None:
    scenario = chat_rag_shift(chat_rate=4, rag_rate=2)
    work = scenario.generate(0)
    rag_hours = (work.arrival >= 10 * HOUR) & (work.arrival < 16 * HOUR)
    assert set(work.request_class[rag_hours]) == {"rag"}
    assert set(work.request_class[~rag_hours]) == {"chat"}
    assert scenario.phase_at(9.9 * HOUR) == "chat-morning"
    assert scenario.phase_at(12 * HOUR) == "rag"
    assert scenario.phase_at(23 * HOUR) == "chat-evening"
    for built in (steady(1), diurnal_with_batch_window(5, 1), bursty(10, 1), scenario):
        assert built.phases[0].start == 0 and built.phases[-1].end == built.duration
        assert all(a.end == b.start for a, b in zip(built.phases, built.phases[1:]))


def test_batch_window_adds_summarisation_at_night_only() -> None:
    work = diurnal_with_batch_window(peak=10, batch_rate=3).generate(0)
    batch = work.arrival[work.request_class == "summarization"]
    assert batch.min() >= 1 * HOUR and batch.max() < 5 * HOUR
    assert len(batch) == pytest.approx(3 * 4 * HOUR, rel=0.03)


def test_overlapping_phases_are_rejected() -> None:
    with pytest.raises(ValueError, match="overlap"):
        Scenario("bad", (Stream(Poisson(1), CHAT),), (Phase("a", 0, 10), Phase("b", 5, 20)), 20)


def test_prefix_classes_share_prefixes() -> None:
    mix = Mix("templated", (RequestClass("t", LengthDist(800, 0.3, 300, 2000), LengthDist(50, 0.3, 10, 100),
                                         prefix_tokens=256, prefix_variants=3),))  # fmt: skip
    requests = list(steady(2, mix, hours=0.5).generate(0).requests())
    assert len({r.prefix_id for r in requests}) == 3
    assert all(r.prefix_tokens == 256 < r.prompt_tokens for r in requests)


def test_requests_window_and_types() -> None:
    work = steady(3, CHAT, hours=1).generate(0)
    window = list(work.requests(600, 1200))
    assert all(600 <= r.arrival < 1200 for r in window)
    assert len(window) == ((work.arrival >= 600) & (work.arrival < 1200)).sum()
    assert isinstance(window[0], Request) and window[0].prefix_id is None


def test_streams_carry_their_clients_timeout_to_the_requests() -> None:
    patient = Scenario(
        "two-clients",
        (Stream(Poisson(2), CHAT, 0, HOUR), Stream(Poisson(2), CHAT, 0, HOUR, first_token_timeout=30.0)),
        (Phase("all", 0, HOUR),),
        HOUR,
    )
    work = patient.generate(0)
    assert set(work.first_token_timeout[work.stream == 0]) == {CLIENT_TIMEOUT_S}
    assert set(work.first_token_timeout[work.stream == 1]) == {30.0}
    assert [r.first_token_timeout for r in work.requests()] == work.first_token_timeout.tolist()
