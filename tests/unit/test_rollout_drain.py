"""What a rolling restart of the target does to the requests in flight, read from its pod template."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_autotuner.knobs import EngineArgs, Sigterm, parse_version
from vllm_autotuner.rollout.drain import drain_advice, drain_seconds, pre_stop_sleep, sigterm_fate, termination_grace


def vllm(*args: str, pre_stop: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "vllm", "command": ["vllm", "serve"], "args": ["m", *args]}
    if pre_stop is not None:
        container["lifecycle"] = {"preStop": pre_stop}
    return container


SLEEP_5 = {"sleep": {"seconds": 5}}
HTTP_HOOK = {"httpGet": {"path": "/drain", "port": 8000}}


def advice(spec: dict[str, Any], container: dict[str, Any]) -> str | None:
    """The advice for a template, its --shutdown-timeout read as the operator reads it, with the knobs."""
    return drain_advice(spec, container, EngineArgs.from_container(container).shutdown_timeout)


@pytest.mark.parametrize(("hook", "seconds"), [
    (None, 0.0),
    ({"sleep": {"seconds": 15}}, 15.0),  # the sleep action (Kubernetes 1.30 on)
    ({"exec": {"command": ["sleep", "5"]}}, 5.0),
    ({"exec": {"command": ["/bin/sleep", "2.5"]}}, 2.5),
    ({"exec": {"command": ["/bin/sh", "-c", "sleep 10"]}}, 10.0),
    ({"exec": {"command": ["sh", "-c", "sleep 10 && curl -X POST localhost:8000/pause"]}}, 10.0),  # then the rest
    ({"exec": {"command": ["bash", "-c", " sleep 3; kill -TERM 1"]}}, 3.0),
    ({"exec": {"command": ["sh", "-c", "sleep '4' # then SIGTERM"]}}, 4.0),  # split as vLLM's scripts are
    ({"exec": {"command": ["sh", "-c", "sleep 3 & curl localhost:8000/pause"]}}, None),  # in the background: no wait
    ({"exec": {"command": ["sh", "-c", "sleep $PAUSE"]}}, None),
    ({"exec": {"command": ["sleep", "1m"]}}, 60.0),  # coreutils' and busybox's unit suffixes
    ({"exec": {"command": ["sleep", "2.5s"]}}, 2.5),
    ({"exec": {"command": ["sleep", "forever"]}}, None),  # sleep refuses it: the hook fails at once, or so
    ({"exec": {"command": ["sleep", "-5"]}}, None),
    ({"exec": {"command": ["sh", "-c", "curl -X POST localhost:8000/pause && sleep 10"]}}, None),  # not known
    ({"exec": {"command": ["/drain.sh"]}}, None),
    ({"httpGet": {"path": "/drain", "port": 8000}}, None),  # a drain endpoint, which may wait
])
def test_a_pre_stop_sleep_is_read_from_the_sleep_action_or_an_exec_of_sleep(hook, seconds):
    assert pre_stop_sleep(vllm(pre_stop=hook)) == seconds


def test_the_grace_period_is_thirty_seconds_unless_the_spec_says():
    assert termination_grace({}) == 30 and termination_grace({"terminationGracePeriodSeconds": 90}) == 90


def test_a_template_whose_vllm_drains_within_the_grace_period_gets_no_advice():
    assert advice({"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout", "45", pre_stop=SLEEP_5)) is None
    assert advice({"terminationGracePeriodSeconds": 50}, vllm("--shutdown-timeout=45", pre_stop=SLEEP_5)) is None


@pytest.mark.parametrize(("spec", "container", "says"), [
    ({}, vllm(), "aborts the requests in flight on SIGTERM (no --shutdown-timeout)"),
    ({"terminationGracePeriodSeconds": 300}, vllm("--shutdown-timeout", "0", pre_stop=SLEEP_5), "--shutdown-timeout=N"),
    ({}, vllm("--shutdown-timeout", "45", pre_stop=SLEEP_5),
     "terminationGracePeriodSeconds (30) is less than the preStop sleep (5 s) plus --shutdown-timeout (45 s): the "
     "kubelet kills vLLM before the requests in flight finish; raise it to at least 50"),
    ({"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout", "45"), "refuses with 503: give the container "
                                                                               "a preStop sleep"),
])
def test_a_template_that_loses_or_refuses_requests_is_told_what_to_set(spec, container, says):
    told = advice(spec, container)
    assert told is not None and says in told


def test_a_drain_a_config_file_may_set_is_not_known_and_the_advice_says_to_put_it_on_the_command_line():
    container = vllm("--config", "serve.yaml", "--max-num-batched-tokens", "4096", "--max-num-seqs", "64",
                     "--enable-chunked-prefill", "-dp", "1", pre_stop=SLEEP_5)
    assert drain_seconds({"terminationGracePeriodSeconds": 60}, container,
                         EngineArgs.from_container(container).shutdown_timeout) is None
    told = advice({"terminationGracePeriodSeconds": 60}, container)
    assert told is not None and "may set --shutdown-timeout where the operator cannot read it" in told and (
        "put --shutdown-timeout=N on the command line") in told


def test_a_drain_short_beside_the_requests_is_told_how_long_they_run_and_what_to_raise_it_to():
    spec, container = {"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout=10", pre_stop=SLEEP_5)
    told = drain_advice(spec, container, 10, request_seconds=20.0)  # e^-0.5: 61% of the requests in flight cut
    assert told == ("--shutdown-timeout (10 s) is short beside the 20 s a request runs in these pods (the last "
                    "window): each pod a restart stops would cut about 61% of the requests it runs; raise it to about "
                    "60 s, three times that (about 5% cut), and terminationGracePeriodSeconds to at least 65")
    assert drain_advice(spec, container, 10, request_seconds=4.0) is None  # e^-2.5: 8% cut, under the 10% warned of
    assert drain_advice(spec, container, 10) is None  # no request measured: no word on it


@pytest.mark.parametrize(("image", "says"), [
    ("vllm/vllm-openai:v0.17.1", "vLLM 0.17 has no --shutdown-timeout to let them finish (it refuses to start with the "
                                 "flag): upgrade to vLLM 0.18.0 or later, then start it with --shutdown-timeout=N"),
    ("vllm/vllm-openai:v0.18.0", "(no --shutdown-timeout): start it with --shutdown-timeout=N (vLLM 0.18.0 and later)"),
    ("vllm/vllm-openai:latest", "(no --shutdown-timeout): start it with --shutdown-timeout=N (vLLM 0.18.0 and later)"),
])
def test_a_vllm_too_old_for_a_shutdown_timeout_is_told_to_upgrade_first(image, says):
    told = drain_advice({}, vllm(), 0, parse_version(image))
    assert told is not None and says in told and "preStop sleep" in told


@pytest.mark.parametrize(("spec", "container", "seconds"), [
    ({"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout=45", pre_stop=SLEEP_5), 45.0),  # all of it
    ({}, vllm("--shutdown-timeout", "45", pre_stop=SLEEP_5), 25.0),  # the kubelet kills at 30 s, 5 s slept first
    ({"terminationGracePeriodSeconds": 60}, vllm(pre_stop=SLEEP_5), 0.0),  # vLLM aborts on SIGTERM
    ({"terminationGracePeriodSeconds": 3}, vllm("--shutdown-timeout", "45", pre_stop=SLEEP_5), 0.0),  # slept out
    ({"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout=soon", pre_stop=SLEEP_5), 0.0),  # unreadable
    ({"terminationGracePeriodSeconds": 40}, vllm("--shutdown-timeout=45", pre_stop=HTTP_HOOK), 40.0),  # at most
])
def test_the_drain_is_the_shutdown_timeout_as_far_as_the_grace_period_leaves_it(spec, container, seconds):
    assert drain_seconds(spec, container, EngineArgs.from_container(container).shutdown_timeout) == seconds


def test_a_hook_of_a_length_not_known_is_not_told_to_sleep_and_the_grace_is_told_to_cover_it_too():
    container = vllm("--shutdown-timeout=45", pre_stop=HTTP_HOOK)
    assert advice({"terminationGracePeriodSeconds": 60}, container) is None  # it may wait as a sleep would
    told = advice({"terminationGracePeriodSeconds": 40}, container)
    assert told == ("terminationGracePeriodSeconds (40) is less than the preStop hook's own time (not known) plus "
                    "--shutdown-timeout (45 s): the kubelet kills vLLM before the requests in flight finish; raise it "
                    "to at least 45 plus the preStop hook's time")
    short = drain_advice({"terminationGracePeriodSeconds": 60}, container, 45, request_seconds=60.0)
    assert short is not None and short.endswith("terminationGracePeriodSeconds to at least 180 plus the preStop "
                                                "hook's time")


def test_a_short_drain_without_a_pre_stop_sleep_is_told_both():
    told = drain_advice({"terminationGracePeriodSeconds": 60}, vllm("--shutdown-timeout=10"), 10, request_seconds=20.0)
    assert told is not None
    short, sleep = told.split("; and ")
    assert short.startswith("--shutdown-timeout (10 s) is short beside the 20 s") and short.endswith(
        "terminationGracePeriodSeconds to at least 60")
    assert sleep.startswith("vLLM gets SIGTERM as soon as a pod is deleted") and "preStop sleep" in sleep
    grace = advice({}, vllm("--shutdown-timeout=45"))
    assert grace is not None and grace.startswith("terminationGracePeriodSeconds (30) is less than the preStop sleep "
                                                  "(0 s) plus --shutdown-timeout (45 s)") and "; and vLLM gets" in grace


#: How the advice for a vLLM that runs as the child of the container's first process begins.
CHILD = "the container's shell, `conda run` or `hatch run` runs vLLM as its child"


def shell(script: str, shell_name: str = "dash", pre_stop: dict[str, Any] | None = SLEEP_5) -> dict[str, Any]:
    """A container that runs vLLM through a shell's -c script."""
    return {**vllm(pre_stop=pre_stop), "command": [shell_name, "-c", script], "args": []}


def read(spec: dict[str, Any], container: dict[str, Any]) -> tuple[float | None, str | None]:
    """The drain and the advice, the command line read as the operator reads it, with the knobs."""
    args = EngineArgs.from_container(container)
    return (drain_seconds(spec, container, args.shutdown_timeout, args.sigterm),
            drain_advice(spec, container, args.shutdown_timeout, sigterm=args.sigterm))


def test_a_vllm_the_sigterm_does_not_reach_serves_until_the_sigkill_whatever_its_timeout_and_is_told_to_exec():
    spec = {"terminationGracePeriodSeconds": 60}
    drain, told = read(spec, shell("vllm serve M --shutdown-timeout 45 --max-num-seqs 64"))
    assert drain == 55.0  # not the 45 s it asks for: it never hears of the SIGTERM, and runs to the SIGKILL
    assert told is not None and told.startswith(CHILD) and (
        "terminationGracePeriodSeconds (60 s)" in told and "`exec vllm serve ...`" in told)
    assert "; and " not in told  # the rest drains: nothing else to say
    # the same flags behind exec: vLLM gets the SIGTERM, drains its 45 s, and nothing is wrong
    assert read(spec, shell("exec vllm serve M --shutdown-timeout 45 --max-num-seqs 64")) == (45.0, None)
    # without a timeout the drain is still the grace period's, and what it lacks once exec'd is said too
    drain, told = read(spec, shell("vllm serve M | tee /log", "bash", pre_stop=None))
    assert drain == 60.0 and told is not None
    first, then = told.split("; and ")
    assert first.startswith(CHILD) and then.startswith(
        "each restarted pod's vLLM aborts the requests in flight on SIGTERM (no --shutdown-timeout)")


def test_a_vllm_under_conda_run_serves_until_the_sigkill_and_is_told_to_run_it_from_path():
    spec = {"terminationGracePeriodSeconds": 60}
    container = {**vllm(pre_stop=SLEEP_5), "command": ["conda", "run", "--no-capture-output", "-n", "serve"],
                 "args": ["vllm", "serve", "M", "--shutdown-timeout", "45"]}
    drain, told = read(spec, container)
    assert drain == 55.0  # conda, PID 1, keeps the SIGTERM from vLLM: it serves on until the SIGKILL
    assert told is not None and "`conda run`" in told and "bin directory first on PATH" in told
    assert read(spec, {**container, "command": ["tini", "--", *container["command"]]})[0] == 0.0
    assert read({**spec, "shareProcessNamespace": True}, container)[0] == 0.0  # conda dies of it, vLLM with it
    on_path = {**container, "command": ["/opt/conda/envs/serve/bin/vllm"], "args": ["serve", "M",
                                                                                      "--shutdown-timeout", "45"]}
    assert read(spec, on_path) == (45.0, None)


def test_a_vllm_an_init_kills_with_its_shell_drains_for_nothing_whatever_its_timeout_and_is_told_to_exec():
    spec = {"terminationGracePeriodSeconds": 60}
    container = {**shell("vllm serve M --shutdown-timeout 45"), "command": ["tini", "--", "dash", "-c"],
                 "args": ["vllm serve M --shutdown-timeout 45"]}
    drain, told = read(spec, container)
    assert drain == 0.0  # the shell dies of the SIGTERM, tini exits, and the kernel kills vLLM with the namespace
    assert told is not None and told.startswith(CHILD) and (
        "an init, such as tini" in told and "`exec vllm serve ...`" in told and "; and " not in told)
    exec_d = {**container, "args": ["exec vllm serve M --shutdown-timeout 45"]}
    assert read(spec, exec_d) == (45.0, None)  # vLLM is tini's child, and tini passes the SIGTERM on


def test_a_vllm_under_runuser_drains_for_two_seconds_at_most_and_is_told_to_switch_user_otherwise():
    spec = {"terminationGracePeriodSeconds": 60}
    container = {**vllm(pre_stop=SLEEP_5), "args": [],
                 "command": ["runuser", "-u", "vllm", "--", "vllm", "serve", "M", "--shutdown-timeout=45"]}
    drain, told = read(spec, container)
    assert drain == 2.0  # runuser passes the SIGTERM on, and kills vLLM 2 s later
    assert told is not None and told.startswith("vLLM runs under runuser or su") and (
        "securityContext.runAsUser" in told and "; and " not in told)
    assert drain_seconds(spec, container, 1, Sigterm.CUT_SHORT) == 1.0  # a shorter timeout stands
    assert drain_seconds(spec, container, None, Sigterm.CUT_SHORT) == 2.0  # whatever a --config file says
    assert drain_seconds({"terminationGracePeriodSeconds": 6}, container, 45, Sigterm.CUT_SHORT) == 1.0  # 6 - 5 s
    setpriv = {**container, "command": ["setpriv", "--reuid=1000", "vllm", "serve", "M", "--shutdown-timeout=45"]}
    assert read(spec, setpriv) == (45.0, None)  # setpriv runs vLLM in its place


def test_in_a_pod_that_shares_its_process_namespace_the_shell_that_would_ignore_the_sigterm_dies_of_it():
    shared = {"terminationGracePeriodSeconds": 60, "shareProcessNamespace": True}
    drain, told = read(shared, shell("vllm serve M --shutdown-timeout 45"))  # dash: not PID 1, the pause is
    assert drain == 0.0 and told is not None and "the pod shares its process namespace" in told
    assert sigterm_fate(shared, Sigterm.IGNORED) is Sigterm.KILLS
    assert read(shared, shell("exec vllm serve M --shutdown-timeout 45")) == (45.0, None)
    assert sigterm_fate({"shareProcessNamespace": False}, Sigterm.IGNORED) is Sigterm.IGNORED
    assert sigterm_fate(shared, None) is None  # dash would die, bash would run vLLM in its place


def test_a_vllm_the_sigterm_may_not_reach_is_priced_as_its_flags_say_and_told_to_exec():
    spec = {"terminationGracePeriodSeconds": 60}
    drain, told = read(spec, shell("vllm serve M --shutdown-timeout 45", "sh"))  # dash or bash: the image says
    assert drain == 45.0
    assert told is not None and told.startswith("vLLM runs in a shell script that may keep the shell as its parent")
    assert "`readlink -f /bin/sh` in the container says which shell sh is" in told  # how to find out
    assert read(spec, shell("vllm serve M --shutdown-timeout 45", "bash")) == (45.0, None)  # bash runs it in its place
