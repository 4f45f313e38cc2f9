"""The family queries evaluated by Prometheus' own engine (``promtool test rules``) over a pod scraped twice.

A pod that two scrape jobs take (a chart's kubernetes-pods and kubernetes-service-endpoints, overlapping
PodMonitors, an HA pair of Prometheus servers behind a querier that does not deduplicate them) has every series
twice, differing in job and instance alone: its rates, gauges and buckets must read as those of a pod scraped once,
batched and per tuning, also where one copy began late in the window (its job, or one of the pair, was down), while
the parts of a count that vLLM tells apart by a label of its own (admission rejections by queue limit) still add up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.integration.test_alerts import promtool

from vllm_autotuner.observe.queries import FAMILIES, Family, Kind, PodMatch, Selector, family_query, pod_matchers

pytestmark = pytest.mark.integration

SELECTOR = Selector(namespace_label="kubernetes_namespace", pod_label="kubernetes_pod_name")
TWICE, ONCE = "llama-abc-1", "llama-abc-2"
JOBS = {TWICE: ("kubernetes-pods", "kubernetes-service-endpoints"), ONCE: ("kubernetes-pods",)}
SUMMED = [f for f in FAMILIES if f.kind in (Kind.RATE, Kind.BUCKETS, Kind.AVERAGE)]
#: Per series, scraped each minute: a counter that counts 1 a second, a gauge of 0.7; a histogram's buckets count
#: half its observations at or under 0.5
COUNTER, GAUGE, BUCKETS = "0+60x10", "0.7x10", {"0.5": "0+30x10", "+Inf": "0+60x10"}
REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")  # vllm:admission_rejections_total's, 0.1 a second each
#: The minute a late copy's first sample is scraped at: two minutes into the 5-minute window that ends at 10m, so
#: its rate reads 0.7 of the whole copy's (the 3 minutes it saw, and half a scrape interval extrapolated)
LATE = 7


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def _begun_late(values: str) -> str:
    """A counter's ``start+stepx10`` or a gauge's ``valuex10`` (a sample a minute), without its samples before
    minute ``LATE``."""
    start, _, step = values.removesuffix("x10").partition("+")
    if not step:
        return f"_x{LATE} {start}x{10 - LATE}"
    return f"_x{LATE} {float(start) + LATE * float(step):g}+{step}x{10 - LATE}"


def _series(family: Family, late: bool) -> dict[str, str]:
    """The family's newest metric, and a part's counter, of both pods as each of their jobs scrapes them; where
    ``late``, the second job's copy begins late in the window."""
    out: dict[str, str] = {}
    for pod, jobs in JOBS.items():
        for job in jobs:
            copy: dict[str, str] = {}
            scrape = {"kubernetes_namespace": "llm", "kubernetes_pod_name": pod, "job": job,
                      "instance": f"10.0.0.1:{8000 + len(job)}", "engine": "0", "model_name": "llama",
                      **dict(family.match)}
            if family.kind is Kind.BUCKETS:
                copy.update({f"{family.metrics[0]}{_labels({**scrape, 'le': le})}": v for le, v in BUCKETS.items()})
            elif family.part_label is not None:
                copy[f"{family.metrics[0]}{_labels({**scrape, family.part_label: 'stop'})}"] = COUNTER
            else:
                copy[f"{family.metrics[0]}{_labels(scrape)}"] = COUNTER if family.kind is Kind.RATE else GAUGE
            for part in family.parts:
                if part.counter is not None:
                    copy.update({f"{part.counter}{_labels({**scrape, 'reason': r})}": "0+6x10" for r in REASONS})
            late_copy = late and job != jobs[0]
            out.update({series: _begun_late(values) if late_copy else values for series, values in copy.items()})
    return out


def _expected(family: Family, pods: tuple[str, ...]) -> list[dict]:
    """What a pod scraped once reads, for each of ``pods``."""
    rows: list[tuple[dict[str, str], float]]
    if family.kind is Kind.BUCKETS:
        rows = [({"le": "0.5"}, 0.5), ({"le": "+Inf"}, 1.0)]
    elif family.part_label is not None:
        rows = [({family.part_label: "stop"}, 1.0), ({family.part_label: "refused"}, 0.2)]
    else:
        rows = [({}, 1.0 if family.kind is Kind.RATE else 0.7)]
    return [{"labels": _labels({"kubernetes_namespace": "llm", "kubernetes_pod_name": pod, **extra}), "value": value}
            for pod in pods for extra, value in rows]


@pytest.mark.parametrize("late", [False, True], ids=["whole", "a-copy-begun-late"])
def test_a_pod_scraped_by_two_jobs_reads_as_one_scraped_once(tmp_path: Path, late: bool) -> None:
    series: dict[str, str] = {}
    checks = []
    tuning = pod_matchers(SELECTOR, "llm", PodMatch(names=(TWICE,)))
    for family in SUMMED:
        series.update(_series(family, late))
        checks.append({"expr": family_query(family, SELECTOR, 300), "eval_time": "10m",
                       "exp_samples": _expected(family, (TWICE, ONCE))})
        checks.append({"expr": family_query(family, SELECTOR, 300, tuning), "eval_time": "10m",
                       "exp_samples": _expected(family, (TWICE,))})
    tests = tmp_path / "family_queries_test.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "promql_expr_test": checks}]}, width=1000))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
