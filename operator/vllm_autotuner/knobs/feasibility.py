"""vLLM's start-up checks on the two knobs, with vLLM's own error texts.

The operator must never roll out a config that vLLM refuses (a pod that never
becomes Ready), and the simulator must refuse exactly what vLLM refuses; both
call this module, so the rules exist once. Texts are those a real vLLM 0.32
server printed (shared/vllm-startup-errors.md). Memory-dependent failures
(activation memory, KV cache) are not decidable from the flags alone: the
simulator models them and the operator learns them from failed rollouts.
Where a rule needs the model's length and it is not known (the model's own,
which only vLLM reads), the rule is not taken to pass: with chunked prefill
off, any budget is refused, saying to set ``--max-model-len``.
"""

from __future__ import annotations

from vllm_autotuner.api.spec import Knobs


def startup_errors(knobs: Knobs, max_model_len: int | None, chunked_prefill: bool = True) -> list[str]:
    """vLLM's validation errors for these knobs, in the order vLLM checks them (it reports the first);
    ``max_model_len`` None when it is not known."""
    tokens, seqs = knobs.max_num_batched_tokens, knobs.max_num_seqs
    errors = []
    if not chunked_prefill and max_model_len is None:
        errors.append(
            f"max_num_batched_tokens ({tokens}) may be smaller than max_model_len, which is not known: with chunked "
            "prefill off vLLM refuses a budget below it; set --max-model-len on the vLLM command line"
        )
    elif not chunked_prefill and tokens < max_model_len:
        errors.append(
            f"Value error, max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
            "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
    if tokens < seqs:
        errors.append(
            f"Value error, max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs})."
        )
    return errors


def startup_warnings(knobs: Knobs, max_model_len: int | None) -> list[str]:
    """vLLM's start-up warnings for these knobs: it starts, but the setting is odd."""
    if max_model_len is not None and knobs.max_num_batched_tokens > knobs.max_num_seqs * max_model_len:
        return [
            f"max_num_batched_tokens ({knobs.max_num_batched_tokens}) exceeds max_num_seqs * max_model_len "
            f"({knobs.max_num_seqs * max_model_len}). This may lead to unexpected behavior."
        ]
    return []
