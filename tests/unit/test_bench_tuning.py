"""The tuning benchmark at toy size: it runs end to end and writes the documented files (not a timing test)."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

from bench.tuning import calibration, scenarios
from bench.tuning.__main__ import _SCORING, _SOURCES, _cache_key, _code, run
from bench.tuning.hindsight import plan, run_hindsight
from bench.tuning.report import POLICIES, phase_best, score_scenario
from bench.tuning.runner import PhaseScore, RunResult, default_config, run_static
from bench.tuning.scenarios import CHAT_SLO, RAG_SLO, BenchScenario, _spec
from vllm_autotuner.api import Knobs
from vllm_autotuner.sim.workload import CHAT, HOUR, RAG, Phase, Poisson, Scenario, Stream


def toy() -> BenchScenario:
    """Twenty simulated minutes of an A100 pair: chat, then long prompts."""
    half = HOUR / 6
    traffic = Scenario(
        "toy",
        (Stream(Poisson(8.0), CHAT, 0, half), Stream(Poisson(1.5), RAG, half, 2 * half)),
        (Phase("chat", 0, half), Phase("rag", half, 2 * half)),
        2 * half,
    )
    return BenchScenario("toy-shift", "llama3-8b-a100", 2, traffic, _spec("llama3-8b-a100", RAG_SLO))


def test_toy_run_writes_json_markdown_and_a_timeline(tmp_path):
    document = run([toy()], tokens=(512, 2048), seqs=(1,), jobs=1, out=tmp_path, command="pytest toy", use_cache=False)
    on_disk = json.loads((tmp_path / "tuning.json").read_text())
    assert on_disk == json.loads(json.dumps(document))
    (scenario,) = on_disk["scenarios"]
    assert (scenario["name"], scenario["profile"], scenario["hours"]) == ("toy-shift", "llama3-8b-a100", 1 / 3)
    assert set(scenario["policies"]) == set(POLICIES)
    for policy in scenario["policies"].values():
        assert {"slo_goodput", "slo_attainment", "rollouts", "failed_rollouts"} <= set(policy)
        assert policy["slo_goodput"] >= 0 and 0 <= policy["slo_attainment"] <= 1
    # the oracle picks per phase among the same grid runs best_static picks from: never below it
    policies = scenario["policies"]
    assert policies["phase_oracle"]["slo_goodput"] >= policies["best_static"]["slo_goodput"]
    assert policies["best_static"]["slo_goodput"] >= policies["vllm_default"]["slo_goodput"]
    assert {t["target"] for t in on_disk["targets"]} >= {"no failed config tried twice"}
    # the ratio targets say what phase_oracle would score in adaptive's place: at least best_static, by the above
    reach = {t["target"]: t.get("phase_oracle") for t in on_disk["targets"]}
    assert float(reach["adaptive >= 1.0x best_static on every scenario"]) >= 1.0
    assert reach["adaptive >= 0.90x phase_oracle on every scenario"] == "1.000"
    assert reach["no failed config tried twice"] is None
    # hindsight: 512 tokens wins both phases; it gets there from the defaults after settle (2m) + window (5m)
    assert policies["hindsight"]["config"] == "0.12h tokens=512 seqs=256"
    assert policies["hindsight"]["rollouts"] == 1 and policies["hindsight"]["capacity_lost_pod_hours"] > 0
    assert all(t.get("hindsight") for t in on_disk["targets"] if t.get("phase_oracle"))
    markdown = (tmp_path / "tuning.md").read_text()
    assert "`pytest toy`" in markdown and "| toy-shift | llama3-8b-a100 |" in markdown
    assert (tmp_path / "tuning-toy-shift-llama3-8b-a100.png").stat().st_size > 10_000


def test_requests_whose_clients_give_up_are_counted_and_missed():
    """An overloaded replica: clients that wait 20 s for a first token give up in numbers, and each one misses."""
    seconds = 300.0
    traffic = Scenario(
        "toy-overload",
        (Stream(Poisson(18.0), CHAT, 0, seconds, first_token_timeout=20.0),),
        (Phase("all", 0, seconds),),
        seconds,
    )
    scenario = BenchScenario("toy-overload", "llama3-8b-a100", 1, traffic, _spec("llama3-8b-a100", CHAT_SLO))
    (phase,) = run_static(scenario, Knobs(max_num_batched_tokens=512, max_num_seqs=256)).phases.values()
    assert phase.timed_out > 0.2 * phase.requests
    assert 0 < phase.met <= phase.requests - phase.timed_out


SMALL = Knobs(max_num_batched_tokens=512, max_num_seqs=256)


def test_hindsight_plans_the_first_change_after_one_window_and_later_ones_at_their_phase():
    scenario = toy()
    default = default_config(scenario)
    assert plan(scenario, {"chat": SMALL, "rag": SMALL}) == [(420.0, SMALL)]
    assert plan(scenario, {"chat": default, "rag": SMALL}) == [(600.0, SMALL)]
    assert plan(scenario, {"chat": SMALL, "rag": default}) == [(420.0, SMALL), (600.0, default)]
    assert plan(scenario, {"chat": default, "rag": default}) == []


def test_hindsight_starts_on_the_defaults_and_pays_for_its_rolling_restart():
    scenario = toy()
    result = run_hindsight(scenario, [(420.0, SMALL)])
    assert [(s.t, s.tokens) for s in result.timeline] == [(300.0, 2048), (600.0, 512), (900.0, 512), (1200.0, 512)]
    assert result.rollouts == 1 and result.down_pod_seconds > 0
    # the same config all along meets more of the chat phase: hindsight spent 7 minutes on the defaults, then
    # restarted the pods one at a time
    static = run_static(scenario, SMALL)
    assert result.phases["chat"].met < static.phases["chat"].met


def test_calibration_sets_the_model_against_the_simulator_at_the_load_it_ran(tmp_path):
    case = next(c for c in calibration.cases(scenarios.full()) if c.name == "llama3-8b-a100 chat")
    row = calibration.measure(case, 0.85, budgets=(512, 2048))
    # the load is a share of the default config's capacity (2048/256 on an A100): there the simulator's utilisation
    # is that share; 512 tokens amortise the step's fixed cost over fewer tokens, so the same load uses more of it
    simulated_default, model_default = row.utilisation[2048]
    assert simulated_default == pytest.approx(0.85)
    assert row.utilisation[512][0] > simulated_default
    assert 0 < model_default < 2 and row.slope_us > 0
    # the model's prediction for the config it measured is that measurement; at 85 % load the defaults' 2048-token
    # steps stall decodes past the 50 ms ITL target, which 512 tokens meet: the model says so, the simulator agrees
    measured_default, predicted_default = row.attainment[2048]
    assert predicted_default == pytest.approx(measured_default, abs=1e-3) and measured_default < 0.1
    assert row.attainment[512][0] > 0.9 and row.choice == 512 and row.regret == 0
    calibration.write_markdown(tmp_path / "calibration.md", [row], "pytest", 1.0)
    document = calibration.write_json(tmp_path / "calibration.json", [row], "pytest")
    assert json.loads((tmp_path / "calibration.json").read_text()) == document
    text = (tmp_path / "calibration.md").read_text()
    assert "| llama3-8b-a100 chat | 85% | 2048/256 |" in text and "| llama3-8b-a100 chat | 85% | 512 |" in text


def test_calibration_reads_prompts_behind_a_cached_system_prompt_as_the_tokens_their_steps_compute():
    """Three quarters of each prompt come from the prefix cache: vLLM's step-token histogram shows the prompts
    whole, past the budget, and the model read them as full steps and kept the default, whose 2048-token steps miss
    the ITL target for nearly every request; taking out the cached tokens it chooses 384, which meets it."""
    case = next(c for c in calibration.cases(scenarios.full()) if c.mix is scenarios.CACHED_RAG)
    row = calibration.measure(case, 0.85, budgets=(384, 2048))
    assert row.attainment[384][0] > 0.9 and row.attainment[2048][0] < 0.1
    assert row.choice == 384 and row.regret == 0


def test_the_static_run_cache_is_keyed_on_code_not_on_its_wording():
    source = 'def f(x):\n    """Twice x."""\n    return 2 * x  # doubled\n'
    assert _code(source) == _code('def f(x):\n    # reworded\n    """x, twice."""\n    return 2 * x\n')
    assert _code(source) != _code('def f(x):\n    """Twice x."""\n    return 3 * x\n')
    assert _code(source) != _code('def f(x, cap=None):\n    """Twice x."""\n    return 2 * x\n')


def test_the_static_run_cache_is_keyed_on_all_the_code_a_static_run_executes():
    """A cached static run served after a change of code it runs would be a stale result: every function of the
    project a toy static run calls is in a module of the key or is one of its functions (the scenario is in it by
    value)."""
    root = Path(__file__).resolve().parents[2]
    called: set[tuple[str, str]] = set()

    def record(frame, event, arg):  # noqa: ANN001, ANN202
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(str(root)) and "/.venv/" not in path and "/tests/" not in path:
            called.add((path, frame.f_code.co_name))

    scenario = toy()
    sys.setprofile(record)
    try:
        run_static(scenario, default_config(scenario))
    finally:
        sys.setprofile(None)
    modules = {str(Path(module.__file__).resolve()) for module in _SOURCES} | {str(root / "bench/tuning/scenarios.py")}
    functions = {(str(Path(inspect.getsourcefile(f)).resolve()), f.__name__) for f in _SCORING}
    assert len(called) > 50
    assert sorted(c for c in called if c[0] not in modules and c not in functions) == []


def test_a_hindsight_run_is_cached_by_its_changes_apart_from_the_static_run_of_its_config():
    scenario, knobs = toy(), Knobs(max_num_batched_tokens=512, max_num_seqs=256)
    changes = [(900.0, knobs)]
    assert _cache_key(scenario, changes) == _cache_key(toy(), [(900.0, Knobs(max_num_batched_tokens=512,
                                                                             max_num_seqs=256))])
    assert _cache_key(scenario, changes) != _cache_key(scenario, knobs)
    assert _cache_key(scenario, changes) != _cache_key(scenario, [(1200.0, knobs)])


def test_equal_goodputs_choose_the_same_configs_whatever_order_the_runs_finished_in():
    """Where several grid configs serve a phase equally (every request met), phase_oracle and best_static take the
    smallest budget among them, not whichever run a process finished first (the pool's order)."""
    scenario = toy()
    names = [p.name for p in scenario.traffic.phases]
    runs = [RunResult(scenario.key, "static", Knobs(max_num_batched_tokens=t, max_num_seqs=s),
                      phases={name: PhaseScore(100, 100, 5000.0) for name in names})
            for t, s in ((2048, 64), (512, 256), (512, 64), (8192, 64))]  # fmt: skip
    default = runs[0]
    for order in (runs, runs[::-1], runs[1:] + runs[:1]):
        tops = phase_best(scenario, order)
        assert {str(r.knobs) for r in tops.values()} == {"tokens=512 seqs=64"}
        scores = score_scenario(scenario, default, order, default, default, 1.0)
        assert scores["best_static"].config == "tokens=512 seqs=64"
