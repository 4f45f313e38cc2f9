"""One evaluation of one VllmTuning: observe, decide, act, report.

This is the glue between the pure parts and the cluster, kept in the order
of DESIGN.md's data flow. It decides nothing itself: the spec is validated
by the models, the knobs read by ``knobs``, the rollout judged by
``rollout.progress``, every state transition made by ``policy``; this module
only fetches what those need, applies what they return, and reports.

Safety rules it enforces around the policy: nothing is patched unless the
mode is Auto (a rollback of our own failed rollout excepted), the target and
its args are readable, it is not paused and no other VllmTuning names it,
and no rollout (by anyone) is running; the status is
written after the patch, and a restarted operator recognises its own patch
by the pod-template annotations, so a rollout is never started twice; they
carry the time of the write, so an old template put back (``kubectl rollout
undo``) is a person's change, not a patch of ours to resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from vllm_autotuner.api import (
    API_VERSION,
    KIND,
    ConditionType,
    CurrentKnobs,
    DecisionAction,
    Knobs,
    KnobSource,
    Mode,
    Recommendation,
    Rollout,
    RolloutPhase,
    VllmTuningSpec,
    VllmTuningStatus,
)
from vllm_autotuner.api.types import duration_seconds, parse_cron, time_zone, utc_timestamp
from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache, Key, revision
from vllm_autotuner.controller.conditions import condition, set_condition
from vllm_autotuner.controller.kube import Kube, api_error, label_selector
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.knobs import (
    CommandLineError,
    EngineArgs,
    Hardware,
    find_vllm_container,
    parse_version,
    vllm_defaults,
)
from vllm_autotuner.knobs.defaults import MEMORY_LABELS
from vllm_autotuner.observe.client import Connection, PrometheusError
from vllm_autotuner.observe.queries import PodMatch, Selector, pod_matchers, reach
from vllm_autotuner.observe.service import ObservationService
from vllm_autotuner.observe.window import observe_target
from vllm_autotuner.policy import (
    Decision,
    HoldReason,
    Observation,
    adopt_generation,
    awaiting_verdict,
    changes_reverted,
    controlled_advice,
    decide,
    defaults_resolved,
    effective_slo,
    last_known_change,
    manual_change_detected,
    resumed_write,
    reverted_advice,
    rollout_blocked,
    rollout_failed,
    rollout_overtaken,
    rollout_progressed,
    rollout_succeeded,
    rollout_unverified,
    rolling_out,
    strategy_seen,
    with_timed_restart,
)
from vllm_autotuner.policy.guardrails import cut_share, failed_configs, in_flight_seconds
from vllm_autotuner.policy.observation import stale_after
from vllm_autotuner.policy.schedule import never_opens
from vllm_autotuner.rollout.apply import ConflictUnread, RolloutBusy, apply_knobs
from vllm_autotuner.rollout.drain import drain_advice, drain_seconds
from vllm_autotuner.rollout.patch import (
    TEMPLATE_HASH_LABEL,
    baseline_annotation,
    command_line_writer,
    split_verdict,
    unrecorded_write,
    written_baseline,
    written_reason,
)
from vllm_autotuner.rollout.progress import (
    Progress,
    progress_mark,
    rollout_in_progress,
    rollout_state,
    template_overtaken,
    template_record,
    unavailable_at_once,
)
from vllm_autotuner.rollout.slots import RolloutSlots

log = logging.getLogger(__name__)

#: Characters of a generateName the apiserver keeps (63 less the 5 random ones it adds): the pods of a Deployment
#: whose name is 47 characters or more have names that begin with a cut ReplicaSet name.
GENERATED_NAME_BASE = 58
GPU_RESOURCE = "nvidia.com/gpu"
#: Age of a node by which its GPU labels would have been written: GPU Feature Discovery's come seconds to a minute
#: after the node takes pods. A node younger than this without any is read again at the next evaluation.
GPU_LABELS_WAIT = timedelta(minutes=10)
#: Hold reasons that mean the metrics themselves are missing, not that the policy is waiting.
_NO_METRICS = {HoldReason.NO_DATA, HoldReason.STALE, HoldReason.INVALID}
#: Holds whose recommendation is the operator's only output: an Event for each new one.
_RECOMMENDING = {HoldReason.RECOMMEND_ONLY, HoldReason.CONTROLLED}


@dataclass(frozen=True)
class OperatorSettings:
    """Operator-wide settings from the command line."""

    prometheus_url: str | None = None
    # for the Prometheus at prometheus_url only: headers (a tuning's own go over them), files of a bearer token and
    # of a CA bundle (read at each evaluation, so a rotated token is taken up; a tuning's own credentials win)
    prometheus_headers: tuple[tuple[str, str], ...] = ()
    prometheus_bearer_token_file: str | None = None
    prometheus_ca_file: str | None = None
    naive_queries: bool = False  # one query per family per tuning: the scale benchmark's baseline
    max_concurrent_rollouts: int = 0  # rollouts of tuned Deployments in progress at once, anyone's; 0: no limit
    rollout_pool_label: str = ""  # node label whose values are the pools the limit holds in; "": one pool
    recommend_only: bool = False  # every Auto tuning acts as Recommend: no change is made (rollbacks still are)


def pod_prefix(replicaset: str) -> str:
    """What the names of a ReplicaSet's pods begin with: its name and '-' (their generateName), cut as the
    apiserver cuts it before adding five random characters."""
    return f"{replicaset}-"[:GENERATED_NAME_BASE]


class TargetProblem(Exception):
    """The target cannot be tuned; ``reason`` is the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _operator_file(path: str, flag: str, value: str) -> str:
    """The text of a file the operator was told to read for its Prometheus (``flag``, chart value ``value``),
    without surrounding whitespace. Raises TargetProblem when it cannot."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise TargetProblem("PrometheusCredentialsUnreadable",
                            f"the operator cannot read {path} ({flag}, chart value prometheus.{value}): "
                            f"{exc.strerror or exc}; mount it in the operator's pod, or unset it") from exc


@dataclass
class Target:
    """What this evaluation learned about the target Deployment."""

    deployment: dict[str, Any]
    container: dict[str, Any]
    args: EngineArgs
    vllm_version: str | None  # spec.engine.vllmVersion, else the container's image (its tag may say the release)
    knobs: Knobs
    from_defaults: bool
    defaults_table: str | None
    replicaset: dict[str, Any] | None
    replicasets: list[dict[str, Any]]  # every one the Deployment owns, the current one included

    @property
    def paused(self) -> bool:
        return bool(self.deployment["spec"].get("paused"))

    @property
    def pod_spec(self) -> dict[str, Any]:
        """The Deployment's pod template's spec: what every pod a rollout starts, or stops, runs with."""
        return self.deployment["spec"]["template"]["spec"]

    @property
    def replicas(self) -> int:
        return int(self.deployment["spec"].get("replicas", 1))

    @property
    def drain_seconds(self) -> float | None:
        """How long its stopping pods let the requests in flight run (``rollout.drain.drain_seconds``)."""
        return drain_seconds(self.pod_spec, self.container, self.args.shutdown_timeout, self.args.sigterm)

    def drain_advice(self, request_seconds: float) -> str | None:
        """What its restarts do to the requests in flight, and what to set (``rollout.drain.drain_advice``)."""
        return drain_advice(self.pod_spec, self.container, self.args.shutdown_timeout,
                            parse_version(self.vllm_version), request_seconds, self.args.sigterm)

    @property
    def ready_pods(self) -> int:
        return int((self.replicaset or {}).get("status", {}).get("readyReplicas") or 0)


class Verdict(NamedTuple):
    """A rollout's outcome as an evaluation judged it, and which rollout that was: an evaluation redone judges the
    same rollout again, and its verdict is counted once (``Reconciler._count``)."""

    outcome: str  # Succeeded, Failed, Blocked
    started_at: str
    to_knobs: Knobs


@dataclass
class Report:
    """The status being built during one evaluation, and the Events to send with it."""

    namespace: str
    name: str
    state: VllmTuningStatus
    generation: int
    now: datetime
    uid: str = ""
    """The VllmTuning's metadata.uid as the evaluation read it."""
    refused: bool = False
    """Its status write was refused (409), the VllmTuning changed since it was read: the result is dropped."""
    decision: Decision | None = None
    patched: bool = False
    """The decision's patch was written: a redo after a refused status write follows that rollout, and decides
    anew, so the decision is counted although the write is refused."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """Events on the VllmTuning: reason, message, type. Sent, and logged, unless ``sent_before`` has them."""
    target_events: list[tuple[str, str, str]] = field(default_factory=list)  # on the Deployment, the same way
    sent_before: frozenset[tuple[Any, ...]] = frozenset()
    """The Events (``events.sameness``) the evaluation before sent, its status write not landed (refused with 409:
    this one is its redo; refused otherwise, or not answered): this one reads the status without that write and
    judges the same again; what it has to say, said, is not sent twice. A different Event is sent."""
    sent: set[tuple[Any, ...]] = field(default_factory=set)
    """Its Events sent, now or by the evaluation before (``sent_before``): kept for the next evaluation should its
    status write not land."""
    finished: list[Verdict] = field(default_factory=list)
    """The verdicts on the rollouts it judged, counted in ``rollouts_total`` unless its status write is refused
    with 409 (the evaluation redone at once judges them again, and counts them). A write that failed otherwise may
    fail for long (a 403, a 422) or have landed (a timeout), and is counted; the evaluations that judge the same
    rollout again, its status without the verdict, count nothing more (``Reconciler._count``)."""

    def judged(self, rollout: Rollout, outcome: str) -> None:
        """Record the verdict ``outcome`` on ``rollout``, to be counted."""
        self.finished.append(Verdict(outcome, rollout.started_at, rollout.to_knobs))

    def condition(self, type_: ConditionType, status: bool | None, reason: str, message: str) -> None:
        self.state = self.state.model_copy(update={"conditions": set_condition(
            self.state.conditions, type_, status, reason, message, self.generation, self.now)})

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, events.WARNING if warning else events.NORMAL))

    def target_event(self, reason: str, message: str, warning: bool = False) -> None:
        self.target_events.append((reason, message, events.WARNING if warning else events.NORMAL))

    def has(self, type_: ConditionType, status: bool, reason: str) -> bool:
        """Whether the condition already says this (so its Event was sent before)."""
        found = condition(self.state.conditions, type_)
        return found is not None and found.status == ("True" if status else "False") and found.reason == reason


def spec_problems(spec: VllmTuningSpec) -> list[str]:
    """What admission could not check: time zones that exist, cron expressions cron can run, windows that ever
    open (schedules' and freezes'), and schedules' bounds with spec.bounds beneath them."""
    problems = [f"spec.schedules[{s.name}].bounds over spec.bounds: {problem}" for s in spec.schedules
                for problem in spec.bounds.overlaid(s.bounds).problems()]
    windows = [("schedules", w) for w in spec.schedules] + [("rollout.freezes", w) for w in spec.rollout.freezes]
    for path, window in windows:
        unreadable = []
        for name, check in (("timeZone", lambda w=window: time_zone(w.time_zone)),
                            ("start", lambda w=window: parse_cron(w.start)),
                            ("end", lambda w=window: parse_cron(w.end))):
            try:
                check()
            except ValueError as exc:
                unreadable.append(f"spec.{path}[{window.name}].{name}: {exc}")
        if not unreadable and never_opens(window.start, window.end, window.time_zone):
            unreadable.append(f"spec.{path}[{window.name}].end: {window.end!r} fires whenever start {window.start!r} "
                              f"does, so the window is never open: give it an end after its start")
        problems += unreadable
    return problems


class Reconciler:
    """Evaluates tunings against the cluster and Prometheus.

    An evaluation whose status write does not land leaves the next one a status without it (at once after a 409,
    which has it redone on the VllmTuning as it is now; at each evaluation while a Role lacks the grant): what it
    counted (``_count``) and the Events it sent (``_send_events``) are kept per tuning, so that the next one,
    judging the same again, neither counts nor sends them twice.
    """

    def __init__(self, kube: Kube, cache: ClusterCache, observations: ObservationService,
                 metrics: OperatorMetrics, settings: OperatorSettings) -> None:
        self.kube = kube
        self.cache = cache
        self.observations = observations
        self.metrics = metrics
        self.settings = settings
        # GPU facts per Deployment, with what they were looked up from (``_hardware``)
        self._hardware_by_uid: dict[str, tuple[tuple[Any, ...], str | None, Hardware]] = {}
        self.slots = RolloutSlots(settings.max_concurrent_rollouts, settings.rollout_pool_label)
        self._slot_lock = asyncio.Lock()  # counting the slots taken and taking one is one step
        # per tuning, the last rollout verdict counted in rollouts_total, with the tuning's uid (``_count``)
        self._counted: dict[Key, tuple[str, Verdict]] = {}
        # per tuning, the Events sent by an evaluation whose status write did not land, for the next one alone
        self._unwritten: dict[Key, frozenset[tuple[Any, ...]]] = {}

    def forget(self, key: Key) -> None:
        """Drop what this process keeps of a deleted tuning: its rollout slot, the last verdict it counted, and the
        Events of an evaluation whose status write did not land."""
        self.slots.forget(key)
        self._counted.pop(key, None)
        self._unwritten.pop(key, None)

    async def _call(self, fn, *args):  # noqa: ANN001, ANN202 - thin wrapper over blocking client calls
        return await asyncio.to_thread(fn, *args)

    # --- the evaluation --------------------------------------------------------------------------

    async def evaluate(self, key: Key, at: float, write: bool = True) -> Report | None:
        """Evaluate the tuning ``key`` at ``at`` (Unix seconds), for the window ending spec.prometheus.queryOffset
        before it.

        ``write=False`` (the one-shot ``recommend`` command) leaves status and
        Events unwritten and returns the report; with mode Recommend nothing is
        patched either.
        """
        body = self.cache.tunings.get(key)
        if body is None:
            return None
        started = time.perf_counter()
        generation = int(body["metadata"].get("generation") or 0)
        now = datetime.fromtimestamp(at, UTC)
        # the Events of an evaluation whose status write did not land are kept for the one after it alone
        report = Report(key[0], key[1], VllmTuningStatus(), generation, now, uid=body["metadata"].get("uid", ""),
                        sent_before=self._unwritten.pop(key, frozenset()))
        try:
            report.state = with_timed_restart(VllmTuningStatus.model_validate(body.get("status") or {}))
        except ValidationError as exc:
            return await self._unreadable_status(body, report, exc, write)
        try:
            spec = VllmTuningSpec.model_validate(body["spec"])
        except ValidationError as exc:
            spec = None
            problems = _validation_problems(exc)
        else:
            problems = spec_problems(spec)
        if spec is None or problems:
            message = "; ".join(problems) + (". Fix the spec; nothing is changed until then (a rollout of the "
                                             "operator's own in progress is still seen through: rolled back if it fails).")
            if not report.has(ConditionType.READY, False, "InvalidSpec"):
                report.event(events.INVALID_SPEC, message, warning=True)
            report.condition(ConditionType.READY, False, "InvalidSpec", message)
            if spec is not None and awaiting_verdict(report.state):
                # what admission cannot check is wrong (a time zone, a cron), the rest of the spec is read: the
                # rollout the last spec started is still ours to judge, and to roll back if its pods crash-loop
                try:
                    await self._follow(spec, report)
                except TargetProblem as problem:
                    log.info("not following the rollout of %s/%s: %s", report.namespace, report.name, problem)
            await self._finish(body, report, spec, started, write)
            return report
        report.state = adopt_generation(report.state, generation)
        try:
            await self._evaluate(spec, report)
        except TargetProblem as problem:
            if not report.has(ConditionType.READY, False, problem.reason):
                report.event(problem.reason, str(problem), warning=True)
            report.condition(ConditionType.READY, False, problem.reason, str(problem))
        await self._finish(body, report, spec, started, write)
        return report

    async def _unreadable_status(self, body: dict[str, Any], report: Report, exc: ValidationError,
                                 write: bool) -> Report:
        """Hold, and say so in the Ready condition alone (in ``report``, of an empty status), when the status cannot
        be read.

        The status is the operator's memory: the configs that failed to start, a
        rollout in flight to roll back if it fails. Rebuilt from nothing, it would
        let a config that crash-looped be tried again. It is unreadable when a newer
        operator wrote it (a downgrade: ``helm rollback``) or a person edited it;
        the rest of it is left as it is, for the operator that can read it.
        """
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        message = (f"status unreadable ({'; '.join(_validation_problems(exc)[:3])}): written by a newer "
                   "vllm-autotuner, or edited. Nothing is changed until it can be read: run the newer operator "
                   "again, or clear the status to start afresh, forgetting failed configs and what was learned "
                   f"(kubectl patch vllmtuning {name} -n {namespace} --subresource=status --type=merge "
                   "-p '{\"status\":null}').")
        report.condition(ConditionType.READY, False, events.STATUS_UNREADABLE, message)
        written = [c for c in (body.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
        ready = next((c for c in written if c.get("type") == ConditionType.READY), {})
        if write and ready.get("reason") != events.STATUS_UNREADABLE:
            report.event(events.STATUS_UNREADABLE, message, warning=True)
            await self._send_events(meta, report, None)
            # a merge patch replaces the whole list: the newer operator's other conditions are written back
            conditions = [*(c for c in written if c.get("type") != ConditionType.READY),
                          *report.state.model_dump(by_alias=True, mode="json")["conditions"]]
            await self._write_status(meta, report, {"conditions": conditions})
        return report

    async def _follow(self, spec: VllmTuningSpec, report: Report) -> Target:
        """Read the target, adopt it if new, and follow our rollout in progress (or notice someone else's change).

        A second VllmTuning of the target (TargetProblem) stops every change, but not the verdict on a rollout of
        ours in progress: its config crash-looping, the rollback is still due.

        The Deployment is the watch's copy. One older than our own write of the rollout in progress (the watch
        lags: reconnecting, a slow apiserver) still shows the knobs before it, which would read as a person's
        revert of our change: nothing is judged until the watch delivers the write (TargetProblem).
        """
        target = await self._target(report.namespace, spec, report.now)
        tunings = self.cache.tunings_of(report.namespace, spec.target_ref.name)
        conflict = None if len(tunings) < 2 else TargetProblem(
            events.TARGET_CONFLICT,
            f"VllmTunings {', '.join(tunings)} all target Deployment {report.namespace}/{spec.target_ref.name}: "
            f"each would undo the others' changes, so none changes anything; delete all but one")
        if conflict is not None and not awaiting_verdict(report.state):
            raise conflict
        report.state = self._adopt_target(report, target)
        rollout, seen = report.state.last_rollout, int(target.deployment["metadata"].get("generation") or 0)
        if awaiting_verdict(report.state) and rollout is not None and seen < (rollout.deployment_generation or 0):
            raise TargetProblem(events.WATCH_BEHIND,
                                f"the Deployment as watched is at generation {seen}, before this operator's write of "
                                f"{rollout.to_knobs} (generation {rollout.deployment_generation}): nothing is judged "
                                f"until the watch delivers it; if this lasts, check the operator's connection to the "
                                f"apiserver (its log, and apiserver_request metrics)")
        await self._track_rollout(spec, target, report)
        if conflict is not None:  # our rollout in progress is judged (rolled back if it fails), nothing new is done
            raise conflict
        return target

    async def _evaluate(self, spec: VllmTuningSpec, report: Report) -> None:
        namespace = report.namespace
        overridden = self.settings.recommend_only and spec.mode == Mode.AUTO
        if overridden:  # the operator-wide dry run: Auto acts as Recommend (a rollback of our change still runs)
            spec = spec.model_copy(update={"mode": Mode.RECOMMEND})
        target = await self._follow(spec, report)
        if target.paused:
            name = spec.target_ref.name
            raise TargetProblem(events.TARGET_PAUSED,
                                f"Deployment {namespace}/{name} is paused: no rollout can run, so nothing is changed; "
                                f"`kubectl rollout resume deployment/{name} -n {namespace}` to go on tuning")
        rolling = rollout_in_progress(target.deployment)
        ours = rolling_out(report.state)
        observation = await self._observe(namespace, spec, target, report, rolling, ours)
        if observation is None and rolling:
            # no window (a rollout leaves partial series; Prometheus may be down), but the Deployment says
            # someone else's rollout runs: the policy must know, or a schedule would patch into it
            observation = Observation(window_start=report.now, window_end=report.now, rollout_in_progress=True)
        seen = strategy_seen(report.state, unavailable_at_once(target.deployment), target.drain_seconds)
        if report.state.blocked_at is not None and seen.blocked_at is None:
            report.event(events.BLOCK_LIFTED,
                         f"the Deployment's strategy now stops {seen.rollout_unavailable} pod(s) before it starts new "
                         f"ones, so a new pod needs no spare GPU: changes need not wait the cooldown after the rollout "
                         f"that could not start its pods")
        before = report.state = seen
        key = (namespace, report.name)
        controlled_by = None if spec.target_ref.ignore_controller else controller_of(target.deployment)
        async with self._slot_lock:
            decision = decide(spec, before, observation, report.now, controlled_by=controlled_by)
            if self.slots.limit and decision.action == DecisionAction.CHANGE:
                # Only a change waits for a slot, and what holds the slots is a walk over every tuning: asked for
                # only then, the same decision as with the holders given at once (a pure function; see decide).
                holders = self.slots.holders(key, before.slot_wait_since, self.cache.tunings, self.cache.target,
                                             report.now)
                decision = decide(spec, before, observation, report.now, slot_holders=holders,
                                  max_concurrent_rollouts=self.slots.limit, controlled_by=controlled_by)
            report.decision = decision
            self._recommended(report, decision)
            report.state = decision.state
            reverts, reverted_by = report.state.reverts, report.state.reverted_by
            self._withheld_condition(  # another writer keeps putting our changes back
                report, events.CHANGES_REVERTED,
                f"{len(reverts)} changes put back, the last at {reverts[0]}: {reverted_advice(reverted_by)}"
                if changes_reverted(report.state) else None,
                "the spec changed: tuning again")
            self._withheld_condition(  # another object controls the target
                report, events.TARGET_CONTROLLED, controlled_advice(controlled_by) if controlled_by else None,
                "the Deployment is no longer controlled by another object, or the spec says to ignore its "
                "controller: tuning again")
            if decision.hold in _NO_METRICS and observation is not None:
                report.condition(ConditionType.METRICS_AVAILABLE, False, decision.hold, decision.reason)
            if decision.hold in _RECOMMENDING and decision.recommendation is not None and (
                    before.recommendation is None or _knobs(before.recommendation) != decision.recommendation):
                report.event(events.RECOMMENDATION, decision.reason)  # once per new recommendation, not per evaluation
                self._warn_if_restarts_lose_requests(target, report, f"applying {decision.recommendation}")
            if decision.changes and (spec.mode == Mode.AUTO or decision.action == DecisionAction.ROLLBACK):
                # the policy never changes outside Auto; the mode check is a second lock on the door
                await self._patch(target, decision, report, before, during_rollout=False)
            self._record_slot(key, report)
        ready_reason = {Mode.AUTO: "Tuning", Mode.RECOMMEND: "Recommending", Mode.PAUSED: "Paused"}[spec.mode]
        why = " (mode Auto, but the operator runs with --recommend-only)" if overridden else ""
        report.condition(ConditionType.READY, True, ready_reason, f"{decision.action}: {decision.reason}{why}")
        self._progress_condition(report)

    def _record_slot(self, key: Key, report: Report) -> None:
        """What this evaluation leaves for the slots: our rollout in progress, and since when a change waits.
        Someone else's rollout of the target (a `kubectl rollout restart`, an image bump) holds a slot too, but
        that is read from the Deployment whenever the slots are counted (``RolloutSlots.holders``): recorded here, it
        would still hold the slot after it finished, until this tuning's next evaluation."""
        waiting = report.decision is not None and report.decision.hold == HoldReason.NO_SLOT
        self.slots.record(key, rolling=rolling_out(report.state),
                          waiting_since=report.state.slot_wait_since if waiting else None)

    # --- target ----------------------------------------------------------------------------------

    async def _target(self, namespace: str, spec: VllmTuningSpec, now: datetime) -> Target:
        ref = spec.target_ref
        deployment = self.cache.deployment(namespace, ref.name)
        if deployment is None:
            raise TargetProblem(
                events.TARGET_NOT_FOUND,
                f"Deployment {namespace}/{ref.name} not found; create it or fix spec.targetRef.name")
        try:
            container = find_vllm_container(deployment["spec"]["template"]["spec"], ref.container)
            args = EngineArgs.from_container(container)
            version = spec.engine.vllm_version or container.get("image")
            if args.max_num_batched_tokens is not None and args.max_num_seqs is not None:
                knobs, from_defaults, table = Knobs(max_num_batched_tokens=args.max_num_batched_tokens,
                                                    max_num_seqs=args.max_num_seqs), False, None
            else:  # a flag is absent: vLLM picked a default (or read a --config file), and no metric says which
                defaults = vllm_defaults(version, await self._hardware(deployment, container, spec, now),
                                         args.performance_mode)
                knobs, from_defaults = args.effective(defaults)
                table = defaults.table
        except CommandLineError as exc:
            raise TargetProblem(events.INVALID_TARGET, f"Deployment {namespace}/{ref.name}: {exc}") from exc
        return Target(deployment, container, args, version, knobs, from_defaults, table,
                      self.cache.current_replicaset(deployment), self.cache.replicasets(deployment))

    async def _hardware(self, deployment: dict[str, Any], container: dict[str, Any], spec: VllmTuningSpec,
                        now: datetime) -> Hardware:
        """GPU count from the container's resources; product and memory from the spec, the pod
        template's nodeSelector, or the labels of a node a pod runs on (GPU Feature Discovery's, GKE's or
        Karpenter's: ``Hardware.from_labels``).
        Looked up once per Deployment and what it is read from: a node's GPU does not change under a running
        Deployment, and reading a node at every evaluation costs API calls (a node read is kept once its GPU
        labels are there, or once it is old enough that none will come: ``_lookup_hardware``); but a
        spec.engine.gpuMemoryGib corrected, other GPUs asked for, or the pods sent to another pool (nodeSelector,
        affinity) are read again at once, not at the operator's next start. A node is read only from the pods of
        the revision that runs the template as it stands: read from an older revision's pods, in the pool the
        template has left, the new inputs would keep the old pool's GPU for good. A new revision is read again (a
        template whose pods may land on any GPU, moved by an edit of another field: tolerations, a priority class);
        while the revision is not known (paused, the Deployment controller or the ReplicaSet watch behind), or its
        pods have no node yet (a surge pod waiting for a GPU) or one whose GPU labels have not come yet, a reading
        of the same inputs stands."""
        uid = deployment["metadata"].get("uid", "")
        pod_spec = deployment["spec"]["template"]["spec"]
        inputs = (spec.engine.gpu_memory_gib, container.get("resources"), pod_spec.get("nodeSelector"),
                  pod_spec.get("affinity"))
        replicaset = self._template_replicaset(deployment)
        revision_read = replicaset and replicaset["metadata"]["uid"]
        cached = self._hardware_by_uid.get(uid)
        standing = cached if cached is not None and cached[0] == inputs else None  # a reading of these inputs
        if standing is not None and revision_read in (None, standing[1]):
            return standing[2]
        hardware, final = await self._lookup_hardware(deployment, container, spec, replicaset, now)
        if final:
            self._hardware_by_uid[uid] = inputs, revision_read, hardware
            return hardware
        return standing[2] if standing is not None else hardware  # no node, or no GPU labels yet: the reading stands

    def _template_replicaset(self, deployment: dict[str, Any]) -> dict[str, Any] | None:
        """The ReplicaSet whose pods run the Deployment's template as it stands; None while that is not known:
        the Deployment paused (a template edited meanwhile makes no revision until it resumes), its controller
        behind a spec edit (status.observedGeneration), or the ReplicaSet watch behind the revision it shows."""
        meta, status = deployment["metadata"], deployment.get("status") or {}
        if deployment["spec"].get("paused") or (status.get("observedGeneration") or 0) < (meta.get("generation") or 0):
            return None
        current = self.cache.current_replicaset(deployment)
        return current if current is not None and revision(current) == revision(deployment) else None

    async def _lookup_hardware(self, deployment: dict[str, Any], container: dict[str, Any], spec: VllmTuningSpec,
                               replicaset: dict[str, Any] | None, now: datetime) -> tuple[Hardware, bool]:
        """Read from ``replicaset``'s pods; without it, from the spec and the template as a Deployment whose pods
        have no node yet is (vLLM's defaults unless the GPU memory is given). With whether the reading is final,
        to be kept (``_hardware``): no GPU, the memory given in the spec or by a nodeSelector label that says it
        (``MEMORY_LABELS``; a GKE accelerator type alone says the whole GPU's, which the node's partition may
        cut), or a node read whose labels tell the memory. A node whose labels do not is final only once it is
        ``GPU_LABELS_WAIT`` old at the evaluation's ``now``: a pod binds to a new node as soon as the device
        plugin advertises its GPUs, and GPU Feature Discovery's labels come seconds to a minute later (on GKE
        too, for a type not in ``GKE_ACCELERATOR_MIB``), so a reading kept at once would assume a GPU of 70 GiB or
        more for the revision's life; an older node has no labeller (EKS without GPU Feature Discovery or
        Karpenter) and asking again would cost a pod list and a node read at each evaluation. Not final while no
        pod has a node, or the pods or the node could not be read."""
        resources = container.get("resources") or {}
        gpus = int((resources.get("limits") or resources.get("requests") or {}).get(GPU_RESOURCE, 0) or 0)
        labels = dict(deployment["spec"]["template"]["spec"].get("nodeSelector") or {})
        hardware = Hardware.from_labels(gpus, labels, spec.engine.gpu_memory_gib)
        final = not gpus or spec.engine.gpu_memory_gib is not None or (
            hardware.memory_gib is not None and any(label in labels for label in MEMORY_LABELS))
        if not final:
            try:
                pods = await self._owned_pods(deployment, {replicaset["metadata"]["uid"]} if replicaset else set())
                node = next((p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")), None)
                if node:
                    meta = await self._call(self.kube.node_metadata, node)
                    node_labels = meta.get("labels") or {}
                    hardware = Hardware.from_labels(gpus, labels | node_labels)
                    final = hardware.memory_gib is not None or (
                        now - datetime.fromisoformat(meta["creationTimestamp"]) >= GPU_LABELS_WAIT)
            except ApiException as exc:
                log.info("GPU labels unreadable (%s); assuming from the defaults table", exc.reason)
        return hardware, final

    def _adopt_target(self, report: Report, target: Target) -> VllmTuningStatus:
        """First sight of the target (or a re-created one): its knobs become ``current`` (source Initial)."""
        state = report.state
        uid = target.deployment["metadata"].get("uid")
        if state.current is not None and state.target_uid == uid:
            return state
        if state.target_uid is not None and state.target_uid != uid:
            report.event(events.TARGET_NOT_FOUND, f"Deployment was re-created (uid {uid}); adopting it afresh")
        last = state.last_rollout
        if last is not None and awaiting_verdict(state):
            last = last.model_copy(update={"phase": RolloutPhase.FAILED, "finished_at": utc_timestamp(report.now),
                                           "message": "target Deployment re-created during the rollout"})
        live_since = (target.replicaset or {}).get("metadata", {}).get("creationTimestamp")
        current = CurrentKnobs(
            max_num_batched_tokens=target.knobs.max_num_batched_tokens,
            max_num_seqs=target.knobs.max_num_seqs,
            since=live_since or utc_timestamp(report.now),  # the config went live with its ReplicaSet
            source=KnobSource.INITIAL,
            from_defaults=target.from_defaults,
            defaults_table=target.defaults_table,
            max_model_len=target.args.max_model_len,
            chunked_prefill=target.args.chunked_prefill is not False,
        )
        return state.model_copy(update={"current": current, "target_uid": uid, "last_rollout": last})

    # --- rollouts --------------------------------------------------------------------------------

    async def _track_rollout(self, spec: VllmTuningSpec, target: Target, report: Report) -> None:
        """Follow our rollout in progress (or unverified, at zero replicas), or notice a change someone else (or our
        past self) made: of the knobs, or of the rest of the template during our rollout, which makes that rollout
        theirs (``policy.rollout_overtaken``)."""
        state = report.state
        rollout = state.last_rollout
        pending = awaiting_verdict(state)
        template = target.knobs
        expected = rollout.to_knobs if pending and rollout else state.current.knobs  # type: ignore[union-attr]
        if template != expected:
            if _defaults_known_better(state, target):
                # the same args, read against a better-known GPU (a pod got a node): no one changed anything
                report.state = defaults_resolved(state, template, target.defaults_table)
                return
            written = unrecorded_write(target.deployment, template, report.name, last_known_change(state))
            source, reason, written_verdict = written_reason(target.deployment)
            ours = bool(written) and source == KnobSource.ROLLBACK
            kept, verdict = split_verdict(rollout.message) if pending and rollout else ("", "")
            if pending and rollout is not None and template == rollout.rollback_knobs and (ours or kept):
                # the rollback of our rollout is in the template: ours, whose status write was lost, or the one a
                # kept verdict waited for, its write refused, made by someone else (`kubectl rollout undo`).
                # Record the verdict again (a config that failed to start is never tried twice; one whose pods
                # found no GPU is not blamed, as our rollback's annotations say) and follow the rollback (the
                # verdict's Events went out before; counted when a status held it, else now: ``Report.finished``);
                # a person who only did what the operator was trying to do made no change to respect.
                fresh, why = split_verdict(written_verdict) if ours else ("", "")
                if not kept or (fresh and fresh != kept):
                    # no status held this verdict (its write refused, the operator stopped before it), or one held
                    # an older verdict, whose rollback was refused (Blocked, then the pod got a GPU and crash-looped)
                    report.judged(rollout, "Blocked" if fresh == events.ROLLOUT_BLOCKED else "Failed")
                    kept, verdict = fresh, why
                at = written if ours else report.now
                if kept == events.ROLLOUT_BLOCKED:
                    decision = rollout_blocked(state, at, verdict or reason)
                else:
                    decision = rollout_failed(state, at, verdict or reason or "rolled back", report.generation)
                report.state = self._with_generation(decision.state, target.deployment)
                # said as the evaluation that judged it said it: the decision's reason, which our rollback's
                # annotations carry where no status kept what went wrong
                report.condition(ConditionType.DEGRADED, True, kept or events.ROLLOUT_FAILED,
                                 decision.reason if verdict else reason or decision.reason)
                return
            if written and not rolling_out(state):
                # our patch landed but its status write did not (operator restarted in between; an unverified
                # rollout does not stop the next write); our annotations with an older time are a person's
                # `kubectl rollout undo`, adopted as Manual below
                report.state = resumed_write(state, spec.schedules, written, template, KnobSource(source or "Traffic"),
                                             reason or "resumed after an operator restart",
                                             **written_baseline(target.deployment))
                report.state = self._with_generation(report.state, target.deployment)
                return
            writer = command_line_writer(target.deployment, target.container.get("name", ""))
            report.state = manual_change_detected(state, template, report.now, writer, target.defaults_table)
            report.event(events.MANUAL_CHANGE,
                         f"knobs changed outside the operator to {template}{f' by {writer}' if writer else ''}; "
                         f"adopted as Manual and respected for the cooldown ({spec.rollout.cooldown})")
            return
        if not pending or rollout is None:
            if (rollout is not None and rollout.phase == RolloutPhase.FAILED and rollout.to_knobs == template
                    and target.replicas > 0 and not rollout_in_progress(target.deployment)):
                # a rollout that stood, closed for no fault of its config (its pods found no room, a rollback that
                # could not start them), and then completed: every pod serves it, and nothing is degraded now
                for reason in (events.ROLLOUT_BLOCKED, events.ROLLOUT_FAILED):
                    if report.has(ConditionType.DEGRADED, True, reason):
                        report.condition(ConditionType.DEGRADED, False, "AsExpected",
                                         f"{rollout.to_knobs} is live on every pod (it stood after {reason})")
            return
        if (template_overtaken(rollout.template_digest, rollout.deployment_generation, target.deployment)
                and not split_verdict(rollout.message)[0]):
            # someone else changed the template since our patch (an image bump), keeping our knobs: a new
            # ReplicaSet rolls out their change with ours, and whether it starts, or how long it takes, is theirs.
            # Not once our rollout was judged, its rollback not written yet (a verdict kept): the verdict came
            # before their change, and the rollback is tried again, as the config it rolls back failed as ours
            seen = target.deployment["metadata"].get("generation")
            message = (f"the Deployment's pod template was changed by someone else during this rollout (at "
                       f"generation {seen}, after the operator's patch at generation {rollout.deployment_generation}"
                       f"), keeping {rollout.to_knobs}: its rollout is theirs, and its outcome too; {rollout.to_knobs} "
                       f"is not judged by it (not failed, not rolled back, not timed), and changes wait until it "
                       f"completes")
            report.state = rollout_overtaken(state, report.now, message)
            report.event(events.ROLLOUT_OVERTAKEN, message)
            return
        pods: list[dict[str, Any]] = []
        if target.replicaset is not None and target.replicas > 0:
            hash_ = (target.replicaset["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL)
            if hash_:
                pods = await self._owned_pods(target.deployment, {target.replicaset["metadata"]["uid"]},
                                              f"{TEMPLATE_HASH_LABEL}={hash_}")
        generation = rollout.deployment_generation or 0
        # paused only once it completed (a CD tool batching its own edits), a rollout ran at its own pace
        report.state = state = rollout_progressed(
            state, report.now, progress_mark(target.deployment, target.replicaset, generation),
            halted=(target.paused and rollout_in_progress(target.deployment)) or target.replicas == 0)
        rollout = state.last_rollout
        assert rollout is not None
        progressed = datetime.fromisoformat(rollout.progressed_at or rollout.started_at)
        judged = rollout_state(target.deployment, generation, pods, target.container.get("name"),
                               (report.now - progressed).total_seconds(),
                               duration_seconds(spec.rollout.progress_deadline))
        if rollout.message and judged.progress not in (Progress.FAILED, Progress.BLOCKED):
            # a verdict kept while its rollback could not be written no longer stands: the pods came up, or
            # start again (a surge pod found its GPU); a verdict from here on is a new one, said and counted
            # (the same outcome again included: ``_count``)
            self._counted.pop((report.namespace, report.name), None)
            rollout = rollout.model_copy(update={"message": ""})
            report.state = state = state.model_copy(update={"last_rollout": rollout})
        if judged.progress is Progress.COMPLETE and target.replicas == 0:
            if rollout.phase == RolloutPhase.IN_PROGRESS:  # else it still waits for its first pod
                report.state = rollout_unverified(state, report.now)
                report.event(events.ROLLOUT_UNVERIFIED,
                             f"{rollout.to_knobs} is written, but the Deployment is scaled to zero and no pod has "
                             f"started it: it is checked, and rolled back if it cannot start, when pods start")
        elif judged.progress is Progress.COMPLETE:
            report.state = rollout_succeeded(state, report.now)
            report.judged(rollout, "Succeeded")
            if rollout.source == KnobSource.ROLLBACK:
                report.condition(ConditionType.DEGRADED, False, "RecoveredByRollback",
                                 f"rolled back to {rollout.to_knobs}: {rollout.reason}")
            else:
                report.condition(ConditionType.DEGRADED, False, "AsExpected", f"{rollout.to_knobs} is live")
            report.event(events.ROLLOUT_SUCCEEDED, f"{rollout.to_knobs} is live: {judged.message}")
        elif judged.progress in (Progress.FAILED, Progress.BLOCKED):
            if judged.progress is Progress.BLOCKED:  # no new pod started vLLM: the knobs are not to blame
                decision = rollout_blocked(state, report.now, judged.message)
                reason, message = events.ROLLOUT_BLOCKED, decision.reason
            else:
                decision = rollout_failed(state, report.now, judged.message, report.generation)
                reason, message = events.ROLLOUT_FAILED, f"{rollout.to_knobs} failed: {judged.message}"
            # judged so before, and the rollback could not be written then: said once, counted once, and the
            # failed config's record stands as first made (when it failed, and why), while the spec it was made
            # under is in force (a spec changed since forgets it: recorded again, under the new one)
            again = split_verdict(rollout.message)[0] == reason
            if again and rollout.to_knobs in failed_configs(state):
                decision = replace(decision, state=decision.state.model_copy(
                    update={"failed_configs": state.failed_configs}))
            if not again:
                report.judged(rollout, judged.progress.value)
                report.event(reason, message, warning=True)
            report.state = decision.state
            # the decision's reason, as our rollback is annotated with it: a redo that finds the rollback says the same
            report.condition(ConditionType.DEGRADED, True, reason, decision.reason)
            if decision.changes:
                # our own rollout failed or is stuck: put the previous config back whatever the mode is now (if
                # that patch fails, the rollout stays in progress, with its verdict and what the verdict
                # records, a failed config or the wait after a blocked rollout, and is judged again and the
                # rollback retried at the next evaluation)
                said = f"{reason}: {judged.message}"  # kept in the status, and with the rollback (``split_verdict``)
                judged_state = state.model_copy(update={
                    "last_rollout": rollout.model_copy(update={"message": said}),
                    "failed_configs": decision.state.failed_configs,
                    "blocked_at": decision.state.blocked_at,
                })
                await self._patch(target, decision, report, judged_state, during_rollout=True, again=again,
                                  verdict=said)

    @staticmethod
    def _withheld_condition(report: Report, reason: str, message: str | None, cleared: str) -> None:
        """Degraded (reason ``reason``, a Warning Event when it begins) while ``message`` says why changes are only
        recommended; back to AsExpected with ``cleared`` once it no longer applies."""
        if message is not None:
            if not report.has(ConditionType.DEGRADED, True, reason):
                report.event(reason, message, warning=True)
            report.condition(ConditionType.DEGRADED, True, reason, message)
        elif report.has(ConditionType.DEGRADED, True, reason):
            report.condition(ConditionType.DEGRADED, False, "AsExpected", cleared)

    def _progress_condition(self, report: Report) -> None:
        rollout = report.state.last_rollout
        if rollout is not None and rollout.phase == RolloutPhase.IN_PROGRESS:
            report.condition(ConditionType.PROGRESSING, True, "RolloutInProgress",
                             f"rolling out {rollout.to_knobs} ({rollout.source}): {rollout.reason}")
        elif rollout is not None and rollout.phase == RolloutPhase.UNVERIFIED:
            report.condition(ConditionType.PROGRESSING, False, "Unverified",
                             f"{rollout.to_knobs} ({rollout.source}) was written while the Deployment was scaled to "
                             f"zero; it is checked when its pods start")
        else:
            report.condition(ConditionType.PROGRESSING, False, "Idle", "no rollout in progress")
        if condition(report.state.conditions, ConditionType.DEGRADED) is None:
            report.condition(ConditionType.DEGRADED, False, "AsExpected", "no failed rollout")

    @staticmethod
    def _with_generation(state: VllmTuningStatus, deployment: dict[str, Any]) -> VllmTuningStatus:
        """``state`` with its last rollout bound to ``deployment`` as our write left it: its generation (the rollout
        is judged once the watch has it) and its pod template's digest (a template changed since is someone
        else's rollout: ``_track_rollout``)."""
        assert state.last_rollout is not None
        rollout = state.last_rollout.model_copy(
            update={"deployment_generation": int(deployment["metadata"].get("generation") or 0),
                    "template_digest": template_record(deployment)})
        return state.model_copy(update={"last_rollout": rollout})

    async def _patch(self, target: Target, decision: Decision, report: Report, before: VllmTuningStatus,
                     during_rollout: bool, again: bool = False, verdict: str | None = None) -> None:
        """Patch the target to the decision's knobs.

        ``report.state`` is the decision's state (a rollout in progress) with this
        evaluation's conditions; it stands when the patch does. ``before`` is the
        status the decision was made from: without a patch there is no rollout,
        so the status goes back to it, keeping the recommendation and the conditions.
        ``again``: a rollback retried after its patch failed; a failure that goes
        on is logged, its Warning Event went out the first time. ``verdict``: the
        judgement (RolloutFailed, RolloutBlocked) of the rollout a rollback undoes,
        annotated with it.
        """
        assert decision.knobs is not None and decision.source is not None
        rollback = decision.action == DecisionAction.ROLLBACK
        if (moved := await self._tuning_moved(report, rollback)) is not None:
            self._not_patched(decision, report, before, *moved, again=again)
            return
        rollout = decision.state.last_rollout
        baseline = None if rollback or rollout is None else baseline_annotation(
            rollout.regime, rollout.baseline_attainment, rollout.baseline_request_rate)
        try:
            previous = await self._replaced_template(target) if rollback else None
            patched = await self._call(apply_knobs, self.kube, target.deployment, target.container.get("name"),
                                       decision.knobs, decision.reason, report.name, str(decision.source),
                                       report.now, during_rollout, previous, verdict, baseline)
        except (RolloutBusy, ConflictUnread, ApiException, CommandLineError, HTTPError) as exc:
            detail = api_error(exc)
            if isinstance(exc, HTTPError) or (isinstance(exc, ApiException) and (exc.status or 0) >= 500):
                landed, found = await self._landed(target, decision, report)
                if landed is not None:  # the write got no answer, but the Deployment read back has it
                    self._started(target, decision, report, landed)
                    return
                detail += (f"; {found}: the next evaluation decides again (or follows the change, should the "
                           "apiserver commit it late)")
            self._not_patched(decision, report, before, detail, not isinstance(exc, RolloutBusy), again)
            return
        self._started(target, decision, report, patched)

    @staticmethod
    def _not_patched(decision: Decision, report: Report, before: VllmTuningStatus, detail: str, warning: bool,
                     again: bool) -> None:
        """The decision's patch was not written (``detail``: why): the status goes back to ``before`` with the
        recommendation and this evaluation's conditions, and a PatchFailed Event (a Warning where ``warning``) says
        why; logged alone when ``again``."""
        report.state = before.model_copy(update={"recommendation": decision.state.recommendation,
                                                 "conditions": report.state.conditions})
        if again:
            log.warning("%s again: not applying %s: %s", events.PATCH_FAILED, decision.knobs, detail,
                        extra={"namespace": report.namespace, "tuning": report.name, "reason": events.PATCH_FAILED})
        else:
            report.event(events.PATCH_FAILED, f"not applying {decision.knobs}: {detail}", warning=warning)

    async def _tuning_moved(self, report: Report, rollback: bool) -> tuple[str, bool] | None:
        """Why the VllmTuning, read again from the apiserver just before a patch of its target, is not the one this
        evaluation decided for, in words, and whether that is to warn of (an apiserver that does not answer); None
        when it is. The watch's copy may be old: after a watch outage kopf's re-list brings no DELETED event for a
        tuning deleted meanwhile, and an edit may not have arrived yet. A tuning deleted (or being deleted) is
        forgotten; one that cannot be read is not acted for either. A spec changed since does not stop a
        ``rollback``, which no spec setting does (our config failed: the one before goes back)."""
        what = f"VllmTuning {report.namespace}/{report.name}"
        try:
            live = await self._call(self.kube.read_tuning, report.namespace, report.name)
        except (ApiException, HTTPError) as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                self.cache.forget_tuning(report.namespace, report.name)
                return f"{what} was deleted (while the watch was down): nothing is done for it any more", False
            why = api_error(exc)
            return f"{what} could not be read again before the patch ({why}): the next evaluation decides again", True
        meta = live["metadata"]
        if meta.get("deletionTimestamp"):
            self.cache.forget_tuning(report.namespace, report.name)
            return f"{what} is being deleted: nothing is done for it any more", False
        if meta.get("uid", "") != report.uid:
            return (f"{what} was deleted and created again since it was read: the next evaluation reads the new "
                    "one", False)
        if not rollback and int(meta.get("generation") or 0) != report.generation:
            return (f"the spec of {what} changed since it was read (generation {report.generation}, now "
                    f"{meta.get('generation')}): the next evaluation decides under the new one", False)
        return None

    def _started(self, target: Target, decision: Decision, report: Report, patched: dict[str, Any]) -> None:
        """The decision's rollout (or rollback) is in the Deployment ``patched``: the decision's state stands, said
        in Events."""
        rollback = decision.action == DecisionAction.ROLLBACK
        if decision is report.decision:  # not the rollback of a failed rollout that ``_track_rollout`` writes
            report.patched = True
        report.state = self._with_generation(report.state, patched)
        report.event(events.ROLLED_BACK if rollback else events.ROLLOUT_STARTED, f"{decision.knobs}: {decision.reason}")
        report.target_event(events.KNOBS_ROLLED_BACK if rollback else events.KNOBS_CHANGED,
                            f"{decision.knobs} by VllmTuning {report.name}: {decision.reason}")
        if not rollback:
            self._warn_if_restarts_lose_requests(target, report, f"rolling the pods to {decision.knobs}")

    async def _landed(
        self, target: Target, decision: Decision, report: Report
    ) -> tuple[dict[str, Any] | None, str]:
        """The Deployment read back after a write that got no answer (a timeout, a reset) or a server error (500,
        504: the apiserver's own timeout waiting on etcd, which may commit the write all the same), when it holds
        this evaluation's patch (our annotations, its knobs, stamped now): the write landed, and the decision's
        state (its baseline, the config a window goes back to) stands. Else None, and what the read found."""
        assert decision.knobs is not None
        meta = target.deployment["metadata"]
        try:
            read = await self._call(self.kube.read_deployment, meta["namespace"], meta["name"])
        except (ApiException, HTTPError) as exc:
            why = api_error(exc)
            return None, f"the Deployment could not be read back ({why})"
        if unrecorded_write(read, decision.knobs, report.name, report.now - timedelta(seconds=1)) is None:
            return None, "the Deployment read back does not have the change"
        return read, ""

    @staticmethod
    def _warn_if_restarts_lose_requests(target: Target, report: Report, change: str) -> None:
        """A RestartLosesRequests Warning Event with ``change`` (a rollout, or a recommendation that would be one)
        when the target's pods abort, refuse or cut requests as they stop (``rollout.drain``: a drain short beside the
        time a request runs in the last window cuts them), saying what to set."""
        advice = target.drain_advice(in_flight_seconds(report.state.observed))
        if advice is not None:
            report.event(events.RESTART_LOSES_REQUESTS, f"{change}: {advice}", warning=True)

    async def _replaced_template(self, target: Target) -> dict[str, Any] | None:
        """The pod template of the revision before the current one, which a rollback of our change puts back
        exactly (``rollout.patch.undo_patch``); None when the Deployment kept none, or it cannot be read (an
        operator's Role from before it could): the rollback is then a change like any other."""
        if target.replicaset is None:
            return None
        older = [rs for rs in target.replicasets if revision(rs) < revision(target.replicaset)]
        if not older:
            return None
        replaced = max(older, key=revision)["metadata"]
        try:
            body = await self._call(self.kube.read_replicaset, replaced["namespace"], replaced["name"])
        except ApiException as exc:
            log.info("not reading ReplicaSet %s/%s to roll back to (%s): rolling back by a new template",
                     replaced["namespace"], replaced["name"], exc.reason)
            return None
        return body["spec"]["template"]

    # --- observation ----------------------------------------------------------------------------

    async def _connection(self, namespace: str, spec: VllmTuningSpec) -> Connection:
        """How to reach the tuning's Prometheus: spec.prometheus's, else the operator's (``--prometheus-url``, with
        the operator's headers and credential files under what the tuning sets)."""
        prom, settings = spec.prometheus, self.settings
        url = prom.url or settings.prometheus_url
        if not url:
            raise TargetProblem("NoPrometheusURL",
                                "no Prometheus URL: set spec.prometheus.url or start the operator with --prometheus-url")
        basic = prom.basic_auth
        secrets = {}
        for field_name, ref in (("bearerTokenSecretRef", prom.bearer_token_secret_ref),
                                ("basicAuth.username", basic and basic.username),
                                ("basicAuth.password", basic and basic.password),
                                ("caSecretRef", prom.ca_secret_ref)):
            if ref is None:
                continue
            try:
                value = await self._call(self.kube.secret_value, namespace, ref.name, ref.key)
            except ApiException as exc:
                what = "not found" if exc.status == 404 else f"unreadable ({exc.reason})"
                raise TargetProblem("SecretNotFound",
                                    f"Secret {namespace}/{ref.name} is {what}; create it or fix "
                                    f"spec.prometheus.{field_name}") from exc
            if value is None:
                raise TargetProblem("SecretNotFound", f"Secret {namespace}/{ref.name} has no key {ref.key!r}; "
                                                      f"fix spec.prometheus.{field_name}.key")
            secrets[field_name] = value.strip()
        headers = dict(prom.headers)
        if prom.url is None:  # the operator's own Prometheus: its headers and credential files, under the tuning's
            named = {name.lower() for name in headers}
            headers.update((name, value) for name, value in settings.prometheus_headers if name.lower() not in named)
            token_file, ca_file = settings.prometheus_bearer_token_file, settings.prometheus_ca_file
            if token_file and basic is None and "bearerTokenSecretRef" not in secrets:
                secrets["bearerTokenSecretRef"] = _operator_file(token_file, "--prometheus-bearer-token-file",
                                                                 "bearerTokenFile")
            if ca_file and "caSecretRef" not in secrets:
                secrets["caSecretRef"] = _operator_file(ca_file, "--prometheus-ca-file", "caFile")
        return Connection(url=url.rstrip("/"), bearer_token=secrets.get("bearerTokenSecretRef"),
                          basic_auth=basic and (secrets["basicAuth.username"], secrets["basicAuth.password"]),
                          headers=tuple(sorted(headers.items())), ca_pem=secrets.get("caSecretRef"),
                          timeout_seconds=duration_seconds(prom.timeout))

    async def _observe(self, namespace: str, spec: VllmTuningSpec, target: Target, report: Report, rolling: bool,
                       ours: bool) -> Observation | None:
        """The window of the target's current pods, ending spec.prometheus.queryOffset before the evaluation (so
        that it holds every scrape stamped in it, and reads the same when queried again); during our own rollout
        (``ours``), and until the window no longer reaches back into it, of all its pods.

        Those windows only measure what the restart costs (``decide`` holds meanwhile, and after the rollout
        they hold as taken under several configs), so they take every pod of the Deployment still reporting,
        the old revision's and the new one's, as many as there are: fewer than are Ready is what a rolling
        restart looks like, not a gap, and the old revision's pods served part of the window.
        """
        window = duration_seconds(spec.traffic.window)
        end = report.now - timedelta(seconds=duration_seconds(spec.prometheus.query_offset))
        if target.replicas == 0 and not (target.deployment.get("status") or {}).get("replicas"):
            # scaled to zero (KEDA and the like): no pod to observe, and none a change would restart; an empty
            # window, not a missing one, so that a schedule's preset is still written (policy.observation.blind)
            report.condition(ConditionType.METRICS_AVAILABLE, False, HoldReason.NO_PODS,
                             f"Deployment {namespace}/{spec.target_ref.name} is scaled to zero: no pod to observe")
            return Observation(window_start=end - timedelta(seconds=window), window_end=end, config=target.knobs,
                               pods=0, rollout_in_progress=rolling or ours,
                               slo=effective_slo(spec, report.state, report.now))
        connection = await self._connection(namespace, spec)
        prom = spec.prometheus
        selector = Selector(matchers=tuple(sorted(prom.label_matchers.items())),
                            namespace_label=prom.namespace_label, pod_label=prom.pod_label)
        if target.replicaset is None:
            report.condition(ConditionType.METRICS_AVAILABLE, False, HoldReason.NO_DATA,
                             "the Deployment has no current ReplicaSet yet")
            return None
        restart = ours or _reaches_into_rollout(report.state, end, window)
        try:
            pods = await self._pods(target, restart)
        except ApiException as exc:
            report.condition(ConditionType.METRICS_AVAILABLE, False, HoldReason.NO_DATA,
                             f"the pods of Deployment {namespace}/{spec.target_ref.name} are unreadable "
                             f"({api_error(exc)}); holding")
            return None
        extra = pod_matchers(selector, namespace, pods) if self.settings.naive_queries else ()
        try:
            data = await self.observations.window(connection, selector, window, end.timestamp(), extra,
                                                  reach(window, duration_seconds(spec.rollout.settle_time)))
        except PrometheusError as exc:
            self.metrics.prometheus_errors.labels(exc.kind).inc()
            if not report.has(ConditionType.METRICS_AVAILABLE, False, exc.kind):
                report.event(events.METRICS_UNAVAILABLE, f"{exc}; holding", warning=True)
            report.condition(ConditionType.METRICS_AVAILABLE, False, exc.kind, f"{exc}; holding")
            return None
        slo = effective_slo(spec, report.state, report.now)
        observation, why = observe_target(data, namespace, pods, 0 if restart else target.ready_pods,
                                          None if restart else target.knobs, slo, rolling or ours,
                                          stale_after_seconds=stale_after(spec))
        if observation is None:
            report.condition(ConditionType.METRICS_AVAILABLE, False, HoldReason.NO_DATA, f"{why}; holding")
        else:
            report.condition(ConditionType.METRICS_AVAILABLE, True, "WindowObserved",
                              f"{observation.pods} pods, {observation.requests or 0:.0f} requests in the last "
                              f"{spec.traffic.window}")
        return observation

    async def _pods(self, target: Target, restart: bool) -> PodMatch:
        """The pods whose series are the tuning's: the current ReplicaSet's, or (``restart``) those of every
        ReplicaSet the Deployment owns, old revisions' included.

        A ReplicaSet's pods are matched by their names' prefix, its name and '-', at no API call, unless that
        is longer than the apiserver keeps of a generateName (``pod_prefix``; a Deployment name of 47 characters
        or more, by the hash's length): the cut prefix, short of (part of) the pod-template hash, would take the
        Deployment's other revisions too (series under other configs) and other Deployments whose names begin
        the same (``<name>-canary``). The pods of such ReplicaSets are listed, by the Deployment's selector (one
        call, whatever the revisions), and matched by their exact names, those whose ownerReferences name one of
        them. That sees only the pods that exist now: one already deleted (an old revision's, gone in the
        rolling restart; one replaced in the window) is not counted, though its series reach into the window,
        rather than counting other configs' or other Deployments' pods.
        """
        prefixes: list[str] = []
        cut: set[str] = set()  # uids of the ReplicaSets whose pods are matched by name
        for rs in target.replicasets if restart else [target.replicaset]:
            name = rs["metadata"]["name"]
            if pod_prefix(name) == f"{name}-":
                prefixes.append(f"{name}-")
            else:
                cut.add(rs["metadata"]["uid"])
        if not cut:
            return PodMatch(tuple(sorted(prefixes)))
        names = [pod["metadata"]["name"] for pod in await self._owned_pods(target.deployment, cut)]
        return PodMatch(tuple(sorted(prefixes)), tuple(sorted(names)))

    async def _owned_pods(self, deployment: dict[str, Any], owners: set[str], term: str = "") -> list[dict[str, Any]]:
        """The pods of the ReplicaSets whose uids are ``owners``: listed by the Deployment's selector (and
        ``term``), kept by their ownerReferences. Labels alone also match the pods of another Deployment whose
        selector overlaps this one's, and a copy of a Deployment (the same template) shares its pod-template
        hash: its crash-looping pods would fail our rollout, its node would stand for our GPU."""
        if not owners:
            return []
        selector = ",".join(filter(None, (label_selector(deployment["spec"]["selector"]), term)))
        listed = await self._call(self.kube.list_pods, deployment["metadata"]["namespace"], selector)
        return [pod for pod in listed
                if owners & {ref.get("uid") for ref in pod["metadata"].get("ownerReferences") or []}]

    # --- report ---------------------------------------------------------------------------------

    def _recommended(self, report: Report, decision: Decision) -> None:
        """Export the decision's recommendation: a gauge, set again by an evaluation redone."""
        if decision.recommendation is not None:
            gauge = self.metrics.recommended
            gauge.labels(report.namespace, report.name, "max_num_batched_tokens").set(
                decision.recommendation.max_num_batched_tokens)
            gauge.labels(report.namespace, report.name, "max_num_seqs").set(decision.recommendation.max_num_seqs)

    async def _finish(self, body: dict[str, Any], report: Report, spec: VllmTuningSpec | None, started: float,
                      write: bool) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        state = report.state.model_copy(update={"observed_generation": report.generation})
        if state.current is not None:
            self.metrics.knobs.labels(namespace, name, "max_num_batched_tokens").set(state.current.max_num_batched_tokens)
            self.metrics.knobs.labels(namespace, name, "max_num_seqs").set(state.current.max_num_seqs)
        self.metrics.slot_wait(namespace, name, state.slot_wait_since)
        cut = cut_share(state.drain_seconds, in_flight_seconds(state.observed))
        self.metrics.drain(namespace, name, state.drain_seconds, cut)
        report.state = state
        status = state.model_dump(by_alias=True, mode="json")
        if not write:
            return
        deployment = self.cache.deployment(namespace, spec.target_ref.name) if spec else None
        self._record_slot((namespace, name), report)  # also after evaluations that stopped early
        # Events before the status: whoever sees a condition in the status finds its Event too, and
        # an operator stopped between the two writes sends an Event twice rather than never (whether
        # to send one is judged from the status). A write that does not land leaves the next evaluation to
        # judge the same again: those this one sent are not sent twice (``Report.sent_before``).
        await self._send_events(meta, report, deployment)
        if _pruned(status) != _pruned(body.get("status") or {}):
            await self._write_status(meta, report, status)
        self._count(report)
        self.metrics.evaluation_seconds.observe(time.perf_counter() - started)

    def _count(self, report: Report) -> None:
        """Count the evaluation's decision and its verdicts, each once although the evaluation may be redone.

        A status write refused with 409 has the evaluation redone at once, deciding again: its decision is counted
        by the redo, unless its patch was written (the redo follows that rollout, and decides anew); its verdicts
        are counted by the redo too. A status write that failed otherwise (refused with another 4xx, which may last
        as long as a Role lacks a grant; timed out) has the same rollout judged again at the next evaluations: the
        last verdict counted is kept per tuning, and the same verdict on the same rollout is counted once (by this
        process: one that starts meanwhile counts it again), unless a kept verdict stopped standing in between
        (``_track_rollout``)."""
        namespace, name, decision = report.namespace, report.name, report.decision
        if decision is not None and (not report.refused or report.patched):
            self.metrics.decisions.labels(namespace, name, decision.action, decision.hold or "").inc()
        for verdict in () if report.refused else report.finished:
            if self._counted.get((namespace, name)) != (report.uid, verdict):
                self.metrics.rollouts.labels(namespace, name, verdict.outcome).inc()
                self._counted[namespace, name] = report.uid, verdict

    async def _write_status(self, meta: dict[str, Any], report: Report, status: dict[str, Any]) -> None:
        """Merge-patch ``status`` into the VllmTuning whose metadata an evaluation read, on condition that it is
        still that object as read (its resourceVersion): one deleted and created again under its name meanwhile
        (``kubectl replace --force``, a reinstall) must not take the old one's failed configs, rollout and target
        uid, nor one edited since (its spec, its status cleared by a person) a status worked out before. Refused
        so, this evaluation's result is dropped (``report.refused``), and the next evaluation reads the object anew,
        as soon as the watch brings it (``Evaluator``). A write that did not land, refused so or otherwise, leaves
        the Events this evaluation sent to the next one (``Report.sent_before``)."""
        namespace, name = meta["namespace"], meta["name"]
        try:
            await self._call(self.kube.patch_tuning_status, namespace, name, status, meta.get("resourceVersion"))
            return
        except ApiException as exc:
            if exc.status == 404:
                # Deleted while the watch was down: a re-list after it brings no DELETED event, and the
                # tuning would be evaluated, and act, for as long as the operator runs.
                log.warning("writing the status of %s/%s failed: %s", namespace, name, exc.reason)
                self.cache.forget_tuning(namespace, name)
                return
            if exc.status == 409:
                log.info("the status of %s/%s is not written: the VllmTuning was changed, or deleted and created "
                         "again, since it was read; it is evaluated again once read anew", namespace, name)
                report.refused = True
            else:  # refused for as long as a Role lacks the grant, or a webhook refuses: tried at each evaluation
                log.warning("writing the status of %s/%s failed: %s", namespace, name, exc.reason)
        except HTTPError as exc:  # a timeout, a reset: written at the next evaluation
            log.warning("writing the status of %s/%s failed: %s", namespace, name, exc)
        # the next evaluation reads a status without this write (one that timed out may have landed) and judges
        # the same again: what this one said is not said again (``Report.sent_before``)
        self._unwritten[namespace, name] = frozenset(report.sent)

    async def _send_events(self, meta: dict[str, Any], report: Report, deployment: dict[str, Any] | None) -> None:
        """Log the report's Events, then send them: on the VllmTuning, and on ``deployment`` (when known) those
        about the target. Those the evaluation before sent, its status write not landed (``Report.sent_before``),
        are neither: the log has them from it, once, as the Events do."""
        namespace, name = meta["namespace"], meta["name"]
        tuning = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta}
        target = None if deployment is None else {"apiVersion": "apps/v1", "kind": "Deployment",
                                                  "metadata": deployment["metadata"]}
        bodies: list[dict[str, Any]] = []
        for involved, listed in ((tuning, report.events), (target, report.target_events)):
            for reason, message, type_ in listed:
                body = events.event_body(involved, reason, message, type_, report.now) if involved else None
                if body is not None and events.sameness(body) in report.sent_before:
                    report.sent.add(events.sameness(body))  # kept, should this redo's write be refused too
                    continue
                # what the Events say goes to the log too: the one record that outlives their TTL
                log.log(logging.WARNING if type_ == events.WARNING else logging.INFO, "%s: %s", reason, message,
                        extra={"namespace": namespace, "tuning": name, "reason": reason})
                bodies += [body] if body is not None else []
        try:
            for body in bodies:
                await self._call(self.kube.create_event, body)
                report.sent.add(events.sameness(body))
        except (ApiException, HTTPError) as exc:  # refused, or a timeout: the status is still written
            log.warning("sending the Events of %s/%s failed: %s", namespace, name, api_error(exc))


def _defaults_known_better(state: VllmTuningStatus, target: Target) -> bool:
    """Whether the template's knobs differ from the current ones only by vLLM's defaults read against a GPU known
    better (a pod got a node): both leave a knob to vLLM, the template sets no knob to another value than the
    current one, and no rollout of ours awaits its verdict. Our rollouts write both flags, so a template without
    them then is someone's revert of ours (``kubectl rollout undo``, a GitOps self-heal to a manifest without
    them), judged as a revert of a template with flags is; taken for a correction, the rollout would stay in
    progress for ever, holding every change and a rollout slot."""
    current, args = state.current, target.args
    return (not awaiting_verdict(state) and target.from_defaults and current is not None and current.from_defaults
            and args.max_num_batched_tokens in (None, current.max_num_batched_tokens)
            and args.max_num_seqs in (None, current.max_num_seqs))


def _validation_problems(exc: ValidationError) -> list[str]:
    """Each problem pydantic found, as ``field.path: what is wrong``."""
    return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]


def _reaches_into_rollout(state: VllmTuningStatus, end: datetime, window_seconds: float) -> bool:
    """Whether the window of ``window_seconds`` ending at ``end`` reaches back into the last rollout, which
    succeeded less than a window before it: the old revision's pods served part of it."""
    last = state.last_rollout
    if last is None or last.phase != RolloutPhase.SUCCEEDED or last.finished_at is None:
        return False
    return datetime.fromisoformat(last.finished_at) > end - timedelta(seconds=window_seconds)


def _knobs(recommendation: Recommendation) -> Knobs:
    return Knobs(max_num_batched_tokens=recommendation.max_num_batched_tokens,
                 max_num_seqs=recommendation.max_num_seqs)


def controller_of(deployment: dict[str, Any]) -> str | None:
    """The object that controls a Deployment (its ownerReference with ``controller: true``) as ``Kind ns/name``."""
    for owner in deployment["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return f"{owner.get('kind')} {deployment['metadata'].get('namespace')}/{owner.get('name')}"
    return None


def _pruned(value: Any) -> Any:
    """``value`` without None entries at any depth: how the API server stores a merge-patched status."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value
