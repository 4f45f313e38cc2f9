"""The operator's scale benchmark (issue 6, item 8): N VllmTunings on one replica, batched vs naive queries.

The operator evaluates every tuning each interval, so its cost grows with
the number of tunings; the question is how. Batched (the default), the
tunings that share a Prometheus send one query per metric family between
them (:mod:`vllm_autotuner.observe.service`); ``--naive-queries`` is the
obvious design, every tuning asking for its own pods. Both modes run here
as the real ``vllm-autotuner run`` process against a real API server and a
real Prometheus holding the series of as many vLLM pods as there are
tunings, and each evaluation period is measured from outside: its wall
time, PromQL queries, Kubernetes API calls and the time they took, the
operator's CPU seconds and resident memory, and Prometheus's CPU seconds.

The pods are not simulated engines (too heavy by the thousand on a small
machine) but pods that replay a simulated engine's steady state
(:mod:`bench.scale.traffic`, :mod:`bench.scale.fleet`), with traffic chosen
so that some tunings really change their Deployment during the run
(:mod:`bench.scale.cluster`). The measurement is :mod:`bench.scale.measure`,
the tables :mod:`bench.scale.report`, the run ``python -m bench.scale``.

The targets: 1000 tunings on one replica at a 30 s evaluation interval, a
query count independent of the number of tunings, and less than 300 MiB
of resident memory.
"""
