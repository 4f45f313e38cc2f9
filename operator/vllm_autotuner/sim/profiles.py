"""GPU and model profiles: the numbers the simulated vLLM engine runs on.

A profile is one vLLM replica: a model served on ``tp`` GPUs of one kind.
It carries three groups of numbers:

* **Hardware and architecture** (datasheet facts): peak dense BF16 tensor
  FLOP/s, HBM bandwidth, the memory ``torch.cuda.mem_get_info`` reports, the
  interconnect used by tensor-parallel all-reduces, and the model's shape
  (parameters, layers, hidden size, KV heads, head dimension, vocabulary,
  MLP width, ``max_position_embeddings``).
* **Efficiency factors** (fitted): the fraction of peak that vLLM's kernels
  reach, a fixed per-step overhead (scheduler, input preparation, launch) and
  a per-request overhead (sampling, detokenisation), and how much slower
  tensor-parallel shards run than one GPU.
* **Start-up**: how long a pod takes from container start to ``/health``
  (API server, weight load, ``torch.compile``, memory profiling, CUDA-graph
  capture), and the memory the profiling run reserves per batched token.

Public figures used (the calibration test ``tests/unit/sim/test_calibration``
reproduces each within the tolerance stated there):

* Datasheets: NVIDIA H100 SXM5 (989 TFLOP/s dense BF16, 3.35 TB/s HBM3,
  NVLink 900 GB/s), A100 SXM4 80GB (312 TFLOP/s, 2.039 TB/s, NVLink
  600 GB/s), A100 40GB (1.555 TB/s), L40S (362 TFLOP/s dense BF16, 864 GB/s
  GDDR6, PCIe Gen4), L4 (121 TFLOP/s dense BF16, 300 GB/s).
* Lambda Labs, "vllm-benchmark" (github.com/LambdaLabsML/vllm-benchmark,
  ``results/prompt_10``, vLLM 0.6 with 10 scheduler steps,
  Meta-Llama-3-8B-Instruct BF16, 10 short ShareGPT prompts): median ITL per
  10-step block 72.3 ms on 1x H100 SXM and 114.9 ms on 1x A100-80GB SXM,
  i.e. a small-batch decode step of 7.2 ms and 11.5 ms.
* Same repository, ``benchmark_v0.md``: Llama 3.1 8B, tp=1 on H100 SXM,
  ShareGPT, 5000 prompts at infinite rate, max-num-seqs 256,
  max-seq-len 2048, chunked prefill off: 8088 output tok/s, median TPOT
  25.6 ms; Llama 3.1 70B, tp=4 on H100 SXM, same settings: 3543 output
  tok/s, median TPOT 61.1 ms.
* J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100"
  (johnmusgrave.com, vLLM 0.23, Llama-3.1-8B-Instruct BF16, A100 40GB,
  1024-token prompts, 128 output tokens): one request decodes at about
  75 tok/s.

The L40S and L4 profiles have no vLLM measurement of their own here: they
reuse the efficiencies fitted on A100/H100 (same kernels, same software),
which the docstring of each says. Start-up times follow the "1-4 minutes per
pod" that production GPU deployments report (``vllm-startup-errors.md``);
the split between phases is an engineering estimate, stated per profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_autotuner.knobs.defaults import Hardware

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model, as its datasheet and ``torch.cuda`` describe it."""

    name: str
    peak_bf16_flops: float
    """Dense BF16 tensor-core FLOP/s (no sparsity)."""
    hbm_bandwidth: float
    """Memory bandwidth, bytes/s."""
    memory_bytes: int
    """Total memory as ``torch.cuda.mem_get_info`` reports it (less than the
    marketing capacity: ECC and the driver's reservation are gone)."""
    link_bandwidth: float
    """Per-direction bytes/s available to an all-reduce between GPUs of one
    replica (NVLink, or PCIe where there is none)."""
    allreduce_latency_s: float
    """Fixed cost of one small all-reduce (custom all-reduce kernel)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape (from its ``config.json``)."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    max_position_embeddings: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (embedding and LM head included)."""
        return self.params * self.dtype_bytes

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def body_params(self) -> int:
        """Parameters every token passes through: all but the input
        embedding (a lookup) and the LM head (run only for sampled tokens)."""
        return self.params - 2 * self.lm_head_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How close vLLM's kernels get to the roofline, and its fixed costs."""

    gemm: float
    """Fraction of peak FLOP/s reached by the linear layers at large batch."""
    attention: float
    """Fraction of peak FLOP/s reached by prefill attention."""
    memory: float
    """Fraction of HBM bandwidth reached reading weights and the KV cache."""
    step_overhead_s: float
    """Fixed cost of one engine step (scheduling, input preparation, kernel
    launch / CUDA-graph replay)."""
    per_seq_overhead_s: float
    """Cost per scheduled request per step (sampling, output processing)."""
    tp_slowdown: float = 1.0
    """Multiplier on compute and memory time when the model is sharded:
    narrower GEMMs and the synchronisation each layer does run below the
    single-GPU efficiency."""


@dataclass(frozen=True, slots=True)
class StartupTimes:
    """Seconds each start-up phase of one vLLM pod takes."""

    process_s: float
    """Container start, Python imports, API server and engine-core spawn;
    also when a flag-validation error is raised."""
    load_s: float
    """Reading the weights onto the GPUs."""
    compile_cold_s: float
    """``torch.compile`` without a usable cache (first start, or a new
    ``--max-num-batched-tokens``, which changes the compiled graph)."""
    compile_warm_s: float
    """``torch.compile`` loading its artefacts from the cache."""
    profile_s: float
    """The memory-profiling forward pass and KV-cache allocation."""
    graph_capture_s: float
    """CUDA-graph capture of the decode batch sizes."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One vLLM replica: a model on ``tp`` GPUs of one kind."""

    name: str
    gpu: GpuSpec
    model: ModelSpec
    tp: int
    efficiency: Efficiency
    startup: StartupTimes
    served_model_name: str
    non_torch_bytes: int
    """Per-GPU memory outside PyTorch's allocator: CUDA context, NCCL and
    attention workspaces."""
    cudagraph_bytes: int
    """Per-GPU memory the captured CUDA graphs keep (vLLM profiles it)."""
    activation_bytes_per_token: float
    """Peak activation memory of the profiling forward pass, per batched
    token and GPU: the MLP's gate/up projection output dominates."""
    sampler_bytes_per_seq: float
    """Memory the profiling run's dummy sampler uses per ``max_num_seqs``
    (float32 logits and their sampling temporaries)."""
    speed_variation: float = 0.02
    """Standard deviation of one replica's speed around the profile's (GPU
    clocks, thermals): each seeded engine draws its own factor."""
    step_jitter: float = 0.02
    """Standard deviation of step-to-step time noise (host scheduling)."""
    notes: str = field(default="", compare=False)

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.weight_bytes / self.tp

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """KV heads are split across tensor-parallel ranks."""
        return self.model.kv_bytes_per_token / self.tp

    @property
    def hardware(self) -> Hardware:
        """The replica's GPUs as the operator describes hardware (what vLLM's
        default knobs depend on)."""
        return Hardware(gpus=self.tp, memory_gib=self.gpu.memory_bytes / GiB, product=self.gpu.name)


H100_SXM = GpuSpec(
    name="NVIDIA H100 80GB HBM3",
    peak_bf16_flops=989e12,
    hbm_bandwidth=3.35e12,
    memory_bytes=int(79.19 * GiB),
    link_bandwidth=450e9,
    allreduce_latency_s=8e-6,
)
A100_80GB = GpuSpec(
    name="NVIDIA A100-SXM4-80GB",
    peak_bf16_flops=312e12,
    hbm_bandwidth=2.039e12,
    memory_bytes=int(79.19 * GiB),
    link_bandwidth=300e9,
    allreduce_latency_s=10e-6,
)
A100_40GB = GpuSpec(
    name="NVIDIA A100-SXM4-40GB",
    peak_bf16_flops=312e12,
    hbm_bandwidth=1.555e12,
    memory_bytes=int(39.39 * GiB),
    link_bandwidth=300e9,
    allreduce_latency_s=10e-6,
)
L40S = GpuSpec(
    name="NVIDIA L40S",
    peak_bf16_flops=362e12,
    hbm_bandwidth=864e9,
    memory_bytes=int(44.99 * GiB),
    link_bandwidth=25e9,
    allreduce_latency_s=25e-6,
)
L4 = GpuSpec(
    name="NVIDIA L4",
    peak_bf16_flops=121e12,
    hbm_bandwidth=300e9,
    memory_bytes=int(22.49 * GiB),
    link_bandwidth=25e9,
    allreduce_latency_s=25e-6,
)

LLAMA3_8B = ModelSpec(
    name="meta-llama/Meta-Llama-3-8B-Instruct",
    params=8_030_261_248,
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=128_256,
    intermediate=14_336,
    max_position_embeddings=8192,
)
LLAMA3_70B = ModelSpec(
    name="meta-llama/Meta-Llama-3-70B-Instruct",
    params=70_553_706_496,
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    head_dim=128,
    vocab=128_256,
    intermediate=28_672,
    max_position_embeddings=8192,
)


def _activation_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """Peak live activations of one token in the profiling forward pass:
    the residual stream and a normalised copy (2 x hidden), the MLP's fused
    gate/up output (2 x intermediate / tp) and the activated half
    (intermediate / tp), in the model dtype, plus a third for the caching
    allocator's fragmentation."""
    live = 2 * model.hidden + 3 * model.intermediate / tp
    return live * model.dtype_bytes * 4 / 3


def _sampler_bytes_per_seq(model: ModelSpec) -> float:
    """float32 logits of one sequence and two same-sized temporaries of the
    sampler (softmax, top-k/top-p masks)."""
    return 3 * model.vocab * 4


# Fitted on the Lambda H100 / A100 measurements and the A100-40GB sweep.
_EFF_SINGLE_GPU = Efficiency(
    gemm=0.62,
    attention=0.45,
    memory=0.80,
    step_overhead_s=0.6e-3,
    per_seq_overhead_s=30e-6,
)
# Fitted on the 70B tp=4 H100 measurement.
_EFF_TP4 = Efficiency(
    gemm=0.62,
    attention=0.45,
    memory=0.80,
    step_overhead_s=1.0e-3,
    per_seq_overhead_s=20e-6,
    tp_slowdown=1.45,
)


def _replica(
    name: str,
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int,
    efficiency: Efficiency,
    startup: StartupTimes,
    *,
    non_torch_gib: float,
    cudagraph_gib: float,
    notes: str,
) -> Profile:
    return Profile(
        name=name,
        gpu=gpu,
        model=model,
        tp=tp,
        efficiency=efficiency,
        startup=startup,
        served_model_name=model.name,
        non_torch_bytes=int(non_torch_gib * GiB),
        cudagraph_bytes=int(cudagraph_gib * GiB),
        activation_bytes_per_token=_activation_bytes_per_token(model, tp),
        sampler_bytes_per_seq=_sampler_bytes_per_seq(model),
        notes=notes,
    )


def _llama3_8b(name: str, gpu: GpuSpec, startup: StartupTimes, notes: str) -> Profile:
    return _replica(
        name, gpu, LLAMA3_8B, 1, _EFF_SINGLE_GPU, startup, non_torch_gib=0.6, cudagraph_gib=0.5, notes=notes
    )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _llama3_8b(
            "llama3-8b-h100",
            H100_SXM,
            StartupTimes(process_s=15, load_s=20, compile_cold_s=45, compile_warm_s=10, profile_s=5, graph_capture_s=15),
            "Efficiencies fitted on the Lambda H100 measurements.",
        ),
        _llama3_8b(
            "llama3-8b-a100",
            A100_80GB,
            StartupTimes(process_s=15, load_s=22, compile_cold_s=60, compile_warm_s=12, profile_s=6, graph_capture_s=20),
            "Efficiencies fitted on the Lambda A100-80GB and the A100-40GB sweep.",
        ),
        _llama3_8b(
            "llama3-8b-l40s",
            L40S,
            StartupTimes(process_s=15, load_s=25, compile_cold_s=60, compile_warm_s=12, profile_s=8, graph_capture_s=20),
            "No L40S measurement: A100/H100 efficiencies applied to the L40S datasheet.",
        ),
        _llama3_8b(
            "llama3-8b-l4",
            L4,
            StartupTimes(process_s=15, load_s=30, compile_cold_s=70, compile_warm_s=15, profile_s=10, graph_capture_s=25),
            "Memory-tight: 15 GiB of weights on a 22.5 GiB GPU; budgets much above "
            "16k tokens leave no room for one 8192-token sequence and fail start-up. "
            "No L4 measurement: A100/H100 efficiencies applied to the L4 datasheet.",
        ),
        _replica(
            "llama3-70b-h100-tp4",
            H100_SXM,
            LLAMA3_70B,
            4,
            _EFF_TP4,
            StartupTimes(process_s=25, load_s=60, compile_cold_s=90, compile_warm_s=20, profile_s=10, graph_capture_s=30),
            non_torch_gib=1.5,
            cudagraph_gib=0.8,
            notes="Efficiencies fitted on the Lambda 70B tp=4 H100 measurement.",
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; a KeyError lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
