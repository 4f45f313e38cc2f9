"""The simulated vLLM world: engine, workloads, metrics and a GPU fleet.

Nothing here is used by the operator at run time. It exists so that the
decision core can be benchmarked, the operator tested end to end and the demo
run on a machine without GPUs, against behaviour that matches a real vLLM
server (``vllm-metrics.txt``, ``vllm-startup-errors.md``).
"""
