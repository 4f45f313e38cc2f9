"""Shared helpers of the simulator tests."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vllm_autotuner.sim.engine import Request
from vllm_autotuner.sim.profiles import Profile, get_profile


def noiseless(name: str) -> Profile:
    """A profile without replica speed variation or step jitter, so step
    times are exactly the roofline's."""
    return dataclasses.replace(get_profile(name), speed_variation=0.0, step_jitter=0.0)


def random_requests(
    n: int,
    rate: float,
    seed: int,
    *,
    prompt: float = 512,
    output: float = 128,
    max_prompt: int = 3000,
    max_output: int = 1000,
    timeout: float = math.inf,
    adapters: int = 0,
) -> list[Request]:
    """Poisson arrivals with log-normal prompt and output lengths, from clients that wait ``timeout`` seconds for
    a first token; with ``adapters``, each names one of that many LoRA adapters or (one in as many plus one) the
    base model."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prompts = np.clip(rng.lognormal(np.log(prompt), 0.8, n), 1, max_prompt).astype(int)
    outputs = np.clip(rng.lognormal(np.log(output), 0.8, n), 1, max_output).astype(int)
    loras = [None if i == adapters else f"adapter-{i}" for i in rng.integers(0, adapters + 1, n)]
    return [Request(float(a), int(p), int(o), first_token_timeout=timeout, lora=lora)
            for a, p, o, lora in zip(arrivals, prompts, outputs, loras, strict=True)]  # fmt: skip
