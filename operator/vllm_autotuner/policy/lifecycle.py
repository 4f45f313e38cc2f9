"""Rollout lifecycle events as pure status transitions.

The operator learns about a rollout's fate from the Deployment (complete,
crash-looping, past its deadline) or from a person editing the args; the
benchmark learns it from the simulated fleet. Both call these functions,
so what the status remembers (the live config and since when, configs that
failed, the rollback, the cooldown a person's change earns) is decided once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from types import EllipsisType

from vllm_autotuner.api import (
    CurrentKnobs,
    DecisionAction,
    FailedConfig,
    Knobs,
    KnobSource,
    Schedule,
    VllmTuningStatus,
)
from vllm_autotuner.api.status import FAILED_LIMIT, REVERT_LIMIT, Rollout, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy.decision import Decision, with_history, with_rollout
from vllm_autotuner.policy.observation import rolling_out
from vllm_autotuner.policy.schedule import preset_in_force, windows_in_force


def awaiting_verdict(state: VllmTuningStatus) -> bool:
    """Whether the last rollout's config is still to be judged: in progress, or written while the Deployment was
    scaled to zero (``rollout_unverified``) and not yet started by a pod."""
    last = state.last_rollout
    return last is not None and last.phase in (RolloutPhase.IN_PROGRESS, RolloutPhase.UNVERIFIED)


def adopt_generation(state: VllmTuningStatus, generation: int) -> VllmTuningStatus:
    """The status for a new spec generation: configs that failed under an older spec may be tried again, and
    changes reverted under it no longer stop the next one."""
    if state.observed_generation == generation:
        return state
    failed = [f for f in state.failed_configs if f.generation == generation]
    return state.model_copy(update={"observed_generation": generation, "failed_configs": failed, "reverts": [],
                                   "reverted_by": None})


def rollout_progressed(state: VllmTuningStatus, now: datetime, mark: int, halted: bool = False) -> VllmTuningStatus:
    """The rollout awaiting its verdict got further (``mark`` above the one last seen), or its Deployment does not
    roll (``halted``: paused, or scaled to zero): its progress deadline counts from ``now`` again. A slow rollout of
    many pods is not a failed one, and a paused Deployment does not roll (the Deployment controller does not count
    paused time either); an unverified config's deadline counts from the scale-up that starts its first pod. A
    rollout seen halted keeps when it first was (``halted_at``) and times no restart (``timed_restart``).

    A mark below the last one (an autoscaler took replicas away, and the Deployment controller scaled the new
    ReplicaSet down with the old) is kept without restarting the clock, so the steps after it count: the Deployment
    controller, too, compares its status with the last one, not with the most it ever had.
    """
    if not awaiting_verdict(state):
        return state
    assert state.last_rollout is not None
    last = state.last_rollout.progress_mark
    if mark == last and not halted:
        return state
    update: dict[str, object] = {"progress_mark": mark}
    if mark > last or halted:
        update["progressed_at"] = utc_timestamp(now)
    if halted and state.last_rollout.halted_at is None:
        update["halted_at"] = utc_timestamp(now)
    return state.model_copy(update={"last_rollout": state.last_rollout.model_copy(update=update)})


def rollout_unverified(state: VllmTuningStatus, now: datetime) -> VllmTuningStatus:
    """The rollout in progress completed with the Deployment scaled to zero: the template holds its config, but no
    pod has started it, so nothing says it can start.

    It is no longer in progress (decisions go on: a schedule window that
    closes while the Deployment is at zero writes the config after it, with
    no pod to restart), and it is judged like one, crash loop and deadline,
    once the Deployment scales up. Its baseline is dropped: what the pods
    serve while a scale-up starts them is no restart's cost, and no evidence
    of a regression.
    """
    if not rolling_out(state) or state.current is None:
        return state
    assert state.last_rollout is not None
    rollout = state.last_rollout.model_copy(update={
        "phase": RolloutPhase.UNVERIFIED, "unverified_at": utc_timestamp(now), "baseline_attainment": None,
        "baseline_request_rate": None, "lost_seconds": 0.0})
    current = _written(state, rollout.to_knobs, rollout.source, now)
    return state.model_copy(update={"last_rollout": rollout, "current": current})


def rollout_succeeded(state: VllmTuningStatus, now: datetime) -> VllmTuningStatus:
    """All pods of the rollout awaiting its verdict are updated and Ready: its config is live from ``now``.

    A change of ours that restarted running pods times a rolling restart
    (``status.rolloutSeconds``), which the next pre-roll, freeze lead and
    restart price follow. A rollback does not: after a blocked rollout it only
    removes the pending surge pod, in seconds, and a freeze lead that short
    would let a long restart start just before a freeze and run in it. Nor
    does a config written at zero replicas: it waited for a scale-up. Nor a
    rollout seen halted (``rollout_progressed``): see ``timed_restart``.
    """
    if not awaiting_verdict(state) or state.current is None:
        return state
    assert state.last_rollout is not None
    rollout = state.last_rollout.model_copy(update={"phase": RolloutPhase.SUCCEEDED, "finished_at": utc_timestamp(now)})
    current = _written(state, rollout.to_knobs, rollout.source, now)
    update: dict[str, object] = {"last_rollout": rollout, "current": current}
    if (took := timed_restart(rollout)) is not None:
        update["rollout_seconds"] = took
    return state.model_copy(update=update)


def timed_restart(rollout: Rollout) -> float | None:
    """How long ``rollout`` took, when it timed a rolling restart of running pods: a change of ours that
    succeeded, not a rollback nor a config written at zero replicas (``rollout_succeeded``); None otherwise, and
    when the wall clock stepped back during it (finished before it started: no duration the CRD could hold).

    Nor a rollout seen halted (``halted_at``: paused, or scaled to zero, while it awaited its verdict), rather than
    timed less its halt: the halt is known only to an evaluation interval, and what ran around it was no rolling
    restart's pace (pods created before a pause start during it; after a scale to zero, the pods that start are a
    scale-up's, all at once). One measurement lost is the price; the last restart timed stands meanwhile.
    """
    if (rollout.phase != RolloutPhase.SUCCEEDED or rollout.finished_at is None or rollout.source == KnobSource.ROLLBACK
            or rollout.unverified_at is not None or rollout.halted_at is not None):
        return None
    took = (datetime.fromisoformat(rollout.finished_at) - datetime.fromisoformat(rollout.started_at)).total_seconds()
    return took if took >= 0 else None


def with_timed_restart(state: VllmTuningStatus) -> VllmTuningStatus:
    """A status from before ``rolloutSeconds`` (chart 0.5.11 and older) takes it from its last rollout, as this
    version would have recorded it: after an upgrade, the freeze lead and pre-roll follow the restarts measured
    before it, not their 5-minute default. Such a status has no ``haltedAt`` either: a halt it saw is not known."""
    if state.rollout_seconds is not None or state.last_rollout is None:
        return state
    took = timed_restart(state.last_rollout)
    return state if took is None else state.model_copy(update={"rollout_seconds": took})


def _written(state: VllmTuningStatus, knobs: Knobs, source: KnobSource, now: datetime) -> CurrentKnobs:
    """``state.current`` once the template holds ``knobs``, written by us for ``source``, from ``now`` on."""
    assert state.current is not None
    return state.current.model_copy(
        update={
            "max_num_batched_tokens": knobs.max_num_batched_tokens,
            "max_num_seqs": knobs.max_num_seqs,
            "since": utc_timestamp(now),
            "source": source,
            "from_defaults": False,
            "defaults_table": None,
        }
    )


def _roll_back(state: VllmTuningStatus, now: datetime, phase: RolloutPhase, reason: str) -> Decision:
    """Close the latest rollout with ``phase`` and start the one back to its previous config."""
    assert state.last_rollout is not None and state.current is not None
    closed = state.last_rollout.model_copy(
        update={"phase": phase, "finished_at": utc_timestamp(now), "message": reason}
    )
    previous = closed.rollback_knobs
    current = state.current.model_copy(
        update={
            "max_num_batched_tokens": closed.to_knobs.max_num_batched_tokens,
            "max_num_seqs": closed.to_knobs.max_num_seqs,
        }
    )
    state = state.model_copy(update={"last_rollout": closed, "current": current})
    state = with_rollout(state, now, previous, KnobSource.ROLLBACK, reason, regime=closed.regime)
    state = with_history(state, now, DecisionAction.ROLLBACK, previous, reason)
    return Decision(
        action=DecisionAction.ROLLBACK,
        knobs=previous,
        reason=reason,
        state=state,
        source=KnobSource.ROLLBACK,
        recommendation=previous,
    )


def _stands(state: VllmTuningStatus, now: datetime, message: str, reason: str) -> Decision:
    """Close the rollout awaiting its verdict as failed for a reason that is not its config's, with nothing to go
    back to: its config is the current one from now on (the template says so, and the Deployment controller keeps
    rolling it out), so that the template is not taken for a patch of ours whose status write was lost."""
    assert state.last_rollout is not None
    rollout = state.last_rollout
    closed = rollout.model_copy(update={"phase": RolloutPhase.FAILED, "finished_at": utc_timestamp(now),
                                        "message": message})
    current = _written(state, rollout.to_knobs, rollout.source, now)
    state = with_history(state.model_copy(update={"last_rollout": closed, "current": current}), now,
                         DecisionAction.HOLD, rollout.to_knobs, reason)
    return Decision(action=DecisionAction.HOLD, knobs=rollout.to_knobs, reason=reason, state=state)


def _goes_back(state: VllmTuningStatus) -> bool:
    """Whether the rollout awaiting its verdict puts back a config pods ran: a rollback, or after a rollout
    written at zero replicas, a change back to the config that ran before it."""
    rollout = state.last_rollout
    assert rollout is not None
    return rollout.source == KnobSource.ROLLBACK or rollout.to_knobs == rollout.rollback_knobs


def rollout_failed(state: VllmTuningStatus, now: datetime, message: str, generation: int) -> Decision:
    """The rollout in progress did not become Ready (deadline passed, crash loop): roll back and never retry it.

    ``message`` is what went wrong (e.g. the vLLM error of a crash-looping
    pod); the config is remembered as failed under spec ``generation``.
    A config that ran before failing now is not the config's fault (a
    failed rollback; or, after a rollout written at zero replicas, a change
    back to the config that ran before it): it is recorded in the rollout,
    and nothing is rolled back (``_stands``).
    """
    if not awaiting_verdict(state) or state.current is None:
        raise ValueError("no rollout in progress to fail")
    assert state.last_rollout is not None
    failed = state.last_rollout.to_knobs
    if _goes_back(state):
        rollback = state.last_rollout.source == KnobSource.ROLLBACK
        what = "rollback to" if rollback else "change back to the last config that ran,"
        return _stands(state, now, message, f"{what} {failed} did not become Ready: {message}")
    record = FailedConfig(
        max_num_batched_tokens=failed.max_num_batched_tokens,
        max_num_seqs=failed.max_num_seqs,
        reason=message,
        at=utc_timestamp(now),
        generation=generation,
    )
    others = [
        f
        for f in state.failed_configs
        if (f.max_num_batched_tokens, f.max_num_seqs) != (record.max_num_batched_tokens, record.max_num_seqs)
    ]
    state = state.model_copy(update={"failed_configs": [record, *others][:FAILED_LIMIT]})
    return _roll_back(state, now, RolloutPhase.FAILED, f"{failed} failed to start ({message}); rolling back")


def rollout_blocked(state: VllmTuningStatus, now: datetime, message: str) -> Decision:
    """The rollout awaiting its verdict made no progress for the deadline, and no new pod has started vLLM (no
    free GPU for it, an image that cannot be pulled, a quota: ``message`` says which).

    No vLLM has read the knobs, so nothing is remembered as failed, and the
    template goes back to the config pods last ran: with a surge pod stuck,
    the old pods still serve it, and the rollback only removes the pending
    pod. A blocked rollback (or change back to the config that ran) has
    nothing to go back to: it stands, and the Deployment controller starts
    its pods when it can. Either way every change then waits the cooldown
    (``guardrails.blocked_left``): a schedule window would otherwise stall
    again at once, and again.
    """
    if not awaiting_verdict(state) or state.current is None:
        raise ValueError("no rollout in progress to block")
    assert state.last_rollout is not None
    to = state.last_rollout.to_knobs
    state = state.model_copy(update={"blocked_at": utc_timestamp(now)})
    if _goes_back(state):
        return _stands(state, now, message, f"{to} could not start its pods; it stands until they can: {message}")
    return _roll_back(state, now, RolloutPhase.FAILED,
                      f"{to} could not start its pods; rolling back, the config is not blamed: {message}")


def rollout_overtaken(state: VllmTuningStatus, now: datetime, message: str) -> VllmTuningStatus:
    """Someone else changed the pod template while the rollout awaiting its verdict ran (an image bump, an env
    var), keeping its config: the Deployment rolls out their change and ours together, and how that goes says
    nothing of the config (their image may not start; their change's restart is no measure of ours). Closed
    without a verdict, ``message`` saying why: no failed config, no rollback, no restart timed, and its config is
    the current one from now on, as the template holds it (not taken for a patch of ours whose status write was
    lost)."""
    if not awaiting_verdict(state) or state.current is None:
        raise ValueError("no rollout in progress to close")
    assert state.last_rollout is not None
    return _stands(state, now, message, f"{state.last_rollout.to_knobs} stands, no verdict on it: {message}").state


def strategy_seen(state: VllmTuningStatus, unavailable: int,
                  drain: float | None | EllipsisType = ...) -> VllmTuningStatus:
    """The pods a rollout of the target now stops at once (``rollout.progress.unavailable_at_once``), and how long
    each lets its requests in flight run as it stops (``rollout.drain.drain_seconds``; None: not known, all taken
    to finish; left out: the one recorded stands), recorded before each decision as ``rollout_unavailable`` and
    ``drain_seconds``.

    More of them than at the last evaluation, after a rollout that could not
    start its pods, ends the wait ``blocked_at`` imposes: the Deployment now
    stops a pod before it starts one (the advice a pod with no free GPU gets:
    maxSurge 0 and maxUnavailable 1, or more replicas), so the change that
    stalled may run at once rather than after the cooldown.
    """
    update: dict[str, object] = {"rollout_unavailable": unavailable}
    if drain is not ...:
        update["drain_seconds"] = drain
    if state.blocked_at is not None and state.rollout_unavailable is not None and (
            unavailable > state.rollout_unavailable):
        update["blocked_at"] = None
    return state.model_copy(update=update)


def regression_measured(state: VllmTuningStatus, now: datetime, reason: str) -> Decision:
    """The settled window after a successful change is measurably worse than before it: roll back."""
    if state.last_rollout is None or state.current is None:
        raise ValueError("no rollout to roll back")
    return _roll_back(state, now, RolloutPhase.ROLLED_BACK, reason)


def defaults_resolved(state: VllmTuningStatus, knobs: Knobs, table: str | None) -> VllmTuningStatus:
    """The template still leaves a knob to vLLM, but which default that means is now known better (the GPU of
    a node a pod landed on): ``current`` is corrected, not changed. Nothing was restarted, so it keeps its
    source and since, and it is no person's change (no cooldown)."""
    if state.current is None:
        raise ValueError("no current knobs to correct")
    current = state.current.model_copy(
        update={
            "max_num_batched_tokens": knobs.max_num_batched_tokens,
            "max_num_seqs": knobs.max_num_seqs,
            "defaults_table": table,
        }
    )
    return state.model_copy(update={"current": current})


def last_known_change(state: VllmTuningStatus) -> datetime:
    """When the status last learned of a change of the knobs: the latest rollout's start, or a second before its
    config went live (which is also when a person's change was adopted or the target first seen). A change of
    ours found in the template, written after this, is one whose status write was lost; one written before it is
    an old template put back (``rollout.patch.unrecorded_write``). Stamps are whole seconds, and the evaluation
    that saw a rollout complete may write the next change in the same second: written then, it is ours."""
    if state.current is None:
        raise ValueError("no current knobs: the target is not adopted yet")
    live = datetime.fromisoformat(state.current.since) - timedelta(seconds=1)
    started = [datetime.fromisoformat(state.last_rollout.started_at)] if state.last_rollout is not None else []
    return max([live, *started])


def resumed_write(state: VllmTuningStatus, schedules: Sequence[Schedule], written: datetime, knobs: Knobs,
                  source: KnobSource, reason: str, regime: str | None = None, baseline_attainment: float | None = None,
                  baseline_request_rate: float | None = None) -> VllmTuningStatus:
    """The status once a write of ours to ``knobs`` is found in the template, stamped ``written``, its status write
    lost (``rollout.patch.unrecorded_write``): a rollout in progress, recorded as ``decide`` records it where the
    template tells, with the regime and the baseline ``decide`` measured for the regression check
    (``rollout.patch.written_baseline``; none from an operator before it annotated them). A schedule's write while
    a window's preset was in force is that preset: it keeps the config it replaced to go back to when the window
    closes (``resume_knobs``); any other schedule write (the way back, a window's bounds) keeps none."""
    state = with_rollout(state, written, knobs, source, reason, regime, baseline_attainment, baseline_request_rate)
    if source != KnobSource.SCHEDULE:
        return state
    assert state.current is not None
    windows, _ = windows_in_force(schedules, state, written)
    preset = preset_in_force(windows) is not None
    return state.model_copy(update={"resume_knobs": (state.resume_knobs or state.current.knobs) if preset else None})


def _puts_back_ours(state: VllmTuningStatus, knobs: Knobs) -> bool:
    """Whether the template changing to ``knobs`` puts back what our last change (not a rollback) replaced, while
    that change still stood: a revert (a GitOps sync, ``kubectl rollout undo``)."""
    last = state.last_rollout
    assert state.current is not None
    if last is None or last.source == KnobSource.ROLLBACK or knobs != last.from_knobs:
        return False
    if awaiting_verdict(state):
        return True
    return last.phase == RolloutPhase.SUCCEEDED and state.current.source != KnobSource.MANUAL


def manual_change_detected(state: VllmTuningStatus, knobs: Knobs, now: datetime, writer: str | None = None,
                           defaults_table: str | None = None) -> VllmTuningStatus:
    """A person changed the knobs in the Deployment: adopt them, and respect them for a cooldown.

    ``writer``, when known, is who (the field manager of the write,
    ``rollout.patch.command_line_writer``); the history names it.
    ``defaults_table`` is vLLM's defaults table a knob the template leaves
    to vLLM was read from (None: it sets both), so that the same template
    read against a GPU known better is no change (``defaults_resolved``). A rollout
    of ours still in progress or unverified is closed as superseded (its
    config did not fail, so it is not remembered as failed). A change that
    puts back what our last change replaced is a revert, and is remembered
    in ``status.reverts``, its writer in ``status.reverted_by``: two in a
    day stop our changes (``guardrails.changes_reverted``), or a GitOps tool
    that owns the args and the operator would take turns restarting the pods.
    """
    if state.current is None:
        raise ValueError("no current knobs to replace")
    updates: dict[str, object] = {}
    reverted = _puts_back_ours(state, knobs)
    if reverted:
        updates["reverts"] = [utc_timestamp(now), *state.reverts][:REVERT_LIMIT]
        updates["reverted_by"] = writer
    if awaiting_verdict(state):
        assert state.last_rollout is not None
        updates["last_rollout"] = state.last_rollout.model_copy(
            update={
                "phase": RolloutPhase.FAILED,
                "finished_at": utc_timestamp(now),
                "message": "superseded by a manual change",
            }
        )
    updates["current"] = CurrentKnobs(
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        max_num_seqs=knobs.max_num_seqs,
        since=utc_timestamp(now),
        source=KnobSource.MANUAL,
        from_defaults=defaults_table is not None,
        defaults_table=defaults_table,
        max_model_len=state.current.max_model_len,
        chunked_prefill=state.current.chunked_prefill,
    )
    updates["resume_knobs"] = None
    state = state.model_copy(update=updates)
    by = f" by {writer}" if writer else ""
    what = f"put back{by}, undoing the operator's change," if reverted else f"changed{by or ' by a person'}"
    return with_history(state, now, DecisionAction.HOLD, knobs, f"knobs {what} to {knobs}: adopted as Manual")
