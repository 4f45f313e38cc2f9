"""Whether a rolling restart of the target loses the requests in flight on the pods it stops (pure).

Every change the operator makes is a rolling restart, and each old pod stops
as the kubelet stops it: the container's preStop hook runs, vLLM gets
SIGTERM, and whatever still runs at the end of the grace period is killed.
On SIGTERM vLLM aborts the requests in flight unless it was started with
``--shutdown-timeout`` (vllm-project/vllm#36666, first released in vLLM
0.18.0, March 2026; 0.17.1 does not know the flag and refuses it): then
it refuses new requests and serves those in flight for up to that long. A
preStop sleep gives the endpoints time to stop sending the pod requests
before that; the grace period must cover the sleep and the drain, or the
kubelet cuts the drain short. The SIGTERM goes to the container's first
process: a shell that runs vLLM as its child ignores it, and vLLM serves
on, its timeout never started, until the SIGKILL; behind an init, or in a
pod that shares its process namespace, the shell dies of it and vLLM is
killed at once; runuser and su pass it on and kill vLLM 2 s later
(``CommandLine.sigterm``, ``sigterm_fate``).
The operator reads the pod template to say,
with each change it makes, whether its restarts cost requests and what to
set so that they do not; the simulated kubelet reads the hooks the same way.
"""

from __future__ import annotations

import math
from typing import Any

from vllm_autotuner.knobs.cmdline import (
    SHELLS,
    WATCHER_ADVICE,
    WATCHER_KILL_SECONDS,
    CommandLineError,
    Sigterm,
    split_shell,
)
from vllm_autotuner.policy.guardrails import CUT_SHARE_WARNED, cut_share

DEFAULT_GRACE_S = 30
"""``terminationGracePeriodSeconds`` when the pod spec leaves it out."""
SHUTDOWN_TIMEOUT_SINCE = (0, 18)
"""The first vLLM release (major, minor) with ``--shutdown-timeout``: 0.18.0's wheel has it in
``vllm/engine/arg_utils.py``, 0.17.1's does not."""
SLEEP_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
"""Suffixes ``sleep`` takes on its operand."""


def termination_grace(pod_spec: dict[str, Any]) -> float:
    """Seconds from a pod's deletion to SIGKILL, as its spec sets them (``terminationGracePeriodSeconds``)."""
    return float(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))


def pre_stop_sleep(container: dict[str, Any]) -> float | None:
    """Seconds the container's preStop hook waits before the kubelet sends SIGTERM: the ``sleep`` action
    (``seconds``), or an ``exec`` of ``sleep N``, alone or as a shell's ``-c`` script, which may go on after it
    (``sleep 10 && curl ...``: what follows is taken as instant). 0 for no hook; None for any other one (an
    ``httpGet`` to a drain endpoint, a script), which may wait too, for a time the template does not say."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if not hook:
        return 0.0
    if "sleep" in hook:
        return float((hook["sleep"] or {}).get("seconds", 0))
    command = list((hook.get("exec") or {}).get("command") or [])
    if len(command) == 3 and command[0].rsplit("/", 1)[-1] in SHELLS and command[1] == "-c":
        command = _first_command(command[2])
    if len(command) == 2 and command[0].rsplit("/", 1)[-1] == "sleep":
        return _sleep_seconds(command[1])
    return None


def _first_command(script: str) -> list[str]:
    """The words of a shell script's first command, split as the operator splits vLLM's scripts
    (``knobs.cmdline.split_shell``), when the script waits for it (not one sent to the background); none when it
    cannot tell (a word that expands, or a script it cannot split)."""
    try:
        words = split_shell(script)
    except CommandLineError:
        return []
    first = []
    for text, _, operator, expands in words:
        if operator:
            return first if text != "&" else []
        if expands:
            return []
        first.append(text)
    return first


def _sleep_seconds(operand: str) -> float | None:
    """What ``sleep`` waits for its operand (coreutils' and busybox's: a number, with a unit suffix or not); None
    for one it refuses."""
    number, unit = (operand[:-1], SLEEP_UNITS[operand[-1]]) if operand[-1:] in SLEEP_UNITS else (operand, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def sigterm_fate(pod_spec: dict[str, Any], sigterm: Sigterm | None) -> Sigterm | None:
    """What the SIGTERM does to vLLM in a pod of this spec, from what it does by the container's command
    (``CommandLine.sigterm``). In a pod that shares its process namespace (``shareProcessNamespace``) the pause
    container is PID 1, not the container's shell: a shell that runs vLLM as its child (or ``conda run``, ``hatch
    run``) dies of the signal like any process without a handler, and the runtime kills what is left of a container
    without a PID namespace of its own when its first process ends (containerd, containerd/cri#983), vLLM with it,
    at once."""
    if sigterm is Sigterm.IGNORED and pod_spec.get("shareProcessNamespace"):
        return Sigterm.KILLS
    return sigterm


def drain_seconds(pod_spec: dict[str, Any], container: dict[str, Any], shutdown_timeout: int | None,
                  sigterm: Sigterm | None = Sigterm.REACHES) -> float | None:
    """How long a stopping pod of this template lets the requests in flight run before they are cut: vLLM's
    ``--shutdown-timeout`` (``EngineArgs.shutdown_timeout``, read with the knobs), as far as the grace period leaves
    it after the preStop sleep (a hook of a length not known counted as none: the drain is at most that); 0 when
    vLLM aborts them on SIGTERM (no ``--shutdown-timeout``), None when a ``--config`` file may set the timeout.
    Whatever its timeout (``sigterm``: ``EngineArgs.sigterm``, in the pod: ``sigterm_fate``), a vLLM whose shell
    (or ``conda run``, ``hatch run``) ignores the SIGTERM serves on until the kubelet's SIGKILL, all the grace
    period leaves, one killed with it drains for 0, and one under runuser or su for at most
    ``WATCHER_KILL_SECONDS``, whatever a ``--config`` file sets. The policy prices restarts with it
    (``status.drainSeconds``)."""
    grace_left = max(termination_grace(pod_spec) - (pre_stop_sleep(container) or 0.0), 0.0)
    sigterm = sigterm_fate(pod_spec, sigterm)
    if sigterm is Sigterm.IGNORED:
        return grace_left
    if sigterm is Sigterm.KILLS:
        return 0.0
    if sigterm is Sigterm.CUT_SHORT:
        grace_left = min(grace_left, WATCHER_KILL_SECONDS)
        return grace_left if shutdown_timeout is None else min(float(shutdown_timeout), grace_left)
    if shutdown_timeout is None:
        return None
    return min(float(shutdown_timeout), grace_left)


def drain_advice(pod_spec: dict[str, Any], container: dict[str, Any], shutdown_timeout: int | None,
                 version: tuple[int, int] | None = None, request_seconds: float = 0.0,
                 sigterm: Sigterm | None = Sigterm.REACHES) -> str | None:
    """What a restart of pods of this template does to the requests in flight, with what to change, when it loses
    or refuses some; None when the pods drain: vLLM gets the SIGTERM (``sigterm``, as ``drain_seconds``), a preStop
    sleep, ``--shutdown-timeout``, and a grace period that covers both. ``version``: the vLLM release the pods run
    (``knobs.parse_version``), when known; one older than ``SHUTDOWN_TIMEOUT_SINCE`` must be upgraded first, as it
    would refuse to start with the flag. ``request_seconds``: the mean time a request runs in a pod
    (``policy.guardrails.in_flight_seconds``; 0: not measured), against which a drain that would cut over
    ``CUT_SHARE_WARNED`` of them is too short."""
    sigterm = sigterm_fate(pod_spec, sigterm)
    told = [] if sigterm is Sigterm.REACHES else [_NO_SIGTERM[sigterm].format(grace=termination_grace(pod_spec))]
    told += _drain_problems(pod_spec, container, shutdown_timeout, version, request_seconds)
    return "; and ".join(told) or None


_CHILD = ("the container's shell, `conda run` or `hatch run` runs vLLM as its child (a shell in a pipeline, in the "
          "background, or as dash, the /bin/sh of Debian, Ubuntu and vLLM's own images, which runs any command in a "
          "child; conda and hatch always, from a shell of their own, and they pass no signal on)")
_PLACE = ("start it with `exec vllm serve ...` in the script, outside any pipeline or background{tee}, and not through "
          "`conda run` or `hatch run` (put the environment's bin directory first on PATH instead), so that the "
          "SIGTERM reaches it")
_NO_SIGTERM = {
    Sigterm.IGNORED: f"{_CHILD} and, as the container's first process, ignores the SIGTERM the kubelet sends: vLLM "
                     "never gets it, so no --shutdown-timeout starts, and it serves on until the kubelet kills it at "
                     "the end of terminationGracePeriodSeconds ({grace:g} s), cutting what still runs, each pod taking "
                     "that long to stop; " + _PLACE.format(tee=" (vLLM's own logging options rather than `| tee`)"),
    Sigterm.KILLS: f"{_CHILD} and is not the first process of a PID namespace of its own (an init, such as tini, "
                   "dumb-init or timeout, runs it, or the pod shares its process namespace): on the SIGTERM the "
                   "kubelet sends it dies, and vLLM with it at once, aborting every request in flight whatever its "
                   "--shutdown-timeout; " + _PLACE.format(tee=""),
    Sigterm.CUT_SHORT: f"vLLM runs under runuser or su, the container's first process: {WATCHER_ADVICE}",
    None: "vLLM runs in a shell script that may keep the shell as its parent: dash (Debian's and Ubuntu's /bin/sh) "
          "always does, bash does but for a script of that one command, and any shell for a pipeline or the "
          "background; the shell, the container's first process, then ignores the SIGTERM the kubelet sends, and "
          "vLLM serves on until the kubelet kills it at the end of terminationGracePeriodSeconds ({grace:g} s), "
          "whatever its --shutdown-timeout (behind an init, or in a pod that shares its process namespace, the "
          "shell dies of it instead, and vLLM is killed at once; `readlink -f /bin/sh` in the container says which "
          "shell sh is), and where the script traps the SIGTERM and kills vLLM with it, the script ends, and vLLM "
          "with it, unless it waits for vLLM a second time; start it with `exec vllm serve ...` in the script, "
          "outside any pipeline or background, so that the SIGTERM reaches it",
}
"""What to do about a vLLM the kubelet's SIGTERM does not reach (IGNORED), kills at once (KILLS), lets drain only
briefly (CUT_SHORT), or may not reach (None)."""


def _drain_problems(pod_spec: dict[str, Any], container: dict[str, Any], shutdown_timeout: int | None,
                    version: tuple[int, int] | None, request_seconds: float) -> list[str]:
    """``drain_advice``'s problems of a vLLM that gets the SIGTERM, each with what to change."""
    pause, grace = pre_stop_sleep(container), termination_grace(pod_spec)
    if shutdown_timeout is None:
        return ["vLLM reads a --config file, which may set --shutdown-timeout where the operator cannot read it, so "
                "it cannot tell whether a restarted pod lets the requests in flight finish, and prices restarts as if "
                "they did: put --shutdown-timeout=N on the command line (it takes precedence over the file), with a "
                "preStop sleep of a few seconds and terminationGracePeriodSeconds of at least the sleep plus N"]
    if shutdown_timeout == 0 and version is not None and version < SHUTDOWN_TIMEOUT_SINCE:
        major, minor = version
        return [f"each restarted pod's vLLM aborts the requests in flight on SIGTERM, and vLLM {major}.{minor} "
                f"has no --shutdown-timeout to let them finish (it refuses to start with the flag): upgrade to vLLM "
                f"0.18.0 or later, then start it with --shutdown-timeout=N, give the container a preStop sleep of a "
                f"few seconds, and terminationGracePeriodSeconds of at least the sleep plus N"]
    if shutdown_timeout == 0:
        return ["each restarted pod's vLLM aborts the requests in flight on SIGTERM (no --shutdown-timeout): start "
                "it with --shutdown-timeout=N (vLLM 0.18.0 and later) to let them finish, give the container a "
                "preStop sleep of a few seconds, and terminationGracePeriodSeconds of at least the sleep plus N"]
    told = []
    share = cut_share(float(shutdown_timeout), request_seconds)
    if grace < (pause or 0.0) + shutdown_timeout:
        told.append(f"terminationGracePeriodSeconds ({grace:g}) is less than {_hook(pause)} plus --shutdown-timeout "
                    f"({shutdown_timeout} s): the kubelet kills vLLM before the requests in flight finish; raise it to "
                    f"at least {_after(pause, shutdown_timeout)}")
    elif share is not None and share > CUT_SHARE_WARNED:
        enough = math.ceil(3 * request_seconds)  # cuts 5%
        told.append(f"--shutdown-timeout ({shutdown_timeout} s) is short beside the {request_seconds:.0f} s a request "
                    f"runs in these pods (the last window): each pod a restart stops would cut about {share:.0%} of "
                    f"the requests it runs; raise it to about {enough} s, three times that (about 5% cut), and "
                    f"terminationGracePeriodSeconds to at least {_after(pause, enough)}")
    if pause == 0:
        told.append("vLLM gets SIGTERM as soon as a pod is deleted, while the endpoints may still send it requests, "
                    "which it then refuses with 503: give the container a preStop sleep of a few seconds "
                    "(lifecycle.preStop.sleep.seconds, or an exec of sleep)")
    return told


def _hook(pause: float | None) -> str:
    """The preStop hook's wait, for the advice."""
    return "the preStop hook's own time (not known)" if pause is None else f"the preStop sleep ({pause:g} s)"


def _after(pause: float | None, seconds: float) -> str:
    """A grace period that covers the preStop hook's wait and then ``seconds``, for the advice."""
    return f"{seconds:g} plus the preStop hook's time" if pause is None else f"{pause + seconds:g}"
