"""The tuning-quality benchmark: does the decision core find better knobs than vLLM's defaults and a static tuning?

An in-process loop runs the real ``decide`` against simulated vLLM replicas
(the simulator's engine) in simulated time: ``fleet`` (replicas, rolling
restarts, what Prometheus holds of a window), ``observe`` (the Observation
the operator builds from it), ``runner`` (a static config or the adaptive
loop, every request scored against the SLO in force), ``hindsight``
(phase_oracle's configs reached from vLLM's defaults by rolling restarts:
what foresight gets from where a policy starts), ``scenarios`` (traffic,
fleet size and spec per profile) and ``report`` (best_static and
phase_oracle from the grid, targets, JSON, Markdown and timelines).
``python -m bench.tuning`` runs it; ``make bench-tuning``. ``calibration``
checks the predictions the adaptive policy prices candidates with against
the simulator, in a minute (``python -m bench.tuning.calibration``; ``make
bench-calibration``).
"""
