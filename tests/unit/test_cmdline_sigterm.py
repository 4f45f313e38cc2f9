"""What the kubelet's SIGTERM does to vLLM, read from the container's command, and checked against real shells.

A container's first process is PID 1 of its PID namespace, which ignores any signal it set no handler for. A shell
that runs vLLM as its child is that process, so the SIGTERM a stopping pod gets never reaches vLLM: its
``--shutdown-timeout`` never starts, and it serves until the SIGKILL at the end of the grace period. Behind an init
(tini, dumb-init, catatonit) the shell is not PID 1: it dies of the signal, the init exits with it, and the kernel
kills the rest of the namespace, vLLM with it, at once. runuser and su stay vLLM's parent, pass the signal on and
kill it 2 s later; uv's ``uv run`` passes it on and waits. ``hatch run`` and ``conda run`` run vLLM from a shell of
their own and pass no signal on, so they act as such a shell; conda (26.7, installed from its source) is not in the
real-shell test, as PyPI has no current conda: as PID 1 it kept the SIGTERM from the stub, behind tini or dumb-init
the namespace ended at once, and under runuser the stub was killed 2.02 s after the SIGTERM without hearing of it.
The real-shell test runs each command as PID 1 of a new PID namespace (``unshare``), with a stub vllm that says
whether a SIGTERM reached it and that stays up until told to stop, and sends PID 1 the SIGTERM as the kubelet's
runtime does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_autotuner.knobs import WATCHER_KILL_SECONDS, CommandLine, EngineArgs, Sigterm

REACHES, IGNORED, KILLS, CUT_SHORT = Sigterm.REACHES, Sigterm.IGNORED, Sigterm.KILLS, Sigterm.CUT_SHORT
# Says it started, then waits: on SIGTERM it writes "got" and drains on; on SIGUSR1 (the test's word) it writes "ran"
# and exits. It never exits by itself.
STUB_VLLM = ('#!/bin/sh\ntrap \'echo got >> "$VLLM_OUT"\' TERM\ntrap \'echo ran >> "$VLLM_OUT"; exit 0\' USR1\n'
             'echo up > "$VLLM_UP"\nwhile :; do sleep 1 & wait $!; done\n')


def reading(command: list[str]) -> Sigterm | None:
    return CommandLine.parse({"name": "vllm", "command": command}).sigterm()


@pytest.mark.parametrize(("command", "expected"), [
    (["vllm", "serve", "M"], REACHES),  # vLLM is the container's first process
    (["tini", "--", "vllm", "serve", "M"], REACHES),  # behind an init that passes signals on
    (["/bin/sh", "-c", "exec vllm serve M --max-num-seqs 64"], REACHES),
    (["/bin/sh", "-c", 'set -e; exec vllm serve "$@"', "--", "M"], REACHES),
    (["bash", "-c", "VLLM_LOGGING_LEVEL=INFO exec vllm serve M"], REACHES),
    (["bash", "-c", "vllm serve M --max-num-seqs 64"], REACHES),  # bash runs a script of one command in its place
    (["tini", "--", "bash", "-c", "vllm serve M"], REACHES),
    (["dash", "-c", "vllm serve M"], IGNORED),  # dash forks for every command
    (["/bin/bash", "-c", "exec vllm serve M 2>&1 | tee /tmp/log"], IGNORED),  # a pipeline runs in children, exec or not
    (["/bin/sh", "-c", "vllm serve M &\nwait"], IGNORED),
    (["env", "A=1", "bash", "-c", "(vllm serve M)"], IGNORED),  # a subshell
    (["tini", "--", "dash", "-c", "vllm serve M"], KILLS),  # the shell dies of the signal tini passes, tini exits
    (["dumb-init", "bash", "-c", "vllm serve M | tee log"], KILLS),  # vLLM gets it too, but dies with the namespace
    (["timeout", "1d", "dash", "-c", "vllm serve M"], KILLS),
    (["/bin/sh", "-c", "vllm serve M"], None),  # dash on Debian and Ubuntu, bash on Red Hat's images
    (["bash", "-c", "pip install x && vllm serve M"], None),  # bash 5.2 runs it in its place, older ones not
    (["tini", "--", "sh", "-c", "vllm serve M"], None),  # dash: killed; bash: in its place
    (["/bin/sh", "-c", "exec python3 -m my_server"], None),  # no vllm the operator knows of
    # a trap passes the signal on: with one wait the script ends at once and vLLM with it, with two vLLM drains
    (["dash", "-c", "trap 'kill -TERM $c' TERM; vllm serve M & c=$!; wait $c"], None),
    (["bash", "-c", "trap 'kill $c' sigterm\nvllm serve M &\nc=$!\nwait $c; wait $c"], None),
    (["dash", "-c", "trap cleanup EXIT; vllm serve M & wait"], IGNORED),  # no trap on TERM
    (["dash", "-c", 'trap "" TERM; exec vllm serve M'], REACHES),  # exec'd: vLLM sets its own handler
    # exec within a compound command puts vLLM in the shell's place too, but not where that runs in a child
    (["sh", "-c", 'if [ -n "$X" ]; then exec vllm serve M; fi'], REACHES),
    (["sh", "-c", "{ exec vllm serve M; }"], REACHES),
    (["sh", "-c", "while :; do X=1 exec vllm serve M; done"], REACHES),
    (["dash", "-c", "{ exec vllm serve M; } | tee log"], IGNORED),
    (["sh", "-c", "if :; then exec vllm serve M; fi &\nwait"], None),
    # over several lines too: what holds vLLM's command is read from the words that open and close it, not its first
    (["sh", "-c", 'if [ "$ROLE" = leader ]; then\n  exec vllm serve M --max-num-seqs 8\nfi 2>&1 | tee /log'], None),
    (["sh", "-c", "{\n  exec vllm serve M --max-num-seqs 8\n} 2>&1 | tee /log"], None),
    (["sh", "-c", "(\n  exec vllm serve M --max-num-seqs 8\n) &\nwait"], None),
    (["sh", "-c", "f() {\n  exec vllm serve M --max-num-seqs 8\n}\nf 2>&1 | tee /log"], None),  # a function's body
    (["sh", "-c", "{\n  exec vllm serve M\n} &\nwait"], None),
    (["dash", "-c", "while :; do\n  exec vllm serve M\ndone | tee log"], IGNORED),
    (["sh", "-c", "if :; then\n  exec vllm serve M\nfi"], REACHES),  # held by no child
    (["sh", "-c", 'case "$R" in a) exec vllm serve M;; esac'], REACHES),  # a case pattern's ) is no subshell
    (["sh", "-c", 'case "$R" in (a|b) exec vllm serve M;; esac'], REACHES),
    (["dash", "-c", 'case "$R" in a) exec vllm serve M;; esac | tee log'], IGNORED),
    # the and-or list vLLM's command starts runs in the background as a whole where it ends in &: exec or not
    (["sh", "-c", "! exec vllm serve M --max-num-seqs 8 || exit 1 &\nwait"], IGNORED),
    (["dash", "-c", "! exec vllm serve M --max-num-seqs 8 || exit 1 &\nwait"], IGNORED),
    (["bash", "-c", "time exec vllm serve M --max-num-seqs 8 || exit 1 &\nwait"], IGNORED),
    (["dash", "-c", "exec vllm serve M > /log 2>&1 || echo failed &\n"
                    "until curl -sf localhost:8000/health; do sleep 1; done\nwait"], IGNORED),
    (["dash", "-c", "exec vllm serve M || { echo x; exit 1; } &\nwait"], IGNORED),
    (["dash", "-c", "exec vllm serve M ||\n  exit 1 &\nwait"], IGNORED),  # a newline after || goes on with it
    (["dash", "-c", "exec vllm serve M || exit 1\nsleep 1 &"], REACHES),  # another list in the background
    (["dash", "-c", "exec vllm serve M || (echo failed; exit 1) &\nwait"], IGNORED),  # a subshell in the list
    (["dash", "-c", "exec vllm serve M || ( exit 1 ) | cat &\nwait"], IGNORED),
    (["sh", "-c", "if true; then exec vllm serve M; fi || (echo failed; exit 1) &\nwait"], None),
    (["sh", "-c", "{ exec vllm serve M; } || (echo failed) &\nwait"], None),
    (["dash", "-c", "exec vllm serve M || (exit 1)\nsleep 1 &"], REACHES),
    # a pipeline, background or subshell elsewhere in the script (a sibling branch, a block closed before, a
    # function's ()) holds no compound command around vLLM's
    (["/bin/bash", "-c", 'if [ "$LWS_WORKER_INDEX" = 0 ]; then\n  ray start --head --port=6379 &\n'
                         '  exec vllm serve M --max-num-seqs 8 --tensor-parallel-size 8\nelse\n'
                         '  exec ray start --address=$LWS_LEADER_ADDRESS:6379 --block\nfi\n'], REACHES),
    (["sh", "-c", "f() {\n  exec vllm serve M --max-num-seqs 8\n}\nf"], REACHES),
    (["bash", "-c", "function f {\n  exec vllm serve M\n}\nf"], REACHES),
    (["sh", "-c", "echo a | cat\nif :; then\n  exec vllm serve M\nfi"], REACHES),
    (["sh", "-c", "(cd /app)\n{\n  exec vllm serve M\n}"], REACHES),
    # a compound command or function call in a pipeline, the background or a command substitution does
    (["sh", "-c", "echo | {\n  exec vllm serve M\n}"], None),
    (["sh", "-c", "true && {\n  exec vllm serve M\n} &\nwait"], None),
    (["sh", "-c", "{\n  exec vllm serve M\n} || exit 1 &\nwait"], None),
    (["sh", "-c", "f() {\n  exec vllm serve M\n}\nf &\nwait"], None),
    (["sh", "-c", "f() {\n  exec vllm serve M\n}\nlog=$(f)"], None),
    (["sh", "-c", "f() (\n  exec vllm serve M\n)\nf"], None),
    (["runuser", "-u", "vllm", "--", "vllm", "serve", "M"], CUT_SHORT),  # passes it on, kills vLLM 2 s later
    (["tini", "--", "/usr/sbin/runuser", "-u", "vllm", "--", "python3", "-m", "vllm.entrypoints.openai.api_server"],
     CUT_SHORT),
    (["bash", "-c", "runuser -u vllm -- vllm serve M"], CUT_SHORT),  # bash runs runuser in its place
    (["dash", "-c", "runuser -u vllm -- vllm serve M"], IGNORED),  # dash, PID 1, keeps the signal from runuser
    (["uv", "run", "vllm", "serve", "M"], REACHES),  # uv passes it on and waits
    (["vllm", "serve", "M", "--served-model-name", "su"], REACHES),  # su after vLLM is its argument
    # conda run starts vLLM from a shell script of its own and passes no signal on; conda 26.7 measured as PID 1
    (["conda", "run", "-n", "serve", "vllm", "serve", "M"], IGNORED),
    (["/opt/conda/bin/conda", "run", "--no-capture-output", "-p", "/env", "python3", "-m",
      "vllm.entrypoints.openai.api_server"], IGNORED),
    (["conda", "run", "-n", "serve", "/app/start.sh"], IGNORED),  # whatever it runs
    (["tini", "--", "conda", "run", "-n", "serve", "vllm", "serve", "M"], KILLS),  # conda dies, tini exits
    (["dumb-init", "conda", "run", "-n", "serve", "vllm", "serve", "M"], KILLS),  # vLLM gets it, dies 0.02 s later
    (["bash", "-c", "conda run -n serve vllm serve M"], IGNORED),  # bash runs conda in its place
    (["dash", "-c", "conda run -n serve vllm serve M"], IGNORED),
    (["tini", "--", "bash", "-c", "exec conda run -n serve vllm serve M"], KILLS),
    (["sh", "-c", "exec tini -- conda run -n serve vllm serve M"], KILLS),
    (["runuser", "-u", "vllm", "--", "conda", "run", "-n", "serve", "vllm", "serve", "M"], CUT_SHORT),  # 2.02 s
    (["bash", "-c", "conda activate serve; exec vllm serve M"], REACHES),  # activated: vLLM in bash's place
    # hatch runs it from a shell of its own too (hatch 1.18 measured); poetry 2.5 and pipenv 2026.10 run it in their
    # place, pdm 2.29 passes the signal on and waits (also behind tini)
    (["hatch", "run", "vllm", "serve", "M"], IGNORED),
    (["hatch", "-e", "prod", "--no-color", "run", "vllm", "serve", "M"], IGNORED),
    (["hatch", "-ve", "prod", "run", "vllm", "serve", "M"], IGNORED),  # -e's value last in a group of letters
    (["tini", "--", "hatch", "run", "vllm", "serve", "M"], KILLS),
    (["hatch", "-e", "run", "shell"], REACHES),  # -e's value is no run
    (["poetry", "run", "vllm", "serve", "M"], REACHES),
    (["pipenv", "run", "vllm", "serve", "M"], REACHES),
    (["pdm", "run", "vllm", "serve", "M"], REACHES),
    (["vllm", "serve", "M", "--served-model-name", "conda", "--tokenizer", "run"], REACHES),
])
def test_what_the_sigterm_does_to_vllm_is_read_from_the_command(command, expected):
    assert reading(command) is expected


@pytest.mark.parametrize(("image", "script", "expected"), [
    ("vllm/vllm-openai:v0.11.0", "vllm serve M", IGNORED),  # vLLM's Kubernetes guide, on its Ubuntu image: dash
    ("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, "vllm serve M", IGNORED),
    ("mirror.example.com:5000/hub/vllm/vllm-openai:latest", "vllm serve M", IGNORED),  # a mirror path in front
    ("public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:latest", "vllm serve M", IGNORED),  # the guide's CPU image
    ("vllm/vllm-openai:latest", "exec vllm serve M", REACHES),  # whatever the shell, exec puts vLLM in its place
    ("vllm/vllm-openai:latest", "vllm serve M | tee log", IGNORED),
    ("registry.redhat.io/rhaiis/vllm-cuda-rhel9:3.1.0", "vllm serve M", REACHES),  # UBI 9: sh is bash
    ("registry.redhat.io/rhaiis/vllm-cuda-rhel9:3.1.0", "vllm serve M | tee log", IGNORED),
    ("registry.redhat.io/rhaiis/vllm-cuda-rhel9:3.1.0", "pip install x && vllm serve M", None),  # bash 5.1: forks?
    # a pipeline in a block closed before vLLM's holds none of it
    ("vllm/vllm-openai:v0.11.0", 'set -e\nif [ -n "$HF_TOKEN" ]; then\n  echo "$HF_TOKEN" | huggingface-cli login '
     '--token-stdin\nfi\nif [ "$ROLE" = leader ]; then\n  exec vllm serve M --max-num-seqs 8\nfi\n', REACHES),
    ("registry.example.com/acme/vllm:1.0", "vllm serve M", None),  # an image the operator does not know
    ("registry.example.com/acme/vllm/vllm-openai-custom:1", "vllm serve M", None),  # a different repository
])
def test_sh_is_read_as_the_shell_of_images_the_operator_knows(image, script, expected):
    container = {"name": "vllm", "image": image, "command": ["/bin/sh", "-c", script]}
    assert CommandLine.parse(container).sigterm() is expected


def test_engine_args_carry_it_with_the_knobs():
    assert EngineArgs.from_container({"command": ["dash", "-c", "vllm serve M --max-num-seqs 8"]}).sigterm is IGNORED
    assert EngineArgs.from_container({"args": ["M", "--max-num-seqs", "8"]}).sigterm is REACHES


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


def _children(pid: int) -> list[str]:
    """The process ids of the children of ``pid``, whichever of its threads started them (uv's are many); none once
    it is gone."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return [child for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    return []


def _stub(pid: int) -> int:
    """The process id of the stub vllm among the descendants of ``pid`` (a child may end as it is read: a shell's
    short-lived helper)."""
    for child in _children(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if b"/vllm\0serve" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        with contextlib.suppress(LookupError):
            return _stub(int(child))
    raise LookupError(f"no stub vllm under process {pid}")


def _needs(*programs: str) -> pytest.MarkDecorator:
    missing = [p for p in programs if shutil.which(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


# uv and hatch come with the test dependencies, beside this Python; runuser is in /usr/sbin, off the stub's PATH
UV = shutil.which("uv", path=os.path.dirname(sys.executable)) or "uv"
HATCH = shutil.which("hatch", path=os.path.dirname(sys.executable)) or "hatch"
# A project hatch runs commands in, in an environment of its own that installs nothing
PROJECT = '[project]\nname = "serve"\nversion = "0"\n\n[tool.hatch.envs.default]\nskip-install = true\n'
RUNUSER = shutil.which("runuser") or "runuser"
SETPRIV = shutil.which("setpriv") or "setpriv"
_AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="runuser runs only as root, setpriv changes its uid as root")


def _observed(command: list[str], tmp_path: Path, ready: str = "up") -> Sigterm:
    """What the SIGTERM does to the stub vllm when ``command`` runs as PID 1 of a new PID namespace and PID 1 gets
    it from outside, as the container runtime sends it: REACHES when the stub got it and still drains
    ``2 * WATCHER_KILL_SECONDS`` later; CUT_SHORT when it got it and the namespace ended, not at once; KILLS when
    the namespace ended at once; IGNORED when the stub never got it and still runs. The signal goes once the file
    ``ready`` exists in ``tmp_path``: the stub writes ``up`` as it starts."""
    stub = tmp_path / "vllm"
    stub.write_text(STUB_VLLM)
    stub.chmod(0o755)
    up, out = tmp_path / "up", tmp_path / "out"
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "VLLM_UP": str(up), "VLLM_OUT": str(out),
           "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "HATCH_DATA_DIR": str(tmp_path / "hatch"),
           "HATCH_CACHE_DIR": str(tmp_path / "hatch-cache")}
    if HATCH in command:  # its environment made beforehand, as an image would hold it
        (tmp_path / "pyproject.toml").write_text(PROJECT)
        subprocess.run([HATCH, "env", "create"], env=env, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    runner = subprocess.Popen(["unshare", "--fork", "--pid", *command], env=env, cwd=tmp_path)
    first = None
    try:
        _wait_for(up.exists, 10, "stub vllm started")
        _wait_for((tmp_path / ready).exists, 10, f"{ready} written")
        stub_pid = _stub(runner.pid)
        (first,) = map(int, _children(runner.pid))  # PID 1 of the new namespace: the container's first process
        os.kill(first, signal.SIGTERM)
        sent = time.monotonic()
        while time.monotonic() < sent + 2 * WATCHER_KILL_SECONDS:  # a watcher kills it at 2.02 s
            if runner.poll() is not None:  # the stub never exits by itself: it was killed
                got = out.exists() and "got" in out.read_text()
                assert "ran" not in (out.read_text() if out.exists() else "")
                return CUT_SHORT if got and time.monotonic() - sent > WATCHER_KILL_SECONDS / 2 else KILLS
            time.sleep(0.05)
        os.kill(stub_pid, signal.SIGUSR1)  # still up: did the SIGTERM reach it?
        answer = _wait_for(lambda: out.exists() and "ran" in out.read_text() and out.read_text().split(), 10,
                           "answer from the stub")
        # timeout passes the signal to the child and to its process group too: "got" may come twice
        assert answer[-1] == "ran" and set(answer) <= {"got", "ran"}
        return REACHES if "got" in answer else IGNORED
    finally:
        if first is not None and runner.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGKILL)  # ends the namespace, whatever still runs in it
        runner.kill()
        runner.wait(10)


_PID_NAMESPACES = pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root or user namespaces)")


@_PID_NAMESPACES
@_needs("dash", "bash")
@pytest.mark.parametrize("command", [
    ["vllm", "serve", "M"],
    ["dash", "-c", "exec vllm serve M"],
    ["dash", "-c", 'if [ -n "$VLLM_UP" ]; then exec vllm serve M; fi'],
    ["dash", "-c", "{ exec vllm serve M; }"],
    ["dash", "-c", "{ exec vllm serve M; } | cat"],
    ["dash", "-c", "{\n  exec vllm serve M\n} | cat"],
    ["dash", "-c", 'if [ -n "$VLLM_UP" ]; then\n  exec vllm serve M\nfi &\nwait'],
    ["dash", "-c", 'case "$VLLM_UP" in (*/*) exec vllm serve M;; esac'],
    ["dash", "-c", "exec vllm serve M || exit 1 &\nwait"],
    ["bash", "-c", "exec vllm serve M || { echo x; exit 1; } &\nwait"],
    ["dash", "-c", 'if [ -n "$VLLM_UP" ]; then\n  true | cat &\n  exec vllm serve M\nelse\n  exit 1\nfi'],
    ["dash", "-c", "f() {\n  exec vllm serve M\n}\nf"],
    ["bash", "-c", "vllm serve M --max-num-seqs 64"],
    ["dash", "-c", "vllm serve M --max-num-seqs 64"],
    ["bash", "-c", "exec vllm serve M 2>&1 | cat"],
    ["dash", "-c", "vllm serve M &\nwait"],
    ["bash", "-c", "(vllm serve M)"],
    ["env", "A=1", "bash", "-c", 'exec vllm serve "$@"', "--", "M"],
    ["timeout", "1d", "dash", "-c", "vllm serve M"],
    ["timeout", "1d", "bash", "-c", "vllm serve M"],
    pytest.param(["tini", "--", "dash", "-c", "vllm serve M"], marks=_needs("tini")),
    pytest.param(["tini", "--", "bash", "-c", "vllm serve M | cat"], marks=_needs("tini")),
    pytest.param(["tini", "--", "dash", "-c", "exec vllm serve M"], marks=_needs("tini")),
    pytest.param(["dumb-init", "dash", "-c", "vllm serve M"], marks=_needs("dumb-init")),
    pytest.param(["catatonit", "--", "dash", "-c", "vllm serve M"], marks=_needs("catatonit")),
    pytest.param(["catatonit", "--", "bash", "-c", "exec vllm serve M"], marks=_needs("catatonit")),
    pytest.param(["dumb-init", "bash", "-c", "vllm serve M"], marks=_needs("dumb-init")),
    pytest.param([RUNUSER, "-u", "root", "--", "vllm", "serve", "M"], marks=[_needs(RUNUSER), _AS_ROOT]),
    pytest.param(["bash", "-c", f"{RUNUSER} -u root -- vllm serve M"], marks=[_needs(RUNUSER), _AS_ROOT]),
    pytest.param(["dash", "-c", f"{RUNUSER} -u root -- vllm serve M"], marks=[_needs(RUNUSER), _AS_ROOT]),
    pytest.param([UV, "run", "--no-project", "vllm", "serve", "M"], marks=_needs(UV)),
    pytest.param([HATCH, "run", "vllm", "serve", "M"], marks=_needs(HATCH)),
    pytest.param(["tini", "--", HATCH, "run", "vllm", "serve", "M"], marks=[_needs(HATCH), _needs("tini")]),
    # the user switch the advice for runuser suggests: it runs vLLM in its place
    pytest.param([SETPRIV, "--reuid=0", "--regid=0", "--clear-groups", "vllm", "serve", "M"],
                 marks=[_needs(SETPRIV), _AS_ROOT]),
])
def test_as_the_first_process_of_a_pid_namespace_the_shell_does_what_the_operator_reads(command, tmp_path: Path):
    expected = reading(command)
    assert expected is not None  # each form here has a definite reading
    assert _observed(command, tmp_path) is expected


@_PID_NAMESPACES
@_needs("dash")
@pytest.mark.parametrize(("script", "observed"), [
    ("trap 'kill -TERM $c' TERM; vllm serve M & c=$!; : > ready; wait $c", KILLS),  # it ends after the first wait
    ("trap 'kill -TERM $c' TERM; vllm serve M & c=$!; : > ready; wait $c; wait $c", REACHES),
])
def test_a_trap_that_passes_the_sigterm_on_does_what_its_waits_say_which_the_operator_does_not_read(
        script, observed, tmp_path: Path):
    assert reading(["dash", "-c", script]) is None
    assert _observed(["dash", "-c", script], tmp_path, ready="ready") is observed  # $c is set: the trap has a target
