"""``make demo``: one compressed day of production on the local cluster, tuned against static.

Why it exists: a newcomer's first question is whether the operator is worth
installing, and the honest answer is a measurement. Two identical vLLM
Deployments on simulated H100s get the same requests for a day squeezed
into minutes; one has a VllmTuning, the other keeps vLLM's defaults; the
report compares their SLO goodput from Prometheus.

``plan``
    The compressed day (clock, traffic, nightly window) and the objects it
    creates; pure.
``run``
    ``vllm-autotuner sim demo``: servers, objects, traffic, live view,
    report, shutdown.
``live``
    The live view's lines.
``report``, ``charts``
    SLO goodput from Prometheus range queries, report.md / report.json, and
    the PNG charts.
"""
