"""The RestartLosesRequests advice an evaluation sends reads the pod template, its vLLM release and the last
window's requests, as the reconciler has them: a template that drains can still drain too briefly for what runs."""

from __future__ import annotations

from typing import Any

from tests.unit.policy.helpers import T0, knobs, status

from vllm_autotuner.api import ObservedTraffic
from vllm_autotuner.controller import events
from vllm_autotuner.controller.reconcile import Reconciler, Report, Target
from vllm_autotuner.knobs import EngineArgs


def target(*flags: str, image: str = "vllm/vllm-openai:v0.32.0", shell: str | None = None) -> Target:
    """The target's Deployment, its vLLM started with ``flags`` as the image's entrypoint's arguments, or (``shell``)
    by that shell's ``-c`` script."""
    args = ["--max-num-batched-tokens", "2048", "--max-num-seqs", "256", *flags]
    container: dict[str, Any] = {"name": "vllm", "image": image, "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                                 "args": args}
    if shell is not None:
        container["command"], container["args"] = [shell, "-c", " ".join(["vllm serve M", *args])], []
    deployment: dict[str, Any] = {"metadata": {"name": "llama", "namespace": "default"}, "spec": {"template": {
        "spec": {"terminationGracePeriodSeconds": 60, "containers": [container]}}}}
    engine = EngineArgs.from_container(container)
    return Target(deployment, container, engine, image, knobs(2048, 256), from_defaults=False, defaults_table=None,
                  replicaset=None, replicasets=[])


def advice(target: Target, running: float | None) -> list[str]:
    """The advice one evaluation sends, its last window 4 pods each running ``running`` requests, 13 ending a
    second in all (``running`` 20: each runs 6.2 s)."""
    observed = ObservedTraffic(window_start="2024-05-01T11:55:00Z", window_end="2024-05-01T12:00:00Z", pods=4,
                               request_rate=13.0, prompt_tokens_per_second=0.0, generation_tokens_per_second=0.0,
                               running=running)
    report = Report("default", "chat", status(observed=observed), 1, T0)
    Reconciler._warn_if_restarts_lose_requests(target, report, "rolling the pods")
    return [message for reason, message, kind in report.events
            if reason == events.RESTART_LOSES_REQUESTS and kind == events.WARNING]


def test_a_drain_of_45_s_is_enough_for_requests_of_6_s_but_not_for_requests_of_a_minute():
    draining = target("--shutdown-timeout=45")
    assert advice(draining, 20.0) == [] and advice(draining, None) == []
    (told,) = advice(draining, 195.0)  # 195 running in each of 4 pods at 13/s: 60 s each, 47% cut
    assert told.startswith("rolling the pods: --shutdown-timeout (45 s) is short beside the 60 s a request runs")
    assert "raise it to about 180 s" in told and "terminationGracePeriodSeconds to at least 185" in told


def test_a_vllm_too_old_for_the_flag_is_told_to_upgrade_and_one_new_enough_to_set_it():
    (old,) = advice(target(image="vllm/vllm-openai:v0.17.1"), 20.0)
    (new,) = advice(target(), 20.0)
    assert "upgrade to vLLM 0.18.0 or later" in old and "upgrade" not in new and "--shutdown-timeout=N" in new


def test_a_vllm_its_shell_keeps_the_sigterm_from_is_told_to_exec_and_its_drain_is_the_grace_period():
    ignored = target("--shutdown-timeout=45", shell="dash")
    assert ignored.drain_seconds == 55.0  # it serves to the kubelet's SIGKILL, 60 s after the deletion, 5 s slept
    (told,) = advice(ignored, 20.0)
    assert told.startswith("rolling the pods: the container's shell, `conda run` or `hatch run` runs vLLM as its")
    assert "exec" in told
    handed_on = target("--shutdown-timeout=45", shell="bash")  # bash runs a one-command script in its place
    assert handed_on.drain_seconds == 45.0 and advice(handed_on, 20.0) == []
