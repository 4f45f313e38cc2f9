"""The stand-in fleet's fast /metrics text is the simulator's vLLM exporter's, to the byte."""

from __future__ import annotations

from bench.scale.fleet import Exposition, exported
from bench.scale.traffic import Traffic, served_info, steady_state
from vllm_autotuner.sim.engine import EngineConfig


def test_rendering_at_any_age_is_what_the_exporter_serves():
    state = steady_state(Traffic("chat", 18.0), EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128),
                         "llama3-8b-h100")
    info = served_info(state, "meta-llama/Meta-Llama-3-8B-Instruct", started=1_700_000_000.0)
    exposition = Exposition(state, info)
    for age in (0.5, 15.0, 3600.25, 86_400.0):
        assert exposition.render(age).decode() == exported(state, info, age), age
