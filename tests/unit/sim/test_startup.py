"""Start-up: vLLM's flag validation and memory check, with its own texts
(vllm-startup-errors.md), the default knobs per GPU class, and start-up time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_autotuner.knobs import EngineArgs
from vllm_autotuner.sim.engine import Engine
from vllm_autotuner.sim.profiles import PROFILES, get_profile
from vllm_autotuner.sim.startup import EngineConfig, StartupError, check_startup, default_knobs, format_gib

# A copy of the project's shared/vllm-startup-errors.md (what a real vLLM 0.32 printed).
ERRORS_MD = Path(__file__).parent / "data" / "vllm-startup-errors.md"


def _assert_vllm_text(message: str, *fragments: str) -> None:
    """Each fragment is in our message and in what the real vLLM printed."""
    real = ERRORS_MD.read_text()
    for fragment in fragments:
        assert fragment in message
        assert fragment in real, f"not in vllm-startup-errors.md: {fragment}"


def test_budget_below_max_num_seqs_fails_validation() -> None:
    out = check_startup(get_profile("llama3-8b-h100"), EngineConfig(max_num_batched_tokens=4, max_num_seqs=8))
    assert out.error is not None and out.memory is None
    _assert_vllm_text(
        out.error,
        "ValidationError: 1 validation error for SchedulerConfig",
        "Value error, max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8).",
    )


def test_budget_below_max_model_len_without_chunked_prefill_fails_validation() -> None:
    config = EngineConfig(max_num_batched_tokens=100, max_num_seqs=8, max_model_len=256, enable_chunked_prefill=False)
    out = check_startup(get_profile("llama3-8b-h100"), config)
    assert out.error is not None
    _assert_vllm_text(
        out.error,
        "Value error, max_num_batched_tokens (100) is smaller than max_model_len (256). This effectively limits "
        "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
        "increase max_num_batched_tokens or decrease max_model_len.",
    )


def test_same_budget_with_chunked_prefill_is_valid() -> None:
    config = EngineConfig(max_num_batched_tokens=100, max_num_seqs=8, max_model_len=256)
    assert check_startup(get_profile("llama3-8b-h100"), config).ok


def test_huge_budget_only_warns() -> None:
    config = EngineConfig(max_num_batched_tokens=100000, max_num_seqs=8, max_model_len=256)
    out = check_startup(get_profile("llama3-8b-h100"), config)
    assert out.ok
    (warning,) = out.warnings
    _assert_vllm_text(
        warning,
        "max_num_batched_tokens (100000) exceeds max_num_seqs * max_model_len (2048). This may lead to "
        "unexpected behavior.",
    )


def test_max_model_len_above_position_embeddings_fails() -> None:
    out = check_startup(get_profile("llama3-8b-h100"), EngineConfig(max_model_len=16384))
    assert out.error is not None
    assert "Value error, User-specified max_model_len (16384) is greater than the derived max_model_len " \
           "(max_position_embeddings=8192.0" in out.error  # fmt: skip
    _assert_vllm_text(out.error, "Value error, User-specified max_model_len (", "is greater than the derived")


def test_budget_too_large_for_one_sequence_fails_with_vllms_message() -> None:
    """On the 24 GB L4 the profiling pass of a 24k-token budget leaves KV
    room for fewer than 8192 tokens."""
    out = check_startup(get_profile("llama3-8b-l4"), EngineConfig(max_num_batched_tokens=24576))
    assert out.error is not None and out.memory is not None
    assert 0 < out.memory.kv_available < 8192 * out.memory.page_bytes / 16
    _assert_vllm_text(
        out.error,
        "ValueError: To serve at least one request with the model's max seq len (",
        "KV cache is needed, which is larger than the available KV cache memory (",
        "Based on the available memory, the estimated maximum model length is ",
        "RuntimeError: Engine core initialization failed.",
    )
    estimated = int(out.error.split("estimated maximum model length is ")[1].split(".")[0])
    assert 0 < estimated < 8192
    assert check_startup(get_profile("llama3-8b-l4"), EngineConfig(max_model_len=estimated,
                                                                   max_num_batched_tokens=24576)).ok  # fmt: skip


def test_budget_leaving_no_memory_fails_with_vllms_message() -> None:
    out = check_startup(get_profile("llama3-8b-l4"), EngineConfig(max_num_batched_tokens=65536))
    assert out.error is not None
    _assert_vllm_text(out.error, "ValueError: No available memory for the cache blocks. Try increasing")


def test_engine_refuses_to_start() -> None:
    with pytest.raises(StartupError, match="No available memory for the cache blocks"):
        Engine(get_profile("llama3-8b-l4"), EngineConfig(max_num_batched_tokens=65536))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_larger_budget_shrinks_the_kv_cache_until_start_up_fails(name: str) -> None:
    profile = get_profile(name)
    blocks = []
    for tokens in (2048, 8192, 32768, 131072, 524288, 2**21):
        out = check_startup(profile, EngineConfig(max_num_batched_tokens=tokens))
        if not out.ok:
            break
        assert out.memory is not None
        blocks.append(out.memory.num_gpu_blocks)
    assert blocks == sorted(blocks, reverse=True) and len(set(blocks)) == len(blocks)
    assert not out.ok, "some budget must be too large for the memory"


def test_memory_tight_profile_fails_where_big_gpus_start() -> None:
    config = EngineConfig(max_num_batched_tokens=32768)
    assert check_startup(get_profile("llama3-8b-h100"), config).ok
    assert not check_startup(get_profile("llama3-8b-l4"), config).ok


def test_higher_memory_utilization_gives_more_blocks() -> None:
    profile = get_profile("llama3-8b-a100")
    low = check_startup(profile, EngineConfig(gpu_memory_utilization=0.8)).memory
    high = check_startup(profile, EngineConfig(gpu_memory_utilization=0.95)).memory
    assert low is not None and high is not None
    assert high.num_gpu_blocks > low.num_gpu_blocks


def test_h100_8b_kv_cache_size_is_plausible() -> None:
    """vLLM logs ~27k blocks (~440k tokens) for Llama-3-8B on an H100 at 0.9."""
    memory = check_startup(get_profile("llama3-8b-h100"), EngineConfig()).memory
    assert memory is not None
    assert 400_000 < memory.kv_tokens < 480_000


@pytest.mark.parametrize(
    ("name", "tokens", "seqs"),
    [
        ("llama3-8b-h100", 8192, 1024),
        ("llama3-70b-h100-tp4", 8192, 1024),
        ("llama3-8b-a100", 2048, 256),  # >= 70 GiB, but A100s are excluded
        ("llama3-8b-l40s", 2048, 256),
        ("llama3-8b-l4", 2048, 256),
    ],
)
def test_default_knobs_follow_vllms_gpu_classes(name: str, tokens: int, seqs: int) -> None:
    profile = get_profile(name)
    defaults = default_knobs(profile).knobs
    assert (defaults.max_num_batched_tokens, defaults.max_num_seqs) == (tokens, seqs)
    resolved = EngineConfig().resolve(profile)
    assert (resolved.max_num_batched_tokens, resolved.max_num_seqs) == (tokens, seqs)


def test_chunked_prefill_off_default_budget_covers_max_model_len() -> None:
    resolved = EngineConfig(enable_chunked_prefill=False).resolve(get_profile("llama3-8b-a100"))
    assert resolved.max_num_batched_tokens == 8192 == resolved.max_model_len


@given(
    profile=st.sampled_from(sorted(PROFILES)),
    tokens=st.none() | st.integers(1, 65536),
    seqs=st.none() | st.integers(1, 4096),
    max_model_len=st.integers(1, 8192),
    chunked=st.booleans(),
    mode=st.sampled_from([None, "throughput"]),
)
def test_the_simulator_runs_the_knobs_the_operator_reads(profile, tokens, seqs, max_model_len, chunked, mode) -> None:
    # one rule fills absent knobs for both (vLLM ties them to each other and to max_model_len)
    given_flags = {"max-num-batched-tokens": tokens, "max-num-seqs": seqs, "max-model-len": max_model_len,
                   "performance-mode": mode}
    args = ["m", *(f"--{name}={value}" for name, value in given_flags.items() if value is not None)]
    engine = EngineArgs.from_container({"args": args + ([] if chunked else ["--no-enable-chunked-prefill"])})
    config = EngineConfig(max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=max_model_len,
                          enable_chunked_prefill=chunked, performance_mode=mode)
    resolved = config.resolve(get_profile(profile))
    knobs, _ = engine.effective(default_knobs(get_profile(profile), mode))
    assert (knobs.max_num_batched_tokens, knobs.max_num_seqs) == (resolved.max_num_batched_tokens, resolved.max_num_seqs)


def test_start_up_takes_minutes_and_a_cached_compile_is_faster() -> None:
    for profile in PROFILES.values():
        cold = check_startup(profile, EngineConfig(), compile_cached=False).seconds
        warm = check_startup(profile, EngineConfig(), compile_cached=True).seconds
        assert 60 <= warm < cold <= 240


def test_failures_come_at_their_phase_and_time_scales() -> None:
    profile = get_profile("llama3-8b-l4")
    invalid = check_startup(profile, EngineConfig(max_num_batched_tokens=4, max_num_seqs=8))
    no_memory = check_startup(profile, EngineConfig(max_num_batched_tokens=65536))
    ready = check_startup(profile, EngineConfig())
    assert invalid.seconds == profile.startup.process_s
    assert invalid.seconds < no_memory.seconds < ready.seconds
    fast = check_startup(profile, EngineConfig(), time_scale=0.1)
    assert fast.seconds == pytest.approx(ready.seconds * 0.1)


def test_format_gib_matches_vllm() -> None:
    assert format_gib(0) == "0.0"
    assert format_gib(1.25 * 2**30) == "1.25"
    assert format_gib(1.23456 * 2**30) == "1.23"
