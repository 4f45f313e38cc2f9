"""vllm-autotuner: keeps vLLM's batching knobs tuned to live traffic.

The package is split the way the data flows (see the project README):
``api`` (the VllmTuning resource), ``observe`` (Prometheus -> Observation),
``policy`` (the pure decision core), ``rollout`` (Deployment patching),
``controller`` (kopf glue) and ``sim`` (the simulated vLLM fleet used by
tests, benchmarks and the demo).
"""

__version__ = "0.1.0"
