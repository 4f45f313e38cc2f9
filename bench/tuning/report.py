"""Scores of the policies per scenario, the targets they are held to, and the files the benchmark writes.

``vllm_default`` and every grid config are static runs; ``best_static`` is
the grid config with the most SLO goodput over the whole scenario (an
offline tuning run with hindsight); ``phase_oracle`` takes, for every phase,
the grid config with the most SLO goodput in that phase, switched instantly
and for free: the reference for what switching configs can gain, though not
a strict bound (each phase is scored as its static run served it, with the
backlog that config carried into it, which a rolling restart sheds: under
overload hindsight can pass it); ``hindsight`` runs
phase_oracle's configs from vLLM's defaults with real rolling restarts, the
first after one observation window (``bench.tuning.hindsight``): what
foresight of the grid reaches under a real policy's handicaps; ``adaptive``
is the decide loop starting from vLLM's defaults.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_autotuner.sim.workload import CLIENT_TIMEOUT_S

from bench.tuning.runner import PhaseScore, RunResult
from bench.tuning.scenarios import BenchScenario

POLICIES = ("vllm_default", "best_static", "phase_oracle", "hindsight", "adaptive")


@dataclass
class PolicyScore:
    """One policy on one scenario."""

    slo_goodput: float
    """Output tokens per GPU-hour of requests within both targets."""
    slo_attainment: float
    """Share of requests within both targets."""
    rollouts: int = 0
    failed_rollouts: int = 0
    capacity_lost_pod_hours: float = 0.0
    config: str = ""
    """The static config, or what a policy that changes configs did."""
    timed_out: int = 0
    """Requests whose clients gave up waiting for a first token."""

    def as_json(self) -> dict[str, object]:
        return {
            "slo_goodput": round(self.slo_goodput, 1),
            "slo_attainment": round(self.slo_attainment, 4),
            "rollouts": self.rollouts,
            "failed_rollouts": self.failed_rollouts,
            "capacity_lost_pod_hours": round(self.capacity_lost_pod_hours, 3),
            "config": self.config,
            "timed_out_requests": self.timed_out,
        }


def _total(phases: dict[str, PhaseScore]) -> PhaseScore:
    return PhaseScore(
        sum(p.requests for p in phases.values()),
        sum(p.met for p in phases.values()),
        sum(p.good_tokens for p in phases.values()),
        sum(p.timed_out for p in phases.values()),
    )


def _score(phases: dict[str, PhaseScore], gpu_hours: float) -> PolicyScore:
    total = _total(phases)
    attainment = total.met / total.requests if total.requests else math.nan
    return PolicyScore(total.good_tokens / gpu_hours, attainment, timed_out=total.timed_out)


def gpu_hours(scenario: BenchScenario, tp: int) -> float:
    return scenario.replicas * tp * scenario.hours


def _started(grid: list[RunResult]) -> list[RunResult]:
    """The grid runs whose config started, smallest budget (then slots) first: among configs with equal goodput
    (several meet every request of a phase) the first is chosen, whatever order the runs finished in."""
    started = [r for r in grid if r.started and r.knobs is not None]
    return sorted(started, key=lambda r: (r.knobs.max_num_batched_tokens, r.knobs.max_num_seqs))


def phase_best(scenario: BenchScenario, grid: list[RunResult]) -> dict[str, RunResult]:
    """For each phase of the scenario, the grid run with the most SLO goodput in it (phase_oracle's choice)."""
    started = _started(grid)
    return {p.name: max(started, key=lambda r: r.phases[p.name].good_tokens) for p in scenario.traffic.phases}


def _moves(run: RunResult, hours: float) -> PolicyScore:
    """A policy that changes configs: its score, rollouts, capacity lost and what it ran when."""
    return replace(
        _score(run.phases, hours),
        rollouts=run.rollouts,
        failed_rollouts=run.failed_rollouts,
        capacity_lost_pod_hours=run.down_pod_seconds / 3600,
        config="; ".join(f"{t / 3600:.2f}h {knobs}" for t, knobs, _ in run.changes) or "no change",
    )


def score_scenario(
    scenario: BenchScenario,
    default: RunResult,
    grid: list[RunResult],
    hindsight: RunResult,
    adaptive: RunResult,
    hours: float,
) -> dict[str, PolicyScore]:
    """The policies' scores from the static runs, the hindsight run and the adaptive run (``hours``: GPU-hours
    of the fleet)."""
    best = max(_started(grid), key=lambda r: _total(r.phases).good_tokens)
    tops = phase_best(scenario, grid)
    oracle_phases = {name: run.phases[name] for name, run in tops.items()}
    oracle_config = "; ".join(f"{name}: {run.knobs}" for name, run in tops.items())
    scores = {}
    for name, phases, config in (
        ("vllm_default", default.phases, str(default.knobs)),
        ("best_static", best.phases, str(best.knobs)),
        ("phase_oracle", oracle_phases, oracle_config),
    ):
        scores[name] = replace(_score(phases, hours), config=config)
    scores["hindsight"] = _moves(hindsight, hours)
    scores["adaptive"] = _moves(adaptive, hours)
    return scores


@dataclass(frozen=True)
class Target:
    """A target of issue 5 and whether the run meets it."""

    text: str
    value: str
    met: bool
    oracle: str = ""
    """The ratio targets' figure with phase_oracle in adaptive's place: about the most any policy could reach on these
    scenarios (per phase, the best grid config, for free; not a strict bound, see the module), so a target well above
    it is out of reach in this run."""
    hindsight: str = ""
    """The same with hindsight in adaptive's place: phase_oracle's configs reached from vLLM's defaults by rolling
    restarts, the first after one observation window. A target above it asks more than foresight of the grid gives
    a policy that has to start from the defaults."""


def ratio(scores: dict[str, PolicyScore], other: str, policy: str = "adaptive") -> float:
    base = scores[other].slo_goodput
    return scores[policy].slo_goodput / base if base > 0 else math.inf


def _ratio_target(
    text: str, bound: float, rows: list[tuple[BenchScenario, dict[str, PolicyScore], RunResult]], other: str, mean: bool
) -> Target:
    """``adaptive / other >= bound``, on average or on the worst scenario of ``rows``."""

    def figure(policy: str) -> tuple[float, str]:
        ratios = [(ratio(s, other, policy), sc.key) for sc, s, _ in rows]
        if mean:
            return sum(r for r, _ in ratios) / len(ratios), ""
        low, key = min(ratios)
        return low, f" ({key})"

    value, where = figure("adaptive")
    ceiling, _ = figure("phase_oracle")
    reached, _ = figure("hindsight")
    return Target(text, f"{value:.3f}{where}", value >= bound, f"{ceiling:.3f}", f"{reached:.3f}")


def targets(rows: list[tuple[BenchScenario, dict[str, PolicyScore], RunResult]]) -> list[Target]:
    """Issue 5's targets, evaluated on this run (on the scenarios it ran)."""
    out = [
        _ratio_target("adaptive >= 0.95x phase_oracle on average", 0.95, rows, "phase_oracle", mean=True),
        _ratio_target("adaptive >= 0.90x phase_oracle on every scenario", 0.90, rows, "phase_oracle", mean=False),
        _ratio_target("adaptive >= 1.0x best_static on every scenario", 1.0, rows, "best_static", mean=False),
    ]
    for name, bound, other, kinds in (
        ("shift and time-of-day", 1.10, "best_static", ("shift", "diurnal-batch")),
        ("long-prompt and shift", 1.5, "vllm_default", ("long-prompt", "shift")),
    ):
        picked = [row for row in rows if row[0].name in kinds]
        if picked:
            out.append(_ratio_target(f"adaptive >= {bound:.2f}x {other} on {name}", bound, picked, other, mean=False))
    per_day = max(_most_in_a_day([t for t, _, _ in r.changes]) for _, _, r in rows)
    out.append(Target("<= 8 rollouts in any 24 simulated hours", f"max {per_day}", per_day <= 8))
    retried = sum(r.failed_retried for _, _, r in rows)
    out.append(Target("no failed config tried twice", f"{retried} retries", retried == 0))
    held = sum(r.changes_on_held for _, _, r in rows)
    out.append(Target("zero changes on held observations", f"{held} changes", held == 0))
    return out


def _most_in_a_day(times: list[float]) -> int:
    return max((sum(1 for u in times if t <= u < t + 86400) for t in times), default=0)


def write_json(path: Path, rows: list[tuple[BenchScenario, dict[str, PolicyScore], RunResult]], command: str) -> dict:
    doc = {
        "command": command,
        "scenarios": [
            {
                "name": sc.name,
                "profile": sc.profile,
                "hours": sc.hours,
                "replicas": sc.replicas,
                "policies": {name: scores[name].as_json() for name in POLICIES},
                "adaptive_lost_requests": result.lost_requests,
            }
            for sc, scores, result in rows
        ],
        "targets": [
            {
                "target": t.text,
                "value": t.value,
                "met": t.met,
                **({"phase_oracle": t.oracle, "hindsight": t.hindsight} if t.oracle else {}),
            }
            for t in targets(rows)
        ],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def write_markdown(
    path: Path, rows: list[tuple[BenchScenario, dict[str, PolicyScore], RunResult]], command: str, wall: float
) -> None:
    lines = [
        "# Tuning benchmark",
        "",
        f"Made by `{command}` in {wall / 60:.1f} minutes. SLO goodput: output tokens per GPU-hour of requests",
        "within both the TTFT target and the ITL target (a request is within it when no more than 1 - q of its",
        "inter-token gaps exceed it: its own ITL at the quantile q); attainment: their share of all requests.",
        "Ratios are adaptive's SLO goodput over the policy named. Clients give up on a request without a first",
        f"token after {CLIENT_TIMEOUT_S:g} s (the OpenAI Python client's default timeout); vLLM aborts it, "
        "and it misses.",
        "",
        "hindsight runs phase_oracle's configs from vLLM's defaults, the first change after one observation window,",
        "each a rolling restart like adaptive's: what foresight of the grid reaches from where a policy starts.",
        "",
        "| scenario | profile | h | vllm_default | best_static | phase_oracle | hindsight | adaptive | /oracle "
        "| /static | /default | /hindsight | rollouts | failed | pod-h lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc, s, _ in rows:
        cells = " | ".join(f"{s[p].slo_goodput:,.0f} ({s[p].slo_attainment:.1%})" for p in POLICIES)
        a = s["adaptive"]
        lines.append(
            f"| {sc.name} | {sc.profile} | {sc.hours:g} | {cells} | {ratio(s, 'phase_oracle'):.3f} "
            f"| {ratio(s, 'best_static'):.3f} | {ratio(s, 'vllm_default'):.3f} | {ratio(s, 'hindsight'):.3f} "
            f"| {a.rollouts} | {a.failed_rollouts} | {a.capacity_lost_pod_hours:.2f} |"
        )
    lines += [
        "",
        "## Targets",
        "",
        "The last columns put phase_oracle, then hindsight, in adaptive's place: the best grid config of each phase",
        "for free, and the same configs reached from vLLM's defaults by rolling restarts. phase_oracle is about the",
        "most switching configs can gain, not a strict bound: it scores each phase as a static run served it, with",
        "the backlog that config carried in, which a rolling restart sheds (under overload hindsight can pass it).",
        "",
        "| target | this run | met | phase_oracle | hindsight |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t.text} | {t.value} | {'yes' if t.met else '**no**'} | {t.oracle} | {t.hindsight} |" for t in targets(rows)
    ]
    lines += ["", "## What each policy ran", ""]
    for sc, s, result in rows:
        lines.append(f"**{sc.key}** ({sc.replicas} replicas): best_static {s['best_static'].config}; "
                     f"phase_oracle {s['phase_oracle'].config}; vllm_default {s['vllm_default'].config}; "
                     f"hindsight {s['hindsight'].config}.")  # fmt: skip
        if any(s[p].timed_out for p in POLICIES):
            counts = ", ".join(f"{p} {s[p].timed_out:,}" for p in POLICIES)
            lines.append(f"Requests whose clients gave up waiting for a first token: {counts}.")
        for t, knobs, reason in result.changes:
            lines.append(f"- {t / 3600:5.2f} h -> {knobs}: {reason}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def plot(path: Path, scenario: BenchScenario, runs: dict[str, RunResult]) -> None:
    """Traffic, knobs and TTFT/ITL p95 against the SLO over the scenario, for the policies in ``runs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    colors = {"vllm_default": "tab:gray", "best_static": "tab:blue", "hindsight": "tab:purple", "adaptive": "tab:red"}
    for name, run in runs.items():
        hours = [s.t / 3600 for s in run.timeline]
        style = {"color": colors[name], "label": f"{name} ({run.knobs})" if run.knobs else name, "lw": 1}
        if name == "adaptive":
            axes[0].plot(hours, [s.request_rate for s in run.timeline], color="black", lw=1)
        axes[1].step(hours, [s.tokens for s in run.timeline], where="post", **style)
        axes[2].plot(hours, [s.ttft_p95 for s in run.timeline], **style)
        axes[3].plot(hours, [s.itl_p95 * 1000 for s in run.timeline], **style)
        if name == "adaptive":
            twin = axes[1].twinx()
            twin.step(hours, [s.seqs for s in run.timeline], where="post", color="tab:red", ls=":", lw=1)
            twin.set_ylabel("max_num_seqs (dotted)")
            twin.set_yscale("log", base=2)
    slo = scenario.spec.slo
    axes[2].axhline(slo.ttft.seconds, color="green", ls="--", lw=1, label=f"TTFT target {slo.ttft.seconds:g}s")
    axes[3].axhline(
        slo.itl.seconds * 1000, color="green", ls="--", lw=1, label=f"ITL target {slo.itl.seconds * 1000:g}ms"
    )
    axes[0].set_ylabel("requests/s (fleet)")
    axes[1].set_ylabel("max_num_batched_tokens")
    axes[1].set_yscale("log", base=2)
    axes[2].set_ylabel("TTFT p95 (s)")
    axes[2].set_yscale("log")
    axes[3].set_ylabel("ITL p95 (ms)")
    axes[3].set_yscale("log")
    axes[3].set_xlabel("hour of the scenario")
    for ax in axes[1:]:
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_title(f"{scenario.key}: {scenario.replicas} replicas, SLO targets per the spec (schedules aside)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
