"""How many requests per second a simulated replica sustains.

Scenarios are written as fractions of a replica's capacity, because the same
"busy afternoon" is 4 req/s for a 70B model and 25 req/s for an 8B one. The
capacity is measured, not estimated: a backlog of requests arrives at once and
the completion rate is taken once the engine is in its steady state.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.profiles import Profile
from vllm_autotuner.sim.workload import Mix, steady


def saturation_rate(
    profile: Profile, mix: Mix, config: EngineConfig | None = None, *, requests: int = 4000, seed: int = 0
) -> float:
    """Requests per second ``profile`` completes under a backlog of ``mix``.

    Counts completions between the 25th and 75th percentile of finish times:
    the ramp-up (an empty batch filling) and the drain (the backlog running
    out) are left out.
    """
    engine = Engine(profile, config or EngineConfig(), seed=seed)
    work = steady(1.0, mix, hours=requests / 3600 * 1.2 + 0.1).generate(seed, engine.config.max_model_len)
    for index in range(min(requests, len(work))):
        engine.submit(replace(work.request(index, 0.0), first_token_timeout=math.inf))
    finish = np.sort([f.finish_time for f in engine.advance(float("inf"))])
    lo, hi = int(len(finish) * 0.25), int(len(finish) * 0.75)
    return (hi - lo) / (finish[hi] - finish[lo])
