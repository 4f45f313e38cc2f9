"""Reading and rewriting the knobs in every command-line form vLLM accepts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_autotuner.api import Knobs
from vllm_autotuner.knobs import (
    CommandLine,
    CommandLineError,
    EngineArgs,
    Hardware,
    Sigterm,
    find_vllm_container,
    set_knobs,
    vllm_defaults,
)
from vllm_autotuner.knobs.cmdline import split_shell

NEW = Knobs(max_num_batched_tokens=3072, max_num_seqs=96)


@pytest.mark.parametrize(
    ("container", "tokens", "seqs"),
    [
        ({"command": ["vllm", "serve", "M", "--max-num-batched-tokens", "8192", "--max-num-seqs", "64"]}, 8192, 64),
        ({"args": ["--model", "M", "--max-num-batched-tokens=4096", "--max-num-seqs=32"]}, 4096, 32),
        ({"args": ["--max_num_batched_tokens", "2048", "--max_num_seqs=16"]}, 2048, 16),
        ({"command": ["/bin/sh", "-c", "vllm serve M --max-num-seqs 64"]}, None, 64),
        (
            {"command": ["bash", "-c"], "args": ["exec vllm serve M --max-num-batched-tokens='1024' 2>&1 | tee /l"]},
            1024,
            None,
        ),
        ({"command": ["/usr/bin/env", "sh", "-ec", "vllm serve M --max_num_seqs=8 && echo done"]}, None, 8),
        (
            {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--max-num-seqs", "7"]},
            None,
            7,
        ),
        # argparse semantics: the last occurrence wins
        ({"args": ["--max-num-seqs", "1", "--max-num-seqs", "2"]}, None, 2),
        ({"args": ["--model", "M"]}, None, None),
    ],
)
def test_reads_every_spelling(container, tokens, seqs):
    args = EngineArgs.from_container(container)
    assert (args.max_num_batched_tokens, args.max_num_seqs) == (tokens, seqs)


@pytest.mark.parametrize(
    ("container", "model"),
    [
        ({"command": ["vllm", "serve", "org/m", "--max-num-seqs", "8"]}, "org/m"),
        ({"command": ["vllm", "serve", "org/m", "--model", "other"]}, "org/m"),  # vLLM prefers the positional
        ({"command": ["vllm", "serve", "--model", "org/m"]}, "org/m"),
        ({"args": ["org/m", "--max-num-seqs", "8"]}, "org/m"),  # the image's entrypoint is `vllm serve`
        ({"args": ["--model=org/m"]}, "org/m"),
        ({"command": ["sh", "-c", "exec vllm serve 'org/my m' --port 8000 | tee l"]}, "org/my m"),
        ({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "org/m"]}, "org/m"),
        ({"args": ["--max-num-seqs", "8"]}, None),
    ],
)
def test_reads_the_model(container, model):
    assert CommandLine.parse(container).model() == model


def test_write_changes_only_the_knob_tokens_in_a_shell_string():
    script = "pip list >/dev/null && exec vllm serve 'my model' --max-num-seqs=64 --port 8000 2>&1 | tee /log"
    out = set_knobs({"command": ["/bin/sh", "-c", script]}, NEW)
    assert out["command"][2] == (
        "pip list >/dev/null && exec vllm serve 'my model' --max-num-seqs=96 --port 8000"
        " --max-num-batched-tokens 3072 2>&1 | tee /log"
    )


def test_write_keeps_style_and_spelling_in_lists():
    out = set_knobs({"name": "vllm", "args": ["--max_num_seqs=5", "--model=M"]}, NEW)
    assert out == {"name": "vllm", "args": ["--max_num_seqs=96", "--model=M", "--max-num-batched-tokens=3072"]}


def test_write_rewrites_every_occurrence():
    out = set_knobs({"args": ["--max-num-seqs", "1", "--max-num-seqs", "2"]}, NEW)
    assert out["args"][:4] == ["--max-num-seqs", "96", "--max-num-seqs", "96"]


def test_boolean_flags_do_not_swallow_the_next_flag():
    c = {"args": ["--enable-chunked-prefill", "--max-num-seqs", "4", "--no-enable-prefix-caching"]}
    args = EngineArgs.from_container(c)
    assert args.max_num_seqs == 4 and args.chunked_prefill is True
    off = EngineArgs.from_container({"args": ["--no-enable-chunked-prefill", "--max-model-len", "4096"]})
    assert off.chunked_prefill is False


def test_a_boolean_flags_true_or_false_after_a_space_is_its_value():
    # older vLLM (StoreBoolean, nargs='?') took `--enable-chunked-prefill False`; with chunked prefill off, a
    # budget under max-model-len fails at start-up, so reading it as on would let the operator write one
    c = {"args": ["--enable-chunked-prefill", "False", "--max-model-len", "8192", "--max-num-seqs", "4"]}
    args = EngineArgs.from_container(c)
    assert args.chunked_prefill is False and args.max_model_len == 8192 and args.max_num_seqs == 4
    shell = CommandLine.parse({"command": ["sh", "-c", "vllm serve M --enable-chunked-prefill true --max-num-seqs 8"]})
    assert (shell.get_bool("enable-chunked-prefill"), shell.get_int("max-num-seqs"), shell.model()) == (True, 8, "M")


def test_one_dash_aliases_are_read_as_their_flags_and_take_no_other_flags_value():
    cmd = CommandLine.parse({"command": ["vllm", "serve", "M", "-tp", "2", "-dp=4", "--max-num-seqs", "8"]})
    assert (cmd.get_int("tensor-parallel-size"), cmd.get_int("data-parallel-size"), cmd.get_int("max-num-seqs")) == (
        2, 4, 8)
    assert [(f.spelling, f.value) for f in cmd.flags()] == [("-tp", "2"), ("-dp", "4"), ("--max-num-seqs", "8")]
    # a one-dash alias is a flag, not the value of the flag before it (argparse: "expected one argument")
    assert CommandLine.parse({"args": ["--served-model-name", "-dp", "2"]}).get("served-model-name").value is None


@pytest.mark.parametrize(
    "container",
    [
        {"command": ["vllm", "serve", "M", "--data-parallel-size", "2"]},
        {"args": ["--model=M", "--data_parallel_size=4", "--max-num-seqs=64"]},
        {"args": ["--model", "M", "-dp", "2"]},
        {"args": ["--model", "M", "-dp=8"]},
        {"command": ["/bin/sh", "-c", "exec vllm serve M -dp 2 --max-num-seqs 64 2>&1 | tee /log"]},
        {"args": ["--model", "M", "--data-parallel-size-local", "2"]},
        {"args": ["--model", "M", "-dp", "4", "-dpl", "1"]},  # ranks on other pods: still not one engine per pod
        {"args": ["--model", "M", "-dp", "1", "-dp", "2"]},  # argparse: the last occurrence wins
    ],
)
def test_a_data_parallel_engine_is_refused_saying_what_to_do(container):
    with pytest.raises(CommandLineError, match="run one engine per pod .* or tune this Deployment by hand"):
        EngineArgs.from_container(container)


@pytest.mark.parametrize(
    "args",
    [["-dp", "1"], ["--data-parallel-size=1"], ["--data-parallel-size-local", "1"], ["-dp", "2", "-dp", "1"]],
)
def test_data_parallel_size_1_is_one_engine_and_tunable(args):
    engine = EngineArgs.from_container({"args": ["--model", "M", *args, "--max-num-seqs", "64"]})
    assert engine.max_num_seqs == 64


def test_non_integer_value_is_a_clear_error():
    with pytest.raises(CommandLineError, match="--max-num-seqs has value '\\$SEQS'"):
        EngineArgs.from_container({"command": ["sh", "-c", "vllm serve M --max-num-seqs $SEQS"]})


@pytest.mark.parametrize(("text", "value"), [("8192", 8192), ("8k", 8000), ("8K", 8192), ("25.6k", 25600),
                                           ("32K", 32768), ("1M", 1048576), ("2.5K", None), ("8kb", None)])
def test_sizes_are_read_as_vllm_reads_them(text, value):
    container = {"args": ["--max-num-batched-tokens", text, "--max-model-len", text]}
    if value is None:
        with pytest.raises(CommandLineError, match="such as 8192, 8k or 8K"):
            EngineArgs.from_container(container)
    else:
        engine = EngineArgs.from_container(container)
        assert (engine.max_num_batched_tokens, engine.max_model_len) == (value, value)


@pytest.mark.parametrize(("args", "timeout"), [([], 0), (["--shutdown-timeout", "45"], 45), (["--shutdown-timeout=0"], 0),
                                              (["--shutdown-timeout", "soon"], 0), (["--shutdown-timeout=-5"], 0)])
def test_the_shutdown_timeout_is_read_with_the_knobs_and_an_unreadable_one_refuses_nothing(args, timeout):
    engine = EngineArgs.from_container({"args": ["--model", "M", *args, "--max-num-seqs", "64"]})
    assert (engine.shutdown_timeout, engine.max_num_seqs) == (timeout, 64)


@pytest.mark.parametrize("length", ["auto", "-1"])
def test_a_model_length_vllm_fits_to_memory_is_unknown(length):
    assert EngineArgs.from_container({"args": ["--max-model-len", length, "--max-num-seqs", "8"]}).max_model_len is None


def both_args(stated: list[str]) -> list[str]:
    return ["--config", "serve.yaml", *stated]


def test_knobs_left_to_a_config_file_cannot_be_known():
    with pytest.raises(CommandLineError, match="may set --max-num-batched-tokens, --max-num-seqs, .* where"):
        EngineArgs.from_container({"args": ["--config", "serve.yaml"]})
    stated = ["--max-num-batched-tokens", "4k", "--max-num-seqs", "64", "--enable-chunked-prefill", "-dp", "1"]
    both = EngineArgs.from_container({"args": both_args(stated)})
    defaults = vllm_defaults("0.11", Hardware(gpus=1, memory_gib=80))
    assert both.effective(defaults) == (Knobs(max_num_batched_tokens=4000, max_num_seqs=64), False)  # over the file
    assert (both.chunked_prefill, both.max_model_len) == (True, None)  # a length left to the file is unknown
    assert both.shutdown_timeout is None  # so is a drain the file may set, unless the command line says it
    assert EngineArgs.from_container({"args": [*both_args(stated), "--shutdown-timeout=30"]}).shutdown_timeout == 30
    off = ["--config", "serve.yaml", *stated[:4], "--no-enable-chunked-prefill", "-dp", "1"]
    with pytest.raises(CommandLineError, match="set --max-model-len on the command line"):  # then it is the floor
        EngineArgs.from_container({"args": off})


@pytest.mark.parametrize(
    "pooling", [["--runner", "pooling"], ["--convert=embed"], ["--convert", "classify"], ["--task", "embed"],
                ["--task", "score"]],
)
def test_a_pooling_model_must_say_whether_chunked_prefill_is_on(pooling):
    # vLLM turns chunked prefill off for a pooling model whose pooling does not support it, and then refuses a budget
    # below max_model_len: left to vLLM, the operator cannot know the budget's floor
    command = ["vllm", "serve", "BAAI/bge-m3", *pooling, "--max-model-len", "8192"]
    with pytest.raises(CommandLineError, match="runs a pooling model.*add --enable-chunked-prefill or "
                                               "--no-enable-chunked-prefill"):
        EngineArgs.from_container({"command": command})
    assert EngineArgs.from_container({"command": [*command, "--enable-chunked-prefill"]}).chunked_prefill is True
    assert EngineArgs.from_container({"command": [*command, "--no-enable-chunked-prefill"]}).chunked_prefill is False
    for generating in (["--runner", "generate"], ["--convert", "none"], ["--task", "generate"]):
        assert EngineArgs.from_container({"command": ["vllm", "serve", "M", *generating]}).chunked_prefill is None


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        ("--no-enable-chunked-prefill", "--enable-chunked-prefill or --no-enable-chunked-prefill"),
        ("-dp", "--data-parallel-size"),
    ],
)
def test_a_config_file_may_not_hold_what_the_start_up_rules_or_the_data_parallel_refusal_read(missing, said):
    # vLLM loads the file's keys as flags: chunked prefill off (a budget below max_model_len is refused) or a
    # data-parallel size there would be missed, so the command line must say them, as it must the knobs
    stated = ["--max-num-batched-tokens", "4096", "--max-num-seqs", "64", "--no-enable-chunked-prefill", "-dp", "1"]
    at = stated.index(missing)
    args = ["--config=/etc/vllm/serve.yaml", *stated[:at], *stated[at + (1 if missing.startswith("--") else 2):]]
    with pytest.raises(CommandLineError, match=f"which may set --[a-z-]+ where the operator cannot read it; put {said} "
                                               "on the command line"):
        EngineArgs.from_container({"args": args})


def test_unbalanced_quote_is_a_clear_error():
    with pytest.raises(CommandLineError, match="unbalanced"):
        CommandLine.parse({"command": ["sh", "-c", "vllm serve 'M --max-num-seqs 4"]})


def test_shell_tokenizer_spans_and_redirections():
    words = split_shell("a 'b c'\\ d 2>&1|e >/l f")
    # redirections pass nothing to the command, also between its arguments
    assert [(w, op) for w, _, op, _ in words] == [("a", False), ("b c d", False), ("|", True), ("e", False),
                                                  ("f", False)]
    assert words[1][1] == (2, 10)


def test_a_line_continuation_between_words_separates_them():
    # `\` + newline is removed before the shell splits words: between words it is no word of its own
    words = split_shell("vllm serve \\\n  org/model \\\n  --max-num-seqs \\\n  64 --max-num\\\n-batched-tokens 8")
    assert [w for w, *_ in words] == ["vllm", "serve", "org/model", "--max-num-seqs", "64", "--max-num-batched-tokens",
                                      "8"]


def test_shell_tokenizer_keeps_expansions_whole_and_skips_comments():
    script = 'x $(a ")" (b)) `c d` $((1+(2))) ${e:-"f g"} "$(h)\\"" # i ) j\nk'
    assert [(w, op, expands) for w, _, op, expands in split_shell(script)] == [
        ("x", False, False),
        ('$(a ")" (b))', False, True),
        ("`c d`", False, True),
        ("$((1+(2)))", False, True),
        ('${e:-"f g"}', False, True),
        ('$(h)"', False, True),
        ("\n", True, False),
        ("k", False, False),
    ]
    marked = [(w, expands) for w, _, _, expands in split_shell("""$A "$1x" '$B' \\$C $@ a$ "$" ${#x}""")]
    assert marked == [("$A", True), ("$1x", True), ("$B", False), ("$C", False), ("$@", True), ("a$", False),
                      ("$", False), ("${#x}", True)]


def test_find_container():
    pod = {
        "containers": [
            {"name": "proxy", "image": "envoy", "args": ["--port", "1"]},
            {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "M"]},
        ]
    }
    assert find_vllm_container(pod)["name"] == "engine"
    assert find_vllm_container(pod, "proxy")["name"] == "proxy"
    with pytest.raises(CommandLineError, match="containers: proxy, engine"):
        find_vllm_container(pod, "missing")
    with pytest.raises(CommandLineError, match="set spec.targetRef.container"):
        find_vllm_container({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]})


def test_defaults_table():
    h100 = vllm_defaults("v0.11.0", Hardware(gpus=1, memory_gib=80, product="NVIDIA-H100-80GB-HBM3"))
    assert (h100.knobs.max_num_batched_tokens, h100.knobs.max_num_seqs) == (8192, 1024)
    a100 = vllm_defaults("0.11.0", Hardware(gpus=1, memory_gib=80, product="NVIDIA-A100-SXM4-80GB"))
    assert (a100.knobs.max_num_batched_tokens, a100.knobs.max_num_seqs) == (2048, 256)
    assert "A100" in a100.table
    l40s = vllm_defaults("vllm/vllm-openai:v0.20.1", Hardware(gpus=1, memory_gib=48))
    assert (l40s.knobs.max_num_batched_tokens, l40s.knobs.max_num_seqs) == (2048, 256)
    cpu = vllm_defaults(None, Hardware(gpus=0))
    assert (cpu.knobs.max_num_batched_tokens, cpu.knobs.max_num_seqs) == (2048, 128)
    assert "version unknown" in cpu.table
    newer = vllm_defaults("v0.40.0", Hardware(gpus=1), performance_mode="throughput")
    assert (newer.knobs.max_num_batched_tokens, newer.knobs.max_num_seqs) == (16384, 2048)
    assert "newer than the newest table" in newer.table and "memory unknown" in newer.table


B200 = Hardware(gpus=1, memory_gib=178.4, product="NVIDIA-B200")
GB10 = Hardware(gpus=1, memory_gib=119.7, product="NVIDIA-GB10")
H200 = Hardware(gpus=1, memory_gib=139.8, product="NVIDIA-H200")


@pytest.mark.parametrize(("version", "hardware", "expected"), [
    ("v0.27.1", B200, (8192, 1024)),  # no >= 160 GiB tier before 0.28
    ("v0.28.0", B200, (16384, 1024)),
    ("v0.34.0", B200, (16384, 1024)),
    (None, B200, (16384, 1024)),  # version unknown: the newest table
    ("v0.34.0", H200, (8192, 1024)),
    ("v0.32.0", GB10, (8192, 1024)),  # a GB10 keeps the small tier from 0.33
    ("v0.33.0", GB10, (2048, 256)),
    ("v0.33.0", Hardware(gpus=1, memory_gib=173.2, product="NVIDIA-GB200"), (16384, 1024)),
])
def test_defaults_by_release_and_gpu(version: str | None, hardware: Hardware, expected: tuple[int, int]) -> None:
    defaults = vllm_defaults(version, hardware)
    assert (defaults.knobs.max_num_batched_tokens, defaults.knobs.max_num_seqs) == expected, defaults.table
    assert f"{expected[0]} tokens / {expected[1]} seqs" in defaults.table


def test_effective_knobs_fill_absent_flags_from_defaults():
    defaults = vllm_defaults("0.11", Hardware(gpus=1, memory_gib=80))
    knobs, from_defaults = EngineArgs.from_container({"args": ["--max-num-seqs", "64"]}).effective(defaults)
    assert (knobs.max_num_batched_tokens, knobs.max_num_seqs, from_defaults) == (8192, 64, True)


# --- property-based: any container form, any spelling --------------------------------------------

flag_names = st.sampled_from(["--port", "--dtype", "--gpu-memory-utilization", "--served-model-name", "--host"])
values = st.from_regex(r"[a-z0-9.]{1,8}", fullmatch=True)
other_flags = st.lists(st.tuples(flag_names, values), max_size=4)
knob_value = st.integers(min_value=1, max_value=65536)


@st.composite
def containers(draw):
    """A container in one of the forms vLLM is started with, and the knob values it sets."""
    tokens = draw(st.none() | knob_value)
    seqs = draw(st.none() | knob_value)
    words: list[str] = []
    for name, value in draw(other_flags):
        words += [f"{name}={value}"] if draw(st.booleans()) else [name, value]
    for name, value in (("max-num-batched-tokens", tokens), ("max-num-seqs", seqs)):
        if value is None:
            continue
        spelled = "--" + (name.replace("-", "_") if draw(st.booleans()) else name)
        pos = draw(st.integers(min_value=0, max_value=len(words)))
        # insert between flags, never between a flag and its value
        while pos < len(words) and not words[pos].startswith("--"):
            pos += 1
        words[pos:pos] = [f"{spelled}={value}"] if draw(st.booleans()) else [spelled, str(value)]
    form = draw(st.sampled_from(["args", "command", "shell", "shell-args"]))
    head = ["vllm", "serve", "org/model"]
    if form == "args":
        container = {"args": words}
    elif form == "command":
        container = {"command": head + words}
    else:
        script = shlex.join(head + words) + draw(st.sampled_from(["", " 2>&1 | tee /tmp/log", " ; echo bye", " # $(x"]))
        shells = [["/bin/sh", "-c"], ["bash", "-c"], ["tini", "--", "bash", "-o", "pipefail", "-c"]]
        shell = draw(st.sampled_from(shells))
        container = {"command": [*shell, script]} if form == "shell" else {"command": shell, "args": [script]}
    return container, tokens, seqs


@settings(max_examples=300, deadline=None)
@given(containers(), knob_value, knob_value)
def test_read_write_roundtrip_changes_nothing_else(case, new_tokens, new_seqs):
    container, tokens, seqs = case
    args = EngineArgs.from_container(container)
    assert (args.max_num_batched_tokens, args.max_num_seqs) == (tokens, seqs)

    new = Knobs.model_construct(max_num_batched_tokens=new_tokens, max_num_seqs=new_seqs)
    out = set_knobs(container, new)
    again = EngineArgs.from_container(out)
    assert (again.max_num_batched_tokens, again.max_num_seqs) == (new_tokens, new_seqs)

    # every other flag keeps its value, and nothing but the knob tokens changed
    def others(c):
        return [
            (f.name, f.value)
            for f in CommandLine.parse(c).flags()
            if f.name not in ("max-num-batched-tokens", "max-num-seqs")
        ]

    assert others(out) == others(container)
    assert set(out) == set(container)
    # idempotent: writing the same values again is a no-op
    assert set_knobs(out, new) == out
    # writing the current values back restores a container that set both flags exactly
    if tokens is not None and seqs is not None:
        assert set_knobs(out, Knobs.model_construct(max_num_batched_tokens=tokens, max_num_seqs=seqs)) == container


# --- shell forms, checked against a real shell ---------------------------------------------------

STUB_VLLM = '#!/bin/sh\nprintf "%s\\0" "$@" > "$VLLM_ARGV"\n'
# Runs the command after its options, as tini and dumb-init do.
STUB_INIT = '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do [ "$1" = -- ] && { shift; break; }; shift; done\nexec "$@"\n'


@pytest.fixture
def shell_run(tmp_path):
    """Run a container's command and args with a stub vllm on PATH; the argv vLLM received (None: not started)."""
    for name, text in (("vllm", STUB_VLLM), ("tini", STUB_INIT), ("dumb-init", STUB_INIT)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    received = tmp_path / "argv"

    def run(container):
        received.unlink(missing_ok=True)
        env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "VLLM_ARGV": str(received)}
        subprocess.run([*container.get("command", []), *container.get("args", [])], env=env, cwd=tmp_path,
                       capture_output=True, timeout=30, check=False)
        return received.read_text().split("\0")[:-1] if received.exists() else None

    return run


def knob_flags(argv):
    """The knob flags in a list-form argv, in order, as (name, value)."""
    return [(f.name, f.value) for f in CommandLine.parse({"args": argv}).flags()
            if f.name in ("max-num-batched-tokens", "max-num-seqs")]


@pytest.mark.skipif(shutil.which("bash") is None or not os.path.exists("/bin/sh"), reason="needs /bin/sh and bash")
@pytest.mark.parametrize(
    ("container", "seqs"),
    [
        # Kubernetes' $(VAR), left as it is when VAR is undefined: the shell's command substitution
        ({"command": ["/bin/sh", "-c"], "args": ["vllm serve M -tp $(TP_SIZE) --max-num-seqs 64 2>&1 | tee log"]}, 64),
        ({"command": ["/bin/sh", "-c", "vllm serve M --max-num-seqs 64 -tp $(echo 'a )' | wc -l)"]}, 64),
        ({"command": ["/bin/sh", "-c", "vllm serve M --max-num-seqs 64 -tp $(( (1+1)/2 )) --port `echo 80`"]}, 64),
        ({"command": ["/bin/bash", "-o", "pipefail", "-c", "vllm serve M --max-num-seqs 64 2>&1 | tee log"]}, 64),
        ({"command": ["bash", "-eo", "pipefail", "+O", "extglob", "-c", "vllm serve M --max-num-seqs=64 | tee l"]}, 64),
        ({"command": ["/bin/sh", "-c", "--", "vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["tini", "--", "/bin/sh", "-c", "vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["dumb-init", "--single-child", "bash", "-c", "exec vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["env", "-u", "HOME", "A=1", "/bin/sh", "-ec"], "args": ["vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["taskset", "-c", "0", "/bin/sh", "-c", "vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["timeout", "-k", "5", "1h", "stdbuf", "-o", "L", "nice", "-n", "5", "/bin/sh", "-c",
                      "vllm serve M --max-num-seqs 64"]}, 64),
        ({"command": ["/bin/sh", "-c", "vllm serve M --max-model-len 8192  # serves M\n"]}, None),
        ({"command": ["/bin/sh", "-c", "vllm serve M >log 2>&1 --max-num-seqs 64"]}, 64),  # flags after a redirection
        # line continuations, between words and between a flag and its value
        ({"command": ["/bin/sh", "-c", "vllm serve \\\n  M \\\n  --max-num-seqs 64"]}, 64),
        ({"command": ["/bin/sh", "-c", "vllm serve M \\\n  --max-num-batched-tokens \\\n    8192 \\\n"
                                       "  --max-num-seqs \\\n  64"]}, 64),
        ({"command": ["/bin/sh", "-c", 'vllm serve M --override-generation-config "{\\"t\\": 1}" --max-num-seqs 64']},
         64),
        # arguments the script passes on as "$@" ($0 is the word after the script)
        ({"command": ["/bin/sh", "-c", 'set -e; exec vllm serve "$@"', "--"], "args": ["M", "--max-num-seqs", "64"]},
         64),
        ({"command": ["/bin/sh", "-c", 'vllm serve "$@" | tee log', "sh", "M"]}, None),
        ({"command": ["/bin/sh", "-c", 'exec "$@"', "sh", "vllm", "serve", "M", "--max-num-seqs=64"]}, 64),
    ],
)
def test_shell_forms_vllm_gets_what_the_operator_reads_and_writes(shell_run, container, seqs):
    received = shell_run(container)
    assert received is not None and received[:2] == ["serve", "M"]
    assert EngineArgs.from_container(container).max_num_seqs == seqs == EngineArgs.from_container(
        {"args": received}).max_num_seqs

    out = set_knobs(container, NEW)
    new = EngineArgs.from_container(out)
    assert (new.max_num_batched_tokens, new.max_num_seqs) == (3072, 96)
    received = shell_run(out)
    assert received is not None and received[:2] == ["serve", "M"]
    # each knob once, with the new value: nothing written where vLLM does not get it, no old value left
    assert sorted(knob_flags(received)) == [("max-num-batched-tokens", "3072"), ("max-num-seqs", "96")]


@pytest.mark.parametrize(
    "wrapper",
    [["numactl", "--cpunodebind", "0", "--membind=0"], ["numactl", "-N", "1", "-m", "1", "--"],
     ["numactl", "-l", "-C", "0-15"], ["taskset", "-c", "0-15"], ["taskset", "ff"],
     ["tini", "--", "numactl", "-i", "all", "taskset", "0x3"],
     ["/usr/local/bin/gosu", "vllm:vllm"], ["su-exec", "1000"], ["catatonit", "-g", "--", "setsid", "-w"],
     ["nohup", "nice", "-10"], ["nice", "--adjustment", "5"], ["ionice", "-c", "2", "-n", "7", "nice", "-n", "-5"],
     ["chrt", "-f", "10"], ["chrt", "-d", "-T", "100000", "-P", "1000000", "0"], ["stdbuf", "-oL", "-e", "0"],
     ["stdbuf", "--output", "L"], ["timeout", "--signal", "INT", "-v", "24h"]],
)
def test_a_shell_under_a_known_wrapper_is_read(wrapper):
    container = {"command": [*wrapper, "bash", "-c", "exec vllm serve M --max-num-seqs 64 $(EXTRA_FLAG_VALUE)"]}
    with pytest.raises(CommandLineError, match="write the flags literally"):  # the script is read: an expansion
        EngineArgs.from_container(container)
    container["command"][-1] = "exec vllm serve M --max-num-seqs 64 2>&1 | tee log"
    assert EngineArgs.from_container(container).max_num_seqs == 64
    assert set_knobs(container, NEW)["command"] == [
        *wrapper, "bash", "-c", "exec vllm serve M --max-num-seqs 96 --max-num-batched-tokens 3072 2>&1 | tee log"]


@pytest.mark.parametrize(
    ("command", "written"),
    [
        (["/bin/sh", "-c", "vllm serve M -tp $(TP_SIZE) --max-num-seqs 64 | tee log"],
         "vllm serve M -tp $(TP_SIZE) --max-num-seqs 96 --max-num-batched-tokens 3072 | tee log"),
        (["/bin/sh", "-c", "vllm serve M --max-num-seqs 64 # (tuned)\necho done"],
         "vllm serve M --max-num-seqs 96 --max-num-batched-tokens 3072 # (tuned)\necho done"),
        (["/bin/sh", "-c", "vllm serve M 2>&1 >log --max-num-seqs 64 && echo done"],
         "vllm serve M 2>&1 >log --max-num-seqs 96 --max-num-batched-tokens 3072 && echo done"),
    ],
)
def test_shell_rewrite_changes_only_the_knob_tokens(command, written):
    assert set_knobs({"command": command}, NEW)["command"] == [*command[:-1], written]


def test_arguments_passed_on_as_dollar_at_are_rewritten_where_they_are():
    container = {"command": ["sh", "-c", 'exec vllm serve "$@" 2>&1 | tee log', "--"],
                 "args": ["M", "--max-num-seqs", "64"]}
    assert set_knobs(container, NEW) == {
        "command": container["command"], "args": ["M", "--max-num-seqs", "96", "--max-num-batched-tokens", "3072"]}
    assert CommandLine.parse(container).model() == "M"


@pytest.mark.parametrize(
    ("command", "match"),
    [
        (["sh", "-c", "vllm serve M -tp $(case $G in a) echo 2;; esac) --max-num-seqs 64"], "case statement"),
        (["sh", "-c", "vllm serve M -tp $(nproc --max-num-seqs 64"], "unclosed \\$\\("),
        (["sh", "-c", "vllm serve M -tp `nproc --max-num-seqs 64"], "unclosed `"),
        (["sh", "-c", "cat >/c <<EOF\nvllm serve X\nEOF\nvllm serve M --max-num-seqs 64"], "here-document"),
        (["bash", "-c", "vllm serve M --max-num-seqs 64 > >(tee log)"], "no file or descriptor"),
        (["runuser", "-u", "vllm", "--", "bash", "-c", "vllm serve M --max-num-seqs 64"],
         "runs under runuser.*kill it 2 s after the SIGTERM"),
        # su's and runuser's own -c: flags added after it would reach su, not vLLM
        (["su", "vllm", "-c", "vllm serve M --max-num-seqs 64"], "su runs its own -c script.*runAsUser"),
        (["/usr/sbin/runuser", "-l", "vllm", "-s", "/bin/sh", "-c", "vllm serve M"], "runuser runs its own -c"),
        (["su", "-lc", "vllm serve M --max-num-seqs 64", "vllm"], "su runs its own -c"),
        (["su", "--command=vllm serve M --max-num-seqs 64", "vllm"], "su runs its own -c"),
        (["dash", "-c", "pip install x; exec su vllm -c 'vllm serve M --max-num-seqs 64'"], "su runs its own -c"),
        (["sh", "-o", "pipefail", "-c"], "no command string"),
        (["sh", "-c", "exec vllm serve $1 --max-num-seqs 64", "sh", "M"], "uses its arguments as \\$1"),
        (["sh", "-c", 'shift; exec vllm serve "$@"', "sh", "x", "M"], "changes its arguments \\(shift\\)"),
        (["sh", "-c", 'set -- "$@" --max-num-seqs 8; exec vllm serve "$@"', "sh", "M"], "changes its arguments"),
        (["sh", "-c", "exec vllm serve $@", "sh", "my model", "--max-num-seqs", "8"], 'write "\\$@"'),
        # "$@" is what set -- leaves, also where the container passes no args: vLLM gets 8, the last
        (["sh", "-c", 'set -- --max-num-seqs 8\nexec vllm serve M --max-num-seqs 64 "$@"'],
         "changes its arguments \\(set\\)"),
        # within a function "$@" is the function's arguments
        (["sh", "-c", 'serve() { exec vllm serve M --max-num-seqs 64 "$@"; }\nserve --max-num-seqs 8'],
         "within function serve"),
        (["bash", "-c", 'function run { vllm serve "$@"; }; run M --max-num-seqs 8', "sh", "--max-num-seqs", "64"],
         "within function run"),
        (["sh", "-c", 'run() (\n exec vllm serve M "$@"\n); run --max-num-seqs 8'], "within function run"),
    ],
)
def test_forms_that_cannot_be_read_with_certainty_are_refused(command, match):
    with pytest.raises(CommandLineError, match=match):
        EngineArgs.from_container({"command": command})
    with pytest.raises(CommandLineError, match=match):
        set_knobs({"command": command}, NEW)


@pytest.mark.parametrize(
    "script",
    [
        "vllm serve M --max-num-seqs 64 || vllm serve M --max-num-seqs 64 --enforce-eager",
        "if [ -n \"$LORA\" ]; then exec vllm serve M --enable-lora --max-num-seqs 16; else exec vllm serve M; fi",
        "vllm serve M --max-num-seqs 64 & sleep 5; python3 -m vllm.entrypoints.openai.api_server --model N",
    ],
)
def test_a_script_that_runs_vllm_in_several_commands_is_refused(script):
    # the operator would read and rewrite the first command only, whichever one vLLM runs as
    container = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "command": ["sh", "-c", script]}
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match="runs vLLM in 2 commands .*start vLLM from a single command"):
            read(container)
    assert find_vllm_container({"containers": [container]}) is container  # found, then refused with this message


def test_a_function_that_does_not_pass_on_its_arguments_leaves_the_script_readable():
    script = 'banner() { echo starting; }\nbanner; exec vllm serve "$@"'
    args = EngineArgs.from_container({"command": ["sh", "-c", script, "--", "M", "--max-num-seqs", "64"]})
    assert args.max_num_seqs == 64


@pytest.mark.parametrize("passed", [[], ["x", "--max-num-seqs", "64"]])
def test_a_function_of_its_own_that_passes_on_its_arguments_leaves_the_vllm_command_readable(passed):
    # the logging function's "$@" holds what it is called with; vLLM's command is outside it
    script = 'log() { echo "$@" >&2; }; log start; exec vllm serve M ' + ('"$@"' if passed else "--max-num-seqs 64")
    container = {"command": ["bash", "-c", script, *passed]}
    assert EngineArgs.from_container(container).max_num_seqs == 64
    assert set_knobs(container, NEW)["command"][2:] == (
        [script, "x", "--max-num-seqs", "96", "--max-num-batched-tokens", "3072"] if passed else
        [script.replace("64", "96 --max-num-batched-tokens 3072")])


def test_a_dash_c_after_the_command_or_a_shell_given_with_dash_s_is_no_user_switch_script():
    # after --, -c is vLLM's operand, not runuser's option; -s takes a shell, not a script
    args = EngineArgs.from_container({"command": ["runuser", "-u", "vllm", "--", "vllm", "serve", "M", "-c", "x",
                                                  "--max-num-seqs", "64"]})
    assert args.max_num_seqs == 64
    assert EngineArgs.from_container({"command": ["su", "-s", "/bin/bash", "vllm"]}).max_num_seqs is None


def test_an_unreadable_sidecar_does_not_hide_the_vllm_container():
    init = {"name": "writer", "image": "busybox", "command": ["sh", "-c", "cat >/cfg <<EOF\nit's: 1\nEOF"]}
    engine = {"name": "engine", "image": "registry/llm", "command": ["vllm", "serve", "M"]}
    assert find_vllm_container({"containers": [init, engine]})["name"] == "engine"


def test_a_sidecar_that_names_vllm_and_serve_in_two_commands_does_not_run_vllm():
    watcher = {"name": "watcher", "image": "busybox", "command": ["sh", "-c", "pgrep vllm; serve --port 9000"]}
    engine = {"name": "engine", "image": "registry/llm", "command": ["vllm", "serve", "M"]}
    assert find_vllm_container({"containers": [watcher, engine]})["name"] == "engine"


def test_a_sidecar_that_names_vllm_serve_in_an_argument_does_not_run_vllm():
    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["M", "--max-num-seqs", "64"]}
    probe = {"name": "probe", "image": "busybox", "command": [
        "sh", "-c", "until wget -q localhost:8000/health; do echo waiting for vllm serve; sleep 2; done; sleep inf"]}
    assert find_vllm_container({"containers": [engine, probe]}) is engine
    # in the vLLM container too, only the command that starts vLLM is read and rewritten
    script = "echo starting vllm serve; exec vllm serve M --max-num-seqs 64"
    assert EngineArgs.from_container({"command": ["sh", "-c", script]}).max_num_seqs == 64
    assert set_knobs({"command": ["sh", "-c", script]}, NEW)["command"][2] == (
        "echo starting vllm serve; exec vllm serve M --max-num-seqs 96 --max-num-batched-tokens 3072")


@pytest.mark.parametrize(
    "script",
    ["while true; do vllm serve M; done", "exec python3 -m vllm.entrypoints.openai.api_server --model M",
     "if [ -f /x ]; then VLLM_X=1 exec numactl -N 0 conda run -n serve vllm serve M; fi"],
)
def test_vllm_behind_reserved_words_wrappers_and_launchers_runs(script):
    container = {"name": "engine", "image": "registry/llm", "command": ["sh", "-c", script]}
    assert find_vllm_container({"containers": [{"name": "proxy", "image": "envoy"}, container]}) is container
    assert CommandLine.parse(container).model() == "M"


@pytest.mark.parametrize(
    "script",
    [
        "ddtrace-run vllm serve M --max-num-seqs 64 2>&1 | tee /log/out",
        "ddtrace-run vllm serve M --max-num-seqs 64 &\nwait",
        "set -e\nopentelemetry-instrument vllm serve M --max-num-seqs 64\necho exited",
        "nsys profile -o /t vllm serve M --max-num-seqs 64 | tee x",
        "exec -a vllm-server vllm serve M --max-num-seqs 64",
        "command -v vllm && exec command vllm serve M --max-num-seqs 64",
        "torchrun --nproc-per-node 1 -m vllm.entrypoints.openai.api_server --model M --max-num-seqs 64; echo done",
        "pkill -f vllm serve || true; echo vllm serve; coverage run -m vllm.entrypoints.api_server --model M "
        "--max-num-seqs 64",
    ],
)
def test_vllm_behind_a_program_that_does_not_only_name_it_runs(script):
    # a tracer, a profiler or a launcher in front starts vLLM; flags go to that command, not to the script's last
    container = {"name": "engine", "image": "registry/llm", "command": ["bash", "-c", script]}
    assert find_vllm_container({"containers": [{"name": "proxy", "image": "envoy"}, container]}) is container
    assert CommandLine.parse(container).model() == "M"
    assert EngineArgs.from_container(container).max_num_seqs == 64
    assert set_knobs(container, NEW)["command"][2] == script.replace(
        "--max-num-seqs 64", "--max-num-seqs 96 --max-num-batched-tokens 3072")


def test_a_launcher_in_front_of_vllm_reads_the_same_in_list_and_script_form():
    argv = ["opentelemetry-instrument", "vllm", "serve", "M", "--max-num-seqs", "64"]
    listed = CommandLine.parse({"command": argv})
    scripted = CommandLine.parse({"command": ["bash", "-c", "exec " + " ".join(argv)]})
    for cmd in (listed, scripted):
        assert (cmd.runs_vllm(), cmd.model(), cmd.get_int("max-num-seqs"), cmd.sigterm()) == (
            True, "M", 64, Sigterm.REACHES)


@pytest.mark.parametrize(
    "command",
    [
        ["xargs", "-a", "/cfg/args", "vllm", "serve", "M"],
        ["tini", "--", "/usr/bin/xargs", "-0", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"],
        ["sh", "-c", "cat /a | xargs vllm serve M"],
        ["bash", "-c", "set -e; exec xargs -a /cfg/args vllm serve M --max-num-seqs 64"],
        ["sh", "-c", "find /models -maxdepth 1 -name 'llama*' | xargs vllm serve --max-num-seqs 64"],
        # behind the shell's command builtin, which runs it as exec does, or a launcher not read past (sudo)
        ["sh", "-c", "command xargs -a /a vllm serve M"],
        ["sh", "-c", "sudo -u vllm -E VLLM_LOGGING_LEVEL=INFO xargs -a /a vllm serve M"],
        ["sudo", "-Eu", "app", "xargs", "-a", "/args", "vllm", "serve", "M"],
        ["parallel", "vllm", "serve", "M", ":::", "--max-num-seqs=64"],  # GNU parallel appends its ::: arguments
        ["sudo", "-E", "xargs", "-a", "/a", "vllm", "serve", "M"],
        ["conda", "run", "-n", "base", "xargs", "vllm", "serve", "M"],
        # the options of a launcher not known here are taken to take no value: parallel may be the program it runs
        ["nsys", "profile", "-o", "parallel", "vllm", "serve", "M"],
    ],
)
def test_vllm_started_by_xargs_is_refused(command):
    # xargs appends what it reads to vLLM's command: flags the operator cannot see, the knobs among them
    container = {"name": "engine", "image": "registry/llm", "command": command}
    sidecar = {"name": "feed", "image": "busybox", "command": ["sh", "-c", "echo x | xargs"]}
    assert find_vllm_container({"containers": [sidecar, container]}) is container  # found, then refused
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match=r"started by (xargs|parallel), which appends the words it reads"
                                                   r".*write the flags in the vLLM command, and start vLLM without \1"):
            read(container)


@pytest.mark.parametrize("command", [["xargs", "-a", "/args", "/start.sh"],
                                     ["sh", "-c", "cat /args | xargs /start.sh"],
                                     ["sudo", "-u", "app", "xargs", "-a", "/args", "/start.sh"],
                                     ["sh", "-c", "exec sudo -Eu app /usr/bin/xargs -a /args /start.sh"],
                                     ["conda", "run", "-n", "serve", "xargs", "-a", "/args", "/start.sh"],
                                     ["runuser", "-u", "app", "--", "xargs", "-a", "/args", "/start.sh"],
                                     ["sh", "-c", "exec runuser -u app -- xargs -a /args /start.sh"],
                                     ["micromamba", "run", "-n", "base", "xargs", "-a", "/a", "/start.sh"],
                                     ["mamba", "run", "-n", "base", "xargs", "-a", "/a", "/start.sh"],
                                     ["setpriv", "--reuid=1000", "xargs", "-a", "/a", "/start.sh"],
                                     ["setpriv", "--reuid", "1000", "--init-groups", "xargs", "-a", "/a", "/start.sh"]])
def test_the_command_that_may_run_vllm_started_by_xargs_is_refused(command):
    # the image's script may run vLLM: xargs appends the file's words after the flags written, and they win; behind
    # a launcher known to run the rest of its argv (sudo, runuser, setpriv, conda run) as where it is the program
    container = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "command": command}
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match="the command that may run vLLM is started by xargs, which appends"):
            read(container)


@pytest.mark.parametrize(
    "command",
    [
        ["env", "-C", "/srv/parallel", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["sh", "-c", "exec env -C xargs vllm serve M --max-num-seqs 64"],
        ["conda", "run", "-n", "parallel", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["sh", "-c", "hatch -e xargs run vllm serve M --max-num-seqs 64"],
        ["sudo", "-Eu", "xargs", "--", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["gosu", "parallel", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["micromamba", "run", "-n", "parallel", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["mamba", "run", "-p", "/opt/xargs", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["runuser", "-u", "xargs", "-w", "PATH", "--", "vllm", "serve", "M", "--max-num-seqs", "64"],
        ["setpriv", "--reuid", "xargs", "vllm", "serve", "M", "--max-num-seqs", "64"],
        # no vLLM word: the program that may run vLLM is not known to run its arguments
        ["sudo", "-u", "app", "/start.sh", "--mode", "parallel", "--max-num-seqs", "64"],
    ],
)
def test_an_option_value_or_operand_named_xargs_starts_no_xargs(command):
    # a directory, an environment or a user of that name: only a program in front of vLLM's word appends to it
    container = {"name": "engine", "image": "registry/llm", "command": command}
    assert EngineArgs.from_container(container).max_num_seqs == 64
    written = EngineArgs.from_container({**container, **set_knobs(container, NEW)})
    assert (written.max_num_seqs, written.max_num_batched_tokens) == (96, 3072)


def test_the_xargs_check_reads_no_word_again_for_vllm(monkeypatch):
    # the vLLM word _vllm_segment found is the one the check for xargs behind a launcher stops at: not found twice
    examined = []
    is_vllm_word = CommandLine._is_vllm_word
    monkeypatch.setattr(CommandLine, "_is_vllm_word", lambda self, i: examined.append(i) or is_vllm_word(self, i))
    cmd = CommandLine._split({"command": ["sh", "-c", "cd /app; exec sudo -u app vllm serve M --max-num-seqs 64"]})
    assert cmd._vllm_segment == (3, 12)
    assert sorted(examined) == sorted(set(examined))


@pytest.mark.parametrize(
    ("command", "builtin"),
    [
        (["command", "vllm", "serve", "M", "--max-num-seqs", "64"], "command"),
        (["exec", "vllm", "serve", "M", "--max-num-seqs", "64"], "exec"),
        (["tini", "--", "command", "vllm", "serve", "M", "--max-num-seqs", "64"], "command"),
        (["command", "sh", "-c", "exec vllm serve M --max-num-seqs 64"], "command"),
        # args alone that hold a vLLM command are read as a command, and refused alike
        ({"args": ["exec", "vllm", "serve", "M", "--max-num-seqs", "64"]}, "exec"),
        ({"args": ["command", "vllm", "serve", "M", "--max-num-seqs", "64"]}, "command"),
        # the api_server module takes its model as --model: no positional to tell the args from a model
        ({"args": ["exec", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"]}, "exec"),
        ({"args": ["command", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"]}, "command"),
    ],
)
def test_a_shell_builtin_in_a_list_form_command_is_refused(command, builtin):
    # no shell reads the list: kubelet runs command or exec as a program, absent from vLLM's images, and where
    # RHEL has one, a script whose shell keeps vLLM as its child: read as the builtin, the SIGTERM would reach vLLM
    container = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                 **(command if isinstance(command, dict) else {"command": command})}
    assert find_vllm_container({"containers": [container]}) is container
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match=rf"starts {builtin}, a builtin of the shell, with no shell.*drop "
                                                   rf"{builtin} from the command, or run it in a shell's -c script"):
            read(container)
    # in a script, the shell runs the builtin
    scripted = {**container, "command": ["sh", "-c", "command vllm serve M --max-num-seqs 64"]}
    assert EngineArgs.from_container(scripted).max_num_seqs == 64


@pytest.mark.parametrize("script", ['case "$ROLE" in a|b) ;; esac', 'case "$ROLE" in (b) : ;; esac',
                                    'case "$ROLE" in\n  b) echo hi ;;\nesac'])
def test_a_case_pattern_is_refused_as_the_command_to_write_flags_after(script):
    # a word after a pattern's | or ( or a newline is no command: flags after it break the script
    with pytest.raises(CommandLineError, match=r"'b', is a pattern of a case statement.*run vLLM outside the case"):
        set_knobs({"name": "engine", "command": ["sh", "-c", script]}, NEW)


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="needs /bin/sh")
def test_a_program_a_case_runs_gets_the_flags_in_its_command():
    script = set_knobs({"command": ["sh", "-c", 'case "$ROLE" in leader) /start.sh;; esac']}, NEW)["command"][2]
    assert script == 'case "$ROLE" in leader) /start.sh --max-num-batched-tokens 3072 --max-num-seqs 96;; esac'
    subprocess.run(["/bin/sh", "-n", "-c", script], check=True)  # the script still parses


@pytest.mark.parametrize("model", ["/models/command", "/models/exec", "command"])
def test_args_alone_whose_model_is_named_as_a_builtin_are_read(model):
    # no command: the image's entrypoint (vllm serve) gets the args, the first of them the model, which starts nothing
    container = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "args": [model, "--max-num-seqs", "64"]}
    assert CommandLine.parse(container).model() == model
    assert EngineArgs.from_container(container).max_num_seqs == 64
    assert set_knobs(container, NEW)["args"] == [model, "--max-num-seqs", "96", "--max-num-batched-tokens", "3072"]

def test_command_v_names_a_program_and_runs_none():
    # as which does: neither vLLM nor a second program that may run it, beside the script that does
    assert not CommandLine.parse({"command": ["sh", "-c", "command -v vllm serve && exec /start.sh"]}).runs_vllm()
    engine = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
              "command": ["sh", "-c", "command -V nvidia-smi && exec /start.sh --max-num-seqs 64"]}
    assert EngineArgs.from_container(engine).max_num_seqs == 64
    assert set_knobs(engine, NEW)["command"][2].endswith("--max-num-seqs 96 --max-num-batched-tokens 3072")


def test_xargs_in_a_command_that_does_not_start_vllm_is_no_refusal():
    # a sidecar's xargs, or one that prepares the vLLM container, starts no vLLM
    sidecar = {"name": "feed", "image": "vllm/vllm-openai:v0.11.0", "command": ["sh", "-c", "echo x | xargs"]}
    script = "find /tmp -name '*.lock' | xargs rm -f; echo xargs vllm serve M; exec vllm serve M --max-num-seqs 64"
    engine = {"name": "engine", "image": "registry/llm", "command": ["sh", "-c", script]}
    assert find_vllm_container({"containers": [sidecar, engine]}) is engine
    assert EngineArgs.from_container(engine).max_num_seqs == 64
    assert set_knobs(engine, NEW)["command"][2] == script.replace(
        "--max-num-seqs 64", "--max-num-seqs 96 --max-num-batched-tokens 3072")


def test_a_script_of_several_commands_none_of_which_starts_vllm_is_refused():
    # the image's entrypoint may run vLLM from any one of them: the operator cannot tell which gets the flags
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "command": ["sh", "-c", "echo starting; /opt/fetch.sh; /opt/start.sh --max-num-seqs 64; echo exited"]}
    assert find_vllm_container({"containers": [container, {"name": "proxy", "image": "envoy"}]}) is container
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match="runs 2 commands and none starts vLLM.*exec vllm serve.*"
                                                   "spec.targetRef.container"):
            read(container)


@pytest.mark.parametrize(
    "script",
    [
        "for i in 1 2; do /start.sh --max-num-seqs 64; done",
        "if [ -f /x ]; then exec /start.sh --max-num-seqs 64; fi",
        "{ /start.sh --max-num-seqs 64; }",
        "case $MODE in serve) /start.sh --max-num-seqs 64;; esac",
    ],
)
def test_the_script_of_the_image_in_a_compound_command_gets_the_flags_inside_it(script):
    # done, fi, esac and } close the compound command and start nothing: flags written after them are a syntax error
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "command": ["sh", "-c", script]}
    assert EngineArgs.from_container(container).max_num_seqs == 64
    written = set_knobs(container, NEW)["command"][2]
    assert written == script.replace("--max-num-seqs 64", "--max-num-seqs 96 --max-num-batched-tokens 3072")
    subprocess.run(["sh", "-n", "-c", written], check=True)


@pytest.mark.parametrize(
    ("script", "count"),
    [("while :; do sleep 1; done", "2 commands"),
     ("until wget -q localhost:8000/health; do sleep 2; done; sleep inf", "3 commands"),
     ("if [ -f /x ]; then echo hi; fi", "2 commands"), ("{ echo hi; }", "1 command"),
     ("while :; do sleep 1 & wait $!; done", "3 commands")],
)
def test_a_compound_command_that_starts_no_program_gets_no_flags_after_its_closing_word(script, count):
    # an idle or probing container's script: the flags would go after done, fi or }, and the pods crash-loop; the
    # refusal counts the commands it runs, none of them a closing word alone, which starts nothing
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "command": ["sh", "-c", script]}
    for read in (EngineArgs.from_container, lambda c: set_knobs(c, NEW)):
        with pytest.raises(CommandLineError, match=f"runs {count} and none starts vLLM"):
            read(container)


@pytest.mark.parametrize(
    ("command", "written"),
    [
        (["/opt/start.sh", "--max-num-seqs", "64"],
         ["/opt/start.sh", "--max-num-seqs", "96", "--max-num-batched-tokens", "3072"]),
        # a script's one command, not the empty one after its last newline
        (["sh", "-c", "exec /opt/start.sh --max-num-seqs 64\n"],
         ["sh", "-c", "exec /opt/start.sh --max-num-seqs 96 --max-num-batched-tokens 3072\n"]),
        # the one command beside those that only prepare it or say what happens
        (["sh", "-c", "set -e; cd /app; echo starting; exec ./start.sh --max-num-seqs 64"],
         ["sh", "-c",
          "set -e; cd /app; echo starting; exec ./start.sh --max-num-seqs 96 --max-num-batched-tokens 3072"]),
        (["sh", "-c", "cd /app && python serve.py --max-num-seqs 64"],
         ["sh", "-c", "cd /app && python serve.py --max-num-seqs 96 --max-num-batched-tokens 3072"]),
    ],
)
def test_a_single_command_that_names_no_vllm_is_read_as_the_entrypoints(command, written):
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "command": command}
    assert EngineArgs.from_container(container).max_num_seqs == 64
    assert set_knobs(container, NEW)["command"] == written


def test_a_container_whose_entrypoint_may_run_vllm_beside_one_that_runs_it_is_no_choice_to_make():
    entrypoint = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["M", "--max-num-seqs", "64"]}
    embed = {"name": "embed", "image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve", "E", "--port", "8001"]}
    pod = {"containers": [entrypoint, embed]}
    with pytest.raises(CommandLineError, match=r"embed \(its command runs vLLM\), vllm \(a vLLM image, whose "
                                               r"entrypoint may run vLLM\).*set spec.targetRef.container to the one"):
        find_vllm_container(pod)
    assert find_vllm_container(pod, "vllm") is entrypoint
    assert find_vllm_container(pod, "embed") is embed
    # a vLLM image that runs a command of its own, not vLLM, is no candidate
    router = {"name": "router", "image": "vllm/vllm-openai:v0.11.0", "command": ["python3", "/router.py"]}
    assert find_vllm_container({"containers": [router, embed]}) is embed


# --- what vLLM gets after kubelet's $(VAR) and the shell's expansions ----------------------------

H100 = vllm_defaults("v0.11.0", Hardware(gpus=1, memory_gib=80, product="NVIDIA-H100-80GB-HBM3"))


def env(**values):
    return [{"name": name, "value": value} for name, value in values.items()]


@pytest.mark.parametrize(
    ("element", "expanded"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)", "x1y2 3"),
        ("$$(A)", "$(A)"),  # escaped
        ("$$$(A)", "$1"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),  # left as written
        ("$(A", "$(A"),
        ("$A", "$A"),
        ("$(C)", "1-$(D)"),  # C's value expanded with the variables before it only
        ("$(E)", ""),
    ],
)
def test_kubelet_expands_variable_references_with_the_containers_env(element, expanded):
    container = {"args": ["--served-model-name", element],
                 "env": [*env(A="1", B="2 3", C="$(A)-$(D)", D="4"), {"name": "E"}]}
    assert CommandLine.parse(container).get("served-model-name").value == expanded


def test_flags_passed_through_a_variable_reference_are_read_and_refused_as_written():
    script = ["/bin/sh", "-c", "exec vllm serve $(MODEL) $(VLLM_ARGS) 2>&1 | tee log"]
    container = {"command": script, "env": env(MODEL="org/m", VLLM_ARGS="--max-num-seqs 32 -dp 2")}
    with pytest.raises(CommandLineError, match="run one engine per pod"):
        EngineArgs.from_container(container)
    container["env"] = env(MODEL="org/m", VLLM_ARGS="--max-num-seqs 32 --max-model-len 32768 --no-enable-chunked-prefill")
    engine = EngineArgs.from_container(container)
    assert (engine.max_num_seqs, engine.max_model_len, engine.chunked_prefill) == (32, 32768, False)
    assert CommandLine.parse(container).model() == "org/m"
    # the operator changes the command line only, never a variable's value
    with pytest.raises(CommandLineError, match=r"--max-num-seqs comes from \$\(VLLM_ARGS\) of the container's env"):
        set_knobs(container, NEW)
    container["env"] = env(MODEL="org/m", VLLM_ARGS="--max-model-len 4096")
    assert set_knobs(container, NEW)["command"][2] == (
        "exec vllm serve $(MODEL) $(VLLM_ARGS) --max-num-batched-tokens 3072 --max-num-seqs 96 2>&1 | tee log")


def test_a_rewrite_keeps_variable_references_where_they_are():
    container = {"command": ["sh", "-c", "vllm serve $(MODEL) --max-num-seqs $(SEQS) --port $$PORT"],
                 "args": ["$(SEQS)"], "env": env(MODEL="org/m", SEQS="64")}
    with pytest.raises(CommandLineError, match=r"--max-num-seqs comes from \$\(SEQS\)"):
        set_knobs(container, NEW)
    container["command"][2] = "vllm serve $(MODEL) --max-num-seqs 64 --port $$PORT"
    assert set_knobs(container, NEW)["command"][2] == (
        "vllm serve $(MODEL) --max-num-seqs 96 --port $$PORT --max-num-batched-tokens 3072")
    listed = {"args": ["$(MODEL)", "--max-num-seqs", "$(SEQS)"], "env": env(MODEL="org/m", SEQS="64")}
    assert EngineArgs.from_container(listed).max_num_seqs == 64
    assert set_knobs(listed, NEW)["args"] == ["$(MODEL)", "--max-num-seqs", "96", "--max-num-batched-tokens", "3072"]


@pytest.mark.parametrize(
    "container",
    [
        {"command": ["/bin/sh", "-c", "exec vllm serve M $VLLM_ARGS"]},
        {"command": ["/bin/sh", "-c", "exec vllm serve ${MODEL} ${EXTRA_ARGS:-} --max-num-seqs 8"]},
        {"command": ["bash", "-c", 'vllm serve M --max-num-seqs 8 "$EXTRA" | tee log']},
        {"command": ["sh", "-c", "vllm serve M `cat /etc/vllm/args`"]},
        {"command": ["sh", "-c", "python3 -m vllm.entrypoints.openai.api_server $(cat /args)"]},
        {"command": ["sh", "-c", "vllm serve M --enforce-eager $EXTRA"]},  # a flag that takes no value
        {"command": ["sh", "-c", "vllm serve M --$NAME=8"]},
        # Kubernetes: a variable from a Secret, or one envFrom may set, is unknown
        {"args": ["M", "$(EXTRA)"], "env": [{"name": "EXTRA", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        {"args": ["M", "$(EXTRA)"], "envFrom": [{"configMapRef": {"name": "vllm-args"}}]},
        {"command": ["sh", "-c", "vllm serve M '$(EXTRA)'"], "envFrom": [{"configMapRef": {"name": "vllm-args"}}]},
    ],
)
def test_an_expansion_where_vllm_takes_flags_is_refused_saying_to_write_them_literally(container):
    with pytest.raises(CommandLineError, match="write the flags literally in the command or args"):
        EngineArgs.from_container(container)
    with pytest.raises(CommandLineError, match="write the flags literally"):
        set_knobs(container, NEW)


@pytest.mark.parametrize(
    "flag",
    ["--skip-tokenizer-init", "--return-tokens-as-token-ids", "--allow-credentials", "--use-tqdm-on-load",
     "--multi-step-stream-outputs", "--guided-decoding-disable-fallback", "--data-parallel-hybrid-lb", "--tokens-only",
     "--kv-cache-metrics", "--numa-bind", "--grpc", "--language-model-only", "--shuffle-safetensors-files",  # 0.12+
     "--skip-tokenizer",  # an abbreviation, as vLLM's parser takes it
     "-ep", "-dpe"],  # one-dash forms
)
def test_an_expansion_after_any_of_vllms_flags_that_take_no_value_is_refused(flag):
    with pytest.raises(CommandLineError, match="write the flags literally in the command or args"):
        EngineArgs.from_container({"command": ["sh", "-c", f"exec vllm serve M {flag} $EXTRA"]})


@pytest.mark.parametrize("spelling", ["--disable-chunked-prefill", "--disable_chunked_prefill", "--disable-chunked"])
def test_vllm_033s_disable_chunked_prefill_turns_it_off(spelling):
    args = ["M", "--max-num-seqs", "64", spelling]
    with pytest.raises(CommandLineError, match="chunked prefill is off and --max-model-len is not set"):
        EngineArgs.from_container({"args": args})
    engine = EngineArgs.from_container({"args": [*args, "--max-model-len", "16384"]})
    assert engine.chunked_prefill is False
    # vLLM then needs a budget of at least max_model_len: the defaults' 8192 is raised to it
    assert engine.effective(H100)[0].max_num_batched_tokens == 16384
    # the flag written last wins, whichever spelling
    assert EngineArgs.from_container({"args": [*args, "--enable-chunked-prefill"]}).chunked_prefill is True


def test_other_spellings_of_flags_read_are_read_as_them():
    cmd = CommandLine.parse({"args": ["M", "--device-memory-utilization", "0.8", "--disable-prefix-caching"]})
    assert cmd.get("gpu-memory-utilization").value == "0.8"
    assert cmd.get_bool("enable-prefix-caching") is False


@pytest.mark.parametrize(
    "container",
    [
        # an expansion in another command of the script is not vLLM's
        {"command": ["sh", "-c", 'exec vllm serve "$MODEL" --port $PORT --served-model-name "${NAME:-m}" '
                                 "--max-num-seqs 8 -tp $(nproc) | tee $LOG"]},
        {"command": ["sh", "-c", "vllm serve $(MODEL) --max-num-seqs=8 --api-key=$KEY"], "envFrom": [{"x": 1}]},
        {"args": ["$(MODEL)", "--served-model-name", "$(POD_NAME)", "--max-num-seqs", "8"],
         "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        {"command": ["sh", "-c", 'exec vllm serve "$@"', "--"], "args": ["M", "--max-num-seqs", "8"]},
        # vLLM's one-dash options that take a value: the expansion after one is its value
        {"command": ["sh", "-c", "exec vllm serve M -q $QUANT -pp ${PP:-1} -asc $(nproc) --max-num-seqs 8"]},
    ],
)
def test_an_expansion_for_a_flags_value_or_the_model_is_read(container):
    assert EngineArgs.from_container(container).max_num_seqs == 8


def test_the_data_parallel_refusal_and_the_rules_see_flags_from_a_variable_in_list_form():
    container = {"args": ["M", "$(DP)", "$(N)"], "env": env(DP="--data-parallel-size=2", N="--max-num-seqs=8")}
    with pytest.raises(CommandLineError, match="run one engine per pod"):
        EngineArgs.from_container(container)


# --- vLLM's own reading of the flags: abbreviations, value types, tied defaults --------------------


def test_a_unique_prefix_of_a_flag_is_read_and_rewritten_as_that_flag():
    container = {"command": ["vllm", "serve", "M", "--max-num-batched", "2048", "--max_num_seq=64",
                             "--no-enable-chunked", "--max-model", "4096"]}
    engine = EngineArgs.from_container(container)
    assert (engine.max_num_batched_tokens, engine.max_num_seqs, engine.chunked_prefill, engine.max_model_len) == (
        2048, 64, False, 4096)
    assert set_knobs(container, NEW)["command"] == ["vllm", "serve", "M", "--max-num-batched", "3072",
                                                    "--max_num_seq=96", "--no-enable-chunked", "--max-model", "4096"]
    with pytest.raises(CommandLineError, match="run one engine per pod"):
        EngineArgs.from_container({"args": ["--data-parallel-size-l", "2", "--max-num-seqs", "64"]})


@pytest.mark.parametrize("prefix", ["--max-num", "--max_num=64", "--data-parallel-s", "--no-enable"])
def test_a_prefix_of_several_flags_is_refused_as_vllm_refuses_it(prefix):
    with pytest.raises(CommandLineError, match="abbreviates several of vLLM's flags .* write the flag in full"):
        EngineArgs.from_container({"args": ["M", prefix, "64"]})


@pytest.mark.parametrize(
    ("args", "read"),
    [
        (["--max-model-len", "Auto"], (None, None, None)),
        (["--max-model-len", "None"], (None, None, None)),
        (["--max-model-len", "8_192", "--max-num-batched-tokens", " 8_192 "], (8192, None, 8192)),
        (["--max-num-seqs", "None", "--max-num-batched-tokens="], (None, None, None)),  # absent: vLLM's default
        (["--max-num-seqs", "+64"], (None, 64, None)),
    ],
)
def test_integer_values_are_read_with_the_type_vllm_gives_each_flag(args, read):
    engine = EngineArgs.from_container({"args": ["M", *args]})
    assert (engine.max_model_len, engine.max_num_seqs, engine.max_num_batched_tokens) == read


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--max-num-seqs", "1k"], "'1k', not a positive integer .* plain number such as 64"),  # vLLM: type=int
        (["--max-num-seqs", "0"], "'0', not a positive integer"),
        (["--max-num-batched-tokens", "-1"], "'-1', not a positive integer"),
        (["--data-parallel-size", "None"], "'None', not a positive integer"),  # not optional in vLLM
        (["--max-num-seqs"], "None, not a positive integer"),
    ],
)
def test_values_vllm_refuses_are_refused(args, match):
    with pytest.raises(CommandLineError, match=match):
        EngineArgs.from_container({"args": ["M", *args]})


@pytest.mark.parametrize(
    ("args", "knobs"),
    [
        (["--max-num-batched-tokens", "512"], (512, 512)),  # max_num_seqs = min(default, budget)
        (["--no-enable-chunked-prefill", "--max-model-len", "32768", "--max-num-seqs", "64"], (32768, 64)),
        (["--max-model-len", "1024", "--max-num-seqs", "2"], (2048, 2)),  # budget <= max_num_seqs * max_model_len
        (["--max-model-len", "4", "--no-enable-chunked-prefill"], (4096, 1024)),  # both ties: max(4, 8192), 1024 * 4
        (["--max-num-seqs", "64"], (8192, 64)),  # the model's length is unknown: no ceiling from it
    ],
)
def test_absent_knobs_are_filled_as_vllm_ties_them(args, knobs):
    (effective, from_defaults) = EngineArgs.from_container({"args": ["M", *args]}).effective(H100)
    assert (effective.max_num_batched_tokens, effective.max_num_seqs, from_defaults) == (*knobs, True)


@pytest.mark.parametrize("budget", [[], ["--max-num-batched-tokens", "8192"]])
def test_chunked_prefill_off_without_a_max_model_len_is_refused(budget):
    # vLLM refuses a budget below the model's own length, which only vLLM reads: no change is known to be safe (a
    # floor at the budget running now would keep every budget a preset raised)
    with pytest.raises(CommandLineError, match="set --max-model-len on the command line"):
        EngineArgs.from_container({"args": ["M", "--no-enable-chunked-prefill", *budget]})
