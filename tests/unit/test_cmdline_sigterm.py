"""Whether the kubelet's SIGTERM reaches vLLM, read from the container's command, and checked against real shells.

A container's first process is PID 1 of its PID namespace, which ignores any signal it set no handler for. A shell
that runs vLLM as its child is that process, so the SIGTERM a stopping pod gets never reaches vLLM: its
``--shutdown-timeout`` never starts, and it serves until the SIGKILL at the end of the grace period. The real-shell
test runs each command as PID 1 of a new PID namespace (``unshare``), with a stub vllm that says whether a SIGTERM
reached it, and sends PID 1 the SIGTERM as the kubelet's runtime does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vllm_autotuner.knobs import CommandLine, EngineArgs

# Says it started, then waits: on SIGTERM it writes "got" and exits, on SIGUSR1 "ran" (the test's word that the
# SIGTERM did not come).
STUB_VLLM = ('#!/bin/sh\ntrap \'echo got > "$VLLM_OUT"; exit 0\' TERM\ntrap \'echo ran > "$VLLM_OUT"; exit 0\' USR1\n'
             'echo up > "$VLLM_UP"\nwhile :; do sleep 1 & wait $!; done\n')


def reaches(command: list[str]) -> bool | None:
    return CommandLine.parse({"name": "vllm", "command": command}).sigterm_reaches_vllm()


@pytest.mark.parametrize(("command", "expected"), [
    (["vllm", "serve", "M"], True),  # vLLM is the container's first process
    (["tini", "--", "vllm", "serve", "M"], True),  # behind an init that passes signals on
    (["/bin/sh", "-c", "exec vllm serve M --max-num-seqs 64"], True),
    (["/bin/sh", "-c", 'set -e; exec vllm serve "$@"', "--", "M"], True),
    (["bash", "-c", "VLLM_LOGGING_LEVEL=INFO exec vllm serve M"], True),
    (["bash", "-c", "vllm serve M --max-num-seqs 64"], True),  # bash runs a script of one command in its place
    (["dash", "-c", "vllm serve M"], False),  # dash forks for every command
    (["/bin/bash", "-c", "exec vllm serve M 2>&1 | tee /tmp/log"], False),  # a pipeline runs in children, exec or not
    (["/bin/sh", "-c", "vllm serve M &\nwait"], False),
    (["env", "A=1", "bash", "-c", "(vllm serve M)"], False),  # a subshell
    (["/bin/sh", "-c", "vllm serve M"], None),  # dash on Debian and Ubuntu, bash on Red Hat's images
    (["bash", "-c", "pip install x && vllm serve M"], None),  # bash 5.2 runs it in its place, older ones not
    (["tini", "--", "bash", "-c", "vllm serve M | tee log"], None),  # tini signals the shell alone
    (["/bin/sh", "-c", "exec python3 -m my_server"], None),  # no vllm the operator knows of
])
def test_whether_sigterm_reaches_vllm_is_read_from_the_command(command, expected):
    assert reaches(command) is expected


@pytest.mark.parametrize(("image", "script", "expected"), [
    ("vllm/vllm-openai:v0.11.0", "vllm serve M", False),  # vLLM's Kubernetes guide, on its Ubuntu image: dash
    ("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, "vllm serve M", False),
    ("mirror.example.com:5000/hub/vllm/vllm-openai:latest", "vllm serve M", False),  # a mirror path in front
    ("public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:latest", "vllm serve M", False),  # the guide's CPU image
    ("vllm/vllm-openai:latest", "exec vllm serve M", True),  # whatever the shell, exec puts vLLM in its place
    ("vllm/vllm-openai:latest", "vllm serve M | tee log", False),
    ("registry.example.com/acme/vllm:1.0", "vllm serve M", None),  # an image the operator does not know
    ("registry.example.com/acme/vllm/vllm-openai-custom:1", "vllm serve M", None),  # a different repository
])
def test_sh_is_read_as_the_shell_of_images_the_operator_knows(image, script, expected):
    container = {"name": "vllm", "image": image, "command": ["/bin/sh", "-c", script]}
    assert CommandLine.parse(container).sigterm_reaches_vllm() is expected


def test_engine_args_carry_it_with_the_knobs():
    assert EngineArgs.from_container({"command": ["dash", "-c", "vllm serve M --max-num-seqs 8"]}) \
        .sigterm_reaches_vllm is False
    assert EngineArgs.from_container({"args": ["M", "--max-num-seqs", "8"]}).sigterm_reaches_vllm is True


def _unshare_works() -> bool:
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run([unshare, "--fork", "--pid", "true"], capture_output=True,
                                                  check=False).returncode == 0


def _wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)
    return found


def _stub(pid: int) -> int:
    """The process id of the stub vllm among the descendants of ``pid``."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if b"/vllm\0serve" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
        with contextlib.suppress(LookupError):
            return _stub(int(child))
    raise LookupError(f"no stub vllm under process {pid}")


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root or user namespaces)")
@pytest.mark.skipif(shutil.which("dash") is None or shutil.which("bash") is None, reason="needs dash and bash")
@pytest.mark.parametrize("command", [
    ["vllm", "serve", "M"],
    ["dash", "-c", "exec vllm serve M"],
    ["bash", "-c", "vllm serve M --max-num-seqs 64"],
    ["dash", "-c", "vllm serve M --max-num-seqs 64"],
    ["bash", "-c", "exec vllm serve M 2>&1 | cat"],
    ["dash", "-c", "vllm serve M &\nwait"],
    ["bash", "-c", "(vllm serve M)"],
    ["env", "A=1", "bash", "-c", 'exec vllm serve "$@"', "--", "M"],
])
def test_as_the_first_process_of_a_pid_namespace_the_shell_does_what_the_operator_reads(command, tmp_path: Path):
    expected = reaches(command)
    assert expected is not None  # each form here has a definite reading
    stub = tmp_path / "vllm"
    stub.write_text(STUB_VLLM)
    stub.chmod(0o755)
    up, out = tmp_path / "up", tmp_path / "out"
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "VLLM_UP": str(up), "VLLM_OUT": str(out)}
    runner = subprocess.Popen(["unshare", "--fork", "--pid", *command], env=env, cwd=tmp_path)
    try:
        _wait_for(up.exists, 10, "stub vllm started")
        children = Path(f"/proc/{runner.pid}/task/{runner.pid}/children").read_text().split()
        (first,) = children  # PID 1 of the new namespace: the container's first process
        os.kill(int(first), signal.SIGTERM)  # from outside the namespace, as the container runtime sends it
        if not expected:  # the SIGTERM was dropped, or is on its way: the stub is told to say "ran" after it
            os.kill(_stub(runner.pid), signal.SIGUSR1)
        answer = _wait_for(lambda: out.exists() and out.read_text().strip(), 10, "answer from the stub")
        assert answer == ("got" if expected else "ran")
    finally:
        runner.kill()
        runner.wait(10)
