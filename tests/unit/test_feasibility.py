"""vLLM's start-up rules on the knobs, with the texts a real vLLM 0.32 printed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_autotuner.api import Knobs
from vllm_autotuner.knobs import startup_errors, startup_warnings


def k(tokens, seqs):
    return Knobs.model_construct(max_num_batched_tokens=tokens, max_num_seqs=seqs)


def test_tokens_below_seqs_is_vllms_error():
    assert startup_errors(k(4, 8), max_model_len=None) == [
        "Value error, max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)."
    ]


def test_chunked_prefill_off_needs_room_for_max_model_len():
    (error,) = startup_errors(k(100, 8), max_model_len=256, chunked_prefill=False)
    assert error.startswith("Value error, max_num_batched_tokens (100) is smaller than max_model_len (256).")
    assert startup_errors(k(100, 8), max_model_len=256, chunked_prefill=True) == []


def test_chunked_prefill_off_with_the_model_length_unknown_passes_no_budget():
    # vLLM checks the budget against the model's own length, which only vLLM reads: no budget is known to pass
    (error,) = startup_errors(k(2048, 64), max_model_len=None, chunked_prefill=False)
    assert "max_model_len, which is not known" in error and error.endswith("set --max-model-len on the vLLM command line")
    assert startup_errors(k(2048, 64), max_model_len=None, chunked_prefill=True) == []


def test_oversized_budget_only_warns():
    assert startup_errors(k(100000, 1), max_model_len=2048) == []
    (warning,) = startup_warnings(k(100000, 1), max_model_len=2048)
    assert "exceeds max_num_seqs * max_model_len (2048)" in warning


@given(st.integers(1, 10**6), st.integers(1, 10**4), st.none() | st.integers(1, 10**6), st.booleans())
def test_errors_exactly_when_a_rule_is_broken(tokens, seqs, max_model_len, chunked):
    broken = tokens < seqs or (not chunked and (max_model_len is None or tokens < max_model_len))
    assert bool(startup_errors(k(tokens, seqs), max_model_len, chunked)) == broken
