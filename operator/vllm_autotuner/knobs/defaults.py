"""vLLM's own default knob values, for Deployments that do not set the flags.

No metric exposes the knobs, so when a flag is absent the operator must know
what vLLM picked. vLLM chooses by hardware (``EngineArgs.get_batch_defaults``,
formerly ``_set_default_args``): since 0.10, GPUs with at least 70 GiB that
are not A100s (H100, H200, MI300x) get 8192 tokens / 1024 seqs in the OpenAI
API server; every other GPU gets 2048 / 256; the CPU backend 2048 / 128.
``--performance-mode throughput`` (newer releases) doubles them. Newer
releases are also reported to add a >= 160 GiB tier whose values we have not
verified, so for versions past the newest table the operator keeps the newest
table and says so: the table assumed is always reported in status. vLLM
then ties an absent flag to the other knob and to ``max_model_len``
(``engine_knobs``), which the simulator and the operator both apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_autotuner.api.spec import Knobs

GIB = 1024**3


@dataclass(frozen=True)
class DefaultsTable:
    """One row of vLLM's defaults: the versions it covers and the values per hardware class."""

    versions: tuple[tuple[int, int], tuple[int, int]]  # inclusive (major, minor) range
    large_gpu: Knobs  # >= 70 GiB and not an A100
    other_gpu: Knobs
    cpu: Knobs


TABLES = (
    DefaultsTable(
        versions=((0, 10), (0, 32)),
        large_gpu=Knobs(max_num_batched_tokens=8192, max_num_seqs=1024),
        other_gpu=Knobs(max_num_batched_tokens=2048, max_num_seqs=256),
        cpu=Knobs(max_num_batched_tokens=2048, max_num_seqs=128),
    ),
)
NEWEST = TABLES[-1]
LARGE_GPU_MIN_GIB = 70


@dataclass(frozen=True)
class Hardware:
    """What the operator knows about the GPU a pod runs on."""

    gpus: int  # GPUs requested by the container; 0 means the CPU backend
    memory_gib: float | None = None  # per GPU; None when unknown
    product: str | None = None  # e.g. "NVIDIA-A100-SXM4-80GB" from nvidia.com/gpu.product


@dataclass(frozen=True)
class AssumedDefaults:
    """vLLM's defaults for a deployment, with a sentence saying which table was assumed and why."""

    knobs: Knobs
    table: str


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) from a version or image tag such as ``v0.11.0`` or ``vllm-openai:0.9.2-cu128``."""
    if not text:
        return None
    match = re.search(r"(?<![0-9])v?([0-9]+)\.([0-9]+)(?:\.[0-9]+)?", text.rsplit(":", 1)[-1])
    return (int(match.group(1)), int(match.group(2))) if match else None


def vllm_defaults(version: str | None, hardware: Hardware, performance_mode: str | None = None) -> AssumedDefaults:
    """vLLM's OpenAI-server defaults for this version and hardware.

    Unknown version: the newest table. Unknown GPU memory: assumed >= 70 GiB
    unless the product name says A100. Both assumptions are named in ``table``.
    """
    parsed = parse_version(version)
    notes = []
    table = NEWEST
    if parsed is None:
        notes.append("vLLM version unknown, newest table assumed")
    else:
        for candidate in TABLES:
            if candidate.versions[0] <= parsed <= candidate.versions[1]:
                table = candidate
                break
        else:
            if parsed < TABLES[0].versions[0]:
                notes.append(f"vLLM {parsed[0]}.{parsed[1]} is older than the oldest table, oldest assumed")
                table = TABLES[0]
            else:
                notes.append(f"vLLM {parsed[0]}.{parsed[1]} is newer than the newest table, newest assumed")
    lo, hi = table.versions
    name = f"vLLM {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]} API server"
    a100 = bool(hardware.product) and "a100" in hardware.product.lower()
    if hardware.gpus == 0:
        knobs, cls = table.cpu, "CPU backend"
    elif a100:
        knobs, cls = table.other_gpu, "A100 (excluded from the large-GPU defaults)"
    elif hardware.memory_gib is None:
        knobs, cls = table.large_gpu, f"GPU memory unknown, >= {LARGE_GPU_MIN_GIB} GiB assumed"
    elif hardware.memory_gib >= LARGE_GPU_MIN_GIB:
        knobs, cls = table.large_gpu, f"GPU with {hardware.memory_gib:g} GiB (>= {LARGE_GPU_MIN_GIB})"
    else:
        knobs, cls = table.other_gpu, f"GPU with {hardware.memory_gib:g} GiB (< {LARGE_GPU_MIN_GIB})"
    if performance_mode == "throughput":
        knobs = Knobs(max_num_batched_tokens=knobs.max_num_batched_tokens * 2, max_num_seqs=knobs.max_num_seqs * 2)
        cls += ", --performance-mode throughput doubles them"
    description = f"{name}, {cls}: {knobs.max_num_batched_tokens} tokens / {knobs.max_num_seqs} seqs"
    if notes:
        description += f" ({'; '.join(notes)})"
    return AssumedDefaults(knobs=knobs, table=description)


def engine_knobs(
    tokens: int | None, seqs: int | None, defaults: Knobs, max_model_len: int | None, chunked_prefill: bool
) -> tuple[int, int]:
    """The budget and max_num_seqs vLLM runs with, given the flags (None: absent) and its defaults for them.

    vLLM does not fill the absent flags independently
    (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): an
    absent budget is at least ``max_model_len`` with chunked prefill off (so
    that any prompt fits one step), and at most ``max_num_seqs *
    max_model_len``; then an absent ``max_num_seqs`` is at most the budget.
    ``max_model_len`` None is the model's own length, which the operator
    cannot read: the ceiling is then left out, as it binds only for a model
    shorter than the budget per sequence (8 to 16 tokens at vLLM's defaults;
    more where ``--max-num-seqs`` is set low). With chunked prefill off the
    length must be known (``EngineArgs.from_container`` refuses the rest).
    """
    seqs_or_default = defaults.max_num_seqs if seqs is None else seqs
    if tokens is None:
        tokens = defaults.max_num_batched_tokens
        if not chunked_prefill:
            assert max_model_len is not None, "chunked prefill off without a known max_model_len is refused"
            tokens = max(max_model_len, tokens)
        if max_model_len is not None:
            tokens = min(seqs_or_default * max_model_len, tokens)
    if seqs is None:
        seqs = min(defaults.max_num_seqs, tokens)
    return tokens, seqs
