"""What a kubelet would do with a container and show in its pod's status.

The simulated fleet stands in for the kubelet of its GPU nodes. The operator
judges a rollout by what the kubelet reports (``Ready``, ``started``,
``restartCount``, ``CrashLoopBackOff``, ``lastState.terminated``), so that
report must have the real shape and the real timing. This module is the pure
part of it, kept apart from the I/O as in the Kubernetes sample-controller:

* :func:`plan_attempt`: the timeline of one container run from its probes
  and when vLLM answers ``/health`` (or exits): when the container counts as
  started, when it turns Ready, and whether the kubelet kills it because a
  startup or liveness probe gave up first (a cold ``torch.compile`` is a
  classic way to outlast a tight startup probe).
* :func:`crash_backoff`: the kubelet's restart back-off, 10 s doubling to
  five minutes.
* :class:`PodStatus`: the ``status`` the kubelet writes: phase, the four
  conditions it owns with their transition times, and container statuses.
* :func:`grace_period`: how long a deleted pod's containers get before
  SIGKILL (a preStop sleep, read by ``rollout.drain`` as the operator reads
  it, comes out of it before SIGTERM).

Probe schedules and back-off are multiplied by the fleet's ``time_scale``,
like the start-up durations, so a scaled-down pod keeps the real ratios
between them. Probes are assumed to ask vLLM's ``/health`` (or its port):
they succeed exactly when the engine serves.

Termination messages follow ``terminationMessagePolicy``: with the default
``File`` vLLM (which writes no termination-log file) leaves the message
empty; with ``FallbackToLogsOnError`` the kubelet uses the end of the log,
which is where vLLM's error is.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from vllm_autotuner.rollout.drain import termination_grace
from vllm_autotuner.rollout.progress import ProbeSpec

BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 600.0
"""A container that ran this long without failing restarts its back-off."""
PROBE_KILL_EXIT = 143
"""The kubelet stops a container that failed its probe with SIGTERM."""
MESSAGE_MAX_BYTES = 2048
"""The kubelet keeps at most this much of a log tail as the message (and 80 lines)."""
MESSAGE_MAX_LINES = 80
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def grace_period(pod: dict[str, Any]) -> float:
    """Seconds from a pod's deletion to SIGKILL: what the deletion asked for (``deletionGracePeriodSeconds``, which
    the apiserver sets from the delete call or the spec), else the spec's ``terminationGracePeriodSeconds``."""
    grace = pod["metadata"].get("deletionGracePeriodSeconds")
    return float(grace) if grace is not None else termination_grace(pod["spec"])


def rfc3339(when: datetime) -> str:
    """A Kubernetes timestamp (seconds, UTC)."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's schedule, in (scaled) seconds from the container's start."""

    initial_delay: float
    period: float
    failure_threshold: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None, time_scale: float) -> Probe | None:
        """The probe a container spec declares (read as the operator reads it: ``ProbeSpec``), or ``None``."""
        probe = ProbeSpec.read(spec)
        if probe is None:
            return None
        return cls(initial_delay=probe.initial_delay * time_scale, period=probe.period * time_scale,
                   failure_threshold=probe.failure_threshold)

    def first_success(self, not_before: float) -> float:
        """When the first probe at or after ``not_before`` runs."""
        k = max(0, math.ceil((not_before - self.initial_delay) / self.period - 1e-9))
        return self.initial_delay + k * self.period

    def gives_up(self, after: float) -> float:
        """When the ``failureThreshold``-th consecutive failure happens for a
        probe that starts probing at ``after``."""
        return after + self.initial_delay + (self.failure_threshold - 1) * self.period


@dataclass(frozen=True, slots=True)
class Attempt:
    """One container run, in seconds from its start; ``None``: never."""

    started_after: float | None
    """``started`` turns true (the startup probe passed, or at once without one)."""
    serving_after: float | None
    """vLLM answers on its port."""
    ready_after: float | None
    exit_after: float | None
    exit_code: int
    killed_by: str | None
    """``"startup"`` or ``"liveness"`` when a probe made the kubelet kill it."""


def plan_attempt(container: dict[str, Any], serves_after: float | None, exits_after: float | None,
                 exit_code: int, time_scale: float) -> Attempt:
    """The kubelet's view of a run in which vLLM serves after ``serves_after``
    seconds, or exits with ``exit_code`` after ``exits_after`` (one of the two).

    Liveness probes start once the container counts as started; readiness
    probes too, and a container without a readiness probe is Ready as soon as
    it started, whether or not vLLM answers yet (as in a real cluster).
    """
    startup = Probe.from_spec(container.get("startupProbe"), time_scale)
    liveness = Probe.from_spec(container.get("livenessProbe"), time_scale)
    readiness = Probe.from_spec(container.get("readinessProbe"), time_scale)
    up = math.inf if serves_after is None else serves_after
    crash = math.inf if exits_after is None else exits_after
    killed_by, kill = None, math.inf
    if startup is not None:
        give_up = startup.gives_up(0.0)
        started = startup.first_success(up) if up <= give_up else math.inf
        if started == math.inf:
            killed_by, kill = "startup", give_up
    else:
        started = 0.0
        if liveness is not None and liveness.gives_up(started) < up:
            killed_by, kill = "liveness", liveness.gives_up(started)
    if crash <= kill:
        killed_by, kill = None, math.inf
    end = min(crash, kill)
    if readiness is None:
        ready = started
    else:
        ready = readiness.first_success(max(up, started)) if max(up, started) < math.inf else math.inf

    def before_end(t: float) -> float | None:
        return t if t < end else None

    return Attempt(
        started_after=before_end(started),
        serving_after=before_end(up),
        ready_after=before_end(ready),
        exit_after=None if end == math.inf else end,
        exit_code=PROBE_KILL_EXIT if killed_by else exit_code,
        killed_by=killed_by,
    )


def crash_backoff(consecutive_failures: int, time_scale: float) -> float:
    """Seconds the kubelet waits before restarting a container that failed
    ``consecutive_failures`` times in a row (at least once)."""
    return min(BACKOFF_INITIAL_S * 2 ** (consecutive_failures - 1), BACKOFF_MAX_S) * time_scale


def termination_message(container: dict[str, Any], log_tail: str) -> str:
    """What ``lastState.terminated.message`` says for a container whose log
    ends with ``log_tail`` and which wrote no termination-log file."""
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    lines = log_tail.splitlines()[-MESSAGE_MAX_LINES:]
    return "\n".join(lines).encode()[-MESSAGE_MAX_BYTES:].decode(errors="ignore")


def image_id(image: str) -> str:
    """A digest reference for an image, as the runtime reports the one it pulled."""
    name = image.split("@")[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return f"{name}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


@dataclass
class ContainerStatus:
    """One entry of ``status.containerStatuses``."""

    name: str
    image: str
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    last_state: dict[str, Any] = field(default_factory=dict)
    started: bool = False
    ready: bool = False
    container_id: str = ""

    def run(self, container_id: str, now: datetime) -> None:
        """A new container instance starts."""
        self.container_id = container_id
        self.state = {"running": {"startedAt": rfc3339(now)}}
        self.started = self.ready = False

    def exit(self, exit_code: int, message: str, now: datetime) -> dict[str, Any]:
        """The running instance exits; returns its ``terminated`` record."""
        started_at = self.state.get("running", {}).get("startedAt", rfc3339(now))
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": rfc3339(now),
            "containerID": self.container_id,
        }
        if message:
            terminated["message"] = message
        self.state = {"terminated": terminated}
        self.started = self.ready = False
        return terminated

    def back_off(self, terminated: dict[str, Any], delay: float, pod: str) -> None:
        """Waiting in CrashLoopBackOff after ``terminated``, for ``delay`` seconds."""
        self.last_state = {"terminated": terminated}
        self.state = {"waiting": {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {_duration(delay)} restarting failed container={self.name} pod={pod}",
        }}

    def to_api(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": image_id(self.image),
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


@dataclass
class PodStatus:
    """The status a kubelet keeps for one pod (``restartPolicy: Always``)."""

    host_ip: str
    pod_ip: str
    start_time: datetime
    containers: list[ContainerStatus]
    others: list[dict[str, Any]] = field(default_factory=list)
    """Conditions other components own (``PodScheduled``...), as last seen."""
    transitions: dict[str, tuple[bool, str]] = field(default_factory=dict)
    """Own condition type -> (status, lastTransitionTime)."""

    def render(self, now: datetime) -> dict[str, Any]:
        """The ``status`` to write now (a JSON merge patch replaces its lists
        whole, so it carries the other components' conditions too)."""
        unready = [c.name for c in self.containers if not c.ready]
        values = {
            "PodReadyToStartContainers": True,
            "Initialized": True,
            "ContainersReady": not unready,
            "Ready": not unready,
        }
        conditions = []
        for kind in OWN_CONDITIONS:
            status = values[kind]
            previous = self.transitions.get(kind)
            if previous is None or previous[0] != status:
                self.transitions[kind] = (status, rfc3339(now))
            condition: dict[str, Any] = {"type": kind, "status": str(status), "lastProbeTime": None,
                                         "lastTransitionTime": self.transitions[kind][1]}
            if not status:
                condition["reason"] = "ContainersNotReady"
                condition["message"] = f"containers with unready status: [{' '.join(unready)}]"
            conditions.append(condition)
        conditions += [c for c in self.others if c.get("type") not in OWN_CONDITIONS]
        return {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": rfc3339(self.start_time),
            "containerStatuses": [c.to_api() for c in self.containers],
        }


def _duration(seconds: float) -> str:
    """Go's ``time.Duration`` string, as the kubelet's back-off message shows it."""
    if seconds >= 60:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes}m{rest}s"
    return f"{seconds:g}s" if seconds >= 1 else f"{seconds * 1000:g}ms"
