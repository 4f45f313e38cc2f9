"""vLLM's own default knob values, for Deployments that do not set the flags.

No metric exposes the knobs, so when a flag is absent the operator must know
what vLLM picked. vLLM chooses by hardware (``EngineArgs.get_batch_defaults``,
formerly ``_set_default_args``), in the OpenAI API server: GPUs with at least
70 GiB that are not A100s (H100, H200, MI300x) get 8192 tokens / 1024 seqs;
every other GPU gets 2048 / 256; the CPU backend 2048 / 128. From 0.28 GPUs
with at least 160 GiB (B200, B300) get 16384 / 1024, and from 0.33 a GB10
(DGX Spark: the memory of a large GPU, not its compute) keeps the small
tier. ``--performance-mode throughput`` (from 0.17) doubles what it leaves
to the defaults. The tables were read from ``get_batch_defaults`` in the
source of every minor release from 0.10 to 0.34 (its last patch release);
for a newer version the operator keeps the newest table and says so: the
table assumed is always reported in status. vLLM then ties an absent flag to
the other knob and to ``max_model_len`` (``engine_knobs``), which the
simulator and the operator both apply.

The GPU's memory and name come from its node's labels (``Hardware.from_labels``):
GPU Feature Discovery's where it runs, else the labels GKE and Karpenter on EKS
put on every GPU node, so that an L4 or a T4 pool without GPU Feature Discovery
is not taken for a GPU of 70 GiB or more, nor a slice of a GKE multi-instance
GPU for the whole GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_autotuner.api.spec import Knobs


@dataclass(frozen=True)
class DefaultsTable:
    """One row of vLLM's defaults: the versions it covers and the values per hardware class."""

    versions: tuple[tuple[int, int], tuple[int, int]]  # inclusive (major, minor) range
    large_gpu: Knobs  # >= 70 GiB and not an A100
    other_gpu: Knobs
    cpu: Knobs
    huge_gpu: Knobs | None = None  # >= 160 GiB, where the table has that tier
    gb10_small: bool = False  # a GB10 gets other_gpu whatever its memory


_LARGE = Knobs(max_num_batched_tokens=8192, max_num_seqs=1024)
_OTHER = Knobs(max_num_batched_tokens=2048, max_num_seqs=256)
_CPU = Knobs(max_num_batched_tokens=2048, max_num_seqs=128)
_HUGE = Knobs(max_num_batched_tokens=16384, max_num_seqs=1024)
TABLES = (
    DefaultsTable(versions=((0, 10), (0, 27)), large_gpu=_LARGE, other_gpu=_OTHER, cpu=_CPU),
    DefaultsTable(versions=((0, 28), (0, 32)), large_gpu=_LARGE, other_gpu=_OTHER, cpu=_CPU, huge_gpu=_HUGE),
    DefaultsTable(versions=((0, 33), (0, 34)), large_gpu=_LARGE, other_gpu=_OTHER, cpu=_CPU, huge_gpu=_HUGE,
                  gb10_small=True),
)
NEWEST = TABLES[-1]
LARGE_GPU_MIN_GIB = 70
HUGE_GPU_MIN_GIB = 160
MIB_PER_GIB = 1024

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's: NVIDIA-A100-SXM4-80GB
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB of one GPU, as GPU Feature Discovery writes it (NVML's total)
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"  # GKE's, on each GPU node: nvidia-l4
#: GKE's, on a node whose GPUs are cut into multi-instance GPU partitions: ``[compute]g.[memory]gb`` (1g.10gb); a
#: pod gets one partition, and vLLM sees its memory, not the whole GPU's
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
GKE_PARTITION_SIZE = re.compile(r"[0-9]+g\.([0-9]+)gb\b")
KARPENTER_GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"  # EC2's GPU name in lower kebab case: a100, l4
KARPENTER_GPU_MEMORY_LABEL = "karpenter.k8s.aws/instance-gpu-memory"  # MiB of one GPU, as EC2 describes it
#: The labels that say the memory a pod's GPU has, partitions included; a GKE accelerator type says the whole
#: GPU's, which its node's partition label may cut
MEMORY_LABELS = (GPU_MEMORY_LABEL, GKE_PARTITION_LABEL, KARPENTER_GPU_MEMORY_LABEL)
#: MiB of one GPU of each GKE accelerator type (the values of ``cloud.google.com/gke-accelerator``, Compute
#: Engine's GPU model names), as NVML reports the device: what GPU Feature Discovery's label would say there,
#: so that a GPU reads the same by either label (an H100 "80GB" is 79.6 GiB, an L4 "24 GB" 22.5 GiB). A value
#: not in the table (a GPU GKE adds later) is a GPU of unknown memory.
GKE_ACCELERATOR_MIB = {
    "nvidia-tesla-p4": 7611,
    "nvidia-tesla-t4": 15360,
    "nvidia-tesla-v100": 16160,
    "nvidia-tesla-p100": 16280,
    "nvidia-l4": 23034,
    "nvidia-tesla-a100": 40960,  # A100 40GB
    "nvidia-a100-80gb": 81920,
    "nvidia-h100-80gb": 81559,
    "nvidia-h100-mega-80gb": 81559,
    "nvidia-h200-141gb": 143771,
    "nvidia-b200": 183359,
    "nvidia-gb200": 189471,
}


@dataclass(frozen=True)
class Hardware:
    """What the operator knows about the GPU a pod runs on."""

    gpus: int  # GPUs requested by the container; 0 means the CPU backend
    memory_gib: float | None = None  # per GPU; None when unknown
    product: str | None = None  # the GPU's name from its node's labels (``from_labels``)

    @classmethod
    def from_labels(cls, gpus: int, labels: Mapping[str, str], memory_gib: float | None = None) -> Hardware:
        """The GPU of a node with these labels (a node's own, or those a nodeSelector asks for).

        Memory, unless given: GPU Feature Discovery's label (under its MIG
        "single" strategy, a partition's memory), else GKE's partition size
        (``GKE_PARTITION_LABEL``: a 1g.10gb slice of an H100 has about 10 GiB,
        the profile's name rounding up what NVML reports, 9.75; not the GPU's
        80), else its accelerator type (``GKE_ACCELERATOR_MIB``), else
        Karpenter's on EKS; the product likewise (it names an A100 or a GB10,
        which vLLM keeps off the large-GPU defaults whatever their memory):
        NVIDIA-A100-SXM4-80GB, nvidia-a100-80gb or a100. None where no label
        says.
        """
        accelerator = labels.get(GKE_ACCELERATOR_LABEL)
        if memory_gib is None:
            partition = GKE_PARTITION_SIZE.match(labels.get(GKE_PARTITION_LABEL, ""))
            readings = (_gib(labels.get(GPU_MEMORY_LABEL)), int(partition[1]) if partition else None,
                        _gib(GKE_ACCELERATOR_MIB.get(accelerator or "")), _gib(labels.get(KARPENTER_GPU_MEMORY_LABEL)))
            memory_gib = next((gib for gib in readings if gib is not None), None)
        product = labels.get(GPU_PRODUCT_LABEL) or accelerator or labels.get(KARPENTER_GPU_NAME_LABEL)
        return cls(gpus=gpus, memory_gib=memory_gib, product=product)


def _gib(mib: str | int | None) -> float | None:
    """GiB of a label's (or ``GKE_ACCELERATOR_MIB``'s) MiB; None where it holds no number."""
    return int(mib) / MIB_PER_GIB if str(mib).isdigit() else None


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
    (and < 160 GiB) unless the product name says A100 (or GB10). Both
    assumptions are named in ``table``.
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
    product = (hardware.product or "").lower()
    memory = hardware.memory_gib
    if hardware.gpus == 0:
        knobs, cls = table.cpu, "CPU backend"
    elif table.huge_gpu is not None and memory is not None and memory >= HUGE_GPU_MIN_GIB:
        knobs, cls = table.huge_gpu, f"GPU with {memory:g} GiB (>= {HUGE_GPU_MIN_GIB})"
    elif "a100" in product:
        knobs, cls = table.other_gpu, "A100 (excluded from the large-GPU defaults)"
    elif table.gb10_small and re.search(r"gb10(?![0-9])", product):
        knobs, cls = table.other_gpu, "GB10 (excluded from the large-GPU defaults)"
    elif memory is None:
        below = f" and < {HUGE_GPU_MIN_GIB}" if table.huge_gpu is not None else ""
        knobs, cls = table.large_gpu, f"GPU memory unknown, >= {LARGE_GPU_MIN_GIB}{below} GiB assumed"
    elif memory >= LARGE_GPU_MIN_GIB:
        knobs, cls = table.large_gpu, f"GPU with {memory:g} GiB (>= {LARGE_GPU_MIN_GIB})"
    else:
        knobs, cls = table.other_gpu, f"GPU with {memory:g} GiB (< {LARGE_GPU_MIN_GIB})"
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
