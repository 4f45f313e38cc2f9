"""The simulated vLLM world: engine, workloads, metrics and a GPU fleet.

Nothing here is used by the operator at run time. It exists so that the
decision core can be benchmarked, the operator tested end to end and the demo
run on a machine without GPUs, against behaviour that matches a real vLLM
server (``vllm-metrics.txt``, ``vllm-startup-errors.md``). Only this package
and ``bench/`` may import numpy.

Modules, and what a benchmark uses from each:

``profiles``
    ``PROFILES`` / ``get_profile(name)``: GPU + model replicas
    (``llama3-8b-h100``, ``llama3-8b-a100``, ``llama3-8b-l40s``,
    ``llama3-8b-l4`` (memory-tight), ``llama3-70b-h100-tp4``), with the
    public figures their efficiencies were fitted on.
``startup``
    ``EngineConfig`` (vLLM's flags; ``None`` = absent), ``check_startup(profile,
    config, compile_cached=, time_scale=) -> StartupOutcome`` (ok, vLLM's
    error text, seconds to ready or to the crash, the memory plan),
    ``default_knobs(profile)``.
``engine``
    ``Engine(profile, config, seed)`` (raises ``StartupError``),
    ``submit(Request) -> rid``, ``advance(until) -> list[FinishedRequest]``,
    ``snapshot() -> MetricsSnapshot``, ``unfinished()``.
``metricstate``
    ``MetricsSnapshot`` (``later - earlier`` = a window's increase),
    ``HistogramSnapshot.quantile(q)`` (Prometheus-exact, the operator's).
``workload``
    Arrival processes, length mixes and phased ``Scenario`` builders;
    ``Scenario.generate(seed) -> Workload``; ``Workload.requests(start, end)``.
``capacity``
    ``saturation_rate(profile, mix, config)``: requests/s a replica sustains,
    to size scenarios per profile.
``metrics``
    ``VllmCollector(source, server_info(engine, created))``: the engine as a
    prometheus-client collector serving vLLM 0.32's ``/metrics``.

For the local cluster (``vllm-autotuner sim up|down|fleet|load``):

``localenv``
    Starts and stops the control plane, Prometheus and the fleet.
``fleet``
    Simulated GPU nodes and their kubelet (leases, pod watch, scrape targets).
``podrunner``, ``kubelet``, ``podlaunch``
    One pod's life on a fleet node; the kubelet's probe timelines, back-off
    and status shapes; a container's command line as vLLM reads it.
``serving``
    One pod's vLLM HTTP API (OpenAI endpoints, ``/metrics``) over an engine
    in wall-clock time.
``load``
    Workload scenarios sent to a Deployment's Ready pods.
"""
