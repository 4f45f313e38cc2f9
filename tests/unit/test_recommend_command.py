"""``vllm-autotuner recommend``: what it takes from a manifest or from flags, and the errors that stop it before it
reads anything from the cluster (its evaluation against live data is in ``tests/e2e/test_recommend_and_manual``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_autotuner.api import API_VERSION, KIND
from vllm_autotuner.cli import main
from vllm_autotuner.controller.recommend import read_manifest

TUNING = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "chat"},
          "spec": {"targetRef": {"name": "llama"}, "prometheus": {"url": "http://prometheus:9090"}}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}}


def manifest(tmp_path: Path, *documents: dict) -> Path:
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


def test_the_tuning_of_a_manifest_is_read_with_its_namespace_or_the_one_given(tmp_path: Path) -> None:
    path = manifest(tmp_path, DEPLOYMENT, TUNING)  # the Deployment beside it, as in deploy/examples
    assert read_manifest(path, "inference") == ("inference", TUNING["spec"])
    placed = manifest(tmp_path, {**TUNING, "metadata": {"name": "chat", "namespace": "llm"}})
    assert read_manifest(placed, None)[0] == read_manifest(placed, "llm")[0] == "llm"


@pytest.mark.parametrize(
    ("documents", "namespace", "error"),
    [
        ((TUNING,), None, "names no namespace: give --namespace"),
        (({**TUNING, "metadata": {"name": "chat", "namespace": "llm"}},), "other",
         "is in namespace llm, not --namespace other"),
        ((TUNING, {**TUNING, "metadata": {"name": "rag"}}), "llm", "holds 2 VllmTunings"),
        (({**TUNING, "apiVersion": "autotuner.vllm-tuning.io/v1"},), "llm", "holds 0 VllmTunings"),
    ],
)
def test_a_manifest_without_one_placeable_tuning_is_refused(tmp_path: Path, documents: tuple, namespace: str | None,
                                                            error: str) -> None:
    with pytest.raises(ValueError, match=error):
        read_manifest(manifest(tmp_path, *documents), namespace)


@pytest.mark.parametrize(
    ("extra", "tuning", "error"),
    [
        (["--ttft", "1"], TUNING, "-f takes the target, SLO and window from the manifest: drop --ttft"),
        ([], {**TUNING, "spec": {"targetRef": {"name": "llama"}}}, "sets no spec.prometheus.url: give --prometheus"),
        ([], {**TUNING, "spec": {**TUNING["spec"], "slo": {"itl": {"seconds": -1}}}},
         "not a valid VllmTuning spec: .*slo.itl.seconds"),
    ],
)
def test_the_command_stops_before_any_request_on_what_it_cannot_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], tuning: dict, error: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["recommend", "-f", str(manifest(tmp_path, tuning)), "--namespace", "llm", *extra])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert re.search(error, err, re.DOTALL), err


def test_without_a_manifest_the_deployment_and_prometheus_are_needed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["recommend", "--namespace", "llm", "--ttft", "1"])
    assert "give -f MANIFEST, or --deployment, --prometheus" in capsys.readouterr().err
