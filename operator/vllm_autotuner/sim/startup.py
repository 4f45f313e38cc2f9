"""What happens when a vLLM pod starts: flag validation, the memory check, and
how long it takes.

vLLM validates its scheduler flags before touching the GPU, then loads the
weights, runs one profiling forward pass with ``max_num_batched_tokens``
tokens (and a dummy sampler pass over ``max_num_seqs`` sequences) to measure
peak activation memory, and gives whatever is left of
``gpu_memory_utilization`` x GPU memory to the KV cache. A larger token budget
therefore shrinks the KV cache, and past a point start-up fails. The error
texts here are vLLM 0.32's own, as ``vllm-startup-errors.md`` records them,
because the operator and the end-to-end tests match on them.

The same module gives the start-up delay: process start, weight load,
``torch.compile`` (cold when the pod has never compiled this token budget:
a new budget changes the compiled graph), profiling and CUDA-graph capture.
The fleet scales it down with ``time_scale`` so end-to-end tests run in
minutes; the benchmark keeps the real ratios.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_autotuner.api.spec import Knobs
from vllm_autotuner.knobs import AssumedDefaults, engine_knobs, startup_errors, startup_warnings, vllm_defaults
from vllm_autotuner.sim.profiles import GiB, Profile

SIMULATED_VLLM_VERSION = "0.32.0"
DOCS_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
ENGINE_CORE_FAILED = "RuntimeError: Engine core initialization failed."
SCHEDULER_CONFIG_ERROR = "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig"
MODEL_CONFIG_ERROR = "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM flags the simulator honours, as given on the command line.

    ``None`` means the flag was absent: :meth:`resolve` fills in vLLM's
    default for the profile, exactly as vLLM would.
    """

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    performance_mode: str | None = None
    max_loras: int | None = None
    """LoRA adapters in a batch at once (``--max-loras``, 1 by default with ``--enable-lora``); None: LoRA off.
    The adapters' weights are not in the memory model or the step time: only the scheduling rule is."""
    enable_mfu_metrics: bool = False
    """``--enable-mfu-metrics``: vLLM counts its estimated FLOPs and bytes (``vllm:estimated_*_per_gpu_total``) only
    when asked, and serves them at 0 otherwise (as in the reference scrape)."""

    def resolve(self, profile: Profile) -> ResolvedConfig:
        """The effective values vLLM would run with on ``profile``.

        Absent knobs take the GPU class defaults (:func:`default_knobs`), tied
        to each other and to ``max_model_len`` by the operator's own rule
        (:func:`~vllm_autotuner.knobs.engine_knobs`), so that both read the
        same knobs from the same flags.
        """
        max_model_len = self.max_model_len or profile.model.max_position_embeddings
        tokens, seqs = engine_knobs(self.max_num_batched_tokens, self.max_num_seqs,
                                    default_knobs(profile, self.performance_mode).knobs, max_model_len,
                                    self.enable_chunked_prefill)
        return ResolvedConfig(
            max_num_batched_tokens=tokens,
            max_num_seqs=seqs,
            max_model_len=max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_chunked_prefill=self.enable_chunked_prefill,
            enable_prefix_caching=self.enable_prefix_caching,
            block_size=self.block_size,
            max_loras=self.max_loras,
            enable_mfu_metrics=self.enable_mfu_metrics,
        )


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """An :class:`EngineConfig` with every default filled in."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    block_size: int
    max_loras: int | None = None
    enable_mfu_metrics: bool = False


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-GPU memory budget of the start-up profiling run, in bytes."""

    requested: float
    """``gpu_memory_utilization`` x GPU memory."""
    weights: float
    activations: float
    """Peak of the profiling forward pass and the dummy sampler pass."""
    non_torch: float
    cudagraphs: float
    kv_available: float
    """What is left for the KV cache; may be negative."""
    page_bytes: float
    """One KV block (``block_size`` tokens) over all layers."""
    block_size: int
    num_gpu_blocks: int

    @property
    def kv_tokens(self) -> int:
        """vLLM's "GPU KV cache size: N tokens"."""
        return self.num_gpu_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class StartupOutcome:
    """How a pod with these flags starts: when it is ready, or when and how it
    fails."""

    config: ResolvedConfig
    error: str | None
    """The end of vLLM's log when start-up fails, else ``None``."""
    seconds: float
    """Until ``/health`` answers, or until the process exits with the error."""
    warnings: tuple[str, ...]
    memory: MemoryPlan | None
    """``None`` when flag validation failed before the GPU was touched."""

    @property
    def ok(self) -> bool:
        return self.error is None


class StartupError(Exception):
    """vLLM refused to start; ``str(err)`` is what its log ends with."""


def format_gib(num_bytes: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to two decimals, as Python prints a
    float (``0.0``, ``1.25``)."""
    return str(round(num_bytes / GiB, 2))


def default_knobs(profile: Profile, performance_mode: str | None = None) -> AssumedDefaults:
    """vLLM's knob values when the flags are absent, for this replica's GPUs
    (the operator's own table, for the vLLM version the simulator models)."""
    return vllm_defaults(SIMULATED_VLLM_VERSION, profile.hardware, performance_mode)


def validate_flags(profile: Profile, cfg: ResolvedConfig) -> tuple[str | None, tuple[str, ...]]:
    """vLLM's ``ModelConfig`` and ``SchedulerConfig`` checks.

    Returns the error text (``None`` when the flags are valid) and the
    warnings vLLM logs for valid but odd flags. The knob rules are the
    operator's (:mod:`vllm_autotuner.knobs.feasibility`), so the simulator
    refuses exactly what the operator avoids.
    """
    mpe = profile.model.max_position_embeddings
    if cfg.max_model_len > mpe:
        return (
            f"{MODEL_CONFIG_ERROR}\n  Value error, User-specified max_model_len ({cfg.max_model_len}) is greater "
            f"than the derived max_model_len (max_position_embeddings={float(mpe)} or model_max_length=None "
            "in model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. "
            "If the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len "
            "lead to nan. If the model uses absolute position encoding, positions exceeding "
            "derived_max_model_len will cause a CUDA array out-of-bounds error.",
            (),
        )
    knobs = Knobs(max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs)
    errors = startup_errors(knobs, cfg.max_model_len, cfg.enable_chunked_prefill)
    if errors:
        return f"{SCHEDULER_CONFIG_ERROR}\n  {errors[0]}", ()
    return None, tuple(startup_warnings(knobs, cfg.max_model_len))


def plan_memory(profile: Profile, cfg: ResolvedConfig) -> MemoryPlan:
    """Per-GPU memory split the way vLLM's ``determine_available_memory``
    measures it: the profiling pass runs ``max_num_batched_tokens`` tokens
    and samples ``max_num_seqs`` sequences; the KV cache gets the rest."""
    requested = cfg.gpu_memory_utilization * profile.gpu.memory_bytes
    activations = (
        cfg.max_num_batched_tokens * profile.activation_bytes_per_token
        + cfg.max_num_seqs * profile.sampler_bytes_per_seq
    )
    kv_available = (
        requested - profile.weight_bytes_per_gpu - activations - profile.non_torch_bytes - profile.cudagraph_bytes
    )
    page_bytes = cfg.block_size * profile.kv_bytes_per_token_per_gpu
    return MemoryPlan(
        requested=requested,
        weights=profile.weight_bytes_per_gpu,
        activations=activations,
        non_torch=profile.non_torch_bytes,
        cudagraphs=profile.cudagraph_bytes,
        kv_available=kv_available,
        page_bytes=page_bytes,
        block_size=cfg.block_size,
        num_gpu_blocks=max(0, int(kv_available // page_bytes)),
    )


def memory_error(cfg: ResolvedConfig, plan: MemoryPlan) -> str | None:
    """vLLM's ``_check_enough_kv_cache_memory``: some memory must be left, and
    enough for one request of ``max_model_len`` tokens."""
    if plan.kv_available <= 0:
        return (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            f"when initializing the engine. See {DOCS_URL} for more details.\n{ENGINE_CORE_FAILED}"
        )
    blocks_per_seq = -(-cfg.max_model_len // cfg.block_size)
    needed = blocks_per_seq * plan.page_bytes
    if needed <= plan.kv_available:
        return None
    estimated = min(cfg.max_model_len, int(plan.kv_available // plan.page_bytes) * cfg.block_size)
    estimated_msg = (
        f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated > 0 else ""
    )
    return (
        f"ValueError: To serve at least one request with the model's max seq len ({cfg.max_model_len}), "
        f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({format_gib(plan.kv_available)} GiB). {estimated_msg}Try increasing `gpu_memory_utilization` or "
        f"decreasing `max_model_len` when initializing the engine. See {DOCS_URL} for more details."
        f"\n{ENGINE_CORE_FAILED}"
    )


def check_startup(
    profile: Profile, config: EngineConfig, *, compile_cached: bool = False, time_scale: float = 1.0
) -> StartupOutcome:
    """Start a pod with ``config`` on ``profile``, on paper.

    ``compile_cached`` says whether this pod's node has compiled this token
    budget before (``torch.compile`` then loads its cache). Validation errors
    come after the process start; memory errors after weight load, compile
    and the profiling pass; success after CUDA-graph capture too.
    """
    cfg = config.resolve(profile)
    times = profile.startup
    error, warnings = validate_flags(profile, cfg)
    if error is not None:
        return StartupOutcome(cfg, error, times.process_s * time_scale, warnings, None)
    plan = plan_memory(profile, cfg)
    compile_s = times.compile_warm_s if compile_cached else times.compile_cold_s
    until_profiled = times.process_s + times.load_s + compile_s + times.profile_s
    error = memory_error(cfg, plan)
    if error is not None:
        return StartupOutcome(cfg, error, until_profiled * time_scale, warnings, plan)
    return StartupOutcome(cfg, None, (until_profiled + times.graph_capture_s) * time_scale, warnings, plan)
