"""vllm-autotuner: keeps vLLM's batching knobs tuned to live traffic.

The package is split the way the data flows (see the project README):
``api`` (the VllmTuning resource), ``observe`` (Prometheus -> Observation),
``policy`` (the pure decision core), ``rollout`` (Deployment patching),
``controller`` (kopf glue) and ``sim`` (the simulated vLLM fleet used by
tests, benchmarks and the demo).
"""

__version__ = "0.1.0"
#: The field manager the operator writes as. The apiserver records a write's manager as its User-Agent's product
#: (the part before the first ``/``), so ``kubectl get deployment --show-managed-fields`` names the operator as the
#: owner of the vLLM container's args it set, and a GitOps tool can be told to trust what it sets (Argo CD:
#: ``ignoreDifferences[].managedFieldsManagers``). The Python client's own User-Agent would record every Python
#: client alike, as ``OpenAPI-Generator``.
FIELD_MANAGER = "vllm-autotuner"
USER_AGENT = f"{FIELD_MANAGER}/{__version__}"
