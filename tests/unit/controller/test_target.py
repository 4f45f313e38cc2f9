"""A target the operator cannot tune is refused before anything is read from Prometheus or written to it.

One whole evaluation by the Reconciler, over a cache holding the tuning and
its Deployment and an API that records every call: the refusal must show as
the Ready condition and one Event, and the Deployment must not be touched.
Refused: a data-parallel engine, and knobs left to a ``--config`` file.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler

NAMESPACE, TUNING, DEPLOYMENT = "default", "chat", "llama"


class RecordingKube:
    """The API calls an evaluation makes, answered with nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, verb: str) -> Any:
        return lambda *args: self.calls.append((verb, args))


def evaluate(args: list[str]) -> tuple[Any, RecordingKube]:
    """One evaluation of a tuning whose Deployment runs vLLM with ``args``."""
    deployment = {
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "uid": "u1", "resourceVersion": "7", "generation": 1},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": args}]}}},
    }
    cache = ClusterCache()
    cache.bind({(NAMESPACE, DEPLOYMENT): [deployment]}, {})
    cache.on_tuning_event(None, {"metadata": {"namespace": NAMESPACE, "name": TUNING, "generation": 1},
                                 "spec": {"targetRef": {"name": DEPLOYMENT}}})
    kube = RecordingKube()
    reconciler = Reconciler(kube, cache, observations=None, metrics=OperatorMetrics(),  # type: ignore[arg-type]
                            settings=OperatorSettings(prometheus_url="http://prometheus.invalid"))
    report = asyncio.run(reconciler.evaluate((NAMESPACE, TUNING), 1_714_564_800.0))
    assert report is not None
    return report, kube


def assert_refused(report: Any, kube: RecordingKube, message: str) -> None:
    (ready,) = [c for c in report.state.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", events.INVALID_TARGET)
    assert ready.message.startswith(f"Deployment {NAMESPACE}/{DEPLOYMENT}: {message}"), ready.message
    assert report.state.current is None  # not adopted: nothing about its knobs is trusted
    assert [verb for verb, _ in kube.calls] == ["create_event", "patch_tuning_status"]  # no Deployment call
    assert kube.calls[0][1][0]["reason"] == events.INVALID_TARGET


def test_a_data_parallel_deployment_is_refused_as_an_invalid_target_and_left_alone():
    report, kube = evaluate(["--model=M", "-dp", "2", "--max-num-batched-tokens=4096", "--max-num-seqs=128"])
    assert_refused(report, kube, "-dp 2: ")
    assert "run one engine per pod" in report.state.conditions[0].message


def test_knobs_left_to_a_config_file_are_refused_saying_to_put_them_on_the_command_line():
    report, kube = evaluate(["--model=M", "--config", "/etc/vllm/serve.yaml", "--max-num-seqs=128"])
    assert_refused(report, kube, "vLLM reads --config /etc/vllm/serve.yaml, which may set --max-num-batched-tokens")
    assert "put --max-num-batched-tokens on the command line" in report.state.conditions[0].message
