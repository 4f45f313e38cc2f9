"""The packaging files agree with the code they package.

The chart, the plain manifests and the image are written by hand around the
operator; these checks keep the facts they repeat (the CRD, the version, the
metric names a dashboard queries, the image's entry point and pinned
dependencies) from drifting away from the code. What needs a server is in
tests/integration.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_autotuner.controller.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vllm-autotuner"
CRD = "vllmtunings.autotuner.vllm-tuning.io.yaml"
VLLM_SCRAPE = ROOT / "tests" / "unit" / "sim" / "data" / "vllm-metrics.txt"
LOCK = ROOT / "hack" / "operator-requirements.txt"
BUILD_LOCK = ROOT / "hack" / "build-requirements.txt"
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
# A metric name in PromQL: vLLM's carry a colon, the operator's a prefix.
METRIC = re.compile(r"(?:vllm:|vllm_autotuner_)[a-z0-9_:]+")


def test_the_chart_and_the_plain_manifests_carry_the_generated_crd_byte_for_byte() -> None:
    generated = (ROOT / "crds" / CRD).read_bytes()
    for copy in (CHART / "crds" / CRD, ROOT / "deploy" / "crds" / CRD):
        assert copy.read_bytes() == generated, f"{copy.relative_to(ROOT)} is stale: run `make crd`"


def test_the_chart_app_version_is_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == project["version"]


def _exposed_names() -> set[str]:
    """Every series name the operator's /metrics and a real vLLM server's /metrics expose."""
    names = set()
    for text in (VLLM_SCRAPE.read_text(), _operator_exposition()):
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
    return names


def _operator_exposition() -> str:
    metrics = OperatorMetrics()
    # Labelled families expose no series until a child exists: make one of each.
    metrics.decisions.labels("ns", "t", "Hold", "").inc()
    metrics.rollouts.labels("ns", "t", "Succeeded").inc()
    metrics.prometheus_errors.labels("unreachable").inc()
    metrics.api_calls.labels("get", "deployments").inc()
    metrics.api_call_seconds.labels("get", "deployments").observe(0.01)
    metrics.knobs.labels("ns", "t", "max_num_seqs").set(1)
    metrics.recommended.labels("ns", "t", "max_num_seqs").set(1)
    metrics.slot_wait("ns", "t", "2024-05-01T12:00:00Z")
    metrics.drain("ns", "t", 0, 1.0)
    return generate_latest(metrics.registry).decode()


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [a["expr"] for a in dashboard["annotations"]["list"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    exposed = _exposed_names()
    queried = {name for query in _dashboard_queries() for name in METRIC.findall(query)}
    assert queried - exposed == set()
    # What the dashboard is for: knobs, traffic, latency against the SLO, decisions, rollouts.
    for name in (
        "vllm_autotuner_knob",
        "vllm_autotuner_recommended_knob",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm_autotuner_decisions_total",
        "vllm_autotuner_rollouts_total",
    ):
        assert name in queried


def test_the_alerts_read_only_metrics_that_exist() -> None:
    # a renamed metric must break a test, not silently mute an alert
    alerted = set(METRIC.findall((CHART / "files" / "alerts.yaml").read_text()))
    assert "vllm_autotuner_rollouts_total" in alerted and alerted - _exposed_names() == set()


def test_the_image_runs_the_operator_as_a_non_root_user_from_the_tested_install() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    assert 'ENTRYPOINT ["vllm-autotuner", "run"]' in final_stage
    user = re.search(r"^USER (\d+):(\d+)$", final_stage, re.M)
    assert user and int(user.group(1)) > 0
    # The build stage installs with the script tests/integration/test_image.py runs.
    assert "RUN hack/install-operator.sh /opt/vllm-autotuner" in dockerfile
    # the chart pins no UID of its own (OpenShift's restricted-v2 SCC refuses one outside the namespace's range):
    # Kubernetes checks runAsNonRoot against the image's numeric user
    security = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert security["runAsNonRoot"] is True and "runAsUser" not in security and "runAsGroup" not in security


def _locked(lock: Path) -> dict[str, tuple[Version, int]]:
    """Each package of a lock: its pinned version and how many hashes pin its files."""
    entries = re.sub(r"\\\n", " ", lock.read_text()).splitlines()
    locked = {}
    for entry in filter(None, (line.split("#", 1)[0].strip() for line in entries)):
        requirement = Requirement(HASH.sub("", entry))
        pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        assert len(pins) == len(requirement.specifier) == 1, f"not pinned to one version: {entry}"
        locked[canonicalize_name(requirement.name)] = (Version(pins[0]), len(HASH.findall(entry)))
    return locked


def _assert_pinned_in_range_and_by_hash(requirements: list[str], lock: Path) -> set[str]:
    """Each requirement pinned in lock to a version it allows, every pin by hash; returns the names."""
    locked = _locked(lock)
    for requirement in map(Requirement, requirements):
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in {lock.name}: run `make lock`"
        version, _ = locked[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock.name} pins {name} {version}, outside pyproject's {requirement}: run `make lock`")
    unhashed = [name for name, (_, hashes) in locked.items() if hashes == 0]
    assert unhashed == [], f"pip's --require-hashes refuses entries without a hash: {unhashed}"
    return set(locked)


def test_the_image_lock_pins_every_runtime_dependency_in_its_range_and_by_hash() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = _assert_pinned_in_range_and_by_hash(project["dependencies"], LOCK)
    extras = {canonicalize_name(Requirement(r).name)
              for group in project["optional-dependencies"].values() for r in group}
    assert extras.isdisjoint(locked), "the image's lock must not carry the sim or test extras"


def test_the_build_lock_pins_the_build_backend_in_its_range_and_by_hash() -> None:
    # install-operator.sh builds the operator's wheel with what this lock pins (no build isolation).
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    _assert_pinned_in_range_and_by_hash(build_system["requires"], BUILD_LOCK)


def test_the_build_stage_gets_both_locks_the_install_script_reads() -> None:
    # No container engine runs here: a file left out of the build context or the COPY shows up
    # only in `docker build`.
    script = (ROOT / "hack" / "install-operator.sh").read_text()
    read = set(re.findall(r"hack/[\w.-]+", re.sub(r"(?m)^#.*$", "", script)))
    assert {str(lock.relative_to(ROOT)) for lock in (LOCK, BUILD_LOCK)} <= read
    needed = read | {"hack/install-operator.sh"}
    copy = re.search(r"^COPY (hack/\S+(?: hack/\S+)*) hack/$", (ROOT / "Dockerfile").read_text(), re.M)
    assert copy and needed <= set(copy.group(1).split())
    kept = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert needed <= kept
