"""A changed pod template is resumed as the operator's own rollout only when it is a write the status never saw.

A restarted operator that finds the template's knobs differ from its status
must tell its own patch whose status write was lost (resume it) from an
older template put back by a person (``kubectl rollout undo``, a GitOps
revert: adopt it as Manual). Both carry the operator's annotations, so only
the time of the write tells them apart. A lost write of our rollback of a
failed rollout still records the failed config. A rollout into a Deployment
scaled to zero starts no pod, so it stays unverified until one starts it, and
is then judged (and rolled back) like any other. Here the status is built by the
policy's own lifecycle functions and the template by the operator's own
patch builder, and ``Reconciler._track_rollout`` judges them as a fresh
operator process would: no cluster is needed for a template already read.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.policy.helpers import T0, knobs, spec, status
from tests.unit.policy.test_decide import NIGHT, quietly
from tests.unit.test_rollout_pure import merge, wrote
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.api import (
    ConditionType,
    DecisionAction,
    Knobs,
    KnobSource,
    RolloutPhase,
    VllmTuningSpec,
    VllmTuningStatus,
)
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache, deployment_index
from vllm_autotuner.controller.conditions import condition
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report, Target
from vllm_autotuner.knobs import AssumedDefaults, EngineArgs
from vllm_autotuner.policy import adopt_generation, awaiting_verdict, rollout_succeeded
from vllm_autotuner.policy.guardrails import DEFAULT_RESTART_SECONDS, failed_configs, restart_seconds
from vllm_autotuner.policy.decision import with_rollout
from vllm_autotuner.rollout.patch import REASON_LIMIT, baseline_annotation, knob_patch

TUNING = "chat"
SPEC = spec()
A, B, C, D, E = knobs(8192, 1024), knobs(4096, 512), knobs(2048, 256), knobs(2048, 128), knobs(1024, 64)
#: vLLM's defaults as read before a pod had a node (A), and once its GPU is known (C).
ASSUMED = AssumedDefaults(A, "GPU memory unknown, >= 70 GiB assumed: 8192 tokens / 1024 seqs")
KNOWN = AssumedDefaults(C, "GPU with 24 GiB (< 70): 2048 tokens / 256 seqs")


def args(of: Knobs | None) -> list[str]:
    """The knob flags that set ``of``; none (vLLM's defaults) for None."""
    if of is None:
        return []
    return ["--max-num-batched-tokens", str(of.max_num_batched_tokens), "--max-num-seqs", str(of.max_num_seqs)]


def deployment(start: Knobs | None) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "default", "uid": "u1", "resourceVersion": "1", "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": "llama"}}, "template": {"metadata": {"annotations": {}}, "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "args": args(start)}]}}},
    }


def patched(
    deployment: dict[str, Any], to: Knobs, at: datetime, source: KnobSource = KnobSource.TRAFFIC,
    baseline: str | None = None,
) -> dict[str, Any]:
    """The Deployment once the operator's patch to ``to`` at ``at`` (against ``baseline``) is merged in (as the
    apiserver would)."""
    patch = knob_patch(deployment, None, to, f"to {to}", TUNING, str(source), at, None, baseline)["spec"]["template"]
    out = copy.deepcopy(deployment)
    template = out["spec"]["template"]
    template["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    (container,) = patch["spec"]["containers"]
    template["spec"]["containers"][0]["args"] = container["args"]
    out["metadata"]["generation"] += 1
    return out


def edited(deployment: dict[str, Any], to: Knobs) -> dict[str, Any]:
    """A person's edit of the args (``kubectl edit``): the annotations stay as the operator left them."""
    out = copy.deepcopy(deployment)
    out["spec"]["template"]["spec"]["containers"][0]["args"] = args(to)
    out["metadata"]["generation"] += 1
    return out


def undone(deployment: dict[str, Any], to_revision: dict[str, Any]) -> dict[str, Any]:
    """``kubectl rollout undo``: an older revision's pod template, annotations and all, copied back."""
    out = copy.deepcopy(deployment)
    out["spec"]["template"] = copy.deepcopy(to_revision["spec"]["template"])
    out["metadata"]["generation"] += 1
    return out


RS_UID = "rs-uid"
TUNING_UID = "tuning-uid"
OWNED = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-7f8b", "uid": RS_UID, "controller": True}]
"""The ownerReferences of the new ReplicaSet's pods."""


class Kube:
    """The API calls judging a rollout makes: the new ReplicaSet's pods, and the patch of a rollback."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.patches: list[dict[str, Any]] = []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.pods

    def read_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace, "uid": TUNING_UID, "generation": 1}}

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return {"metadata": {"generation": 99}, "spec": {"template": {}}}  # the template is not read back here


def target_of(deployment: dict[str, Any], watched: bool, defaults: AssumedDefaults = ASSUMED) -> Target:
    """The target as an evaluation finds it, a knob flag it lacks read from ``defaults``; with its new ReplicaSet
    where ``watched``."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    engine = EngineArgs.from_container(container)
    read, from_defaults = engine.effective(defaults)
    replicaset = {"metadata": {"name": "llama-7f8b", "uid": RS_UID, "labels": {"pod-template-hash": "7f8b"}},
                  "status": {}}
    return Target(deployment, container, engine, container.get("image"), read, from_defaults=from_defaults,
                  defaults_table=defaults.table if from_defaults else None,
                  replicaset=replicaset if watched else None, replicasets=[])


def process(cache: ClusterCache | None = None) -> Reconciler:
    """The reconciler of an operator process that has judged nothing yet."""
    return Reconciler(kube=None, cache=cache or ClusterCache(), observations=None,  # type: ignore[arg-type]
                      metrics=OperatorMetrics(), settings=OperatorSettings())


def track(state: VllmTuningStatus, deployment: dict[str, Any], now: datetime, kube: Kube | None = None,
          generation: int = 1, the_spec: VllmTuningSpec = SPEC,
          cache: ClusterCache | None = None, defaults: AssumedDefaults = ASSUMED,
          reconciler: Reconciler | None = None) -> Report:
    """One evaluation's look at the target, by an operator that knows only ``state`` (and what ``cache`` holds),
    reading a knob flag the template lacks from ``defaults``; by ``reconciler``, one that has judged before."""
    report = Report("default", TUNING, state, generation, now, uid=TUNING_UID)
    reconciler = reconciler or process(cache)
    reconciler.kube = kube  # type: ignore[assignment]
    asyncio.run(reconciler._track_rollout(the_spec, target_of(deployment, kube is not None, defaults), report))
    return report


def outcomes(report: Report) -> list[str]:
    """The outcomes of the verdicts an evaluation reached, to be counted in rollouts_total."""
    return [verdict.outcome for verdict in report.finished]


def two_rollouts() -> tuple[VllmTuningStatus, dict[str, Any], dict[str, Any]]:
    """A -> B at T0, B -> C at T0+1h, both live: the status, the revision that ran B, and the Deployment now."""
    state, initial = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2)), deployment(A)
    revision_b = patched(initial, B, T0)
    state = rollout_succeeded(with_rollout(state, T0, B, KnobSource.TRAFFIC, f"to {B}"), T0 + timedelta(minutes=3))
    later = T0 + timedelta(hours=1)
    now = patched(revision_b, C, later)
    state = rollout_succeeded(with_rollout(state, later, C, KnobSource.TRAFFIC, f"to {C}"),
                              later + timedelta(minutes=3))
    return state, revision_b, now


def test_undo_to_the_previous_revision_is_adopted_as_a_persons_change():
    state, revision_b, live = two_rollouts()
    assert state.last_rollout is not None and state.last_rollout.from_knobs == B  # undo restores exactly this

    report = track(state, undone(live, revision_b), T0 + timedelta(hours=2))

    assert report.state.current is not None
    assert (report.state.current.knobs, report.state.current.source) == (B, KnobSource.MANUAL)
    assert [reason for reason, _, _ in report.events] == [events.MANUAL_CHANGE]
    assert report.state.last_rollout == state.last_rollout  # no rollout of ours resumed


def from_defaults(state: VllmTuningStatus, table: str = ASSUMED.table) -> VllmTuningStatus:
    """``state`` with its current knobs read from vLLM's defaults table ``table`` (a template without knob flags)."""
    assert state.current is not None
    return state.model_copy(update={"current": state.current.model_copy(
        update={"from_defaults": True, "defaults_table": table})})


@pytest.mark.parametrize("flags", [True, False], ids=["knob flags", "vLLM's defaults"])
def test_our_first_rollout_undone_midway_is_a_revert_whether_the_template_set_the_knobs_or_not(flags):
    # `kubectl rollout undo`, or a GitOps self-heal to the manifest, while our first change rolls out: the template
    # put back leaves the knobs to vLLM (read as A) or sets A. Either is a person's revert, adopted as Manual and
    # counted; a template without flags is no GPU known better, or the rollout would stay in progress for ever.
    initial = deployment(A if flags else None)
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    state = with_rollout(state if flags else from_defaults(state), T0, B, KnobSource.TRAFFIC, f"to {B}")

    report = track(state, undone(patched(initial, B, T0), initial), T0 + timedelta(minutes=2))

    current, rollout = report.state.current, report.state.last_rollout
    assert current is not None and rollout is not None
    assert (current.knobs, current.source, current.from_defaults) == (A, KnobSource.MANUAL, not flags)
    assert current.defaults_table == (None if flags else ASSUMED.table)
    assert (rollout.phase, rollout.message) == (RolloutPhase.FAILED, "superseded by a manual change")
    assert [reason for reason, _, _ in report.events] == [events.MANUAL_CHANGE]
    assert len(report.state.reverts) == 1


def test_defaults_known_better_correct_the_current_knobs_and_a_flag_set_meanwhile_is_a_change():
    # the same template without knob flags, read once a pod's node tells its GPU: C, not the A first assumed
    state = from_defaults(status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2)))
    live = deployment(None)

    resolved = track(state, live, T0, defaults=KNOWN)

    assert state.current is not None and resolved.state.current is not None
    assert resolved.state.current == state.current.model_copy(
        update={"max_num_batched_tokens": 2048, "max_num_seqs": 256, "defaults_table": KNOWN.table})
    assert resolved.events == []
    # a person sets --max-num-seqs 128 meanwhile: the budget is still vLLM's, but the template is not the same
    edit = copy.deepcopy(live)
    edit["spec"]["template"]["spec"]["containers"][0]["args"] = ["--max-num-seqs", "128"]
    changed = track(state, edit, T0, defaults=KNOWN)
    assert changed.state.current is not None
    assert (changed.state.current.knobs, changed.state.current.source) == (D, KnobSource.MANUAL)
    assert changed.state.current.defaults_table == KNOWN.table
    assert [reason for reason, _, _ in changed.events] == [events.MANUAL_CHANGE]


def test_an_edit_is_adopted_naming_its_writer_as_the_apiserver_recorded_it():
    state, _, live = two_rollouts()
    at = T0 + timedelta(hours=2)
    edit = edited(live, E)
    edit["metadata"]["managedFields"] = [
        wrote("OpenAPI-Generator", "Update", utc_timestamp(T0 - timedelta(hours=3)), vllm=["f:image"]),
        wrote("vllm-autotuner", "Update", utc_timestamp(T0 + timedelta(hours=1)), vllm=[]),
        wrote("kubectl-edit", "Update", utc_timestamp(at), vllm=["f:args"])]
    (seen,) = deployment_index("default", "llama", edit).values()  # as the watch's cache keeps it

    report = track(state, seen, at + timedelta(seconds=20))

    assert report.state.current is not None and report.state.current.source == KnobSource.MANUAL
    ((reason, message, _),) = report.events
    assert reason == events.MANUAL_CHANGE and f"to {E} by kubectl-edit;" in message, message
    assert report.state.history[-1].reason == f"knobs changed by kubectl-edit to {E}: adopted as Manual"


def test_a_patch_whose_status_write_was_lost_is_resumed_as_ours():
    state, _, live = two_rollouts()
    at = T0 + timedelta(hours=2)

    report = track(state, patched(live, D, at, KnobSource.SCHEDULE), at + timedelta(seconds=30))

    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source, rollout.phase) == (
        D, KnobSource.SCHEDULE, RolloutPhase.IN_PROGRESS)
    assert rollout.started_at == "2024-05-01T14:00:00Z"  # when it was written, not when it was found
    assert report.state.current is not None and report.state.current.source == KnobSource.TRAFFIC
    assert report.events == []


@pytest.mark.parametrize(("annotated", "baseline"), [
    (baseline_annotation("chat-medium", 0.93, 2.5), ("chat-medium", 0.93, 2.5)),
    (baseline_annotation(None, 0.5, None), (None, 0.5, None)),
    ('{"regime":"chat","baselineAttainment":1.5}', (None, None, None)),  # edited by hand: no baseline, no failure
    ('{"regime":"chat","baselineAttainment":NaN}', (None, None, None)),
    ('{"regime":7,"baselineAttainment":0.9}', (None, None, None)),
    ('{"baselineAttainment":true}', (None, None, None)),
    ('{"baselineAttainment":0.9,"baselineRequestRate":-1}', (None, None, None)),
    ("[0.9]", (None, None, None)),
    ("0.9 of requests", (None, None, None)),
    ('{"baselineAttainment":1' + "0" * 400 + "}", (None, None, None)),  # no float holds it
    ("[" * 1020, (None, None, None)),  # nested past the parser's recursion, within the length read
    ('{"regime":"' + "r" * 64 + '","baselineAttainment":0.9}', (None, None, None)),  # longer than a tier's name
])
def test_a_change_whose_status_write_was_lost_is_resumed_with_the_baseline_annotated_with_it(annotated, baseline):
    """The regime and baseline ``decide`` measured go into the template with the change: a change found there with
    its status write lost (an operator restarted; a write the apiserver committed after its timeout) is still
    checked for a regression. One that does not read as a baseline is none."""
    state, _, live = two_rollouts()
    at = T0 + timedelta(hours=2)
    report = track(state, patched(live, D, at, baseline=annotated), at + timedelta(seconds=30))
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.phase) == (D, RolloutPhase.IN_PROGRESS)
    assert (rollout.regime, rollout.baseline_attainment, rollout.baseline_request_rate) == baseline


def test_a_lost_write_a_person_overrode_and_then_put_back_is_the_persons():
    state, _, live = two_rollouts()
    at = T0 + timedelta(hours=2)
    lost = patched(live, D, at)  # newer than the status's last rollout, but a person edits it before we look
    state = track(state, edited(lost, E), at + timedelta(seconds=20)).state
    assert state.current is not None and (state.current.knobs, state.current.source) == (E, KnobSource.MANUAL)

    report = track(state, undone(edited(lost, E), lost), at + timedelta(minutes=5))

    assert report.state.current is not None
    assert (report.state.current.knobs, report.state.current.source) == (D, KnobSource.MANUAL)
    assert [reason for reason, _, _ in report.events] == [events.MANUAL_CHANGE]


def test_a_rollback_whose_status_write_was_lost_still_records_the_failed_config():
    state, initial = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2)), deployment(A)
    state = with_rollout(state, T0, B, KnobSource.TRAFFIC, f"to {B}")  # written, B crash-loops
    rolled_back = patched(patched(initial, B, T0), A, T0 + timedelta(minutes=10), KnobSource.ROLLBACK)

    report = track(state, rolled_back, T0 + timedelta(minutes=11))  # the status never heard of the rollback

    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 512)]
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source, rollout.phase) == (
        A, KnobSource.ROLLBACK, RolloutPhase.IN_PROGRESS)
    assert rollout.deployment_generation == rolled_back["metadata"]["generation"]
    assert rollout.started_at == report.state.failed_configs[0].at == "2024-05-01T12:10:00Z"
    assert report.state.current is not None and report.state.current.source != KnobSource.MANUAL
    assert events.MANUAL_CHANGE not in [reason for reason, _, _ in report.events]


def scaled(deployment: dict[str, Any], replicas: int, updated: int, available: int) -> dict[str, Any]:
    """``deployment`` at ``replicas`` (a scale is a spec change: a new generation), as its controller reports it."""
    out = copy.deepcopy(deployment)
    out["metadata"]["generation"] += 1
    out["spec"]["replicas"] = replicas
    out["status"] = {"observedGeneration": out["metadata"]["generation"], "replicas": replicas,
                     "updatedReplicas": updated, "availableReplicas": available}
    return out


def crash_looping(message: str, finished: datetime) -> dict[str, Any]:
    """A pod whose vLLM exited with ``message`` a second time at ``finished``."""
    return {"metadata": {"name": "llama-7f8b-x2x4q", "ownerReferences": OWNED}, "status": {"containerStatuses": [{
        "name": "vllm", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": message, "finishedAt": utc_timestamp(finished)}}}]}}


def write(
    state: VllmTuningStatus, before: dict[str, Any], to: Knobs, at: datetime
) -> tuple[VllmTuningStatus, dict[str, Any]]:
    """A preset ``to`` written at ``at`` into the Deployment ``before``: the status, and the Deployment with its
    controller caught up with the new generation (at zero replicas that is all there is to roll)."""
    state = with_rollout(state, at, to, KnobSource.SCHEDULE, f"preset {to}", baseline_attainment=0.9)
    written = patched(before, to, at, KnobSource.SCHEDULE)
    written["status"]["observedGeneration"] = written["metadata"]["generation"]
    assert state.last_rollout is not None
    state = state.model_copy(update={"last_rollout": state.last_rollout.model_copy(
        update={"deployment_generation": written["metadata"]["generation"]})})
    return state, written


def written_at_zero() -> tuple[VllmTuningStatus, dict[str, Any]]:
    """A night preset B written at T0 into a Deployment (running A) that KEDA has scaled to zero."""
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    return write(state, scaled(deployment(A), 0, 0, 0), B, T0)


def unverified_at_zero() -> tuple[VllmTuningStatus, dict[str, Any]]:
    """``written_at_zero`` once an evaluation has found the rollout complete at zero replicas: Unverified."""
    state, written = written_at_zero()
    return track(state, written, T0 + timedelta(seconds=30), Kube([])).state, written


def crash_at_scale_up(
    state: VllmTuningStatus, written: dict[str, Any], at: datetime,
    message: str = "ValueError: not enough KV cache for one max-length request",
) -> tuple[Report, Kube]:
    """The Deployment scaled to one replica at ``at`` and its pod crash-looping with ``message``: the evaluation
    two minutes later, and the API calls it made."""
    kube = Kube([crash_looping(message, at + timedelta(minutes=1))])
    return track(state, scaled(written, 1, 1, 0), at + timedelta(minutes=2), kube), kube


def test_a_rollout_into_a_deployment_scaled_to_zero_waits_for_its_first_pod():
    state, written = written_at_zero()

    report = track(state, written, T0 + timedelta(seconds=30), Kube([]))

    rollout = report.state.last_rollout
    assert rollout is not None and rollout.phase == RolloutPhase.UNVERIFIED and rollout.finished_at is None
    assert rollout.unverified_at is not None and rollout.baseline_attainment is None
    assert awaiting_verdict(report.state)
    assert report.state.current is not None and report.state.current.knobs == B  # the template holds it
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_UNVERIFIED]

    hours_later = track(report.state, written, T0 + timedelta(hours=3), Kube([]))
    assert hours_later.events == []
    waiting = hours_later.state.last_rollout
    assert waiting is not None and waiting.phase == RolloutPhase.UNVERIFIED
    assert waiting.progressed_at == "2024-05-01T15:00:00Z"  # its deadline does not run while nothing starts it


def test_an_unverified_config_that_cannot_start_at_scale_up_is_rolled_back_and_remembered():
    state, written = unverified_at_zero()

    report, kube = crash_at_scale_up(state, written, T0 + timedelta(hours=3))

    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 512)]
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source, rollout.phase) == (
        A, KnobSource.ROLLBACK, RolloutPhase.IN_PROGRESS)
    (patch,) = kube.patches
    assert patch["spec"]["template"]["spec"]["containers"][0]["args"] == args(A)
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_FAILED, events.ROLLED_BACK]


def test_an_unverified_config_whose_pods_start_is_live_and_did_not_measure_a_restart():
    state, written = unverified_at_zero()
    up = T0 + timedelta(hours=3)

    report = track(state, scaled(written, 2, 2, 2), up + timedelta(minutes=4), Kube([]))

    rollout = report.state.last_rollout
    assert rollout is not None and rollout.phase == RolloutPhase.SUCCEEDED
    assert report.state.current is not None and report.state.current.since == "2024-05-01T15:04:00Z"
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_SUCCEEDED]
    # three hours from the patch to Ready were a wait for the scale-up, not a restart's duration
    assert restart_seconds(report.state, waves=2) == DEFAULT_RESTART_SECONDS


def test_a_write_after_an_unverified_one_whose_status_write_was_lost_is_resumed_as_ours():
    state, written = unverified_at_zero()
    closes = T0 + timedelta(hours=8)  # the window closes at zero replicas: back to A, then the operator restarts

    report = track(state, patched(written, A, closes, KnobSource.SCHEDULE), closes + timedelta(seconds=20), Kube([]))

    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.from_knobs, rollout.to_knobs, rollout.source, rollout.phase) == (
        B, A, KnobSource.SCHEDULE, RolloutPhase.IN_PROGRESS)
    assert rollout.rollback_knobs == A  # B never ran
    assert report.events == []  # not a person's change


def test_a_config_written_after_an_unverified_one_rolls_back_to_the_last_config_that_ran():
    state, written = unverified_at_zero()
    later = T0 + timedelta(hours=8)  # another preset, C, still at zero: B has not run
    state, written = write(state, written, C, later)
    state = track(state, written, later + timedelta(seconds=30), Kube([])).state

    report, kube = crash_at_scale_up(state, written, later + timedelta(hours=1))

    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(2048, 256)]
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source) == (A, KnobSource.ROLLBACK)
    (patch,) = kube.patches
    assert patch["spec"]["template"]["spec"]["containers"][0]["args"] == args(A)  # not B, which no pod ran


def test_the_last_config_that_ran_failing_after_a_scale_up_is_not_its_fault():
    state, written = unverified_at_zero()
    closes = T0 + timedelta(hours=8)  # the window closes at zero: back to A, which ran before B was written
    state, written = write(state, written, A, closes)
    state = track(state, written, closes + timedelta(seconds=30), Kube([])).state

    # a node's GPU in trouble, not A
    report, kube = crash_at_scale_up(state, written, closes + timedelta(hours=1), "torch.OutOfMemoryError: CUDA")

    assert report.state.failed_configs == [] and kube.patches == []  # nothing to roll back to, nothing blamed
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.phase) == (A, RolloutPhase.FAILED)
    assert report.state.current is not None and report.state.current.knobs == A
    assert report.has(ConditionType.DEGRADED, True, "RolloutFailed")
    # scaled to zero (to stop the crash loop, or by KEDA at night): no pod runs A, and nothing says it starts now
    zero = track(report.state, scaled(written, 0, 0, 0), closes + timedelta(hours=2), Kube([]))
    assert zero.has(ConditionType.DEGRADED, True, "RolloutFailed")


def unschedulable(name: str) -> dict[str, Any]:
    """A new pod kube-scheduler could not place: the node's only GPU is taken."""
    return {"metadata": {"name": name, "ownerReferences": OWNED}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}}


def surge_stuck(to: Knobs) -> tuple[VllmTuningStatus, dict[str, Any]]:
    """``to`` written at T0 into two pods running A with a surge pod allowed: the surge pod was created (the
    rollout's first progress, seen at T0 + 30 s) and never scheduled."""
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    state, written = write(state, scaled(deployment(A), 2, 2, 2), to, T0)
    written["status"].update({"replicas": 3, "updatedReplicas": 1, "availableReplicas": 2})
    return track(state, written, T0 + timedelta(seconds=30), Kube([unschedulable("llama-7f8b-s1")])).state, written


def test_only_the_new_replicasets_own_pods_judge_the_rollout():
    """A copy of the Deployment (the same pod template, its selector overlapping) has a ReplicaSet of the same
    pod-template hash: its pods carry our new ReplicaSet's labels, and only their ownerReferences tell them
    apart. Its crash-looping pod is not our config failing; the same pod owned by our ReplicaSet is."""
    state, written = surge_stuck(B)
    theirs = crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=4))
    theirs["metadata"]["ownerReferences"] = [{**OWNED[0], "uid": "copy-rs-uid"}]
    kube = Kube([theirs])

    report = track(state, written, T0 + timedelta(minutes=5), kube)

    rollout = report.state.last_rollout
    assert rollout is not None and rollout.phase == RolloutPhase.IN_PROGRESS and rollout.message == ""
    assert kube.patches == [] and report.state.failed_configs == [] and report.events == []
    ours = Kube([crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=4))])
    failed = track(state, written, T0 + timedelta(minutes=5), ours)
    assert [reason for reason, _, _ in failed.events] == [events.ROLLOUT_FAILED, events.ROLLED_BACK]


def test_a_rollout_whose_new_pod_finds_no_gpu_is_rolled_back_at_the_deadline_without_blaming_the_config():
    state, written = surge_stuck(B)
    kube = Kube([unschedulable("llama-7f8b-s1")])

    report = track(state, written, T0 + timedelta(minutes=11), kube)

    assert report.state.failed_configs == []  # B may be tried again: where a pod fits is not up to the knobs
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source) == (A, KnobSource.ROLLBACK)
    (patch,) = kube.patches
    assert patch["spec"]["template"]["spec"]["containers"][0]["args"] == args(A)
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_BLOCKED, events.ROLLED_BACK]
    blocked = condition(report.state.conditions, ConditionType.DEGRADED)
    assert blocked is not None and (blocked.status, blocked.reason) == ("True", events.ROLLOUT_BLOCKED)
    assert "Insufficient nvidia.com/gpu" in blocked.message and "maxSurge: 0" in blocked.message


def test_a_pod_that_loads_for_longer_than_the_specs_deadline_within_the_deployments_is_not_failed():
    """A 70B model loading for 12 minutes into one surge pod, under the spec's 10-minute deadline and the
    Deployment's progressDeadlineSeconds of an hour: still rolling out, no config blamed, nothing rolled back."""
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    state, written = write(state, scaled(deployment(A), 1, 1, 1), B, T0)
    written["spec"]["progressDeadlineSeconds"] = 3600
    written["status"].update({"replicas": 2, "updatedReplicas": 1, "availableReplicas": 1})
    loading = {"metadata": {"name": "llama-7f8b-l1", "ownerReferences": OWNED}, "status": {"containerStatuses": [
        {"name": "vllm", "restartCount": 0, "ready": False,
         "state": {"running": {"startedAt": utc_timestamp(T0 + timedelta(seconds=40))}}}]}}
    kube = Kube([loading])
    state = track(state, written, T0 + timedelta(seconds=30), kube).state

    report = track(state, written, T0 + timedelta(minutes=12), kube)

    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.phase) == (B, RolloutPhase.IN_PROGRESS)
    assert report.state.failed_configs == [] and kube.patches == [] and report.events == []


def test_an_evicted_surge_pod_does_not_make_a_blocked_rollout_the_configs_failure():
    """The surge pod was evicted while it pulled the image; its replacement finds no GPU. The list of the new
    ReplicaSet's pods still holds the evicted one (phase Failed): no config is blamed at the deadline."""
    state, written = surge_stuck(B)
    evicted = {"metadata": {"name": "llama-7f8b-e1", "ownerReferences": OWNED}, "status": {
        "phase": "Failed", "reason": "Evicted", "containerStatuses": [{"name": "vllm", "restartCount": 0, "state": {
            "terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}}]}}
    kube = Kube([evicted, unschedulable("llama-7f8b-s2")])

    report = track(state, written, T0 + timedelta(minutes=11), kube)

    assert report.state.failed_configs == []
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_BLOCKED, events.ROLLED_BACK]


def test_a_blocked_rollback_stands():
    state, written = surge_stuck(B)
    state = track(state, written, T0 + timedelta(minutes=11), Kube([unschedulable("llama-7f8b-s1")])).state
    back = patched(written, A, T0 + timedelta(minutes=11), KnobSource.ROLLBACK)
    back["status"] = {**written["status"], "observedGeneration": back["metadata"]["generation"]}
    assert state.last_rollout is not None
    state = state.model_copy(update={"last_rollout": state.last_rollout.model_copy(
        update={"deployment_generation": back["metadata"]["generation"]})})
    state = track(state, back, T0 + timedelta(minutes=12), Kube([unschedulable("llama-6d5c-r1")])).state
    kube = Kube([unschedulable("llama-6d5c-r1")])  # the GPU went to another workload meanwhile

    report = track(state, back, T0 + timedelta(minutes=23), kube)

    assert kube.patches == [] and report.state.failed_configs == []
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.phase) == (A, RolloutPhase.FAILED)
    assert report.state.current is not None and report.state.current.knobs == A
    assert report.has(ConditionType.DEGRADED, True, events.ROLLOUT_BLOCKED)
    # the Deployment controller starts the pod when a GPU frees: once every pod runs A, nothing is degraded
    assert track(report.state, back, T0 + timedelta(minutes=40), kube).has(
        ConditionType.DEGRADED, True, events.ROLLOUT_BLOCKED)  # still short of a pod
    done = copy.deepcopy(back)
    done["status"].update({"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2})
    recovered = track(report.state, done, T0 + timedelta(hours=2), kube)
    degraded = condition(recovered.state.conditions, ConditionType.DEGRADED)
    assert degraded is not None and (degraded.status, degraded.reason) == ("False", "AsExpected")
    assert degraded.message.startswith(f"{A} is live on every pod") and recovered.events == []


def test_the_rollback_of_a_blocked_rollout_whose_status_write_was_lost_does_not_blame_the_config():
    state, written = surge_stuck(B)
    kube = Kube([unschedulable("llama-7f8b-s1")])
    judged = track(state, written, T0 + timedelta(minutes=11), kube)  # the rollback is written...
    (patch,) = kube.patches
    back = merge(written, patch)
    back["metadata"]["generation"] += 1

    report = track(state, back, T0 + timedelta(minutes=12))  # ...and its status write lost: the status before it

    assert report.state.failed_configs == []  # B may be tried again, as the evaluation that judged it said
    assert report.state.blocked_at == judged.state.blocked_at is not None  # and the wait after it holds
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source) == (A, KnobSource.ROLLBACK)
    assert report.has(ConditionType.DEGRADED, True, events.ROLLOUT_BLOCKED)
    # said as the evaluation that judged it said it, what went wrong as far as our rollback's annotation keeps it
    assert degraded(judged).startswith(degraded(report)) and len(degraded(report)) > REASON_LIMIT
    assert rollout.reason.count(str(B)) == 1  # the rollback's reason says the knobs once, as the first one did


REFUSAL = "deployments.apps \"llama\" is forbidden: ValidatingAdmissionPolicy 'freeze' denied request: frozen"


class RefusingKube(Kube):
    """The API calls of ``Kube``, with the rollback's patch refused ``refusals`` times (an admission webhook
    down, the operator's Role edited) before one is let through."""

    def __init__(self, pods: list[dict[str, Any]], refusals: int) -> None:
        super().__init__(pods)
        self.refusals = refusals

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.refusals:
            self.refusals -= 1
            refused = ApiException(status=422, reason="Unprocessable Entity")
            refused.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Invalid", "message": REFUSAL})
            raise refused
        return super().patch_deployment(namespace, name, patch)


def test_a_rollback_that_cannot_be_written_is_retried_and_the_failure_said_once():
    state, written = unverified_at_zero()
    up = T0 + timedelta(hours=3)
    kube = RefusingKube([crash_looping("ValueError: not enough KV cache", up + timedelta(minutes=1))], refusals=2)
    pods = scaled(written, 1, 1, 0)
    reports = []
    for minute in (2, 3, 4):
        reports.append(track(state, pods, up + timedelta(minutes=minute), kube))
        state = reports[-1].state

    first, second, third = ([reason for reason, _, _ in r.events] for r in reports)
    assert first == [events.ROLLOUT_FAILED, events.PATCH_FAILED]
    assert reports[0].events[1][1].endswith(f"Unprocessable Entity: {REFUSAL}")  # the why, from the Status
    assert second == []  # the same verdict, the same refusal: not a Warning a minute
    assert third == [events.ROLLED_BACK]
    for report in reports[:2]:  # until the rollback is written, the rollout waits for it, failed
        rollout = report.state.last_rollout
        assert rollout is not None and rollout.to_knobs == B and awaiting_verdict(report.state)
        assert report.has(ConditionType.DEGRADED, True, events.ROLLOUT_FAILED)
    rollout = state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source) == (A, KnobSource.ROLLBACK)
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in state.failed_configs] == [(4096, 512)]
    assert state.failed_configs[0].at == utc_timestamp(up + timedelta(minutes=2))  # when it was found failing
    assert len(kube.patches) == 1
    assert [outcomes(r) for r in reports] == [["Failed"], [], []]  # one failed rollout, judged three times



def read_timeout(path: str) -> Exception:
    """urllib3's word for a request that got no answer in time."""
    return ReadTimeoutError(None, path, "read timed out")


def etcd_timeout(path: str) -> Exception:
    """The apiserver's answer when etcd did not confirm the write in time; it may commit it all the same."""
    exc = ApiException(status=504, reason="Gateway Timeout")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Timeout", "code": 504,
                           "message": "Timeout: request did not complete within requested timeout"})
    return exc


class TimingOutKube(RefusingKube):
    """Its first patch gets no answer in time (an apiserver too slow, ``error``); the Deployment read back
    (``live``) has the patch where it ``lands`` all the same."""

    def __init__(self, pods: list[dict[str, Any]], live: dict[str, Any], lands: bool,
                 error: Callable[[str], Exception] = read_timeout) -> None:
        super().__init__(pods, refusals=1)
        self.live, self.lands, self.error = live, lands, error

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.refusals:
            self.refusals -= 1
            if self.lands:
                self.live = merge(self.live, patch)
                self.live["metadata"]["generation"] += 1
            raise self.error(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        return super().patch_deployment(namespace, name, patch)

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return self.live


def rollback_unanswered(
    lands: bool, error: Callable[[str], Exception], kube_type: type[TimingOutKube] = TimingOutKube,
) -> tuple[Report, TimingOutKube, dict[str, Any], datetime]:
    """An unverified config found crash-looping at a scale-up, the patch of its rollback answered with ``error``
    (it ``lands`` all the same, or not): the evaluation, its API calls, the Deployment and the scale-up's time."""
    state, written = unverified_at_zero()
    up = T0 + timedelta(hours=3)
    pods = scaled(written, 1, 1, 0)
    kube = kube_type([crash_looping("ValueError: not enough KV cache", up + timedelta(minutes=1))], pods, lands, error)
    return track(state, pods, up + timedelta(minutes=2), kube), kube, pods, up


@pytest.mark.parametrize("error, said", [(read_timeout, "read timed out"), (etcd_timeout, "Gateway Timeout")])
def test_a_patch_that_times_out_and_did_not_land_is_said_and_retried_like_a_refused_one(
    error: Callable[[str], Exception], said: str
) -> None:
    """Not an evaluation that fails with a traceback, its status unwritten: the verdict and a PatchFailed Event
    that says the Deployment read back does not have the change, and the rollback written at the next evaluation."""
    first, kube, pods, up = rollback_unanswered(False, error)
    assert [reason for reason, _, _ in first.events] == [events.ROLLOUT_FAILED, events.PATCH_FAILED]
    assert said in first.events[1][1] and "read back does not have" in first.events[1][1]
    second = track(first.state, pods, up + timedelta(minutes=3), kube)
    assert [reason for reason, _, _ in second.events] == [events.ROLLED_BACK]


def test_a_patch_that_times_out_and_cannot_be_read_back_says_so():
    """An apiserver that answers neither the patch nor the read: the Event says the read failed, not that the
    Deployment lacks the change (it may have it)."""
    class Unreadable(TimingOutKube):
        def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
            raise ApiException(status=503, reason="Service Unavailable")

    report, *_ = rollback_unanswered(False, etcd_timeout, Unreadable)
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_FAILED, events.PATCH_FAILED]
    message = report.events[1][1]
    assert "Gateway Timeout" in message and "could not be read back (" in message and "Service Unavailable" in message
    assert "does not have the change" not in message


def test_a_patch_refused_whose_deployment_cannot_be_read_again_is_said_refused_not_maybe_landed():
    """A 409 is a refusal: with the Deployment unreadable after it (no answer in time), the Event says nothing was
    patched and why, not that the apiserver may still commit a write it refused."""
    class ConflictThenUnreadable(TimingOutKube):
        def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
            raise read_timeout(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")

    report, kube, *_ = rollback_unanswered(False, lambda _: ApiException(status=409, reason="Conflict"),
                                           ConflictThenUnreadable)
    assert [(reason, warning) for reason, _, warning in report.events] == [
        (events.ROLLOUT_FAILED, "Warning"), (events.PATCH_FAILED, "Warning")]
    message = report.events[1][1]
    assert "409 Conflict" in message and "could not be read again (" in message and "read timed out" in message
    assert "nothing was patched" in message and "commit it late" not in message and not kube.patches


@pytest.mark.parametrize("error", [read_timeout, etcd_timeout])
def test_a_patch_that_times_out_but_landed_stands_with_what_its_decision_recorded(
    error: Callable[[str], Exception]
) -> None:
    """The Deployment read back has the rollback: it is followed as written, at once, not failed and then found in
    the template as a write of unknown purpose."""
    report, kube, *_ = rollback_unanswered(True, error)
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_FAILED, events.ROLLED_BACK]
    rollout = report.state.last_rollout
    assert rollout is not None and rollout.source == KnobSource.ROLLBACK and awaiting_verdict(report.state)
    assert rollout.deployment_generation == kube.live["metadata"]["generation"]


def test_our_write_in_the_second_a_rollout_was_seen_complete_is_ours_when_its_status_write_was_lost():
    """Stamps are whole seconds: the evaluation that saw B's rollout complete also rolled out the next config; found
    in the template with the status of before it (the status write lost), it is resumed, not adopted as Manual."""
    started, now = T0, T0 + timedelta(minutes=4)
    before = rollout_succeeded(with_rollout(status(A.max_num_batched_tokens, A.max_num_seqs), started, B,
                                            KnobSource.TRAFFIC, f"to {B}"), now)
    live = patched(patched(deployment(A), B, started), C, now, KnobSource.SCHEDULE)
    report = track(before, live, now + timedelta(seconds=30))
    assert events.MANUAL_CHANGE not in [reason for reason, _, _ in report.events]
    assert report.state.last_rollout is not None and report.state.last_rollout.to_knobs == C
    assert report.state.last_rollout.phase == RolloutPhase.IN_PROGRESS


def test_a_window_preset_found_with_its_status_write_lost_goes_back_when_the_window_closes():
    """The write is followed as decide recorded it: the night preset remembers the config it replaced, so the
    window's close still goes back to it (not the preset left in force through the day)."""
    the_spec = spec(schedules=[NIGHT])
    opens = T0.replace(hour=20)  # 22:00 in Berlin (CEST)
    at = opens - timedelta(minutes=5)
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    preset = knobs(16384, 512)
    found = track(state, patched(deployment(A), preset, at, KnobSource.SCHEDULE), at + timedelta(seconds=30),
                  the_spec=the_spec)
    assert found.state.last_rollout is not None and found.state.last_rollout.to_knobs == preset
    assert found.state.resume_knobs == A
    closes = opens + timedelta(hours=8)
    after = quietly(the_spec, rollout_succeeded(found.state, opens), closes)
    assert after.action == DecisionAction.CHANGE and after.knobs == A, after.reason
    traffic = track(state, patched(deployment(A), B, at), at + timedelta(seconds=30), the_spec=the_spec)
    assert traffic.state.last_rollout.to_knobs == B and traffic.state.resume_knobs is None


def test_a_spec_changed_while_a_rollback_is_refused_records_the_failed_config_under_the_new_spec():
    state, written = unverified_at_zero()
    state = adopt_generation(state, 1)
    up = T0 + timedelta(hours=3)
    kube = RefusingKube([crash_looping("ValueError: not enough KV cache", up + timedelta(minutes=1))], refusals=1)
    pods = scaled(written, 1, 1, 0)
    refused = track(state, pods, up + timedelta(minutes=2), kube)
    edited = adopt_generation(refused.state, 2)  # a person edits the VllmTuning meanwhile: generation 1's record goes

    report = track(edited, pods, up + timedelta(minutes=3), kube, generation=2)

    assert len(kube.patches) == 1  # the rollback, written this time
    assert B in failed_configs(report.state)  # still never tried again, under the spec in force
    assert [reason for reason, _, _ in report.events] == [events.ROLLED_BACK]  # the failure was said before


def test_a_new_verdict_after_a_refused_rollback_is_said_and_recorded():
    state, written = surge_stuck(B)
    blocked = track(state, written, T0 + timedelta(minutes=11),
                    RefusingKube([unschedulable("llama-7f8b-s1")], refusals=9))
    # the GPU frees up before the rollback is let through: the surge pod starts vLLM, which crash-loops
    crash = crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=15))
    failed = track(blocked.state, written, T0 + timedelta(minutes=16), RefusingKube([crash], refusals=9))

    assert [reason for reason, _, _ in blocked.events] == [events.ROLLOUT_BLOCKED, events.PATCH_FAILED]
    assert [reason for reason, _, _ in failed.events] == [events.ROLLOUT_FAILED, events.PATCH_FAILED]
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in failed.state.failed_configs] == [(4096, 512)]
    assert (outcomes(blocked), outcomes(failed)) == (["Blocked"], ["Failed"])


def test_a_failed_config_is_recorded_before_its_rollback_is_written():
    crash = crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=4))
    state, written = surge_stuck(B)
    failed = track(state, written, T0 + timedelta(minutes=5), RefusingKube([crash], refusals=1))
    # the crash-looping pod is replaced by one that finds no GPU: the rollback goes through as a blocked one
    blocked = track(failed.state, written, T0 + timedelta(minutes=12), RefusingKube([unschedulable("llama-7f8b-s2")], 0))

    assert [reason for reason, _, _ in blocked.events] == [events.ROLLOUT_BLOCKED, events.ROLLED_BACK]
    for report in (failed, blocked):  # never tried again, whoever puts the old config back
        assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 512)]


def test_a_verdict_whose_rollback_was_refused_ends_when_the_pods_come_up():
    state, written = surge_stuck(B)
    blocked = track(state, written, T0 + timedelta(minutes=11),
                    RefusingKube([unschedulable("llama-7f8b-s1")], refusals=9))
    live = copy.deepcopy(written)
    live["status"].update({"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2})

    report = track(blocked.state, live, T0 + timedelta(minutes=20), RefusingKube([], refusals=9))

    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.phase, rollout.message) == (
        B, RolloutPhase.SUCCEEDED, "")
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_SUCCEEDED]


def test_a_persons_undo_of_a_rollout_whose_rollback_was_refused_is_that_rollback():
    state, written = unverified_at_zero()
    up = T0 + timedelta(hours=3)
    pods = scaled(written, 1, 1, 0)
    kube = RefusingKube([crash_looping("ValueError: not enough KV cache", up + timedelta(minutes=1))], refusals=9)
    refused = track(state, pods, up + timedelta(minutes=2), kube)
    # a person does what the operator could not write: kubectl rollout undo, to the revision that ran A
    report = track(refused.state, undone(pods, scaled(deployment(A), 1, 1, 1)), up + timedelta(minutes=5), kube)

    assert report.events == [] and report.state.reverts == []  # no person's change to respect, nor a revert
    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source) == (A, KnobSource.ROLLBACK)
    assert awaiting_verdict(report.state)  # followed to its end like the operator's own rollback
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 512)]
    assert degraded(report) == degraded(refused)


def test_a_failed_verdict_whose_status_write_was_refused_after_its_rollback_landed_is_counted_when_redone():
    """The evaluation that judged B failed wrote its rollback, and then its status write was refused (a person
    edited the VllmTuning meanwhile), dropping its count. The redo finds our rollback in the template under the
    status from before: it records the verdict, and counts it, once."""
    state = status(A.max_num_batched_tokens, A.max_num_seqs, since=T0 - timedelta(hours=2))
    state = with_rollout(state, T0, B, KnobSource.TRAFFIC, f"to {B}")
    written = scaled(patched(deployment(A), B, T0), 1, 1, 0)
    at = T0 + timedelta(minutes=5)
    kube = Kube([crash_looping("ValueError: not enough KV cache", at - timedelta(minutes=1))])
    first = track(state, written, at, kube)
    assert outcomes(first) == ["Failed"] and len(kube.patches) == 1  # the rollback landed

    redo = track(state, patched(written, A, at, KnobSource.ROLLBACK), at + timedelta(seconds=1), Kube([]))

    assert outcomes(redo) == ["Failed"] and B in failed_configs(redo.state)
    again = track(redo.state, patched(written, A, at, KnobSource.ROLLBACK), at + timedelta(minutes=1), Kube([]))
    assert outcomes(again) == []


def test_a_failed_verdict_after_a_kept_blocked_one_is_recorded_and_counted_when_its_status_write_was_refused():
    """B is blocked and its rollback refused (the Blocked verdict kept, and counted); the surge pod then gets a GPU
    and crash-loops: B fails and its rollback is written, but that status write is refused. The redo finds our
    rollback in the template under the kept Blocked verdict: the newer Failed verdict, which our rollback's
    annotations carry, is the one recorded (B never tried again) and counted."""
    state, written = surge_stuck(B)
    state = track(state, written, T0 + timedelta(minutes=11), RefusingKube([unschedulable("llama-7f8b-s1")], 1)).state
    kube = Kube([crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=12))])
    judged = track(state, written, T0 + timedelta(minutes=13), kube)
    assert outcomes(judged) == ["Failed"] and len(kube.patches) == 1
    back = merge(written, kube.patches[0])
    back["metadata"]["generation"] += 1

    redo = track(state, back, T0 + timedelta(minutes=13, seconds=1), Kube([]))

    assert outcomes(redo) == ["Failed"] and B in failed_configs(redo.state)
    assert redo.has(ConditionType.DEGRADED, True, events.ROLLOUT_FAILED)
    # said as the evaluation that judged it said it, in the words our rollback is annotated with
    what = judged.state.failed_configs[0].reason
    assert degraded(redo) == degraded(judged) == f"{B} failed to start ({what}); rolling back"
    assert redo.state.failed_configs[0].reason == what  # the vLLM error, as first recorded


def degraded(report: Report) -> str:
    """What the Degraded condition says."""
    found = condition(report.state.conditions, ConditionType.DEGRADED)
    assert found is not None
    return found.message


def judged(reconciler: Reconciler, state: VllmTuningStatus, deployment: dict[str, Any], now: datetime,
           kube: Kube) -> Report:
    """``track`` by ``reconciler``, one operator process, which counts the verdicts after its status write."""
    report = track(state, deployment, now, kube, reconciler=reconciler)
    reconciler._count(report)
    return report


def counted(reconciler: Reconciler) -> dict[str, float]:
    """rollouts_total by outcome, where counted."""
    return {outcome: value for outcome in ("Succeeded", "Failed", "Blocked")
            if (value := reconciler.metrics.registry.get_sample_value(
                "vllm_autotuner_rollouts_total", {"namespace": "default", "tuning": TUNING, "outcome": outcome}))}


def test_each_verdict_on_a_rollout_is_counted_once_however_often_it_is_judged():
    """B is blocked (its rollback refused); the status write of that evaluation times out and did not land, so the
    next judges B blocked again. Then its surge pod gets a GPU and crash-loops: a new verdict, judged twice the same
    way. One Blocked and one Failed."""
    reconciler = process()
    state, written = surge_stuck(B)
    for minute in (11, 12):  # the second from the status before the first: its write lost
        blocked = judged(reconciler, state, written, T0 + timedelta(minutes=minute),
                         RefusingKube([unschedulable("llama-7f8b-s1")], 9))
        assert outcomes(blocked) == ["Blocked"]
    crash = crash_looping("ValueError: not enough KV cache", T0 + timedelta(minutes=15))
    for minute in (16, 17):
        failed = judged(reconciler, blocked.state, written, T0 + timedelta(minutes=minute), RefusingKube([crash], 9))
        assert outcomes(failed) == ["Failed"]
    assert counted(reconciler) == {"Blocked": 1, "Failed": 1}


def test_a_verdict_reached_again_once_the_kept_one_no_longer_stood_is_counted_again():
    """B is blocked (its rollback refused); its surge pod then gets a GPU and the rollout moves on (the kept verdict
    no longer stands), until the next surge pod finds none: blocked again, a new verdict, counted as one."""
    reconciler = process()
    state, written = surge_stuck(B)
    blocked = judged(reconciler, state, written, T0 + timedelta(minutes=11),
                     RefusingKube([unschedulable("llama-7f8b-s1")], 9))
    moving = copy.deepcopy(written)
    moving["status"]["updatedReplicas"] = 2
    moved = judged(reconciler, blocked.state, moving, T0 + timedelta(minutes=13), RefusingKube([], 9))
    assert outcomes(moved) == [] and moved.state.last_rollout is not None and not moved.state.last_rollout.message
    again = judged(reconciler, moved.state, moving, T0 + timedelta(minutes=25),
                   RefusingKube([unschedulable("llama-7f8b-s2")], 9))
    assert outcomes(again) == ["Blocked"] and counted(reconciler) == {"Blocked": 2}
