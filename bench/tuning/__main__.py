"""``python -m bench.tuning [--quick]``: run every policy on every scenario, score them, write the report.

    make bench-tuning            # the full run: every scenario, 24 simulated hours each
    make bench-tuning QUICK=1    # two shortened scenarios on a small grid, in under 3 minutes

Runs go to a process pool (one per core): every grid config of every
scenario as a static run, and the adaptive run; then, once the grid has
picked phase_oracle's configs, the hindsight run (``bench.tuning.hindsight``).
Progress is printed as runs finish. Static and hindsight runs do not depend
on the decision core, so their results are kept in ``.cache/bench-tuning/``,
keyed by the scenario, the config (hindsight: its planned changes) and the
code (comments and docstrings aside) of the simulator, of the benchmark's
fleet and runner (and hindsight's own) and of the rules it scores with (a
request within the ITL target, the SLO in force): a rerun after a policy
change simulates only the adaptive runs (``--no-cache`` to simulate and
keep nothing). Outputs
(``--out``, default ``bench/results``, ``bench/results/quick`` for the quick
run): ``tuning.json``, ``tuning.md`` and one
``tuning-<scenario>-<profile>.png`` timeline per scenario.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import os
import pickle
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from multiprocessing import Pool
from pathlib import Path

from vllm_autotuner.api import Knobs
from vllm_autotuner.api import spec as api_spec
from vllm_autotuner.knobs import defaults, feasibility
from vllm_autotuner.observe import quantile
from vllm_autotuner.policy import schedule
from vllm_autotuner.policy.decide import effective_slo, settings_at
from vllm_autotuner.policy.model import slow_gaps_allowed
from vllm_autotuner.sim import capacity, engine, metricstate, profiles, startup, workload
from vllm_autotuner.sim.profiles import get_profile

from bench.tuning import fleet, hindsight, report, runner, scenarios
from bench.tuning.runner import RunResult, default_config, run_adaptive, run_static
from bench.tuning.scenarios import BenchScenario

GRID_TOKENS = (256, 512, 1024, 2048, 4096, 8192)
GRID_SEQS = (1 / 4, 1)
"""Fractions of vLLM's default max_num_seqs: 256 and 1024 on an H100, 64 and 256 on an A100 or L4. (A sixteenth
was dropped after a first run: it starved every chat scenario of slots, and won nowhere.)"""
QUICK_TOKENS = (256, 2048)
"""The quick run's budgets: vLLM's default on an A100 or L4, and the one that wins both quick scenarios on the
full grid's budgets (shift: 256/256 served 96.6% of requests, 512/256 85.7%, 1024, 2048 and 8192 at most 0.5%;
L4: 256/64 99.6%, 512/64 99.3%, 1024/64 90.0%). On two cores, uncached, budgets (512, 1024, 2048, 8192) took
212 s and (256, 512, 2048) 193 s: the run must stay under 3 minutes, and small budgets are the slowest to simulate
(more steps)."""
QUICK_SEQS = (1 / 4, 1)


def grid(scenario: BenchScenario, tokens: Sequence[int], seqs: Sequence[float]) -> list[Knobs]:
    """The static configs searched for best_static and phase_oracle: token budgets times fractions of vLLM's
    default max_num_seqs for the GPU (1024 on an H100, 256 on an A100 or L4), the defaults included."""
    default = default_config(scenario)
    counts = [max(1, int(default.max_num_seqs * f)) for f in seqs]
    configs = {Knobs(max_num_batched_tokens=t, max_num_seqs=s) for t in tokens for s in counts if s <= t}
    configs.add(default)
    return sorted(configs, key=lambda k: (k.max_num_batched_tokens, k.max_num_seqs))


CACHE = Path(".cache/bench-tuning")
#: The code a static run executes: the simulator's engine and what it is built from, vLLM's defaults and start-up
#: rules, the benchmark's fleet and runner (the scenario itself, traffic and spec, is in the key by value), and the
#: decision core's rules the runner scores with: a request within the ITL target, and the SLO in force at each minute
#: (a schedule window's over the spec's). The rest of the decision core is not in the key, nor is
#: ``bench.tuning.observe``: a static run builds no Observation (``test_bench_tuning`` traces a run to check this).
_SOURCES = (engine, metricstate, profiles, startup, workload, capacity, defaults, feasibility, api_spec, quantile,
            fleet, runner, schedule)
_SCORING = (slow_gaps_allowed, settings_at, effective_slo)


def _code(source: str) -> bytes:
    """What ``source`` runs: its syntax tree without comments and docstrings (string statements, which run as
    nothing), so that a change of wording does not throw away hours of simulation."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                 and isinstance(s.value.value, str))]
    return ast.dump(tree).encode()


def _cache_key(scenario: BenchScenario, plan: Knobs | list[tuple[float, Knobs]]) -> str:
    """What a static run (``plan``: its config) or a hindsight run (``plan``: its changes) depends on: the scenario,
    the plan, and the code that simulates it."""
    digest = hashlib.sha256(repr((scenario, plan)).encode())
    for module in (*_SOURCES, *(() if isinstance(plan, Knobs) else (hindsight,))):
        digest.update(_code(Path(module.__file__).read_text()))
    for function in _SCORING:
        digest.update(_code(textwrap.dedent(inspect.getsource(function))))
    return digest.hexdigest()[:32]


Plan = Knobs | list[tuple[float, Knobs]] | None
"""What one run is: a static config, hindsight's changes (``hindsight.plan``), or None for the adaptive run."""


def _simulate(scenario: BenchScenario, plan: Plan) -> RunResult:
    if plan is None:
        return run_adaptive(scenario)
    if isinstance(plan, Knobs):
        return run_static(scenario, plan)
    return hindsight.run_hindsight(scenario, plan)


def _work(task: tuple[int, BenchScenario, Plan, bool]) -> tuple[int, RunResult, float, bool]:
    """One run, from the cache where it is a static or hindsight run already simulated by the same code."""
    index, scenario, plan, use_cache = task
    start = time.perf_counter()
    if plan is None or not use_cache:
        return index, _simulate(scenario, plan), time.perf_counter() - start, False
    path = CACHE / f"{_cache_key(scenario, plan)}.pickle"
    if path.exists():
        return index, pickle.loads(path.read_bytes()), time.perf_counter() - start, True
    result = _simulate(scenario, plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(result))
    return index, result, time.perf_counter() - start, False


def _describe(result: RunResult) -> str:
    if not result.started:
        return "does not start on this GPU"
    total = report._total(result.phases)
    text = f"attainment {total.met / total.requests:.3f}" if total.requests else "no requests"
    if total.timed_out:
        text += f", {total.timed_out} timed out"
    if result.policy != "static":
        text += f", {result.rollouts} rollouts ({result.failed_rollouts} failed)"
    return text


def run(
    chosen: list[BenchScenario],
    tokens: Sequence[int],
    seqs: Sequence[float],
    jobs: int,
    out: Path,
    command: str,
    use_cache: bool = True,
) -> dict:
    """Run, score and write everything; returns the JSON document."""
    started = time.perf_counter()
    tasks: list[tuple[int, BenchScenario, Plan, bool]] = []
    for i, scenario in enumerate(chosen):
        tasks.append((i, scenario, None, use_cache))
        tasks.extend((i, scenario, knobs, use_cache) for knobs in grid(scenario, tokens, seqs))
    total = len(tasks) + len(chosen)
    print(f"{total} runs over {len(chosen)} scenarios on {jobs} processes (hindsight after the grid)", flush=True)
    results: dict[int, list[RunResult]] = {i: [] for i in range(len(chosen))}
    with Pool(jobs) as pool:

        def finished() -> Iterator[tuple[int, RunResult, float, bool]]:
            yield from pool.imap_unordered(_work, tasks)
            # every grid run is in ``results`` now: hindsight follows phase_oracle's choices
            plans = []
            for i, scenario in enumerate(chosen):
                best = report.phase_best(scenario, [r for r in results[i] if r.policy == "static"])
                changes = hindsight.plan(scenario, {name: r.knobs for name, r in best.items()})
                plans.append((i, scenario, changes, use_cache))
            yield from pool.imap_unordered(_work, plans)

        for done, (i, result, wall, cached) in enumerate(finished(), 1):
            results[i].append(result)
            what = str(result.knobs) if result.policy == "static" else result.policy
            took = "cached" if cached else f"{wall:.0f}s"
            print(f"[{done}/{total}] {chosen[i].key} {what}: {_describe(result)} ({took})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, scenario in enumerate(chosen):
        adaptive = next(r for r in results[i] if r.policy == "adaptive")
        foresight = next(r for r in results[i] if r.policy == "hindsight")
        static = [r for r in results[i] if r.policy == "static"]
        default = next(r for r in static if r.knobs == default_config(scenario))
        hours = report.gpu_hours(scenario, get_profile(scenario.profile).tp)
        scores = report.score_scenario(scenario, default, static, foresight, adaptive, hours)
        rows.append((scenario, scores, adaptive))
        best = next(r for r in static if str(r.knobs) == scores["best_static"].config)
        runs = {"vllm_default": default, "best_static": best, "hindsight": foresight, "adaptive": adaptive}
        report.plot(out / f"tuning-{scenario.name}-{scenario.profile}.png", scenario, runs)
    document = report.write_json(out / "tuning.json", rows, command)
    report.write_markdown(out / "tuning.md", rows, command, time.perf_counter() - started)
    for target in report.targets(rows):
        reach = f" (in its place phase_oracle {target.oracle}, hindsight {target.hindsight})" if target.oracle else ""
        print(f"{'met ' if target.met else 'MISS'}  {target.text}: {target.value}{reach}")
    print(f"wrote {out}/tuning.json, tuning.md and {len(rows)} timelines in {time.perf_counter() - started:.0f}s")
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tuning", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two shortened scenarios on a small grid (< 3 min)")
    parser.add_argument("--only", default="", help="only scenarios whose name/profile contains this text")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--no-cache", action="store_true", help="simulate static runs even when cached")
    args = parser.parse_args(argv)
    chosen = scenarios.quick() if args.quick else scenarios.full()
    chosen = [s for s in chosen if args.only in s.key]
    out = args.out or Path("bench/results") / ("quick" if args.quick else "")
    tokens, seqs = (QUICK_TOKENS, QUICK_SEQS) if args.quick else (GRID_TOKENS, GRID_SEQS)
    command = " ".join(["python -m bench.tuning", *(argv if argv is not None else sys.argv[1:])])
    run(chosen, tokens, seqs, args.jobs, out, command, use_cache=not args.no_cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
