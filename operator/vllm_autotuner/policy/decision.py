"""The Decision a policy returns, and the status bookkeeping every decision shares.

A decision carries the status to persist with it, so that the live
operator and the benchmark apply exactly the same state transitions: the
operator patches the Deployment (for Change and Rollback in Auto mode) and
writes ``decision.state``; it never edits the status itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from vllm_autotuner.api import DecisionAction, DecisionRecord, Knobs, KnobSource, Rollout, VllmTuningStatus
from vllm_autotuner.api.status import HISTORY_LIMIT, ROLLOUT_TIMES_LIMIT, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.policy.guardrails import rollouts_last_day
from vllm_autotuner.policy.observation import HoldReason


@dataclass(frozen=True)
class Decision:
    """Hold, or change the target to ``knobs``; always with a reason a person can read."""

    action: DecisionAction
    """Hold, Change (a new config) or Rollback (back to the previous config)."""
    knobs: Knobs | None
    """The config the target should run: the new one for Change and Rollback, the current one (if known) for Hold."""
    reason: str
    """Why, in words."""
    state: VllmTuningStatus
    """The status to persist once the decision is acted on as spec.mode says."""
    source: KnobSource | None = None
    """Who asked for a change: Traffic, Schedule or Rollback."""
    expected_gain_percent: float | None = None
    """Expected SLO-goodput gain of a traffic-driven change, net of the restart cost."""
    hold: HoldReason | None = None
    """For Hold: why, as a word for conditions and metrics."""
    recommendation: Knobs | None = None
    """The config the policy prefers, applied or not (Recommend mode reports it without applying)."""
    warnings: tuple[str, ...] = ()
    """Problems with the spec the decision worked around, e.g. a schedule with an unreadable cron expression."""

    @property
    def changes(self) -> bool:
        """Whether the operator must patch the target now."""
        return self.action != DecisionAction.HOLD


def with_history(
    state: VllmTuningStatus,
    now: datetime,
    action: DecisionAction,
    knobs: Knobs | None,
    reason: str,
    hold: HoldReason | None = None,
) -> VllmTuningStatus:
    """The status with this decision in its history, newest first (``hold``: a Hold's reason word).

    Consecutive holds share one entry, the latest, so the bounded history
    shows the changes and what the policy is waiting for now.
    """
    if knobs is None:
        return state
    history = list(state.history)
    record = DecisionRecord(
        time=utc_timestamp(now),
        action=action,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        max_num_seqs=knobs.max_num_seqs,
        reason=reason,
        hold=hold,
    )
    if action == DecisionAction.HOLD and history and history[0].action == DecisionAction.HOLD:
        history[0] = record
    else:
        history.insert(0, record)
    return state.model_copy(update={"history": history[:HISTORY_LIMIT]})


def with_rollout(
    state: VllmTuningStatus,
    now: datetime,
    target: Knobs,
    source: KnobSource,
    reason: str,
    regime: str | None = None,
    baseline_attainment: float | None = None,
    baseline_request_rate: float | None = None,
) -> VllmTuningStatus:
    """The status once the target is patched to ``target``: a rollout in progress, counted in the daily budget.

    Its rollback goes to the config pods last ran: the current one, unless
    the last rollout is unverified (written at zero replicas, no pod has
    started it), and then where that one's rollback would have gone. A
    rollback's own config ran before it, so it is kept even unverified.
    """
    assert state.current is not None
    last = state.last_rollout
    ran = state.current.knobs
    if last is not None and last.phase == RolloutPhase.UNVERIFIED and last.source != KnobSource.ROLLBACK:
        ran = last.rollback_knobs
    rollout = Rollout(
        from_knobs=state.current.knobs,
        rollback_to=None if ran == state.current.knobs else ran,
        to_knobs=target,
        source=source,
        reason=reason,
        started_at=utc_timestamp(now),
        phase=RolloutPhase.IN_PROGRESS,
        regime=regime,
        baseline_attainment=baseline_attainment,
        baseline_request_rate=baseline_request_rate,
    )
    # a schedule change counts 23 hours (SHORTEST_DAY_SECONDS), so the day's list can hold more than the
    # budget; the newest ROLLOUT_TIMES_LIMIT, more than any budget, still say it is spent
    times = [*rollouts_last_day(state, now), utc_timestamp(now)][-ROLLOUT_TIMES_LIMIT:]
    return state.model_copy(update={"last_rollout": rollout, "rollout_times": times})
