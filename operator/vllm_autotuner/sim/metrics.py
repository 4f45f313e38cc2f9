"""A Prometheus exporter that serves a simulated engine exactly as vLLM 0.32
serves a real one.

Every ``vllm:`` family of ``vllm-metrics.txt`` (a scrape of a real server) is
here with the same name, type, HELP text, label names and histogram bucket
bounds, including the ``_created`` gauges prometheus-client adds, so the
operator's queries and the Prometheus recording rules written against a real
vLLM work unchanged. Families that exist in vLLM but describe features the
simulator does not have (multi-modal cache, KV transfer between instances,
finish reasons other than ``length``) are served with vLLM's labels and the
values an idle feature has (zero), because a real server exports them that
way too. Queue-limit rejections and the sleep state are what the API server
gives (``rejections``, ``sleep_state``: ``sim.serving``), zero and awake
elsewhere. With ``--enable-lora`` (an engine with ``max_loras``), vLLM's
``vllm:lora_requests_info`` too, which the real scrape (no LoRA) lacks: its
name, HELP and labels are those of vLLM's logger.

``old_names=True`` serves an older vLLM (0.8-0.9): the KV usage gauge as
``vllm:gpu_cache_usage_perc`` and the per-token latency histogram as
``vllm:time_per_output_token_seconds``, instead of today's names, and no
``vllm:num_requests_waiting_by_reason``, so the operator's fallback queries
can be tested against both generations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from vllm_autotuner.sim.metricstate import HistogramSnapshot, MetricsSnapshot

if TYPE_CHECKING:
    from vllm_autotuner.sim.engine import Engine

BASE_LABELS = ("model_name", "engine")

# (counter name without _total, HELP, snapshot counter feeding it)
_COUNTERS = (
    (
        "vllm:estimated_flops_per_gpu",
        "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
        "estimated_flops_per_gpu",
    ),
    (
        "vllm:estimated_read_bytes_per_gpu",
        "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
        "estimated_read_bytes_per_gpu",
    ),
    (
        "vllm:estimated_write_bytes_per_gpu",
        "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
        "estimated_write_bytes_per_gpu",
    ),
)
_CACHE_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
    (
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, "
        "in terms of number of queried tokens.",
        None,
    ),
    (
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
        None,
    ),
    ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", None),
    ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", None),
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
)
_HISTOGRAM_HELP = {
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "vllm:request_params_n": "Histogram of the n request parameter.",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "vllm:request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "vllm:request_prefill_kv_computed_tokens": (
        "Histogram of new KV tokens computed during prefill (excluding cached tokens)."
    ),
}
# Families renamed since vLLM 0.9: today's name -> (old name, old HELP).
OLD_NAMES = {
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
    "vllm:inter_token_latency_seconds": (
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
    ),
}
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def finished_by_reason(counters: Mapping[str, float]) -> dict[str, float]:
    """``vllm:request_success`` by ``finished_reason``: every request the engine finished under ``length`` (it ends
    one only at its output length), none under the others. A request whose client went away (or gave up waiting for
    a first token) is aborted unrecorded, under ``abort`` too: vLLM V1's output processor drops an aborted request's
    state without its finished-request stats; only an abort the engine itself reports is counted there."""
    return {reason: counters["request_success"] if reason == "length" else 0.0 for reason in FINISHED_REASONS}


# vLLM's CacheConfig.metrics_info() labels that do not depend on the engine.
_CACHE_CONFIG_STATIC = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a vLLM server states about itself in its metrics."""

    model_name: str
    engine: str
    """The engine index label (``"0"`` without data parallelism)."""
    created: float
    """Unix time the server's metrics were created (the ``_created`` gauges)."""
    block_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    num_gpu_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    max_loras: int | None = None
    """``--max-loras`` with ``--enable-lora`` (``vllm:lora_requests_info``'s ``max_lora``); None without LoRA."""

    def cache_config_labels(self) -> dict[str, str]:
        """``vllm:cache_config_info``'s labels, with this engine's values."""
        tokens = self.num_gpu_blocks * self.block_size
        return {
            **_CACHE_CONFIG_STATIC,
            "block_size": str(self.block_size),
            "effective_attention_block_size": str(self.block_size),
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "engine": self.engine,
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(tokens / self.max_model_len),
            "kv_cache_memory_bytes": str(self.kv_cache_bytes),
            "kv_cache_size_tokens": str(tokens),
            "num_gpu_blocks": str(self.num_gpu_blocks),
        }


REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
"""The ``reason`` label values of ``vllm:admission_rejections_total``: the limit that refused a request."""


class VllmCollector(Collector):
    """Serves ``source()``'s snapshot as vLLM's ``/metrics``.

    ``source`` is called at every scrape; the snapshot carries counters and
    histograms since the engine started and the gauges of now. ``rejections``
    counts the requests the API server refused at admission, by
    ``REJECTION_REASONS`` (none counted where it is not given);
    ``sleep_state()`` gives ``vllm:engine_sleep_state`` by its ``sleep_state`` label (awake where not given).
    """

    def __init__(self, source: Callable[[], MetricsSnapshot], info: ServerInfo, *, old_names: bool = False,
                 rejections: Mapping[str, int] | None = None,
                 sleep_state: Callable[[], Mapping[str, int]] | None = None) -> None:
        self._source = source
        self._info = info
        self._old_names = old_names
        self._rejections = rejections
        self._sleep_state = sleep_state
        self._lora_series: dict[tuple[str, str], float] = {}
        """Unix time each (running, waiting) adapter combination was last seen, for ``vllm:lora_requests_info``."""

    def describe(self) -> list[Metric]:
        """Nothing: registering must not call ``source`` before the engine runs."""
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        sleep = self._sleep_state() if self._sleep_state else {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        counters, gauges = snap.counters, snap.gauges
        for name, help_text, key in _COUNTERS:
            yield self._counter(name, help_text, counters[key])
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          gauges.num_requests_running)  # fmt: skip
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          gauges.num_requests_waiting)  # fmt: skip
        if not self._old_names:  # vLLM counts waiting requests by reason since spring 2026 (vllm-project/vllm#38435)
            yield self._labelled_gauge(
                "vllm:num_requests_waiting_by_reason",
                "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
                "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
                "Sum of all reasons equals vllm:num_requests_waiting.",
                "reason",
                {"capacity": gauges.num_requests_waiting - gauges.num_requests_deferred,
                 "deferred": gauges.num_requests_deferred},
            )
        yield self._labelled_gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state",
            sleep,
        )
        yield self._gauge(
            *self._name("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
            gauges.kv_cache_usage_perc,
        )
        for name, help_text, key in _CACHE_COUNTERS:
            yield self._counter(name, help_text, counters[key] if key else 0.0)
        prompt, cached = counters["prompt_tokens"], counters["prompt_tokens_cached"]
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)
        yield self._labelled_counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            {"local_compute": prompt - cached, "local_cache_hit": cached, "external_kv_transfer": 0},
        )
        yield self._counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", cached)
        yield self._labelled_counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded "
            "to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source",
            {"device": cached, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": 0},
        )
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            counters["generation_tokens"])  # fmt: skip
        yield self._labelled_counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            finished_by_reason(counters),
        )
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in REJECTION_REASONS:
            refused = (self._rejections or {}).get(reason, 0)
            rejections.add_metric([self._info.model_name, reason], float(refused), created=self._info.created)
        yield rejections
        for name, help_text in _HISTOGRAM_HELP.items():
            yield self._histogram(*self._name(name, help_text), snap.histograms[name])
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._info.cache_config_labels()),
        )
        info.add_metric(list(self._info.cache_config_labels().values()), 1.0)
        yield info
        if self._info.max_loras is not None:
            yield self._lora_info(snap)

    def _lora_info(self, snap: MetricsSnapshot) -> GaugeMetricFamily:
        """``vllm:lora_requests_info``, served with ``--enable-lora``: the adapters running and waiting, each list
        joined by commas, in labels, and the time it was set as the value. vLLM sets the series of the labels of
        each moment to the time and never removes one, so a scrape carries every combination seen since start,
        and a reader (the Gateway API inference extension's endpoint picker, for LoRA affinity) takes the one of
        the latest time. Here a combination is seen when a scrape finds it, not at every step."""
        gauges = snap.gauges
        now = (",".join(gauges.running_lora_adapters), ",".join(gauges.waiting_lora_adapters))
        self._lora_series[now] = self._info.created + snap.time
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        for (running, waiting), at in self._lora_series.items():
            family.add_metric([str(self._info.max_loras), running, waiting], at)
        return family

    # ---------------------------------------------------------------- helpers

    def _name(self, name: str, help_text: str) -> tuple[str, str]:
        """The family's name and HELP in the vLLM generation being served."""
        if self._old_names and name in OLD_NAMES:
            return OLD_NAMES[name]
        return name, help_text

    def _base(self) -> list[str]:
        return [self._info.model_name, self._info.engine]

    def _gauge(self, name: str, help_text: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, help_text, labels=list(BASE_LABELS))
        family.add_metric(self._base(), float(value))
        return family

    def _labelled_gauge(self, name: str, help_text: str, label: str, values: dict[str, float]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, help_text, labels=[*BASE_LABELS, label])
        for value_label, value in values.items():
            family.add_metric([*self._base(), value_label], float(value))
        return family

    def _counter(self, name: str, help_text: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, help_text, labels=list(BASE_LABELS))
        family.add_metric(self._base(), float(value), created=self._info.created)
        return family

    def _labelled_counter(
        self, name: str, help_text: str, label: str, values: dict[str, float]
    ) -> CounterMetricFamily:
        family = CounterMetricFamily(name, help_text, labels=[*BASE_LABELS, label])
        for value_label, value in values.items():
            family.add_metric([*self._base(), value_label], float(value), created=self._info.created)
        return family

    def _histogram(self, name: str, help_text: str, hist: HistogramSnapshot) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, help_text, labels=list(BASE_LABELS))
        buckets = [(floatToGoString(bound), count) for bound, count in zip(hist.bounds, hist.cumulative, strict=True)]
        family.add_metric(self._base(), buckets, hist.sum)
        # HistogramMetricFamily has no `created`; prometheus-client serves
        # this sample as its own `<name>_created` gauge, as vLLM's do.
        family.samples.append(Sample(f"{name}_created", dict(zip(BASE_LABELS, self._base())), self._info.created))
        return family


def server_info(engine: Engine, created: float, engine_index: str = "0") -> ServerInfo:
    """The :class:`ServerInfo` of a simulated engine started at unix time
    ``created``."""
    cfg = engine.config
    return ServerInfo(
        model_name=engine.profile.served_model_name,
        engine=engine_index,
        created=created,
        block_size=cfg.block_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enable_prefix_caching=cfg.enable_prefix_caching,
        num_gpu_blocks=engine.num_gpu_blocks,
        kv_cache_bytes=int(engine.num_gpu_blocks * engine.memory.page_bytes),
        max_model_len=cfg.max_model_len,
        max_loras=cfg.max_loras,
    )
