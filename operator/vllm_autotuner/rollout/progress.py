"""Where a rolling update stands, read from Deployment and Pod objects (pure).

Kubernetes' own notion of "complete" is the Deployment controller's: status
has caught up with the spec generation, and every replica is updated and
available with no old replica left. Failure has two faces: a new pod whose
vLLM exits at start-up (CrashLoopBackOff, the error in the container's last
termination message), caught at once, and no progress for the VllmTuning's
own deadline, which counts, as the controller's progressDeadlineSeconds
does, from the rollout's last progress: a slow rollout of many pods, one at
a time, is not a failed one. The controller's ``ProgressDeadlineExceeded``
condition decides nothing: a large model that loads for longer than the
Deployment's deadline per pod is slow, not broken, when the spec allows it.
Nor is the spec's deadline shorter than what the Deployment itself allows a
pod (``progress_deadline``). A rollout whose new
pods never started vLLM (the scheduler found no free GPU for a surge pod,
the image cannot be pulled, a quota refuses the pods, the runtime cannot
start the container) is stuck for a reason that has nothing to do with the
knobs, which no vLLM has read: it is ``BLOCKED``, not failed, once the
deadline passes (a cluster autoscaler may be adding a node until then). So
is one whose pods that hold it back never started vLLM while new pods
before them serve: a node lost half way, or more replicas asked for than
there are GPUs, stops it after the config has shown that it starts.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from vllm_autotuner.rollout.drain import termination_grace
from vllm_autotuner.rollout.patch import last_written

#: Restarts of a new pod after which its crash is taken as the config's fault.
CRASH_RESTARTS = 2
#: How the runtime reports a container it could not start, so its process never ran (containerd's StartError,
#: Docker's ContainerCannotRun, exit code 128: the GPU driver the container toolkit cannot load, no such binary).
_START_FAILURES = {"StartError", "ContainerCannotRun"}
#: ``progressDeadlineSeconds`` when the Deployment leaves it out (the API server's default).
DEPLOYMENT_DEADLINE_S = 600
#: Time past the waits a Deployment names (minReadySeconds, a startupProbe's) for the Deployment controller's and
#: the kubelet's syncs, and for a pod's scheduling and image pull before its startupProbe's first period.
DEADLINE_MARGIN_S = 120


class Progress(StrEnum):
    IN_PROGRESS = "InProgress"
    COMPLETE = "Complete"
    FAILED = "Failed"
    BLOCKED = "Blocked"
    """No progress for the deadline, and no new pod that holds it back has started vLLM: not the config's fault."""


@dataclass(frozen=True)
class RolloutState:
    progress: Progress
    message: str


@dataclass(frozen=True)
class Deadline:
    """How long a rollout may go without progress (``progress_deadline``)."""

    seconds: float
    source: str
    """Where ``seconds`` comes from, said with a verdict taken at it."""


@dataclass(frozen=True)
class ProbeSpec:
    """A container's probe as the kubelet runs it, in seconds, with Kubernetes' defaults for the fields a spec leaves
    out: the operator waits out a loading vLLM's startupProbe (``progress_deadline``) and the simulated kubelet runs
    the probes (``sim.kubelet.Probe``), and both must read a spec alike."""

    initial_delay: int
    period: int
    failure_threshold: int
    timeout: int

    @classmethod
    def read(cls, spec: dict[str, Any] | None) -> ProbeSpec | None:
        """The probe ``spec`` declares, or None where it declares none."""
        if not spec:
            return None
        return cls(initial_delay=spec.get("initialDelaySeconds", 0), period=spec.get("periodSeconds", 10),
                   failure_threshold=spec.get("failureThreshold", 3), timeout=spec.get("timeoutSeconds", 1))


def progress_deadline(deployment: dict[str, Any], new_pods: list[dict[str, Any]], container: str | None,
                      spec_seconds: float) -> Deadline:
    """How long a rollout of ``deployment`` may go without progress: the spec's deadline, or longer where the
    Deployment itself gives a pod longer to start, as a fixed deadline would fail rollouts that are slow by the
    Deployment's own design and blacklist their configs. The longest of:

    - ``spec_seconds``, the VllmTuning's spec.rollout.progressDeadline;
    - the Deployment's ``progressDeadlineSeconds``: its owner's own word on how long a step may take;
    - its ``minReadySeconds`` plus a margin: a Ready pod makes no progress for that long before it is available;
    - while vLLM loads in one of ``new_pods`` (its container has run and does not serve yet, the pod not on its
      way out: ``_gone``), the vLLM container's startupProbe budget (initialDelaySeconds + failureThreshold x
      periodSeconds + timeoutSeconds) plus a margin, as the kubelet lets vLLM load for that long before it
      restarts it (and two restarts are a crash loop, failed at once). A rollout whose pods have not started
      vLLM (no GPU for them) waits for no probe: it is Blocked at the other deadlines.

    When the strategy stops old pods before it starts new ones (maxSurge 0, Recreate), an old pod's drain
    (terminationGracePeriodSeconds) comes before any of that, whether or not a pod loads yet: a new pod waits
    Pending for the draining pod's GPU, or under Recreate is not created until every old pod is gone. It is added
    to the longest.
    """
    spec = deployment["spec"]
    candidates = [Deadline(spec_seconds, "spec.rollout.progressDeadline"),
                  Deadline(float(spec.get("progressDeadlineSeconds", DEPLOYMENT_DEADLINE_S)),
                           "the Deployment's progressDeadlineSeconds")]
    if spec.get("minReadySeconds"):
        ready = int(spec["minReadySeconds"])
        candidates.append(Deadline(float(ready + DEADLINE_MARGIN_S),
                                   f"the Deployment's minReadySeconds {ready}s + {DEADLINE_MARGIN_S}s"))
    pod_spec = spec["template"].get("spec") or {}
    loading = any(_ran(s) and not _serving(s)
                  for pod in new_pods if not _gone(pod) for s in _vllm_statuses(pod, container))
    for c in pod_spec.get("containers") or []:
        probe = ProbeSpec.read(c.get("startupProbe"))
        if loading and probe and (container is None or c.get("name") == container):
            budget = probe.initial_delay + probe.failure_threshold * probe.period + probe.timeout
            candidates.append(Deadline(
                float(budget + DEADLINE_MARGIN_S),
                f"container {c.get('name')}'s startupProbe {probe.initial_delay}s + {probe.failure_threshold} x "
                f"{probe.period}s + {probe.timeout}s + {DEADLINE_MARGIN_S}s"))
    longest = max(candidates, key=lambda d: d.seconds)
    drain = 0.0 if _surge(deployment) else termination_grace(pod_spec)
    if not drain:
        return longest
    return Deadline(longest.seconds + drain,
                    f"{longest.source}, after a {drain:.0f}s drain (terminationGracePeriodSeconds)")


def _gone(pod: dict[str, Any]) -> bool:
    """Whether the pod is done with (evicted, its node lost: phase Failed; Succeeded) or on its way out (being
    deleted, or marked for a disruption): what its containers did says nothing of whether the rollout can go on,
    and an eviction while vLLM loaded is no sign against the config, which a replacement will try again."""
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded") or pod["metadata"].get("deletionTimestamp"):
        return True
    return any((c.get("type"), c.get("status")) == ("DisruptionTarget", "True")
               for c in (pod.get("status") or {}).get("conditions") or [])


def _vllm_statuses(pod: dict[str, Any], container: str | None) -> list[dict[str, Any]]:
    """The pod's status of the vLLM container (of every container when its name is not known)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return [s for s in statuses if container is None or s.get("name") == container]


def _ended(status: dict[str, Any]) -> dict[str, Any]:
    """The container's latest termination: the current one, else the last (empty before any)."""
    return (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated") or {}


def _crash_looping(status: dict[str, Any], since: datetime | None) -> bool:
    """Whether the vLLM container crash-loops in this rollout: restarted ``CRASH_RESTARTS`` times and not
    serving again (running and Ready is a container that recovered), its latest exit vLLM's own (a container the
    runtime could not start never ran vLLM) and at or after ``since``, the rollout's start when known. A rollback
    scales old pods back up, whose restarts (an NCCL error days ago) say nothing about this rollout."""
    if status.get("restartCount", 0) < CRASH_RESTARTS or _serving(status):
        return False
    ended = _ended(status)
    finished = ended.get("finishedAt")
    return bool(ended) and ended.get("reason") not in _START_FAILURES and (
        since is None or (finished is not None and datetime.fromisoformat(finished) >= since))


def _new_pods_failure(pods: list[dict[str, Any]], container: str | None, since: datetime | None) -> str | None:
    """Why a new pod's vLLM crash-loops in this rollout (since ``since``); None when none does. Pods on their way
    out (``_gone``) are left out: a crash-looping pod runs (phase Running, its restarts rising), and one evicted
    or being deleted is replaced by a pod that starts the config again."""
    for pod in (p for p in pods if not _gone(p)):
        for status in _vllm_statuses(pod, container):
            if _crash_looping(status, since):
                ended, waiting = _ended(status), (status.get("state") or {}).get("waiting") or {}
                detail = ended.get("message") or waiting.get("message") or waiting.get("reason", "")
                name = pod["metadata"]["name"]
                return (
                    f"pod {name} is crash-looping ({status.get('restartCount')} restarts, "
                    f"{waiting.get('reason') or ended.get('reason') or 'Error'}): {detail.strip()}"
                )
    return None


#: What to do about a new pod that finds no free GPU, when the strategy starts new pods before it stops old ones.
NO_ROOM_ADVICE = (
    "A rolling update starts new pods before it stops old ones (maxSurge; Kubernetes' default of 25% rounds up to "
    "one pod, and maxUnavailable's rounds down to none below four replicas), so each needs a free GPU: without a "
    "spare one, set the Deployment's strategy.rollingUpdate to maxSurge: 0 and maxUnavailable: 1, or add GPU capacity"
)
#: The same, when the strategy stops old pods first: the new pod waits for the GPU of one still draining.
DRAIN_ADVICE = (
    "The Deployment's strategy starts no pod before it stops one, so a new pod waits for the GPU of an old one until "
    "that has drained (its terminationGracePeriodSeconds), or for one another workload took: set the VllmTuning's "
    "spec.rollout.progressDeadline above that drain plus vLLM's load time, or add GPU capacity"
)


def _never_started(deployment: dict[str, Any], pods: list[dict[str, Any]], container: str | None) -> str | None:
    """Why the new pods that hold the rollout back have not started vLLM, when they cannot be created or none of
    those not serving yet has started its container (so none of them has read the knobs; pods that serve the new
    config, before a node went or the autoscaler asked for more, say it starts); None when one has, or nothing is
    known of them. Pods on their way out (``_gone``) hold nothing back: their replacements do. No pod of the new
    template created yet (none updated, or the pods listed all on their way out) has started nothing either: under
    Recreate or maxSurge 0, old pods still draining hold it back, and no pod ever ran the config."""
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status")) == ("ReplicaFailure", "True"):
            return f"the new pods cannot be created: {condition.get('message', '').strip()}"
    surge = _surge(deployment)
    if not (deployment.get("status") or {}).get("updatedReplicas") or (pods and all(_gone(p) for p in pods)):
        return "no pod of the new template has been created yet" + ("" if surge else f". {DRAIN_ADVICE}")
    advice = NO_ROOM_ADVICE if surge else DRAIN_ADVICE
    held = None
    for pod in (p for p in pods if not _gone(p)):
        ours = _vllm_statuses(pod, container)
        if ours and all(_serving(c) for c in ours):
            continue
        if any(_ran(c) for c in ours):
            return None
        held = held or _not_started(pod, ours, advice)
    return held


def _serving(status: dict[str, Any]) -> bool:
    """Whether the container runs and is Ready."""
    return "running" in (status.get("state") or {}) and bool(status.get("ready"))


def _ran(status: dict[str, Any]) -> bool:
    """Whether the container's process has run: it runs, or ended other than by the runtime's failing to start
    it (which restarts it too)."""
    if "running" in (status.get("state") or {}):
        return True
    ended = _ended(status)
    return ended.get("reason") not in _START_FAILURES if ended else bool(status.get("restartCount"))


def _not_started(pod: dict[str, Any], containers: list[dict[str, Any]], no_room: str) -> str:
    """What holds a pod before its vLLM container starts: the scheduler (``no_room``: what to do when it finds no
    room), or the kubelet (image, volumes, the container runtime)."""
    name = pod["metadata"]["name"]
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status")) == ("PodScheduled", "False"):
            message = condition.get("message", "").strip()
            advice = f". {no_room}" if condition.get("reason") == "Unschedulable" else ""
            return f"pod {name} cannot be scheduled: {message}{advice}"
    for status in containers:
        ended = _ended(status)
        if ended:
            return f"pod {name} cannot start its container ({ended.get('reason')}): {ended.get('message', '').strip()}"
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"pod {name} is waiting to start ({waiting['reason']}): {waiting.get('message', '').strip()}"
    return f"pod {name} has not started its container"


def unavailable_at_once(deployment: dict[str, Any]) -> int:
    """Pods a rollout of ``deployment`` takes out of service at once, as the Deployment controller resolves its
    strategy against ``spec.replicas``: all of them under Recreate; under RollingUpdate, maxUnavailable (a
    percentage rounded down, 25 % when unset), and one when it and maxSurge (rounded up) both come to none."""
    replicas = int(deployment["spec"].get("replicas", 1))
    strategy = _rolling_update(deployment)
    if strategy is None:
        return replicas
    unavailable, surge = strategy
    return min(replicas, 1 if unavailable == 0 and surge == 0 else unavailable)


def _surge(deployment: dict[str, Any]) -> bool:
    """Whether a rollout of ``deployment`` starts new pods before it stops old ones (maxSurge, rounded up)."""
    strategy = _rolling_update(deployment)
    return strategy is not None and strategy[1] > 0


def _rolling_update(deployment: dict[str, Any]) -> tuple[int, int] | None:
    """maxUnavailable and maxSurge in pods (25 % each when unset), None under the Recreate strategy."""
    spec = deployment["spec"]
    replicas = int(spec.get("replicas", 1))
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return None
    rolling = strategy.get("rollingUpdate") or {}
    return (_scaled(rolling.get("maxUnavailable", "25%"), replicas, up=False),
            _scaled(rolling.get("maxSurge", "25%"), replicas, up=True))


def _scaled(value: int | str, replicas: int, up: bool) -> int:
    """An int-or-percent of the strategy, in pods (``intstr.GetScaledValueFromIntOrPercent``)."""
    if isinstance(value, int):
        return value
    share = int(value.rstrip("%")) * replicas / 100
    return math.ceil(share) if up else math.floor(share)


def progress_mark(deployment: dict[str, Any], replicaset: dict[str, Any] | None, target_generation: int) -> int:
    """How far a rollout to ``target_generation`` has got: pods of the newest template created
    (``updatedReplicas``) plus those of them Ready and those available (the newest ReplicaSet's). Every step of a
    rolling update raises it, as each does the Deployment controller's ``DeploymentProgressing``: a pod that turned
    Ready is progress while ``minReadySeconds`` keeps it from counting as available. 0 until the Deployment
    controller has seen the patch (before, its counts are the old template's)."""
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < target_generation:
        return 0
    new = (replicaset or {}).get("status") or {}
    return int(status.get("updatedReplicas") or 0) + int(new.get("readyReplicas") or 0) + int(
        new.get("availableReplicas") or 0)


def rollout_state(
    deployment: dict[str, Any],
    target_generation: int,
    new_pods: list[dict[str, Any]],
    container: str | None,
    stalled_seconds: float,
    deadline_seconds: float,
) -> RolloutState:
    """Evaluate a rollout started by a patch that produced ``target_generation``.

    ``new_pods`` are the pods of the Deployment's newest ReplicaSet (after
    a rollback, old pods scaled back up): their crashes count from the
    operator's write that started the rollout, whose time the Deployment
    carries (``patch.last_written``). ``stalled_seconds`` is the time since
    the rollout last made progress (``progress_mark`` rose), failing it past
    ``deadline_seconds``, the spec's deadline, or past a longer one where
    the Deployment gives its pods longer (``progress_deadline``). A
    Deployment at a *later* generation (someone else changed it too) is
    judged the same way: the question is whether the newest template runs.
    """
    if _complete(deployment, target_generation):
        return RolloutState(Progress.COMPLETE, "all replicas updated and available")
    status = deployment.get("status") or {}
    spec_replicas = deployment["spec"].get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    crash = _new_pods_failure(new_pods, container, last_written(deployment))
    if crash:
        return RolloutState(Progress.FAILED, crash)
    deadline = progress_deadline(deployment, new_pods, container, deadline_seconds)
    if stalled_seconds > deadline.seconds:
        stalled = (f"no progress for {stalled_seconds:.0f}s (progressDeadline {deadline.seconds:.0f}s, "
                   f"{deadline.source}): {updated}/{spec_replicas} updated, {available} available")
        held = _never_started(deployment, new_pods, container)
        if held:
            return RolloutState(Progress.BLOCKED, f"{stalled}; {held}")
        return RolloutState(Progress.FAILED, stalled)
    return RolloutState(
        Progress.IN_PROGRESS, f"{updated}/{spec_replicas} replicas updated, {available}/{spec_replicas} available"
    )


def _complete(deployment: dict[str, Any], generation: int = 0) -> bool:
    """The Deployment controller's own test: caught up, all replicas updated and available, none old."""
    spec_replicas = deployment["spec"].get("replicas", 1)
    status = deployment.get("status") or {}
    return (
        status.get("observedGeneration", 0) >= max(generation, deployment["metadata"].get("generation", 0))
        and status.get("updatedReplicas", 0) == spec_replicas
        and status.get("replicas", 0) == spec_replicas
        and status.get("availableReplicas", 0) >= spec_replicas
    )


def rollout_in_progress(deployment: dict[str, Any]) -> bool:
    """True while the Deployment is not settled: the Deployment controller rolls out a template (started by
    anyone: ``template_rolling``), or fewer replicas than asked for are available (pods an autoscaler added,
    loading or finding no GPU; a pod lost with its node). The tuning of that Deployment holds its changes
    meanwhile: a restart while its capacity is short costs more, and a window of it says less."""
    return not _complete(deployment)


#: The pod template annotation of ``kubectl rollout restart`` (and of the tools that restart the same way): the
#: pods it starts run the template they ran, so a restart during our rollout leaves its outcome ours.
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


def template_record(deployment: dict[str, Any]) -> str:
    """What a rollout keeps of the Deployment our write left (``Rollout.template_digest``), ``<generation>:<digest>``:
    the SHA-256 (hex) of its pod template as the apiserver serves it, and the generation it is that of. Taken from
    the answer to our patch (defaults and admission webhooks' changes in), the digest reads the same from every
    later copy of that template, and differs once anyone changes the template. The rest of the spec is left out: an
    autoscaler's scaling, a pause, change no pod; so is a restart's stamp (``RESTARTED_AT``), which changes none
    either: a person restarting our crash-looping rollout does not spare its config the verdict and rollback."""
    return f"{int(deployment['metadata'].get('generation') or 0)}:{_digest(deployment)}"


def template_overtaken(record: str | None, generation: int | None, deployment: dict[str, Any]) -> bool:
    """Whether someone else changed the pod template since our write at ``generation`` left the one ``record``
    (``template_record``) holds: not where there is no record (written by an operator before it), nor where the
    record is of another generation's template: an earlier rollout's, which an operator before it left in the
    status when it wrote this one (its merge patch keeps what it does not know)."""
    written, _, digest = (record or "").partition(":")
    return written == str(generation) and digest != _digest(deployment)


def _digest(deployment: dict[str, Any]) -> str:
    """``template_record``'s SHA-256 (hex): the pod template less its restart stamp (whose annotations, or metadata,
    then empty read as none)."""
    template = dict(deployment["spec"]["template"])
    metadata = dict(template.pop("metadata", None) or {})
    annotations = {key: value for key, value in (metadata.pop("annotations", None) or {}).items()
                   if key != RESTARTED_AT}
    text = json.dumps([template, metadata, annotations], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: Reasons of the Progressing condition that say nothing of a rollout: set while the Deployment is paused, and
#: when it is resumed, until the controller's next sync of it.
_NO_VERDICT = {"DeploymentPaused", "DeploymentResumed"}


def template_rolling(deployment: dict[str, Any]) -> bool:
    """Whether the Deployment controller rolls out a template (started by anyone): it has not caught up with the
    spec, a pod of the newest template is still to be created or an old one to be stopped, or, with all of them
    there, the controller has not yet declared the rollout done (its Progressing condition's reason
    ``NewReplicaSetAvailable``; without a reason that tells, until every replica is available).

    A pod lost after the rollout completed, or one more that an autoscaler asked for and no GPU can take, is no
    rollout: the controller keeps ``NewReplicaSetAvailable``, and so does this. Such a pod holds no rollout slot
    from the other tunings of its node pool (``rollout.slots``), which would otherwise wait for as long as it
    stays unavailable.
    """
    spec_replicas = deployment["spec"].get("replicas", 1)
    status = deployment.get("status") or {}
    updated = status.get("updatedReplicas", 0)
    if (status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0)
            or updated < spec_replicas or status.get("replicas", 0) > updated):
        return True
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") not in _NO_VERDICT:
            return condition.get("reason") != "NewReplicaSetAvailable"
    return status.get("availableReplicas", 0) < spec_replicas
