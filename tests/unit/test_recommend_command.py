"""``vllm-autotuner recommend``: what it takes from a manifest or from flags, and the errors that stop it before it
reads anything from the cluster (its evaluation against live data is in ``tests/e2e/test_recommend_and_manual``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_autotuner.api import API_VERSION, KIND, SLO, LatencyTarget, TrafficSpec, VllmTuningSpec
from vllm_autotuner.cli import main
from vllm_autotuner.controller import recommend as recommend_module
from vllm_autotuner.controller.recommend import read_manifest
from vllm_autotuner.controller.reconcile import OperatorSettings

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
        (["--prometheus", "http://p:9090", "--prometheus-ca-file", "/ca.pem"], TUNING,
         "sets spec.prometheus.url, reached with spec.prometheus's own headers and credentials as the operator "
         "would: drop --prometheus, --prometheus-ca-file"),
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


class _Evaluated(Exception):
    """Raised in place of the evaluation: the spec the flags made is all these tests look at."""


@pytest.mark.parametrize(
    ("flags", "ttft", "itl", "window"),
    [
        ([], SLO().ttft, SLO().itl, TrafficSpec().window),
        (["--quantile", "0.9"], LatencyTarget(quantile=0.9, seconds=SLO().ttft.seconds),
         LatencyTarget(quantile=0.9, seconds=SLO().itl.seconds), TrafficSpec().window),
        (["--itl", "0.05", "--window", "10m"], SLO().ttft, LatencyTarget(quantile=SLO().itl.quantile, seconds=0.05),
         "10m"),
    ],
)
def test_the_flag_form_leaves_what_it_is_not_given_to_the_specs_defaults(
        monkeypatch: pytest.MonkeyPatch, flags: list[str], ttft: LatencyTarget, itl: LatencyTarget,
        window: str) -> None:
    evaluated: list[VllmTuningSpec] = []

    async def evaluate(namespace: str, spec: dict, settings: OperatorSettings) -> None:
        evaluated.append(VllmTuningSpec.model_validate(spec))
        raise _Evaluated

    monkeypatch.setattr(recommend_module, "recommend", evaluate)
    with pytest.raises(_Evaluated):
        main(["recommend", "--namespace", "llm", "--deployment", "llama", "--prometheus", "http://p:9090", *flags])
    (spec,) = evaluated
    assert (spec.target_ref.name, spec.slo.ttft, spec.slo.itl, spec.traffic.window) == ("llama", ttft, itl, window)


def test_prometheus_is_reached_with_the_headers_and_credential_files_an_operator_takes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a Prometheus behind a login or tenants (Mimir's X-Scope-OrgID, OpenShift's Thanos Querier) for a laptop's
    # one-shot evaluation, as `run` takes them for the operator's Prometheus
    used: list[OperatorSettings] = []

    async def evaluate(namespace: str, spec: dict, settings: OperatorSettings) -> None:
        used.append(settings)
        raise _Evaluated

    monkeypatch.setattr(recommend_module, "recommend", evaluate)
    with pytest.raises(_Evaluated):
        main(["recommend", "-f", str(manifest(tmp_path, {**TUNING, "spec": {"targetRef": {"name": "llama"}}})),
              "--namespace", "llm", "--prometheus", "https://thanos:9091", "--prometheus-header",
              "X-Scope-OrgID=team-a", "--prometheus-header", "X-Extra=1", "--prometheus-bearer-token-file", "/t",
              "--prometheus-ca-file", "/ca.pem"])
    assert used == [OperatorSettings(prometheus_url="https://thanos:9091",
                                     prometheus_headers=(("X-Extra", "1"), ("X-Scope-OrgID", "team-a")),
                                     prometheus_bearer_token_file="/t", prometheus_ca_file="/ca.pem")]


def test_the_flag_forms_help_names_the_specs_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["recommend", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    slo = SLO()
    for default in (f"TTFT target in seconds (without -f; default {slo.ttft.seconds})",
                    f"inter-token latency target in seconds (without -f; default {slo.itl.seconds})",
                    f"SLO quantile (without -f; default {slo.ttft.quantile})",
                    f"observation window (without -f; default {TrafficSpec().window})"):
        assert default in text
    assert slo.ttft.quantile == slo.itl.quantile  # one --quantile stands for both
