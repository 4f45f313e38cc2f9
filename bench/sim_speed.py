"""How much faster than real time the engine simulator runs.

For each profile: measure its chat capacity (``saturation_rate``), then
simulate one hour of chat traffic at 50 %, 90 % ("fully loaded") and 150 %
(overload) of it with vLLM's default knobs, and time ``submit`` + ``advance``
(what the tuning benchmark's inner loop does) on this machine's one core.
The real-time factor is simulated seconds per wall second; the issue asks
for >= 1000x for a fully loaded H100 replica.

    make bench-sim                     # every profile, 1 simulated hour each
    python bench/sim_speed.py --hours 0.25 --profiles llama3-8b-h100
"""

from __future__ import annotations

import argparse
import time

from vllm_autotuner.sim.capacity import saturation_rate
from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.profiles import PROFILES, get_profile
from vllm_autotuner.sim.workload import CHAT, steady

TARGET = 1000.0
LOADS = (("half", 0.5), ("full", 0.9), ("overload", 1.5))


def measure(profile_name: str, rate: float, hours: float, seed: int = 0) -> dict[str, float]:
    """Simulate ``hours`` of chat at ``rate``; returns timings and counts."""
    profile = get_profile(profile_name)
    requests = list(steady(rate, CHAT, hours=hours).generate(seed).requests())
    engine = Engine(profile, EngineConfig(), seed=seed)
    horizon = hours * 3600
    start = time.perf_counter()
    for request in requests:
        engine.submit(request)
    finished = 0
    t = 0.0
    while t < horizon:  # advance in 15 s windows, like a scrape loop
        t = min(t + 15.0, horizon)
        finished += len(engine.advance(t))
    wall = time.perf_counter() - start
    snap = engine.snapshot()
    return {
        "wall": wall,
        "rtf": horizon / wall,
        "requests": len(requests),
        "finished": finished,
        "steps": snap.histograms["vllm:iteration_tokens_total"].count,
        "running": snap.gauges.num_requests_running,
        "kv": snap.gauges.kv_cache_usage_perc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours per run")
    parser.add_argument("--profiles", nargs="*", default=sorted(PROFILES))
    args = parser.parse_args()
    print(f"{'profile':22} {'load':8} {'req/s':>6} {'requests':>9} {'steps':>9} {'running':>7} {'kv':>5} "
          f"{'wall s':>7} {'x real time':>11}")  # fmt: skip
    headline = None
    for name in args.profiles:
        capacity = saturation_rate(get_profile(name), CHAT)
        for load, fraction in LOADS:
            r = measure(name, capacity * fraction, args.hours)
            print(f"{name:22} {load:8} {capacity * fraction:6.1f} {r['requests']:9.0f} {r['steps']:9.0f} "
                  f"{r['running']:7.0f} {r['kv']:5.2f} {r['wall']:7.2f} {r['rtf']:11.0f}")  # fmt: skip
            if name == "llama3-8b-h100" and load == "full":
                headline = r["rtf"]
    if headline is not None:
        print(f"\nfully loaded llama3-8b-h100: {headline:.0f}x real time = {headline / TARGET:.1f}x the "
              f"{TARGET:.0f}x target (1 simulated hour in {3600 / headline:.2f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
