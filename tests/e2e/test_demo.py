"""`make demo` at its shortest, end to end, on the session's control plane and Prometheus.

The demo is the README's first command, so it is run here the way a user
runs it, as a process (only the servers are the session's, through its
flags), and judged by what it leaves behind: a report, a tuned Deployment
that really rolled (a new ReplicaSet revision with other knobs than vLLM's
defaults), and numbers that Prometheus gives again when asked the report's
own queries.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from tests.support import Cluster

from vllm_autotuner.api import GROUP, PLURAL, VERSION
from vllm_autotuner.knobs import EngineArgs, find_vllm_container
from vllm_autotuner.observe.quantile import histogram_fraction_below
from vllm_autotuner.policy.model import request_itl_share
from vllm_autotuner.sim import localenv
from vllm_autotuner.sim.demo.plan import NAMESPACE, STATIC, TUNED

pytestmark = pytest.mark.e2e

REVISION = "deployment.kubernetes.io/revision"


@pytest.fixture(scope="module")
def demo(cluster: Cluster, prometheus: localenv.Prometheus, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One `sim demo --duration 3m` against the session's servers: its output, and where its report is."""
    report_dir = tmp_path_factory.mktemp("demo-report")
    result = subprocess.run(
        [sys.executable, "-m", "vllm_autotuner.cli", "sim", "demo", "--duration", "3m", "--report-dir", str(report_dir),
         "--kubeconfig", str(cluster.kubeconfig), "--prometheus-url", prometheus.url,
         "--prometheus-targets-dir", str(prometheus.targets_file.parent)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    return {"stdout": result.stdout, "dir": report_dir, "prometheus": prometheus.url}


def test_it_writes_the_report_and_prints_the_headline(demo: dict) -> None:
    report_dir: Path = demo["dir"]
    for chart in ("knobs.png", "latency.png"):
        assert (report_dir / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    markdown = (report_dir / "report.md").read_text()
    data = json.loads((report_dir / "report.json").read_text())
    printed = re.search(r"SLO goodput, tuned / static: ([0-9.]+)x", demo["stdout"])
    assert printed and float(printed.group(1)) == pytest.approx(data["headline"]["ratio"], abs=0.005)
    assert f"**{data['headline']['ratio']:.2f}x**" in markdown
    assert f"report: {report_dir / 'report.md'}" in demo["stdout"]
    assert "13:" in demo["stdout"] and ">>> operator: Change to" in demo["stdout"]  # the live view ran


def knobs_of(template: dict) -> tuple[int | None, int | None]:
    args = EngineArgs.from_container(find_vllm_container(template["spec"]))
    return args.max_num_batched_tokens, args.max_num_seqs


def test_the_tuned_deployment_was_retuned_through_a_real_rollout(demo: dict, cluster: Cluster) -> None:
    apps = client.AppsV1Api(cluster.api)
    tuned, static = (apps.read_namespaced_deployment(name, NAMESPACE) for name in (TUNED, STATIC))
    assert int(tuned.metadata.annotations[REVISION]) > 1
    assert int(static.metadata.annotations[REVISION]) == 1
    replicasets = [cluster.api.sanitize_for_serialization(rs)
                   for rs in apps.list_namespaced_replica_set(NAMESPACE).items
                   if rs.metadata.owner_references[0].name == TUNED]
    by_revision = {int(rs["metadata"]["annotations"][REVISION]): knobs_of(rs["spec"]["template"])
                   for rs in replicasets}
    assert by_revision[1] == (None, None)  # vLLM's defaults: no knob flags
    assert len(set(by_revision.values())) == len(by_revision) > 1  # each revision ran other knobs
    newest = max(by_revision)
    assert by_revision[newest] == knobs_of(cluster.api.sanitize_for_serialization(tuned.spec.template))
    report = json.loads((demo["dir"] / "report.json").read_text())
    changes = [d for d in report["decisions"] if d["action"] != "Hold"]
    assert len(changes) == newest - 1  # one revision per change the operator decided


def query_range(url: str, promql: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def share_within(rows: list[dict], target: float, t: float) -> float:
    """Share of a histogram's observations within ``target`` at time ``t``, from its bucket series."""
    buckets = sorted((float(row["metric"]["le"]), float(value)) for row in rows
                     for when, value in row["values"] if round(when, 3) == round(t, 3))
    return histogram_fraction_below(target, [b for b, _ in buckets], [c for _, c in buckets]) if buckets else math.nan


def test_the_reports_numbers_are_what_prometheus_answers(demo: dict, cluster: Cluster) -> None:
    report = json.loads((demo["dir"] / "report.json").read_text())
    start, end, step = report["range"]["start"], report["range"]["end"], report["step"]
    tuning = client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, TUNED)
    slos = [tuning["spec"]["slo"], tuning["spec"]["schedules"][0]["slo"]]
    assert all(slo in slos for slo in report["slo_by_step"])  # each step is judged by the tuning's day or night SLO
    means = {}
    for name in (TUNED, STATIC):
        queries = report["queries"][name]
        generation, requests = ({round(t, 3): float(v) for row in query_range(demo["prometheus"], queries[key], start,
                                                                               end, step) for t, v in row["values"]}
                                for key in ("generation", "requests"))
        ttft = query_range(demo["prometheus"], queries["ttft_buckets"], start, end, step)
        itl = query_range(demo["prometheus"], queries["itl_buckets"], start, end, step)
        expected = []
        for t, slo in zip(report["steps"][name]["times"], report["slo_by_step"], strict=True):
            tokens, done = generation.get(round(t, 3), 0.0), requests.get(round(t, 3), 0.0)
            # the decision core's estimate: TTFT share times the share of streams whose own ITL p95 is within target
            gaps = share_within(itl, slo["itl"]["seconds"], t)
            share = share_within(ttft, slo["ttft"]["seconds"], t) * (
                request_itl_share(slo["itl"]["quantile"], gaps, tokens / done) if done > 0 else math.nan)
            expected.append(tokens * share if not math.isnan(share) else 0.0)
        assert report["steps"][name]["goodput"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        means[name] = sum(expected) / len(expected)
        assert report["headline"]["goodput"][name] == pytest.approx(means[name], rel=1e-9)
    assert report["headline"]["ratio"] == pytest.approx(means[TUNED] / means[STATIC], rel=1e-9)
    markdown = (demo["dir"] / "report.md").read_text()
    assert f"| SLO goodput (tokens/s) | {means[TUNED]:,.0f} | {means[STATIC]:,.0f} |" in markdown
