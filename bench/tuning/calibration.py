"""``python -m bench.tuning.calibration``: the decision core's model against the simulator, in a minute.

The adaptive policy prices every candidate config from one window measured
under the running config (``policy.model.Traffic``): the utilisation it
predicts (whether the candidate queues) and the SLO attainment (whether a
rolling restart for it pays). The tuning benchmark shows only where those
predictions led, after 24 simulated hours per scenario and about two hours
of computing; this one checks the predictions themselves. For every GPU
profile and request mix of the tuning scenarios and two loads, one pod runs
vLLM's defaults under Poisson traffic for fifteen simulated minutes while
``decide`` evaluates it every 30 s, as the benchmark's adaptive run does;
from the last window's measurement the model predicts each token budget a
person might pick. The truth is the simulator's: for utilisation, the load
over the rate the pod completes under a backlog with that budget
(``sim.capacity.saturation_rate``); for attainment, what ``decide``
measures in the last window of the same traffic with that budget running.
It also scores the budget the model would choose against the best one
measured. Outputs (``--out``, default ``bench/results``):
``calibration.md`` and ``calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from vllm_autotuner.api import Knobs, Measurement, VllmTuningSpec
from vllm_autotuner.policy import decide
from vllm_autotuner.policy.model import Traffic, fit_step_model
from vllm_autotuner.sim.capacity import saturation_rate
from vllm_autotuner.sim.engine import StepCost
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.startup import check_startup
from vllm_autotuner.sim.workload import Mix, Phase, Poisson, Scenario, Stream

from bench.tuning import scenarios
from bench.tuning.fleet import Fleet, engine_config
from bench.tuning.observe import observe
from bench.tuning.runner import _initial_state, default_config, itl_targets
from bench.tuning.scenarios import START, BenchScenario

LOADS = (0.6, 0.85)
"""Loads, as fractions of the pod's capacity under vLLM's defaults: a calm hour, and the knee the scenarios sit at."""
BUDGETS = (256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)
"""Token budgets of the adaptive policy's grid (powers of two and their midpoints) that people run."""
RUN_SECONDS = 900.0
WINDOW_SECONDS = 300.0
EVALUATE_SECONDS = 30.0
SCRAPE_SECONDS = 15.0
BACKLOG = 2000
"""Requests of the backlog a budget's capacity is measured with."""
@dataclass(frozen=True)
class Case:
    """A GPU profile, a request mix and the spec of the first tuning scenario that runs them."""

    profile: str
    mix: Mix
    scenario: BenchScenario

    @property
    def name(self) -> str:
        return f"{self.profile} {self.mix.name}"


@dataclass(frozen=True)
class Row:
    """One case at one load: the fitted slope, and per token budget the simulator's and the model's numbers."""

    case: str
    load: float
    default: Knobs
    slope_us: float
    """The model's fitted seconds per batched token, in microseconds."""
    simulated_slope_us: float
    """The simulator's GEMM and all-reduce time per batched token, in microseconds."""
    utilisation: dict[int, tuple[float, float]]
    """Per token budget: (the simulator's, the model's)."""
    attainment: dict[int, tuple[float, float]]
    """Per token budget: (measured in a window of the same traffic under it, the model's prediction)."""

    @property
    def choice(self) -> int:
        """The budget the model predicts best; among equals, the one nearest the default (the smallest move)."""
        best = max(model for _, model in self.attainment.values())
        return min((b for b, (_, model) in self.attainment.items() if model >= best - 1e-9),
                   key=lambda b: abs(math.log2(b / self.default.max_num_batched_tokens)))  # fmt: skip

    @property
    def regret(self) -> float:
        """Attainment the model's choice measured short of the best budget's."""
        return max(measured for measured, _ in self.attainment.values()) - self.attainment[self.choice][0]


def cases(chosen: Sequence[BenchScenario]) -> list[Case]:
    """Each (profile, mix) the scenarios run, once, with the first scenario's spec."""
    found: dict[tuple[str, str], Case] = {}
    for scenario in chosen:
        for stream in scenario.traffic.streams:
            found.setdefault((scenario.profile, stream.mix.name), Case(scenario.profile, stream.mix, scenario))
    return list(found.values())


def _measured(case: Case, knobs: Knobs, rate: float, spec: VllmTuningSpec) -> Measurement:
    """What ``decide`` keeps of the last window of one pod running ``knobs`` under the case's traffic at ``rate``."""
    traffic = Scenario("calibration", (Stream(Poisson(rate), case.mix),), (Phase("steady", 0, RUN_SECONDS),),
                       RUN_SECONDS)  # fmt: skip
    fleet = Fleet(get_profile(case.profile), knobs, 1, traffic.generate(case.scenario.seed), case.scenario.seed,
                  keep=int(WINDOW_SECONDS / SCRAPE_SECONDS) + 2, itl_targets=itl_targets(spec))  # fmt: skip
    state = _initial_state(knobs)
    now = 0.0
    while now < RUN_SECONDS:
        now += SCRAPE_SECONDS
        fleet.advance(now)
        if now >= 2 * WINDOW_SECONDS and now % EVALUATE_SECONDS == 0:
            observation = observe(fleet, now - WINDOW_SECONDS, now, spec.slo, START)
            state = decide(spec, state, observation, START + timedelta(seconds=now)).state
    if not state.measurements:
        raise RuntimeError(f"{case.name} under {knobs}: no window was usable ({state.history[0].reason})")
    return state.measurements[0]


def measure(case: Case, load: float, budgets: Sequence[int] = BUDGETS, backlog: int = BACKLOG) -> Row:
    """The model's predictions for each budget at ``load`` of the default config's capacity, from a window under
    the default config, against the simulator's: utilisation under a backlog, attainment of the same traffic."""
    profile = get_profile(case.profile)
    default = default_config(case.scenario)
    rate = load * saturation_rate(profile, case.mix, engine_config(default), requests=backlog)
    spec = case.scenario.spec.model_copy(update={"schedules": []})
    measured = _measured(case, default, rate, spec)
    model = fit_step_model([measured])
    assert model is not None
    predicted = Traffic.of(measured, spec.slo, model)
    utilisation, attainment = {}, {}
    for tokens in budgets:
        knobs = Knobs(max_num_batched_tokens=tokens, max_num_seqs=min(default.max_num_seqs, tokens))
        config = engine_config(knobs)
        if check_startup(profile, config).ok:
            true = rate / saturation_rate(profile, case.mix, config, requests=backlog)
            utilisation[tokens] = (true, predicted.utilisation(knobs))
            attainment[tokens] = (_measured(case, knobs, rate, spec).attainment, predicted.predict(knobs).attainment)
    cost = StepCost(profile)
    return Row(case.name, load, default, 1e6 * model.slope, 1e6 * (cost.per_token + cost.comm_per_token),
               utilisation, attainment)  # fmt: skip


def _errors(rows: Sequence[Row], what: str) -> list[float]:
    return [model - true for row in rows for true, model in getattr(row, what).values()]


def _summary(rows: Sequence[Row], what: str) -> str:
    errors = _errors(rows, what)
    return (f"mean absolute error {sum(map(abs, errors)) / len(errors):.3f}, mean error "
            f"{sum(errors) / len(errors):+.3f}, worst {max(errors, key=abs):+.3f}")  # fmt: skip


def _table(rows: Sequence[Row], what: str) -> list[str]:
    lines = [
        "| profile mix | load | default | slope us | " + " | ".join(str(b) for b in BUDGETS) + " |",
        "|---|---|---|---|" + "---|" * len(BUDGETS),
    ]
    for row in rows:
        values = getattr(row, what)
        cells = [f"{values[b][0]:.2f} / {values[b][1]:.2f}" if b in values else "fails" for b in BUDGETS]
        lines.append(
            f"| {row.case} | {row.load:.0%} | {row.default.max_num_batched_tokens}/{row.default.max_num_seqs} "
            f"| {row.slope_us:.1f} / {row.simulated_slope_us:.1f} | " + " | ".join(cells) + " |"
        )
    return lines


def write_markdown(path: Path, rows: Sequence[Row], command: str, seconds: float) -> None:
    lines = [
        "# Model calibration",
        "",
        f"Made by `{command}` in {seconds:.0f} s. The decision core predicts each budget from one 5-minute window "
        "of a pod under vLLM's defaults (max_num_seqs: the default's, at most the budget). Slope: the model's fitted "
        "time per batched token / the simulator's GEMM and all-reduce time per token.",
        "",
        "## Utilisation",
        "",
        "Each cell: the simulator's utilisation of the budget / the model's. The simulator's is the load over what "
        "the pod completes under a backlog with that budget, as many requests running as max_num_seqs and the KV "
        "cache allow. Negative errors: the model sees more headroom than there is.",
        "",
        f"Model minus simulator: {_summary(rows, 'utilisation')}.",
        "",
        *_table(rows, "utilisation"),
        "",
        "## SLO attainment",
        "",
        "Each cell: the attainment measured (as the operator estimates it from the histograms) in a window of the "
        "same traffic with the budget running / the model's prediction of it from the defaults' window.",
        "",
        f"Model minus measured: {_summary(rows, 'attainment')}. The budget the model would choose (its best "
        "prediction; among equals, the nearest to the default) measured "
        f"{sum(r.regret for r in rows) / len(rows):.3f} short of the best budget on average, at worst "
        f"{max(r.regret for r in rows):.3f}.",
        "",
        *_table(rows, "attainment"),
        "",
        "| profile mix | load | model's choice | measured | best measured |",
        "|---|---|---|---|---|",
        *(f"| {r.case} | {r.load:.0%} | {r.choice} | {r.attainment[r.choice][0]:.2f} | "
          f"{max(m for m, _ in r.attainment.values()):.2f} |" for r in rows),
    ]
    path.write_text("\n".join(lines) + "\n")


def write_json(path: Path, rows: Sequence[Row], command: str) -> dict:
    def pairs(values: dict[int, tuple[float, float]], first: str) -> dict:
        return {str(b): {first: round(a, 4), "model": round(m, 4)} for b, (a, m) in values.items()}

    document = {
        "command": command,
        "rows": [
            {
                "case": row.case,
                "load": row.load,
                "slope_us": round(row.slope_us, 2),
                "simulated_slope_us": round(row.simulated_slope_us, 2),
                "utilisation": pairs(row.utilisation, "simulated"),
                "attainment": pairs(row.attainment, "measured"),
                "choice": row.choice,
                "regret": round(row.regret, 4),
            }
            for row in rows
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tuning.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output folder")
    args = parser.parse_args(argv)
    command = " ".join(["python -m bench.tuning.calibration", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    rows = []
    for case in cases(scenarios.full()):
        for load in LOADS:
            row = measure(case, load)
            rows.append(row)
            print(f"{row.case} at {load:.0%}, simulator or measured / model:", flush=True)
            for what in ("utilisation", "attainment"):
                cells = " ".join(f"{b}:{a:.2f}/{m:.2f}" for b, (a, m) in getattr(row, what).items())
                print(f"  {what}: {cells}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out / "calibration.md", rows, command, time.perf_counter() - started)
    write_json(args.out / "calibration.json", rows, command)
    print(f"utilisation: {_summary(rows, 'utilisation')}; attainment: {_summary(rows, 'attainment')}; "
          f"regret of the model's choice: mean {sum(r.regret for r in rows) / len(rows):.3f}")
    print(f"wrote {args.out}/calibration.md and calibration.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
