"""The decision core: which ``--max-num-batched-tokens`` / ``--max-num-seqs`` a vLLM Deployment should run now.

Pure and deterministic: no I/O, no clock of its own, no randomness. The
live operator and the offline benchmark call the same functions, so what
the benchmark proves is what the operator does.

Stable API
==========

``decide(spec, state, observation, now, *, slot_holders=(), max_concurrent_rollouts=0, controlled_by=None) -> Decision``
    One evaluation. ``spec`` is the ``VllmTuningSpec``; ``state`` the
    ``VllmTuningStatus`` as persisted (after ``adopt_generation``);
    ``observation`` the window Prometheus gave (``None`` when it gave
    nothing; pass an empty window, ``pods=0``, for a Deployment scaled to
    zero, which is not blind); ``now`` a timezone-aware datetime. The ``Decision`` is Hold,
    Change or Rollback, with ``knobs``, a ``reason`` in words, the
    ``source`` (Traffic, Schedule, Rollback), the ``expected_gain_percent``,
    a ``hold`` word for holds, the ``recommendation`` and the ``state`` to
    persist. In Auto mode a Change's state already records the rollout as
    in progress: patch the Deployment, then write the state (if the patch
    fails, drop it). Recommend mode never returns a Change: it holds with
    the recommendation. Paused holds. The keywords carry the facts from
    outside the tuning: when ``slot_holders`` (what holds the operator's
    rollout slots, one string each, as ``rollout.slots`` names them) are
    ``max_concurrent_rollouts`` or more (0: no limit), a change holds
    (``RolloutSlots``, naming them); a rollback does not. ``controlled_by``
    names the object that controls the target Deployment (its controller
    ownerReference, unless ``spec.targetRef.ignoreController``): its
    controller would put the args back, so every change is only
    recommended (``TargetControlled``; ``controlled_advice`` says what to do).

``Observation``
    One window of metrics for the target's current pods; any number may be
    None or NaN. ``hold_reason`` (used by ``decide``) says whether it is
    usable: data present, fresh, numbers finite, enough requests, all taken
    under the current config after the settle time, no rollout running.
    Pass windows during rollouts too (``rollout_in_progress=True``, over
    every pod still reporting, old and new, ``config`` None when pods
    differ): they never drive a change, but what they fell
    short of the pre-change window is the rollout's measured cost
    (``status.restartCostSeconds``), which prices the next change. A request
    meets the SLO when its TTFT is within the TTFT target and its own
    inter-token latency at the ITL quantile within the ITL target (no more
    than ``1 - quantile`` of its gaps longer): a stream that stalls every few
    tokens behind long prefill steps misses a p95 target even when its mean
    gap is short. Prometheus has no per-request gaps, so the share of such
    requests is estimated from the share of all gaps within the target
    (``vllm:inter_token_latency_seconds``) and the mean output length
    (``model.request_itl_share``); the benchmark counts it request by
    request. A request vLLM refused at admission (``refused_rate``, part of
    ``request_rate``, in no latency histogram) meets neither target, and no
    change is predicted to admit it: its queue limit decides that. While
    ``asleep_pods`` says engines slept in the window (vLLM's sleep mode),
    no change starts, a scheduled one neither (``EngineAsleep``): a restart
    would wake them. Nor while the window is blind (``None``, stale, NaN:
    ``observation.blind``): a schedule's preset waits for a fresh window,
    held with the reason of the missing data and shown as the
    recommendation; a quiet window does not hold it.

``effective_slo(spec, state, now) -> SLO``
    The SLO (quantiles and targets) the observation must be computed for: a
    schedule window may override the spec's.

Rollout lifecycle (the operator calls these when the Deployment tells it):
    ``rollout_progressed(state, now, mark, halted)`` a pod of the new config
    was created or became available (``mark`` rose), or the Deployment does
    not roll (paused, scaled to zero): the progress deadline counts from
    ``now`` again, and the rollout times no restart;
    ``rollout_unverified(state, now)`` the rollout completed with the
    Deployment scaled to zero: no pod started the config, which is judged
    when the Deployment scales up (``awaiting_verdict(state)`` is true until
    then, and while a rollout is in progress);
    ``rollout_succeeded(state, now)`` the new pods are all Ready;
    ``rollout_failed(state, now, message, generation) -> Decision`` they did
    not start: the config is recorded as failed and the Decision rolls back
    (to the config pods last ran: ``Rollout.rollback_knobs``);
    ``rollout_blocked(state, now, message) -> Decision`` no new pod started
    vLLM by the deadline (no free GPU, an image not pulled, a quota):
    nothing is blamed, and the Decision rolls back;
    ``rollout_overtaken(state, now, message)`` someone else changed the pod
    template during the rollout, keeping its config: closed with no verdict;
    ``rolling_out(state)`` our last rollout is in progress by the status;
    ``strategy_seen(state, unavailable, drain=...)`` the pods a rollout now
    stops at once, and how long each lets its requests in flight run as it
    stops (None: not known; left out: as recorded), recorded before each
    decision: more pods than before, after a
    blocked rollout, ends the cooldown the block began (a strategy that no
    longer needs a spare GPU);
    ``manual_change_detected(state, knobs, now, writer=None,
    defaults_table=None)`` a person (or ``writer``, a field manager) changed
    the args (leaving a knob to vLLM's ``defaults_table``);
    ``last_known_change(state)`` the latest change of the knobs the status
    knows of (a write of ours after it had its status write lost);
    ``resumed_write(state, schedules, written, knobs, source, reason,
    regime=None, baseline_attainment=None, baseline_request_rate=None)`` such
    a write, followed as the rollout it is, against the baseline annotated
    with it (a window's preset remembering the config to go back to);
    ``defaults_resolved(state, knobs, table)`` the args still leave a knob to
    vLLM, whose default for the pods' GPU is now known better;
    ``adopt_generation(state, generation)`` the spec changed (failed configs
    of older specs may be tried again);
    ``with_timed_restart(state)`` a status read from the cluster, written by
    an older version without ``rolloutSeconds``, takes it from its last
    rollout. A measured regression is found by
    ``decide`` itself, which then returns a Rollback (``regression_measured``).

What it does
============

1. **Time of day** (``schedule``): the schedule window in force, read in its
   IANA time zone, across midnight and daylight-saving changes, with
   overlaps settled by ``priority`` then list order (a window that only
   overrides the SLO or bounds leaves an open preset window's knobs in
   force), and pre-roll so a preset is live when its window opens. A
   preset window closing goes to what the traffic policy would choose for
   the traffic then, where a usable window tells it, else back to the
   config that ran before it; but while a window that would replace that
   config begins its pre-roll within the rollout lead, and its change will
   go out then (no freeze, a preset that may be tried), the preset stays
   until then: one restart, not two.
2. **Traffic** (``regime``, ``adaptive``, ``model``): the regime (load and
   length mix, or the user's ``Tiers``); the Adaptive strategy predicts
   every candidate config with a model fitted online from the windows (step
   time linear in batched tokens, roofline capacity and queueing against
   utilisation, KV cache against concurrency, recomputation of preempted
   requests) and heads for the best in as few rollouts as the step limit
   allows, preferring configs measured in the regime (in a steady state: not
   across a change of traffic, not while a restart's queue drains) and going
   straight back to a regime's learned optimum; a config it left twice in a
   regime it does not return to.
3. **Guardrails** (``guardrails``): bounds and vLLM's start-up rules; never a
   config that failed to start under this spec; no change at all, only
   recommendations, once another writer (a GitOps sync) has put back what
   the operator changed twice in a day (``changes_reverted(state)``;
   ``reverted_advice(state.reverted_by)`` says who, as the Kubernetes API
   recorded the write, and what to do); at most ``maxStepFactor`` per
   Adaptive step into unmeasured territory; cooldown; a daily rollout budget that keeps
   room for the day's schedule windows; no change in a change freeze, nor
   in the rollout lead before one (``schedule.freeze_in_force``); a regime,
   and its length mix, must last one window; no traffic change before the
   last one is judged (and rolled back if it made things measurably worse
   once the restart's queue drained,
   under no more traffic than before it); an expected
   gain, net of the restarts' cost (measured, but never below the estimate
   from the load the other pods must carry now, plus the requests in flight
   that stopping pods cut, which no metric shows) over the regime's expected
   life (its mean remaining life within six hours, given how long it has
   lasted, and for the regime in force when the operator first looked, that
   it began at an unknown time before), of at least
   ``minImprovementPercent``; every hold with a reason.
"""

from vllm_autotuner.policy.decide import controlled_advice, decide, effective_slo, reverted_advice
from vllm_autotuner.policy.decision import Decision
from vllm_autotuner.policy.lifecycle import (
    adopt_generation,
    awaiting_verdict,
    defaults_resolved,
    last_known_change,
    manual_change_detected,
    regression_measured,
    resumed_write,
    rollout_blocked,
    rollout_failed,
    rollout_overtaken,
    rollout_progressed,
    rollout_succeeded,
    rollout_unverified,
    strategy_seen,
    with_timed_restart,
)
from vllm_autotuner.policy.guardrails import changes_reverted
from vllm_autotuner.policy.observation import HoldReason, Observation, hold_reason, rolling_out

__all__ = [
    "decide",
    "effective_slo",
    "Decision",
    "Observation",
    "HoldReason",
    "hold_reason",
    "changes_reverted",
    "reverted_advice",
    "controlled_advice",
    "rollout_progressed",
    "rollout_unverified",
    "rollout_succeeded",
    "awaiting_verdict",
    "rollout_failed",
    "rollout_blocked",
    "rollout_overtaken",
    "strategy_seen",
    "rolling_out",
    "regression_measured",
    "manual_change_detected",
    "last_known_change",
    "resumed_write",
    "adopt_generation",
    "defaults_resolved",
    "with_timed_restart",
]
