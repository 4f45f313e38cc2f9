"""The demo's report: SLO goodput of the tuned and the static Deployment, from Prometheus.

SLO goodput is the policy's own yardstick, measured the same way for both
Deployments. The day is cut into steps of half a simulated hour; for each
step and Deployment, Prometheus gives (one range query each, every pod of
the Deployment, old ReplicaSets included):

* ``G``: generated tokens per second,
  ``sum(rate(vllm:generation_tokens_total{...}[step]))``;
* the rate of each bucket of the TTFT and the inter-token-latency histograms,
  ``sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{...}[step]))``
  and the same for ``vllm:inter_token_latency_seconds_bucket``.

``A``, the estimated share of requests within both SLO targets, is what the
decision core computes for a window (``policy.model.attainment``): the share
of TTFT samples within the TTFT target times the share of requests whose own
inter-token gaps meet the ITL target at its quantile, estimated from the
share of all gaps within the target and the mean output length (requests
over generated tokens per second); the shares are read off the histograms
with Prometheus's interpolation
(``observe.quantile.histogram_fraction_below``). The targets
are the VllmTuning's SLO in force at the step: the chat SLO by day, the
nightly window's relaxed one while that window is open (its pre-roll does
not count), for both Deployments alike.

A step's SLO goodput is ``G * A`` tokens per second; a period's is the mean
over its steps, and its SLO attainment ``sum(G * A) / sum(G)``. The headline
is the ratio of the tuned Deployment's goodput over the whole day to the
static one's. A step without data (no pod serving) counts as zero goodput.

The same range queries give the charts: each step's TTFT and ITL p95
(Prometheus's ``histogram_quantile`` on the same buckets), and the knobs
that served it: the knobs of the ReplicaSet whose pods completed most of
the step's requests (``sum by (pod) (rate(vllm:request_success_total...))``,
each pod mapped to its ReplicaSet's pod template).

``report.json`` keeps every query with its time range and step, and the
numbers, so the report can be checked against Prometheus.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from vllm_autotuner.api import SLO, Knobs, VllmTuningSpec, VllmTuningStatus
from vllm_autotuner.observe.client import PrometheusClient
from vllm_autotuner.observe.quantile import histogram_fraction_below, histogram_quantile
from vllm_autotuner.policy import effective_slo
from vllm_autotuner.policy.model import attainment
from vllm_autotuner.sim.demo.plan import NAMESPACE, NIGHT_WINDOW, REPLICAS, STATIC, TUNED, DemoDay

QUANTILE = 0.95
DEPLOYMENTS = (TUNED, STATIC)

QUERIES = {
    "generation": "sum(rate(vllm:generation_tokens_total{{{selector}}}[{window}]))",
    "requests": "sum(rate(vllm:request_success_total{{{selector}}}[{window}]))",
    "ttft_buckets": "sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{selector}}}[{window}]))",
    "itl_buckets": "sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{{selector}}}[{window}]))",
    "pod_requests": "sum by (pod) (rate(vllm:request_success_total{{{selector}}}[{window}]))",
}
"""The range queries per Deployment; ``selector`` picks its pods, ``window`` is the step."""


def selector(deployment: str) -> str:
    """The PromQL label matchers of a Deployment's pods (its pod label, as Prometheus relabels it)."""
    return f'namespace="{NAMESPACE}",app_kubernetes_io_name="{deployment}"'


def step_seconds(day: DemoDay) -> float:
    """Half a simulated hour, in whole milliseconds (PromQL ranges take integers)."""
    return round(day.hour / 2, 3)


def promql(name: str, deployment: str, step: float) -> str:
    return QUERIES[name].format(selector=selector(deployment), window=f"{round(step * 1000)}ms")


Histogram = dict[float, float]  # bucket upper bound (le) -> rate


@dataclass
class Measured:
    """The answers of the range queries for one Deployment: one entry per step end time."""

    times: list[float]
    generation: list[float]
    requests: list[float]
    ttft: list[Histogram]
    itl: list[Histogram]
    pod_requests: dict[str, list[float]]


def fetch(client: PrometheusClient, deployment: str, start: float, end: float, step: float) -> Measured:
    """Run :data:`QUERIES` for ``deployment`` over the steps ending at ``start + step``, ... up to ``end``."""
    times = [round(start + step * (i + 1), 3) for i in range(int((end - start) / step + 1e-9))]  # Prometheus: ms
    if not times:
        return Measured([], [], [], [], [], {})
    position = {t: i for i, t in enumerate(times)}

    def series(name: str) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
        """Each series' labels and (step index, value) pairs; a time off the steps is a bug, so a KeyError."""
        rows = client.query_range(promql(name, deployment, step), times[0], times[-1], step)
        return [(row.labels, [(position[round(t, 3)], v) for t, v in zip(row.times, row.values, strict=True)])
                for row in rows]

    def scalar(name: str) -> list[float]:
        values = [math.nan] * len(times)
        for _, points in series(name):
            for i, v in points:
                values[i] = v
        return values

    def histograms(name: str) -> list[Histogram]:
        per_step: list[Histogram] = [{} for _ in times]
        for labels, points in series(name):
            for i, v in points:
                per_step[i][float(labels["le"])] = v
        return per_step

    pods: dict[str, list[float]] = {}
    for labels, points in series("pod_requests"):
        values = pods.setdefault(labels.get("pod", ""), [0.0] * len(times))
        for i, v in points:
            values[i] = v
    return Measured(times, scalar("generation"), scalar("requests"), histograms("ttft_buckets"),
                    histograms("itl_buckets"), pods)


def scraped_until(client: PrometheusClient, deployment: str, at: float) -> float:
    """Unix time of the newest sample Prometheus holds of the Deployment's pods at ``at`` (0 without any)."""
    rows = client.query(f"max(timestamp(vllm:generation_tokens_total{{{selector(deployment)}}}))", at)
    return max((row.value for row in rows), default=0.0)


# --- scoring (pure) ---------------------------------------------------------------------------------


def slo_at(spec: VllmTuningSpec, t: float) -> SLO:
    """The SLO in force at Unix time ``t``: the schedule window's while it is open (pre-roll excluded)."""
    without_pre_roll = spec.model_copy(
        update={"schedules": [s.model_copy(update={"pre_roll": "0s"}) for s in spec.schedules]})
    return effective_slo(without_pre_roll, VllmTuningStatus(), datetime.fromtimestamp(t, UTC))


def _curve(histogram: Histogram) -> tuple[list[float], list[float]]:
    bounds = sorted(histogram)
    return bounds, [histogram[b] for b in bounds]


def quantile(histogram: Histogram, q: float = QUANTILE) -> float:
    """Prometheus's histogram_quantile of summed bucket rates; NaN without observations."""
    if not histogram:
        return math.nan
    return histogram_quantile(q, *_curve(histogram))


def within(histogram: Histogram, target: float) -> float:
    """Share of observations within ``target`` seconds; NaN without observations."""
    if not histogram:
        return math.nan
    return histogram_fraction_below(target, *_curve(histogram))


def step_attainment(slo: SLO, ttft: Histogram, itl: Histogram, output_tokens: float) -> float:
    """The decision core's estimate of the share of requests within both targets; NaN without data."""
    ttft_share, itl_share = within(ttft, slo.ttft.seconds), within(itl, slo.itl.seconds)
    if math.isnan(ttft_share) or math.isnan(itl_share) or math.isnan(output_tokens):
        return math.nan
    return attainment(
        slo, quantile(ttft, slo.ttft.quantile), quantile(itl, slo.itl.quantile), ttft_share, itl_share, output_tokens
    )


@dataclass
class Steps:
    """Per-step numbers of one Deployment, derived from :class:`Measured`."""

    times: list[float]
    generation: list[float]
    requests: list[float]
    attainment: list[float]
    goodput: list[float]
    ttft_p95: list[float]
    itl_p95: list[float]
    slo_met: list[bool | None]
    """Whether both quantiles were within their targets (None without data)."""
    knobs: list[Knobs | None]


def score_steps(measured: Measured, spec: VllmTuningSpec, step: float, pod_knobs: Mapping[str, Knobs]) -> Steps:
    """Goodput, attainment, p95s and serving knobs per step (the SLO of each step taken at its middle)."""
    generation = [0.0 if math.isnan(g) else g for g in measured.generation]
    slos = [slo_at(spec, t - step / 2) for t in measured.times]
    lengths = [g / r if r > 0 else math.nan for g, r in zip(measured.generation, measured.requests, strict=True)]
    shares = [step_attainment(slo, ttft, itl, n)
              for slo, ttft, itl, n in zip(slos, measured.ttft, measured.itl, lengths, strict=True)]
    goodput = [g * a if not math.isnan(a) else 0.0 for g, a in zip(generation, shares, strict=True)]
    ttft_p95 = [quantile(h, slo.ttft.quantile) for h, slo in zip(measured.ttft, slos, strict=True)]
    itl_p95 = [quantile(h, slo.itl.quantile) for h, slo in zip(measured.itl, slos, strict=True)]
    met = [None if math.isnan(t) or math.isnan(i) else t <= slo.ttft.seconds and i <= slo.itl.seconds
           for t, i, slo in zip(ttft_p95, itl_p95, slos, strict=True)]
    return Steps(
        times=list(measured.times),
        generation=generation,
        requests=[0.0 if math.isnan(r) else r for r in measured.requests],
        attainment=shares,
        goodput=goodput,
        ttft_p95=ttft_p95,
        itl_p95=itl_p95,
        slo_met=met,
        knobs=serving_knobs(measured.pod_requests, pod_knobs, len(measured.times)),
    )


def serving_knobs(pod_requests: Mapping[str, Sequence[float]], pod_knobs: Mapping[str, Knobs],
                  steps: int) -> list[Knobs | None]:
    """Per step, the knobs of the ReplicaSet whose pods completed the most requests (the previous step's when idle)."""
    out: list[Knobs | None] = []
    for i in range(steps):
        by_knobs: dict[Knobs, float] = {}
        for pod, rates in pod_requests.items():
            knobs = pod_knobs.get(pod)
            if knobs is not None and not math.isnan(rates[i]):
                by_knobs[knobs] = by_knobs.get(knobs, 0.0) + rates[i]
        busiest = max(by_knobs.items(), key=lambda kv: kv[1], default=(None, 0.0))
        out.append(busiest[0] if busiest[1] > 0 else (out[-1] if out else None))
    return out


@dataclass(frozen=True)
class Period:
    """A stretch of the day scored for both Deployments."""

    name: str
    start: float
    end: float
    goodput: dict[str, float]
    """Mean SLO goodput (tokens/s) per Deployment."""
    attainment: dict[str, float]
    """Token-weighted estimated share of requests within both targets per Deployment."""
    generation: dict[str, float]
    """Mean generated tokens/s per Deployment."""
    slo_met: dict[str, float]
    """Share of the steps with data whose TTFT and ITL quantiles were both within target, per Deployment."""

    @property
    def ratio(self) -> float:
        static = self.goodput[STATIC]
        return self.goodput[TUNED] / static if static > 0 else math.nan


def period(name: str, start: float, end: float, steps: Mapping[str, Steps], step: float) -> Period:
    """Scores of the steps whose middle lies in [start, end)."""
    goodput, share, generation, met = {}, {}, {}, {}
    for deployment, s in steps.items():
        picked = [i for i, t in enumerate(s.times) if start <= t - step / 2 < end]
        tokens = sum(s.generation[i] for i in picked)
        good = sum(s.goodput[i] for i in picked)
        goodput[deployment] = good / len(picked) if picked else math.nan
        generation[deployment] = tokens / len(picked) if picked else math.nan
        share[deployment] = good / tokens if tokens > 0 else math.nan
        judged = [s.slo_met[i] for i in picked if s.slo_met[i] is not None]
        met[deployment] = sum(judged) / len(judged) if judged else math.nan
    return Period(name, start, end, goodput, share, generation, met)


# --- the report ----------------------------------------------------------------------------------


@dataclass
class Decision:
    """One decision of the operator, from the VllmTuning's status.history."""

    time: float
    action: str
    knobs: str
    reason: str


@dataclass
class RunFacts:
    """What happened in the run besides the metrics: the operator's decisions, Events and rollouts."""

    decisions: list[Decision] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    """Events of the VllmTuning and the Deployments: time, object, reason, message."""
    revisions: dict[str, int] = field(default_factory=dict)
    """The Deployments' rollout revisions at the end."""
    interrupted: bool = False
    load: dict[str, Any] = field(default_factory=dict)
    """sim load's summary per Deployment."""


@dataclass
class Report:
    day: DemoDay
    end: float
    step: float
    steps: dict[str, Steps]
    whole: Period
    phases: list[Period]
    facts: RunFacts

    @property
    def ratio(self) -> float:
        return self.whole.ratio


def build(day: DemoDay, end: float, measured: Mapping[str, Measured], pod_knobs: Mapping[str, Knobs],
          facts: RunFacts) -> Report:
    """Score both Deployments over the day up to ``end`` (the whole day, or where it was interrupted)."""
    spec, step = day.spec(), step_seconds(day)
    steps = {name: score_steps(m, spec, step, pod_knobs) for name, m in measured.items()}
    scored_end = day.start + step * len(next(iter(steps.values())).times)
    phases = [period(p.name, day.start + p.start, min(day.start + p.end, scored_end), steps, step)
              for p in day.phases() if day.start + p.start < scored_end]
    window = (max(day.window[0], day.start), min(day.window[1], scored_end))
    if window[0] < window[1]:
        phases.append(period(f"{NIGHT_WINDOW} window", *window, steps, step))
    return Report(day, end, step, steps, period("whole day", day.start, scored_end, steps, step), phases, facts)


def _num(value: float, digits: int = 0) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def _ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def markdown(report: Report, command: str) -> str:
    """report.md."""
    day, whole, facts = report.day, report.whole, report.facts
    started = datetime.fromtimestamp(day.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    spec = day.spec()
    rollouts = [d for d in facts.decisions if d.action != "Hold"]
    lines = [
        "# vllm-autotuner demo: one compressed day, tuned against static",
        "",
        f"`{command}` on {started}: 24 simulated hours in {day.duration:g} s of wall-clock time (one simulated "
        f"hour = {day.hour:g} s), the day starting at 06:00."
        + (" **Interrupted**: the numbers cover the day up to "
           f"{day.clock(report.end)}." if facts.interrupted else ""),
        "",
        f"Two identical Deployments of Llama-3-8B on simulated H100s, {REPLICAS} replicas each, "
        "started with vLLM's defaults (8192 batched tokens, 1024 sequences): "
        f"`{TUNED}` with a VllmTuning (Adaptive), `{STATIC}` without. Both got the same requests "
        "(the same seed).",
        "",
        "## Headline",
        "",
        "| | tuned | static | tuned / static |",
        "|---|---:|---:|---:|",
        f"| SLO goodput (tokens/s) | {_num(whole.goodput[TUNED])} | {_num(whole.goodput[STATIC])} | "
        f"**{_ratio(whole.ratio)}** |",
        f"| SLO attainment | {_pct(whole.attainment[TUNED])} | {_pct(whole.attainment[STATIC])} | |",
        f"| half hours with TTFT and ITL p95 within target | {_pct(whole.slo_met[TUNED])} | "
        f"{_pct(whole.slo_met[STATIC])} | |",
        f"| generated tokens/s | {_num(whole.generation[TUNED])} | {_num(whole.generation[STATIC])} | |",
        f"| rollouts (Deployment revision) | {len(rollouts)} ({facts.revisions.get(TUNED, '?')}) | "
        f"0 ({facts.revisions.get(STATIC, '?')}) | |",
        f"| requests sent / failed | {_requests(facts.load.get(TUNED))} | {_requests(facts.load.get(STATIC))} | |",
        "",
        "Failed requests are those a pod refused or cut off as a rolling restart stopped it, or that were sent to "
        "a pod that had just gone. The demo's vLLM drains as deploy/examples' does (a preStop sleep, then "
        "--shutdown-timeout lets what is in flight finish); without that, vLLM aborts what is in flight when its "
        "pod stops. Tokens a cut request produced count in the metrics, so the goodput above flatters the tuned "
        "Deployment by at most the failed share.",
        "",
        "## By part of the day",
        "",
        "| period | demo clock | SLO goodput tuned | static | ratio | attainment tuned / static | "
        "half hours within target tuned / static |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in report.phases:
        lines.append(f"| {p.name} | {day.clock(p.start)}-{day.clock(p.end)} | {_num(p.goodput[TUNED])} | "
                     f"{_num(p.goodput[STATIC])} | {_ratio(p.ratio)} | {_pct(p.attainment[TUNED])} / "
                     f"{_pct(p.attainment[STATIC])} | {_pct(p.slo_met[TUNED])} / {_pct(p.slo_met[STATIC])} |")
    lines += [
        "",
        "SLO goodput: generated tokens/s times SLO attainment, the estimated share of requests within both "
        "targets (see the end). Half hours within target: steps of half a simulated hour whose TTFT and ITL "
        "p95 both met the SLO, the way a p95 SLO is usually checked.",
        "",
        "![knobs against traffic](knobs.png)",
        "",
        "![TTFT and ITL p95 against the SLOs](latency.png)",
        "",
        "## The VllmTuning",
        "",
        f"SLO by day: TTFT p{QUANTILE * 100:g} <= {spec.slo.ttft.seconds:g} s, ITL p{QUANTILE * 100:g} <= "
        f"{spec.slo.itl.seconds * 1000:g} ms. Nightly window `{NIGHT_WINDOW}` "
        f"({day.clock(day.window[0])}-{day.clock(day.window[1])} on the demo clock, cron "
        f"`{spec.schedules[0].start}` to `{spec.schedules[0].end}` UTC): "
        f"TTFT <= {spec.schedules[0].slo.ttft.seconds:g} s, ITL <= {spec.schedules[0].slo.itl.seconds * 1000:g} ms, "
        f"{spec.schedules[0].bounds.max_num_batched_tokens.min} batched tokens. Observation window "
        f"{spec.traffic.window}, evaluated every {spec.traffic.evaluation_interval}, cooldown "
        f"{spec.rollout.cooldown}, settle time {spec.rollout.settle_time}.",
        "",
        "```yaml",
        yaml.safe_dump(day.tuning()["spec"], sort_keys=False).rstrip(),
        "```",
        "",
        "## What the operator decided",
        "",
    ]
    if rollouts:
        lines += ["| demo clock | decision | knobs | reason |", "|---|---|---|---|"]
        lines += [f"| {day.clock(d.time)} | {d.action} | {d.knobs} | {d.reason} |" for d in rollouts]
    else:
        lines.append("No change: every evaluation held.")
    holds = [d for d in facts.decisions if d.action == "Hold"]
    if holds:
        lines += ["", f"And {len(holds)} holds; the last of each hour:", "",
                  "| demo clock | knobs | reason |", "|---|---|---|"]
        lines += [f"| {day.clock(d.time)} | {d.knobs} | {d.reason} |" for d in _last_per_hour(holds, day)]
    if facts.events:
        lines += ["", "Events (`kubectl get events`):", "", "| demo clock | object | reason | message |",
                  "|---|---|---|---|"]
        lines += [f"| {_when(day, e['time'])} | {e['object']} | {e['reason']} | {e['message']} |" for e in facts.events]
    lines += [
        "",
        "## How SLO goodput is measured",
        "",
        (__doc__ or "").split("\n\n", 1)[1].split("\n\nThe same range")[0],
        "",
        f"Steps of {report.step:g} s; the queries (range queries, step {report.step:g} s) for `{TUNED}`:",
        "",
        "```promql",
        *(promql(name, TUNED, report.step) for name in QUERIES),
        "```",
        "",
        "`report.json` holds every query, its time range and the per-step numbers.",
        "",
    ]
    return "\n".join(lines)


def _when(day: DemoDay, t: float) -> str:
    return day.clock(t) if t >= day.start else "setup"


def _requests(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "n/a"
    failed = sum(summary["errors"].values()) + summary["dropped"] + summary["cut_off"]
    return f"{summary['sent']:,} / {failed:,} ({failed / max(summary['sent'], 1):.1%})"


def _last_per_hour(decisions: Sequence[Decision], day: DemoDay) -> list[Decision]:
    by_hour: dict[int, Decision] = {}
    for d in sorted(decisions, key=lambda d: d.time):
        by_hour[int(day.hours(d.time))] = d
    return list(by_hour.values())


def as_json(report: Report) -> dict[str, Any]:
    """report.json: the queries with their range and step, and every number in report.md."""
    first = report.steps[TUNED].times
    return {
        "start": report.day.start,
        "end": report.end,
        "duration": report.day.duration,
        "step": report.step,
        "range": {"start": first[0] if first else None, "end": first[-1] if first else None},
        "queries": {name: {kind: promql(kind, name, report.step) for kind in QUERIES} for name in DEPLOYMENTS},
        "slo_by_step": [slo_at(report.day.spec(), t - report.step / 2).model_dump(mode="json") for t in first],
        "headline": {"ratio": report.ratio, **asdict(report.whole)},
        "periods": [asdict(p) | {"ratio": p.ratio} for p in report.phases],
        "steps": {name: asdict(s) | {"knobs": [str(k) if k else None for k in s.knobs]}
                  for name, s in report.steps.items()},
        "decisions": [asdict(d) for d in report.facts.decisions],
        "events": report.facts.events,
        "revisions": report.facts.revisions,
        "load": report.facts.load,
        "interrupted": report.facts.interrupted,
    }


def write(report: Report, directory: Path, command: str) -> Path:
    """Write report.md, report.json and the charts into ``directory``; returns report.md's path."""
    from vllm_autotuner.sim.demo import charts  # matplotlib is slow to import: only when writing

    directory.mkdir(parents=True, exist_ok=True)
    charts.knobs(report, directory / "knobs.png")
    charts.latency(report, directory / "latency.png")
    (directory / "report.json").write_text(json.dumps(as_json(report), indent=1, allow_nan=True))
    path = directory / "report.md"
    path.write_text(markdown(report, command))
    return path
