"""Recommend mode changes nothing; a person's edit of the knobs is adopted, not fought.

Under the overload of the chat test the policy wants more sequences. In
Recommend mode that want must show in the status and an Event only: the Deployment
keeps its generation and resourceVersion (nothing, not even an annotation,
was written to it). Then a person edits the args and the tuning is switched
to Auto: the operator must adopt the person's knobs as ``source: Manual``
and respect them for the cooldown, though the traffic still calls for a
change; its hold saying "cooldown" is the proof that it wanted to and
did not. An operator run with ``--recommend-only`` treats a tuning in
mode Auto the same way: a schedule preset wanted now is only recommended,
and rolls out once an operator without the flag takes over. The same
tuning's manifest, given to ``vllm-autotuner recommend -f`` before it is
applied, wants the same more sequences and writes nothing either.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.e2e.world import Load, World, knob_args, knobs_of, open_window, parse_time, tuning_spec
from tests.support import H100, Cluster, NotYet, Operators, wait_for

from vllm_autotuner.api import API_VERSION, KIND
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.e2e

START, MANUAL, PRESET = (512, 16), (1024, 16), (8192, 128)
RECOMMENDED = re.compile(r"change to (tokens=\d+ seqs=\d+) recommended")
PRINTED = re.compile(r"^recommended: tokens=\d+ seqs=(\d+)", re.MULTILINE)
COOLDOWN = 120


def test_recommend_mode_only_reports_and_a_persons_edit_is_adopted_and_not_reverted(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators,
        tmp_path: Path) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*START), replicas=2)
    untouched = world.deployment().metadata
    world.create_tuning(tuning_spec(world.name, mode="Recommend", rollout={"cooldown": f"{COOLDOWN}s"}))
    operator = operators.start()

    with Load(world, tmp_path, rate=18):
        recommendation = wait_for(lambda: world.status().get("recommendation"), 150, "a recommendation")
        assert recommendation["maxNumSeqs"] > START[1] and "Recommend mode" in recommendation["reason"]
        assert world.history()[-1]["action"] == "Hold"
        wait_for(lambda: operator.metric("vllm_autotuner_decisions_total", reason="RecommendOnly") >= 3, 60,
                 "three evaluations recommending")
        # An Event per new recommendation, not per evaluation: consecutive ones name different knobs.
        recommended = [RECOMMENDED.search(e.message).group(1) for e in world.events("Recommendation")]
        assert recommended and all(a != b for a, b in zip(recommended, recommended[1:])), recommended
        # these pods abort what is in flight as they stop: a recommendation says what applying it would cost them
        lost = wait_for(lambda: world.events("RestartLosesRequests"), 30, "a RestartLosesRequests Event")
        assert all(e.type == "Warning" and "applying tokens=" in e.message and "--shutdown-timeout" in e.message
                   for e in lost), [e.message for e in lost]
        # the tuning's manifest as a team would write it before applying it (mode Auto): the command evaluates
        # it in mode Recommend, from the same window of the same traffic
        manifest = tmp_path / "tuning.yaml"
        manifest.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "planned"},
                                            "spec": tuning_spec(world.name, rollout={"cooldown": f"{COOLDOWN}s"})}))
        printed = subprocess.run(
            [sys.executable, "-m", "vllm_autotuner.cli", "recommend", "-f", str(manifest), "--namespace", namespace,
             "--prometheus", operators.prometheus_url],
            env={**os.environ, "KUBECONFIG": str(cluster_with_crd.kubeconfig)}, capture_output=True, text=True,
            timeout=120, check=False)
        assert printed.returncode == 0, printed.stdout + printed.stderr
        seqs = PRINTED.search(printed.stdout)
        assert seqs is not None and int(seqs.group(1)) > START[1], printed.stdout
        assert "restarts:    applying tokens=" in printed.stdout, printed.stdout
        deployment = world.deployment().metadata
        assert (deployment.generation, deployment.resource_version) == (untouched.generation,
                                                                        untouched.resource_version)
        assert "lastRollout" not in world.status() and world.has_condition("Ready", "True", "Recommending")
        assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0

        # A person raises the token budget by hand, then lets the operator act.
        world.apps.patch_namespaced_deployment(world.name, namespace, {"spec": {"template": {"spec": {
            "containers": [{"name": "vllm", "args": knob_args(*MANUAL)}]}}}})
        world.patch_tuning({"mode": "Auto"})
        adopted = wait_for(lambda: (c := world.status().get("current") or {}).get("source") == "Manual" and c, 60,
                           "the person's knobs adopted")
        assert (adopted["maxNumBatchedTokens"], adopted["maxNumSeqs"]) == MANUAL
        assert len(world.events("ManualChangeAdopted")) == 1
        cooling = wait_for(lambda: "cooldown" in (h := world.history()[-1])["reason"] and h, COOLDOWN,
                           "the traffic policy to want a change and wait for the cooldown")
    assert (parse_time(cooling["time"]) - parse_time(adopted["since"])).total_seconds() < COOLDOWN
    assert "lastRollout" not in world.status()
    assert world.deployment().metadata.generation == untouched.generation + 1  # the person's edit only
    assert knobs_of(world.template_args()) == MANUAL
    assert operator.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0


def test_with_recommend_only_an_auto_tuning_only_recommends_until_the_operator_runs_without_it(
        cluster_with_crd: Cluster, namespace: str, fleet: localenv.Fleet, operators: Operators) -> None:
    world = World(cluster_with_crd, namespace)
    world.create_deployment(H100, knob_args(*START), replicas=1)
    untouched = world.deployment().metadata
    preset = {"maxNumBatchedTokens": PRESET[0], "maxNumSeqs": PRESET[1]}
    world.create_tuning(tuning_spec(world.name, schedules=[open_window("Europe/Berlin", preset)]))  # mode Auto
    dry = operators.start("dry", None, "--recommend-only")

    def recommending() -> dict | NotYet:
        ready = world.has_condition("Ready", "True", "Recommending")
        return ready if ready and "tokens=8192 seqs=128 recommended" in ready["message"] else NotYet(f"{ready}")

    ready = wait_for(recommending, 60, "the preset recommended")
    assert "--recommend-only" in ready["message"], ready
    assert world.status()["recommendation"]["maxNumBatchedTokens"] == PRESET[0]
    assert world.history()[-1]["hold"] == "RecommendOnly"
    deployment = world.deployment().metadata
    assert (deployment.generation, deployment.resource_version) == (untouched.generation, untouched.resource_version)
    assert dry.metric("vllm_autotuner_kubernetes_api_calls_total", verb="patch", resource="deployments") == 0
    assert dry.stop() == 0

    operators.start("acting")
    world.wait_rolled_out(knob_args(*PRESET), 90)
