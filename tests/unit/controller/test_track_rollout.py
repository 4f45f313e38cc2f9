"""A changed pod template is resumed as the operator's own rollout only when it is a write the status never saw.

A restarted operator that finds the template's knobs differ from its status
must tell its own patch whose status write was lost (resume it) from an
older template put back by a person (``kubectl rollout undo``, a GitOps
revert: adopt it as Manual). Both carry the operator's annotations, so only
the time of the write tells them apart. A lost write of our rollback of a
failed rollout still records the failed config. Here the status is built by the
policy's own lifecycle functions and the template by the operator's own
patch builder, and ``Reconciler._track_rollout`` judges them as a fresh
operator process would: no cluster is needed for a template already read.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime, timedelta
from typing import Any

from tests.unit.policy.helpers import T0, knobs, spec, status

from vllm_autotuner.api import Knobs, KnobSource, RolloutPhase, VllmTuningStatus
from vllm_autotuner.controller import events
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report, Target
from vllm_autotuner.knobs import EngineArgs
from vllm_autotuner.policy import rollout_succeeded
from vllm_autotuner.policy.decision import with_rollout
from vllm_autotuner.rollout.patch import knob_patch

TUNING = "chat"
SPEC = spec()
A, B, C, D, E = knobs(8192, 1024), knobs(4096, 512), knobs(2048, 256), knobs(2048, 128), knobs(1024, 64)


def args(of: Knobs) -> list[str]:
    return ["--max-num-batched-tokens", str(of.max_num_batched_tokens), "--max-num-seqs", str(of.max_num_seqs)]


def deployment(start: Knobs) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "default", "uid": "u1", "resourceVersion": "1", "generation": 1},
        "spec": {"template": {"metadata": {"annotations": {}}, "spec": {"containers": [
            {"name": "vllm", "image": "vllm/vllm-openai", "args": args(start)}]}}},
    }


def patched(
    deployment: dict[str, Any], to: Knobs, at: datetime, source: KnobSource = KnobSource.TRAFFIC
) -> dict[str, Any]:
    """The Deployment once the operator's patch to ``to`` at ``at`` is merged in (as the apiserver would)."""
    patch = knob_patch(deployment, None, to, f"to {to}", TUNING, str(source), at)["spec"]["template"]
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


def track(state: VllmTuningStatus, deployment: dict[str, Any], now: datetime) -> Report:
    """One evaluation's look at the target, by an operator that knows only ``state``."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    engine = EngineArgs.from_container(container)
    assert engine.max_num_batched_tokens is not None and engine.max_num_seqs is not None
    target = Target(deployment, container, engine, knobs(engine.max_num_batched_tokens, engine.max_num_seqs),
                    from_defaults=False, defaults_table=None, replicaset=None, replicasets=[])
    report = Report("default", TUNING, state, 1, now)
    reconciler = Reconciler(kube=None, cache=None, observations=None, metrics=None,  # type: ignore[arg-type]
                            settings=OperatorSettings())
    asyncio.run(reconciler._track_rollout(SPEC, target, report))
    return report


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


def test_a_patch_whose_status_write_was_lost_is_resumed_as_ours():
    state, _, live = two_rollouts()
    at = T0 + timedelta(hours=2)

    report = track(state, patched(live, D, at, KnobSource.SCHEDULE), at + timedelta(seconds=30))

    rollout = report.state.last_rollout
    assert rollout is not None and (rollout.to_knobs, rollout.source, rollout.phase) == (
        D, KnobSource.SCHEDULE, RolloutPhase.IN_PROGRESS)
    assert report.state.current is not None and report.state.current.source == KnobSource.TRAFFIC
    assert report.events == []


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
    assert report.state.current is not None and report.state.current.source != KnobSource.MANUAL
    assert events.MANUAL_CHANGE not in [reason for reason, _, _ in report.events]
