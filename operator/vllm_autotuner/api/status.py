"""The VllmTuning status: what the operator saw, decided and did.

The status is also the operator's memory: everything needed to resume after a
restart (the rollout in flight, the rollout budget, what each traffic regime
liked, which configs failed to start) lives here, so the operator itself is
stateless and a restarted replica never repeats a rollout.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vllm_autotuner.api.spec import BatchedTokens, Knobs, NumSeqs

#: How many decisions status.history keeps, newest first.
HISTORY_LIMIT = 20
#: Most rollout start times the status keeps: the newest, more than the highest daily budget (288) counts.
ROLLOUT_TIMES_LIMIT = 300
#: How many learned regimes and failed configs status keeps.
LEARNED_LIMIT = 32
FAILED_LIMIT = 32
#: How many reverts of our changes status keeps (two within a day stop the changes: ``policy.changes_reverted``).
REVERT_LIMIT = 8
#: How many (regime, config) measurements status keeps, newest first.
MEASUREMENT_LIMIT = 48


class StatusModel(BaseModel):
    """Base of status models. Unknown fields are ignored so an older operator can read a newer status."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    READY = "Ready"
    METRICS_AVAILABLE = "MetricsAvailable"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Condition(StatusModel):
    """A condition in the shape of metav1.Condition."""

    type: str = Field(max_length=316)
    """Type of the condition: Ready, MetricsAvailable, Progressing or Degraded."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """A CamelCase word saying why the condition is in its status."""
    message: str = Field(default="", max_length=32768)
    """What happened, for a person, and what to do about it."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation the condition was set for."""
    last_transition_time: str
    """When the condition last changed status (RFC 3339)."""


class KnobSource(StrEnum):
    INITIAL = "Initial"
    TRAFFIC = "Traffic"
    SCHEDULE = "Schedule"
    MANUAL = "Manual"
    ROLLBACK = "Rollback"


class CurrentKnobs(StatusModel):
    """The knobs the target's pods run with now, read from the pod template."""

    max_num_batched_tokens: BatchedTokens
    """--max-num-batched-tokens in effect."""
    max_num_seqs: NumSeqs
    """--max-num-seqs in effect."""
    since: str
    """When this config went live (RFC 3339)."""
    source: KnobSource
    """Who chose it: Initial (found at adoption), Traffic or Schedule (this operator), Manual (a person), Rollback."""
    from_defaults: bool = False
    """True when a flag is absent and vLLM's default applies; defaultsTable names the table assumed."""
    defaults_table: str | None = None
    """The vLLM default table assumed for absent flags."""
    max_model_len: int | None = Field(default=None, ge=1)
    """--max-model-len of the vLLM container (absent: the model's own), for vLLM's start-up rules."""
    chunked_prefill: bool = True
    """Whether chunked prefill is on (always in the V1 engine), for vLLM's start-up rules."""

    @property
    def knobs(self) -> Knobs:
        return Knobs(max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs)


class Recommendation(StatusModel):
    """The latest decision's preferred config, applied or not (Recommend mode never applies it)."""

    max_num_batched_tokens: BatchedTokens
    """Recommended --max-num-batched-tokens."""
    max_num_seqs: NumSeqs
    """Recommended --max-num-seqs."""
    reason: str
    """Why, in words."""
    expected_gain_percent: float | None = None
    """Expected SLO-goodput gain over the current config, in percent, when one can be estimated."""
    time: str
    """When it was made (RFC 3339)."""


class ObservedTraffic(StatusModel):
    """Numbers from the last usable observation window, all pods of the target together."""

    window_start: str
    """Start of the window (RFC 3339)."""
    window_end: str
    """End of the window (RFC 3339)."""
    pods: int = Field(ge=0)
    """Pods whose series were in the window."""
    request_rate: float
    """Requests per second that ended: finished (whatever the reason) or refused at admission."""
    refused_requests_per_second: float | None = None
    """Of them, refused at admission past vLLM's queue limits (--max-num-queued-reqs, -tokens): misses."""
    prompt_tokens_per_second: float
    """Prefill tokens per second."""
    generation_tokens_per_second: float
    """Generated tokens per second."""
    ttft_seconds: float | None = None
    """TTFT at the SLO's quantile."""
    itl_seconds: float | None = None
    """Inter-token latency at the SLO's quantile."""
    e2e_seconds: float | None = None
    """End-to-end request latency at the SLO's TTFT quantile."""
    queue_seconds: float | None = None
    """Queue time at the SLO's TTFT quantile."""
    running: float | None = None
    """Mean running requests per pod."""
    waiting: float | None = None
    """Mean requests per pod waiting for room in the batch (not those deferred for a LoRA slot or a KV transfer)."""
    kv_cache_usage: float | None = None
    """Mean KV-cache usage, 0 to 1."""
    preemptions_per_second: float | None = None
    """Preemptions per second."""
    mean_prompt_tokens: float | None = None
    """Mean prompt length of completed requests."""
    mean_generation_tokens: float | None = None
    """Mean output length of completed requests."""
    step_tokens_mean: float | None = None
    """Mean tokens per engine step computed (vllm:iteration_tokens_total, less the prompt tokens the prefix cache
    served): how much of the budget is used."""


class RolloutPhase(StrEnum):
    IN_PROGRESS = "InProgress"
    UNVERIFIED = "Unverified"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ROLLED_BACK = "RolledBack"


class Rollout(StatusModel):
    """One change of the knobs applied to the target, and how it went."""

    from_knobs: Knobs = Field(alias="from")
    """Knobs before the change."""
    to_knobs: Knobs = Field(alias="to")
    """Knobs after the change."""
    rollback_to: Knobs | None = None
    """The config a rollback of this change goes back to, when not `from`: the last one pods ran before it. They differ when the rollout before this one was Unverified (written at zero replicas, never started): a rollback never goes to a config no pod has run."""
    source: KnobSource
    """What asked for it."""
    reason: str
    """Why, in words."""
    started_at: str
    """When the Deployment was patched (RFC 3339)."""
    finished_at: str | None = None
    """When the rollout completed, failed or was rolled back (RFC 3339)."""
    phase: RolloutPhase
    """InProgress, Unverified (complete while the Deployment is scaled to zero: no pod has started the config yet; it is judged like a rollout in progress once the Deployment scales up), Succeeded, Failed (did not become Ready, rolled back; or closed without a verdict on its config, as message says: superseded by a person's change, overtaken by someone else's template change) or RolledBack (measured regression)."""
    deployment_generation: int | None = None
    """metadata.generation of the Deployment after the patch; the rollout is complete when status.observedGeneration reaches it and all replicas are updated and available."""
    template_digest: str | None = Field(default=None, max_length=84)
    """`<generation>:<SHA-256>` of the Deployment's pod template as the apiserver returned it after the patch, at the patch's generation (its `kubectl rollout restart` stamp left out). A template that differs from it while it still holds `to` was changed by someone else during the rollout (an image bump, an env var): the Deployment then rolls out their change and ours together, whose outcome is theirs, so the rollout is closed (Failed, with a message saying so) without a verdict on `to`. Absent (written by an operator before chart 0.5.57), of another generation than deploymentGeneration (an earlier rollout's, which an older operator's status write leaves in place after a downgrade), or naming none: every template holding `to` is judged as this rollout."""
    progressed_at: str | None = None
    """When the rollout last made progress, a pod of the new config created or become available (RFC 3339): spec.rollout.progressDeadline counts from here (from startedAt before any), as the Deployment controller's progressDeadlineSeconds does."""
    progress_mark: int = Field(default=0, ge=0)
    """Pods of the new config created plus those of them available, as last seen: a rise is progress (a fall, an autoscaler scaling the rollout down, restarts no clock, and the steps after it count)."""
    message: str = ""
    """Details, e.g. the vLLM error of a crash-looping pod. While the rollout awaits its verdict: the verdict (`RolloutFailed: ...` or `RolloutBlocked: ...`) of a rollout whose rollback could not be written yet; the rollback is retried at each evaluation."""
    regime: str | None = None
    """Traffic regime the change was made for."""
    baseline_attainment: float | None = Field(default=None, ge=0, le=1)
    """Estimated share of requests within the SLO in the window before the change: the regression check's baseline."""
    baseline_request_rate: float | None = Field(default=None, ge=0)
    """Requests per second per pod in the window before the change: a window judged under heavier traffic is no evidence of a regression."""
    verified_at: str | None = None
    """When a settled window after the rollout was compared with the baseline (RFC 3339)."""
    unverified_at: str | None = None
    """When the rollout completed with the Deployment scaled to zero, no pod restarted (RFC 3339). Its duration and the capacity lost after it are a scale-up's, not a restart's, so neither is taken as one."""
    halted_at: str | None = None
    """When its Deployment was first seen not rolling (paused, or scaled to zero) while the rollout awaited its verdict (RFC 3339). Its duration then counts the halt, hours perhaps, and the pods that started after it were no rolling restart's, so it is not taken as a restart's length (rolloutSeconds)."""
    lost_seconds: float = Field(default=0.0, ge=0)
    """SLO goodput lost while the pods restarted and their queue drained, in seconds of the whole target's goodput: the baseline attainment minus what the windows showed, over time."""

    @property
    def rollback_knobs(self) -> Knobs:
        """The config a rollback of this change goes back to: the last one pods ran before it."""
        return self.rollback_to or self.from_knobs


class DecisionAction(StrEnum):
    HOLD = "Hold"
    CHANGE = "Change"
    ROLLBACK = "Rollback"


class DecisionRecord(StatusModel):
    """One decision, for the bounded history."""

    time: str
    """When it was made (RFC 3339)."""
    action: DecisionAction
    """Hold, Change or Rollback."""
    max_num_batched_tokens: BatchedTokens
    """Token budget decided on (the current one for Hold)."""
    max_num_seqs: NumSeqs
    """max-num-seqs decided on (the current one for Hold)."""
    reason: str
    """Why, in words."""
    hold: str | None = Field(default=None, max_length=64)
    """For Hold: why, in one word, as in the decisions_total metric (Cooldown, ChangeFreeze, RolloutSlots, ...)."""


class LearnedOptimum(StatusModel):
    """The best config measured so far for one traffic regime."""

    regime: str
    """Regime name, e.g. 'high/long-prompt'."""
    max_num_batched_tokens: BatchedTokens
    """Best --max-num-batched-tokens measured for the regime."""
    max_num_seqs: NumSeqs
    """Best --max-num-seqs measured for the regime."""
    goodput: float
    """SLO goodput measured with it: output tokens per second per pod of requests within the SLO."""
    attainment: float | None = Field(default=None, ge=0, le=1)
    """Estimated share of requests within both latency targets with it."""
    measured_at: str
    """When (RFC 3339)."""


class Measurement(StatusModel):
    """What one config did under one traffic regime, from the latest usable window.

    The adaptive policy's memory: it predicts a candidate from these before
    paying for a restart (step time against tokens per step, KV-cache use
    against concurrency) and prefers measured configs to predicted ones.
    All rates and means are per pod.
    """

    regime: str
    """Traffic regime of the window."""
    max_num_batched_tokens: BatchedTokens
    """--max-num-batched-tokens the window ran under."""
    max_num_seqs: NumSeqs
    """--max-num-seqs the window ran under."""
    measured_at: str
    """End of the window (RFC 3339)."""
    windows: int = Field(default=1, ge=1)
    """Evaluations that measured this config in this regime."""
    abandoned: int = Field(default=0, ge=0)
    """Times the policy changed away from this config in this regime. Its measurement then counts only at a
    prediction's discount, and after the second time it is not returned to: traffic that drifts while
    configs are compared must not make the policy oscillate."""
    request_rate: float = Field(ge=0)
    """Requests per second per pod that ended: finished (whatever the reason) or refused at admission."""
    refused_share: float | None = Field(default=None, ge=0, le=1)
    """Share of them vLLM refused at admission, past its queue limits (--max-num-queued-reqs, -tokens): misses in
    the attainment. A prediction for another config keeps it: nothing measured says what a change does to it."""
    generation_tokens_per_second: float = Field(ge=0)
    """Generated tokens per second per pod."""
    prompt_tokens_per_second: float = Field(ge=0)
    """Prefill tokens per second per pod."""
    cached_prompt_tokens_per_second: float | None = Field(default=None, ge=0)
    """Of those, the tokens per second not computed: served from the prefix cache or sent by another instance."""
    mean_prompt_tokens: float = Field(ge=0)
    """Mean prompt length."""
    mean_generation_tokens: float = Field(ge=0)
    """Mean output length."""
    attainment: float = Field(ge=0, le=1)
    """Estimated share of requests within both latency targets (TTFT, and their own ITL at the ITL quantile); a
    request refused at admission is within neither."""
    ttft_within_slo: float | None = Field(default=None, ge=0, le=1)
    """Measured share of requests whose TTFT is within the target."""
    itl_within_slo: float | None = Field(default=None, ge=0, le=1)
    """Measured share of inter-token gaps within the ITL target."""
    ttft_seconds: float = Field(ge=0)
    """TTFT at the SLO quantile."""
    itl_seconds: float = Field(ge=0)
    """Inter-token latency at the SLO quantile."""
    queue_seconds: float | None = Field(default=None, ge=0)
    """Queue time at the TTFT quantile."""
    itl_mean_seconds: float | None = Field(default=None, ge=0)
    """Mean inter-token latency: about the mean engine step time."""
    step_tokens_mean: float | None = Field(default=None, ge=0)
    """Mean tokens per engine step computed (the prompt tokens the prefix cache served not counted)."""
    step_tokens_quantile: float | None = Field(default=None, ge=0)
    """Tokens per engine step at the ITL SLO quantile."""
    running: float | None = Field(default=None, ge=0)
    """Mean running requests."""
    waiting: float | None = Field(default=None, ge=0)
    """Mean waiting requests."""
    kv_cache_usage: float | None = Field(default=None, ge=0)
    """Mean KV-cache usage, 0 to 1."""
    preemptions_per_second: float | None = Field(default=None, ge=0)
    """Preemptions per second."""

    @property
    def knobs(self) -> Knobs:
        return Knobs(max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs)


class FailedConfig(StatusModel):
    """A config that did not start (or crash-looped); never tried again until the spec changes."""

    max_num_batched_tokens: BatchedTokens
    """--max-num-batched-tokens of the failed config."""
    max_num_seqs: NumSeqs
    """--max-num-seqs of the failed config."""
    reason: str
    """What went wrong, e.g. the vLLM start-up error."""
    at: str
    """When (RFC 3339)."""
    generation: int = Field(ge=0)
    """metadata.generation of the VllmTuning when it failed; a spec change (new generation) forgets it."""


class VllmTuningStatus(StatusModel):
    """Observed state of a VllmTuning."""

    observed_generation: int | None = None
    """The .metadata.generation last acted upon."""
    target_uid: str | None = None
    """UID of the Deployment this status describes; a re-created Deployment (new UID) is adopted afresh."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready, MetricsAvailable, Progressing and Degraded."""
    current: CurrentKnobs | None = None
    """Knobs the target runs with now."""
    recommendation: Recommendation | None = None
    """The latest recommendation."""
    active_schedule: str | None = None
    """Name of the schedule window in force, if any."""
    active_schedule_start: str | None = None
    """When that window opens or opened (RFC 3339): entered in its pre-roll, it stays in force until this opening closes."""
    preset_schedule: str | None = None
    """Name of the window whose preset is in force when that is not the window in force: a preset window beneath one that only overrides the SLO or bounds."""
    preset_schedule_start: str | None = None
    """When that window opens or opened (RFC 3339): entered in its pre-roll, it stays in force until this opening closes."""
    regime: str | None = None
    """Traffic regime of the last observation (load level and length mix, or the matching tier)."""
    regime_since: str | None = None
    """When the traffic entered that regime, or its length mix last moved (RFC 3339); how long a regime has lasted is the estimate of how long it will last."""
    resume_knobs: Knobs | None = None
    """Knobs in force before the active schedule window's preset, restored when the window closes unless the traffic policy can tell from a usable window what it would choose for the traffic then (one restart, not two); kept, with the preset, past the close while a window that would replace the config the close goes to begins its pre-roll within the rollout lead and its change will go out then."""
    observed: ObservedTraffic | None = None
    """Numbers from the last usable observation."""
    last_rollout: Rollout | None = None
    """The latest rollout."""
    restart_cost_seconds: float | None = Field(default=None, ge=0)
    """What a rollout of this target costs, in seconds of its whole SLO goodput: lostSeconds over the baseline attainment, averaged over the measured rollouts (none yet: estimated from the load)."""
    rollout_seconds: float | None = Field(default=None, ge=0)
    """How long a rolling restart of the target takes: the last one the operator timed, from the patch to its last pod Ready (seconds). Only a change of its own that succeeded with pods running is timed: not a rollback (after a rollout whose new pods could not start, it only removes a pending pod), nor a config written while the Deployment was scaled to zero (it waited for a scale-up), nor a rollout its Deployment was seen paused or scaled to zero during (lastRollout.haltedAt: the halt is no restart's time). Schedule pre-rolls, the lead before a change freeze and the price of a restart follow it; absent, 5 minutes ahead of a window or freeze, and 3 minutes out of service for each wave of pods a restart stops."""
    rollout_times: list[str] = Field(default_factory=list, max_length=ROLLOUT_TIMES_LIMIT)
    """Start times of rollouts in the last 24 hours (the daily rollout budget)."""
    history: list[DecisionRecord] = Field(default_factory=list, max_length=HISTORY_LIMIT)
    """The latest decisions, newest first."""
    learned: list[LearnedOptimum] = Field(default_factory=list, max_length=LEARNED_LIMIT)
    """Best measured config per traffic regime, so a returning regime goes straight back to it."""
    measurements: list[Measurement] = Field(default_factory=list, max_length=MEASUREMENT_LIMIT)
    """Latest window of each (regime, config) measured, newest first: the adaptive policy's data."""
    failed_configs: list[FailedConfig] = Field(default_factory=list, max_length=FAILED_LIMIT)
    """Configs that failed to start; never tried again until the spec changes."""
    rollout_unavailable: int | None = Field(default=None, ge=0)
    """Pods a rollout of the target takes out of service at once, as its Deployment's strategy resolves against spec.replicas: all of them under Recreate, maxUnavailable under RollingUpdate (none when it only surges). Restart costs are estimated with it; absent, one at a time."""
    drain_seconds: float | None = Field(default=None, ge=0)
    """How long a stopping pod of the target lets its requests in flight run before they are cut, as its pod template sets it: vLLM's --shutdown-timeout, as far as terminationGracePeriodSeconds leaves it after the preStop sleep (another preStop hook, whose length the template does not say, counted as none: at most this); 0 when vLLM aborts them on SIGTERM (no --shutdown-timeout), or dies at once with its shell, conda run or hatch run (an init in front of it, or a process namespace the pod shares); at most 2 s under runuser or su, which kill it that long after passing the SIGTERM on; all the grace period leaves when the container's shell, conda run or hatch run runs vLLM as its child and ignores the SIGTERM. A restart's price counts the requests in flight that would run longer, which no metric shows (they die with the process); absent (not read yet, or a --config file may set the timeout), all are taken to finish."""
    blocked_at: str | None = None
    """When a rollout last could not start its new pods (no free GPU for a surge pod, an image not pulled, a quota) and was rolled back (RFC 3339): every change, a schedule window's too, waits spec.rollout.cooldown after it rather than stall again at once. Cleared sooner when the Deployment's strategy comes to stop more pods at once (rolloutUnavailable rises: maxSurge 0 and maxUnavailable 1, more replicas): a new pod then needs no spare GPU."""
    slot_wait_since: str | None = None
    """Since when a change of this tuning has waited for one of the operator's rollout slots (--max-concurrent-rollouts), RFC 3339: the earliest waiting change gets the next free slot. Kept through holds that say nothing of the change (missing or stale data, a rollout in progress), so a short data gap does not cost the place; cleared by any other decision."""
    reverts: list[str] = Field(default_factory=list, max_length=REVERT_LIMIT)
    """When another writer of the Deployment (a GitOps sync, a person's undo) put back the knobs a change of ours had replaced, newest first (RFC 3339). Two within 24 hours stop the operator's changes (it only recommends) until the spec changes."""
    reverted_by: str | None = None
    """Who wrote the newest of the reverts: the field manager the Kubernetes API recorded for the write (argocd-controller for an Argo CD sync, kubectl for a rollout undo), with "(server-side apply)" for an applier such as Flux. Absent when the Deployment's managedFields did not say."""
