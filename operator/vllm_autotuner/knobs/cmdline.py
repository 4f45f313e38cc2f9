"""Read and rewrite vLLM flags in a Kubernetes container spec, in every form vLLM accepts.

A platform team's Deployment may start vLLM as a list (``["vllm", "serve",
"M", "--max-num-seqs", "64"]``), with the image entrypoint and only ``args``,
with ``--flag=value`` or ``--flag value``, with underscores
(``--max_num_seqs``), or through a shell (``["/bin/sh", "-c", "vllm serve M
--max-num-seqs 64 2>&1 | tee log"]``). The operator must read the two knobs
from any of these and change exactly those tokens, leaving every other
character as the person wrote it: a rewrite that reorders or re-quotes a
command would be an unrelated edit to their Deployment.

The model: a container's ``command`` and ``args`` are a list of *words*. In
list form each element is a word. In shell form (a shell's ``-c`` script, also
behind wrappers such as ``env``, ``tini``, ``gosu``, ``numactl`` or
``stdbuf``, and shell options such as ``-o pipefail``) the script string is
split into words by a small POSIX-shell tokenizer that remembers each word's
character span, so a value can be replaced in place; the arguments a script
passes on as ``"$@"`` are elements again. Flags are then read the way vLLM's
argument parser reads them: names normalised (underscores -> dashes),
``--flag=value`` or ``--flag value``, vLLM's one-dash options (``-dp 2``), the
last occurrence wins, a unique prefix of a long option taken for it
(``--max-num-batched 2048``: vLLM's parser keeps argparse's abbreviations),
and each integer value read with the type vLLM gives that flag (``8k`` is a
size for ``--max-num-batched-tokens`` but no number for ``--max-num-seqs``).

What vLLM gets is not always what is written. Kubelet first replaces each
``$(VAR)`` in command and args with the container's variable (``$$`` escapes
it, an undefined one stays as written), so the operator expands them alike
from the container's ``env`` values. A shell then expands ``$VAR``,
``${...}``, ``$(...)`` and backquotes to values the operator never sees, and
an unquoted one may split into several words. Such an expansion (or a
variable the operator cannot read, from a Secret or ``envFrom``) is read only
as a flag's value or as the model: anywhere else vLLM may get flags from it
(``vllm serve M $VLLM_ARGS``), the data-parallel size or chunked prefill that
decide which knobs vLLM accepts among them, so the command is refused.

A wrong reading is worse than none: flags written where vLLM does not get
them leave the operator believing in values vLLM never ran with, and a script
broken by a rewrite crash-loops every pod. So a form that cannot be read with
certainty (an unknown program in front of the shell, a here-document, a
script that reshuffles its arguments, runs vLLM in several commands, or runs
several commands none of which starts vLLM, vLLM started by xargs, which
appends flags read as it runs, or by a builtin of the shell in a command no
shell runs) raises CommandLineError, and the operator changes nothing.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

SHELLS = {"sh", "bash", "ash", "dash", "zsh"}

# Words that show a command runs vLLM's OpenAI server.
_VLLM_ENTRYPOINTS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

# vLLM flags that take no value. Any other flag followed by a non-flag word
# takes that word as its value (argparse's behaviour for vLLM's options).
_BOOLEAN_PREFIXES = ("enable-", "disable-", "no-")
# The others: vllm serve's value-less options, v0.8.0-v0.34.0 (engine/arg_utils.py, cli/serve.py and the server's
# cli_args.py: entrypoints/openai/ to 0.28, launchers/ to 0.32, common/ since), each release's parser read for options
# with nargs=0. (The three guided-decoding-disable-* take a value in 0.11.0-0.11.2 only, and are gone from 0.12: an
# expansion after one is refused, the safe reading for every release.)
_BOOLEAN_FLAGS = {
    "aggregate-engine-logging", "allow-credentials", "allow-deprecated-quantization", "async-scheduling",
    "calculate-kv-scales", "checkpoint-prepare-on-startup", "cohere-is-reasoning-model", "cudagraph-metrics",
    "data-parallel-external-lb", "data-parallel-hybrid-lb", "data-parallel-multi-port-external-lb", "dcp-q-replicate",
    "enforce-eager", "eplb-log-balancedness", "exclude-tools-when-tool-choice-none",
    "expand-tools-even-if-tool-choice-none", "fail-on-environ-validation", "fully-sharded-loras", "grpc",
    "guided-decoding-disable-additional-properties", "guided-decoding-disable-any-whitespace",
    "guided-decoding-disable-fallback", "headless", "interleave-mm-strings", "jit-monitor-verbose",
    "kv-cache-metrics", "kv-sharing-fast-prefill", "language-model-only", "log-error-stack",
    "long-prefill-token-threshold-adaptive", "mm-device-do-normalize", "mm-encoder-only", "monokernel",
    "multi-step-stream-outputs", "numa-bind", "ray-workers-use-nsight", "return-sampling-mask",
    "return-tokens-as-token-ids", "scheduler-reserve-full-isl", "shuffle-safetensors-files",
    "skip-mm-profiling", "skip-tokenizer-init", "sleep-mode-offload-cudagraph", "specialize-active-lora",
    "speculative-disable-mqa-scorer", "swa-bounded-replay", "tokens-only", "trust-remote-code",
    "trust-request-chat-template", "trust-request-mm-kwargs", "use-fp64-gumbel", "use-gpu-for-pooling-score",
    "use-replayssm", "use-tqdm-on-load", "use-v2-block-manager",
}

# vLLM's one-dash options, v0.11.2-v0.34.0, and the long flags they stand for (argparse takes ``-dp 2`` and ``-dp=2``
# as ``--data-parallel-size 2``): those read here, and the others, so that a word after one is known for its value
# (``-q $QUANT``) or, after a value-less one (-dpe, -dph, -dpm, -ep), for none. (-O is 0.11's --compilation-config;
# from 0.12 vLLM rewrites ``-O 3`` to --optimization-level, a value either way.)
_SHORT_ALIASES = {
    "-tp": "tensor-parallel-size", "-dp": "data-parallel-size", "-dpl": "data-parallel-size-local",
    "-pp": "pipeline-parallel-size", "-q": "quantization", "-O": "optimization-level", "-cc": "compilation-config",
    "-ac": "attention-config", "-sc": "speculative-config", "-dc": "diffusion-config", "-asc": "api-server-count",
    "-dcp": "decode-context-parallel-size", "-pcp": "prefill-context-parallel-size", "-n": "nnodes", "-r": "node-rank",
    "-dpa": "data-parallel-address", "-dpb": "data-parallel-backend", "-dpn": "data-parallel-rank",
    "-dpp": "data-parallel-rpc-port", "-dpr": "data-parallel-start-rank", "-dpe": "data-parallel-external-lb",
    "-dph": "data-parallel-hybrid-lb", "-dpm": "data-parallel-multi-port-external-lb", "-ep": "enable-expert-parallel",
}
# Other long spellings of flags read here: vLLM 0.33's --disable-chunked-prefill and --disable-prefix-caching (beside
# the --no-enable-* forms it keeps), 0.31's --device-memory-utilization. Older releases refuse them at start-up.
_LONG_ALIASES = {
    "disable-chunked-prefill": "no-enable-chunked-prefill", "disable-prefix-caching": "no-enable-prefix-caching",
    "device-memory-utilization": "gpu-memory-utilization",
}

# The long options the operator and the simulator read (a boolean in both forms).
_READ_FLAGS = (
    "max-num-batched-tokens", "max-num-seqs", "max-model-len", "enable-chunked-prefill", "no-enable-chunked-prefill",
    "data-parallel-size", "data-parallel-size-local", "performance-mode", "config", "model", "tensor-parallel-size",
    "gpu-memory-utilization", "enable-prefix-caching", "no-enable-prefix-caching", "block-size", "port",
    "served-model-name", "max-num-queued-reqs", "max-num-queued-tokens", "enable-sleep-mode", "enable-lora",
    "max-loras", "lora-modules", "shutdown-timeout", "enable-mfu-metrics", "no-enable-mfu-metrics", "runner", "convert",
    "task",
)
# vLLM's parser takes a word that is a prefix of exactly one option for that option, and refuses a prefix of several
# ("ambiguous option"): so a prefix of one of these (the options read, and the value-less ones, whose abbreviation
# takes no value either) is read as it, and a prefix of several is refused. (Were it also a prefix of an option not
# known here, vLLM would refuse to start, and what the word is read as would not matter.)
_KNOWN_FLAGS = (*_READ_FLAGS, *_LONG_ALIASES, *sorted(_BOOLEAN_FLAGS))

# Characters a shell expands in a word: a flag name with one in it is not known until the script runs.
_EXPANSION_CHARACTERS = ("$", "`")

# The shell's operators: those that separate commands, and redirections, which take the next word as their target
# and pass nothing to the command; longest first. Their characters end a word.
_CONTROL_OPERATORS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n")
_REDIRECTIONS = ("<<<", "&>>", ">>", ">|", ">&", "<&", "<>", "<<", "&>", ">", "<")
_OPERATORS = sorted(_CONTROL_OPERATORS + _REDIRECTIONS, key=len, reverse=True)
_WORD_ENDS = " \t;&|()<>\n"

# Programs that run the command in the rest of their argv (init processes, env, a user switch, CPU and NUMA
# placement, scheduling priority, output buffering, a time limit, the shell's ``command`` builtin): their options
# that take a value as the next word (each reads its options only up to its first operand, as getopt's "+" does),
# and how many operands come before the command (gosu's user, taskset's CPU mask, chrt's priority, timeout's
# duration); a shell behind one of them is found and its -c script read.
_WRAPPERS: dict[str, tuple[set[str], int]] = {
    "env": ({"-u", "--unset", "-C", "--chdir"}, 0),
    "tini": ({"-p", "-e"}, 0),
    "dumb-init": ({"-r", "--rewrite"}, 0),
    "catatonit": (set(), 0),
    "gosu": (set(), 1),
    "su-exec": (set(), 1),
    "setsid": (set(), 0),
    "nohup": (set(), 0),
    "nice": ({"-n", "--adjustment"}, 0),
    "ionice": ({"-c", "--class", "-n", "--classdata"}, 0),
    "chrt": ({"-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"}, 1),
    "stdbuf": ({"-i", "--input", "-o", "--output", "-e", "--error"}, 0),
    "timeout": ({"-s", "--signal", "-k", "--kill-after"}, 1),
    "numactl": ({"-i", "--interleave", "-p", "--preferred", "-P", "--preferred-many", "-w", "--weighted-interleave",
                 "-c", "--cpubind", "-N", "--cpunodebind", "-C", "--physcpubind", "-m", "--membind", "-S", "--shm",
                 "-f", "--file", "-o", "--offset", "-L", "--length", "-M", "--shmmode", "-I", "--shmid"}, 0),
    "taskset": (set(), 1),
    "command": (set(), 0),
}


def human_readable_int(text: str) -> int:
    """vLLM's ``human_readable_int``, the type of ``--max-num-batched-tokens``: a decimal suffix k/m/g/t (``8k`` =
    8000, ``25.6k``) or a binary one K/M/G/T (``8K`` = 8192, whole numbers only), else what Python's ``int`` reads
    (``8192``, ``8_192``). Raises ValueError where vLLM refuses the text."""
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)  # int("2.5") raises: vLLM refuses 2.5K too


def human_readable_int_or_auto(text: str) -> int | None:
    """vLLM's ``human_readable_int_or_auto``, the type of ``--max-model-len``; its ``auto`` or ``-1`` (vLLM fits the
    length to the memory left) as None, a length the operator cannot know."""
    return None if text.strip() == "-1" or text.strip().lower() == "auto" else human_readable_int(text)


# The type vLLM's parser gives each integer flag read here that is not a plain ``int``.
_INT_TYPES: dict[str, Callable[[str], int | None]] = {"max-num-batched-tokens": human_readable_int,
                                                      "max-model-len": human_readable_int_or_auto}


def int_type(name: str) -> Callable[[str], int | None]:
    """The type vLLM's argument parser reads integer flag ``name`` with (argparse names it in its errors)."""
    return _INT_TYPES.get(normalise(name), int)
# Those whose field in vLLM's EngineArgs is ``int | None``: vLLM reads ``None`` or an empty value as absent.
_OPTIONAL_INTS = {"max-num-batched-tokens", "max-num-seqs", "max-model-len", "data-parallel-size-local"}


class CommandLineError(ValueError):
    """The container's command cannot be read or rewritten; the message says what to change."""


@dataclass(frozen=True)
class Word:
    """One argv word: its text after shell unquoting, and where it came from."""

    text: str
    field: str  # "command" or "args"
    index: int  # element index within that field
    span: tuple[int, int] | None = None  # character span within a shell script; None for a whole element
    operator: bool = False  # a shell operator that separates commands (;, &&, |, ...), not an argv word
    expands: bool = False  # holds a shell expansion or a variable the operator cannot read: text is not what vLLM gets
    function: str | None = None  # in a script, the function whose body holds it (``_function_bodies``); None: none


@dataclass(frozen=True)
class Flag:
    """One occurrence of a ``--name`` flag (or of a one-dash alias such as ``-dp``)."""

    name: str  # normalised: no leading dashes, dashes not underscores, an alias's long name
    value: str | None
    flag_word: Word
    value_word: Word | None  # None for --name=value and for boolean flags
    spelling: str  # the flag as written, e.g. "--max_num_seqs" or "-dp"


def normalise(flag: str) -> str:
    """vLLM's flag-name normalisation: ``--max_num_seqs`` -> ``max-num-seqs``."""
    return flag.lstrip("-").replace("_", "-")


def _flag_name(spelling: str) -> str | None:
    """The normalised name of the flag spelled ``spelling`` (the part before any ``=``), a prefix of one flag known
    here taken for it as vLLM's parser takes it, and another spelling of a flag read here for that flag
    (``--disable-chunked-prefill`` is ``no-enable-chunked-prefill``); None when no flag. Raises CommandLineError for
    a prefix of several, which vLLM refuses."""
    if not spelling.startswith("--"):
        return _SHORT_ALIASES.get(spelling)
    if spelling == "--":
        return None
    name = normalise(spelling)
    if name not in _KNOWN_FLAGS:
        candidates = [flag for flag in _KNOWN_FLAGS if flag.startswith(name)]
        if len(candidates) > 1:
            raise CommandLineError(
                f"{spelling} abbreviates several of vLLM's flags ({', '.join('--' + c for c in candidates)}), which "
                f"vLLM's parser refuses as ambiguous; write the flag in full"
            )
        if candidates:
            name = candidates[0]
    return _LONG_ALIASES.get(name, name)


ShellWord = tuple[str, tuple[int, int], bool, bool]


def split_shell(script: str) -> list[ShellWord]:
    """Split a POSIX shell script into (text, span, is_operator, expands) words.

    Handles single and double quotes, backslash escapes and line
    continuations, comments, and the operators that separate commands.
    Redirections (``2>&1``, ``> /log``) are left out, like comments: the
    shell passes neither to the command, and a redirection may stand between
    its arguments. Expansions (``$VAR``, ``${VAR}``, ``$(cmd)``,
    ``$((expr))``, backquotes) are kept literally within their word, which is
    marked ``expands``: the operator cannot know what they expand to, but
    must know where one ends, as it may hold spaces, quotes and operators of
    its own. Raises CommandLineError where it cannot tell the words apart
    with certainty.
    """
    return _scan(script, 0, nested=False)[0]


def _scan(script: str, i: int, nested: bool) -> tuple[list[ShellWord], int]:
    """The words from i to the end of the script, or, ``nested`` (the body of a ``$(``), to the ``)`` that
    closes it; and where that is (len(script) when the script ends first)."""
    words: list[ShellWord] = []
    depth, n = 0, len(script)  # depth: parentheses opened within the body
    while i < n:
        ch, start = script[i], i
        if ch in " \t":
            i += 1
        elif script.startswith("\\\n", i):  # a line continuation between words separates them, like a space
            i += 2
        elif ch == "#":  # a comment, to the end of the line
            i = script.find("\n", i) if "\n" in script[i:] else n
        elif ch in _WORD_ENDS:
            operator = next(op for op in _OPERATORS if script.startswith(op, i))
            if nested and operator == ")" and depth == 0:
                break
            depth += (operator == "(") - (operator == ")")
            if operator in _REDIRECTIONS:
                i = _redirection_end(script, i)
            else:
                i += len(operator)
                words.append((operator, (start, i), True, False))
        else:
            text, i, expands = _text(script, i, _WORD_ENDS)
            if i < n and script[i] in "<>" and text.isdigit():  # the file descriptor of a redirection: 2>&1
                i = _redirection_end(script, i)
            elif nested and text == "case":  # its patterns' unmatched ")" would end the body early
                raise CommandLineError(f"a case statement within $( ) cannot be read; move it out: {script!r}")
            else:
                words.append((text, (start, i), False, expands))
    return words, i


def _text(script: str, i: int, ends: str, in_double_quotes: bool = False) -> tuple[str, int, bool]:
    """The text from i to the first of ``ends`` outside quotes and expansions, unquoted as the shell does,
    where it stops, and whether it holds an expansion (``$NAME``, ``$1``, ``$@``..., ``${``, ``$(``, a
    backquote; not within single quotes). Within double quotes a backslash escapes only ``$ ` " \\`` and a
    newline."""
    out: list[str] = []
    expands = False
    n = len(script)
    while i < n and script[i] not in ends:
        ch = script[i]
        if ch == "\\" and i + 1 < n:
            escaped = script[i + 1]
            if escaped != "\n":  # backslash-newline continues the line
                out.append(escaped if not in_double_quotes or escaped in '$`"\\' else ch + escaped)
            i += 2
        elif ch in "'\"" and not in_double_quotes:
            if ch == "'":
                end = script.find("'", i + 1) if "'" in script[i + 1 :] else n
                text = script[i + 1 : end]
            else:
                text, end, quoted_expands = _text(script, i + 1, '"', in_double_quotes=True)
                expands = expands or quoted_expands
            if end == n:
                raise CommandLineError(f"unbalanced {ch} quote in shell command: {script!r}")
            out.append(text)
            i = end + 1
        elif ch == "`" or script.startswith(("$(", "${"), i):
            end = _expansion_end(script, i)
            out.append(script[i:end])
            expands, i = True, end
        else:
            # $NAME, $1, and the special parameters
            expands = expands or ch == "$" and i + 1 < n and (script[i + 1].isalnum() or script[i + 1] in "_@*#?$!-")
            out.append(ch)
            i += 1
    return "".join(out), i, expands


def _expansion_end(script: str, i: int) -> int:
    """The index just after the expansion starting at i: ``$(...)`` and ``$((...))``, whose body is a script of
    its own; ``${...}``; a backquoted command, which ends at the first backquote not escaped."""
    n = len(script)
    if script[i] == "`":
        end = i + 1
        while end < n and script[end] != "`":
            end += 2 if script[end] == "\\" else 1
    elif script[i + 1] == "(":
        end = _scan(script, i + 2, nested=True)[1]
    else:
        end = _text(script, i + 2, "}")[1]
    if end >= n:
        opener = script[i] if script[i] == "`" else script[i : i + 2]
        raise CommandLineError(f"unclosed {opener} in shell command: {script!r}")
    return end + 1


def _redirection_end(script: str, i: int) -> int:
    """The index after the redirection at i and its target word (``> /log``, ``>&1``). Refuses a here-document,
    whose body would be read as commands, and a target that is no word (``>(tee log)``)."""
    operator = next(op for op in _OPERATORS if script.startswith(op, i))
    if operator == "<<":
        raise CommandLineError(f"a here-document in the shell command cannot be read; use a file: {script!r}")
    i += len(operator)
    while i < len(script) and script[i] in " \t":
        i += 1
    end = _text(script, i, _WORD_ENDS)[1]
    if end == i:
        raise CommandLineError(f"redirection {operator} has no file or descriptor in shell command: {script!r}")
    return end


def image_sh(image: str) -> str | None:
    """The shell ``sh`` is in ``image`` (``_IMAGE_SH``), or None when the image is not one the operator knows."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return next((shell for repository, shell in _IMAGE_SH.items()
                 if name == repository or name.endswith(f"/{repository}")), None)


def _is_shell(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in SHELLS


def _is_watcher(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in _WATCHERS


def _command_words(texts: list[str]) -> list[str]:
    """A script's simple command from its name: after the reserved words that open it (``then``, ``do``, ``{``...)
    and variable assignments, which the shell reads before it (``then X=1 exec vllm serve``)."""
    return list(itertools.dropwhile(lambda t: t in _RESERVED_WORDS or _ASSIGNMENT.fullmatch(t), texts))


def _program_words(texts: list[str]) -> list[str]:
    """A script's simple command from the program it starts: after its name's leading words (``_command_words``),
    and ``exec`` with its options (bash's ``-a NAME``, ``-c``, ``-l``)."""
    words = _command_words(texts)
    if words[:1] != ["exec"]:
        return words
    pos = 1
    while pos < len(words) and words[pos].startswith("-") and words[pos] != "-":
        option = words[pos]
        pos += 1
        if option == "--":
            break
        pos += option.endswith("a")  # -a takes the next word (-la NAME); -aNAME holds it
    return words[pos:]


def _is_init(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in _INITS


def _runs_holder(argv: list[str]) -> bool:
    """Whether the command that wrappers at the start of argv run is the ``run`` of one of _HOLDERS, which keeps
    the SIGTERM from vLLM as a shell that runs vLLM as its child does; its options before ``run`` read as
    ``_launched`` reads them (``hatch -ve prod run``)."""
    start = _command_start(argv)
    name = argv[start].rsplit("/", 1)[-1] if start < len(argv) else None
    if name not in _HOLDERS:
        return False
    pos = _options_end(argv, start + 1, _LAUNCHERS[name])
    return argv[pos:pos + 1] == ["run"]


def _script_position(argv: list[str]) -> int | None:
    """Index in argv of the script a shell runs with ``-c``, behind any wrappers; None when there is none.
    Raises CommandLineError for such a shell started by a program not known to run the rest of its argv, as
    flags written after it would reach the shell, not vLLM, and for a script given to su's or runuser's own -c,
    where they would reach su."""
    start = _command_start(argv)
    if start < len(argv) and _is_shell(argv[start]):
        return _shell_script_index(argv, start)
    _refuse_watcher_script(argv)
    watcher = start < len(argv) and _is_watcher(argv[start])
    for i in range(start + 1, len(argv)):
        if _is_shell(argv[i]) and _shell_script_index(argv, i) is not None:
            raise CommandLineError(
                f"{argv[i]} -c runs under {argv[start]}, which the operator does not know; start the shell "
                f"directly or through {', '.join(_WRAPPERS)}" + (f" ({WATCHER_ADVICE})" if watcher else "")
            )
    return None


def _refuse_watcher_script(argv: list[str]) -> None:
    """Raises CommandLineError where the command that wrappers at the start of argv run is su or runuser with a -c
    script of its own: flags added after it would reach su, not vLLM."""
    start = _command_start(argv)
    if start < len(argv) and _is_watcher(argv[start]) and any(
            _WATCHER_SCRIPT.match(word) for word in itertools.takewhile("--".__ne__, argv[start + 1:])):
        raise CommandLineError(f"{argv[start]} runs its own -c script, which the operator does not rewrite; "
                               f"{WATCHER_ADVICE}, and start vLLM in the container's command")


def _command_start(argv: list[str], pos: int = 0) -> int:
    """Index of the command that wrappers at argv[pos] and after (``env X=1``, ``tini --``, ``gosu vllm``,
    ``numactl -N 0``, ``taskset -c 0-15``, ``stdbuf -oL``) run (``_wrapper_chain``)."""
    *_, start = _wrapper_chain(argv, pos)
    return start


def _wrapper_chain(argv: list[str], pos: int = 0) -> Iterator[int]:
    """Index of each of the wrappers at argv[pos] and after, one running the next, then, last, of the command they
    run (len(argv) where none). ``command -v`` or ``-V`` names the command and runs none (``command -v vllm``, as
    ``which`` does): it is the command itself, at its own index."""
    while pos < len(argv) and (name := argv[pos].rsplit("/", 1)[-1]) in _WRAPPERS:
        yield pos
        valued, operands = _WRAPPERS[name]
        wrapper, pos = pos, pos + 1
        while pos < len(argv) and argv[pos].startswith("-"):
            option = argv[pos]
            pos += 2 if option in valued else 1
            if option == "--":
                break
        if name == "command" and any(o != "--" and set(o) & {"v", "V"} for o in argv[wrapper + 1:pos]):
            return
        while name == "env" and pos < len(argv) and "=" in argv[pos]:
            pos += 1
        pos += operands
    yield pos


def _refuse_builtin(argv: list[str]) -> None:
    """Raises CommandLineError where the program that argv, the container's command and args, starts, or one a
    wrapper in front of it runs, is one of _BUILTINS: kubelet runs it with no shell, as a program, not the builtin
    that runs vLLM in the shell's place that it would be read as."""
    names = [argv[i].rsplit("/", 1)[-1] for i in _wrapper_chain(argv) if i < len(argv)]
    name = next((name for name in names if name in _BUILTINS), None)
    if name is not None:
        raise CommandLineError(
            f"the container's command starts {name}, a builtin of the shell, with no shell: kubelet runs it as a "
            f"program, which most images lack (vLLM's own), and where there is one, a script (RHEL's "
            f"/usr/bin/command) whose shell runs vLLM as its child, out of reach of the kubelet's SIGTERM; drop {name} "
            f"from the command, or run it in a shell's -c script"
        )


def _launched(argv: list[str], any_launches: bool) -> Iterator[str]:
    """The name (no path) of each program the command in argv starts, one behind the other: the one behind any
    _WRAPPERS (``_command_start``), then each word a launcher in front of it may run: past the launcher's options,
    the values of those known to take one (_LAUNCHERS; another launcher's options are taken to take none, so that
    the word after one may be the program it runs), ``NAME=value`` words (sudo's variables), a runner's ``run``,
    and any wrappers there. So an option's value is no program (``env -C /srv/parallel``, ``conda run -n
    parallel``). ``any_launches``: argv ends before vLLM's word, and each program in front of it starts the next;
    else only those of _LAUNCHERS are known to, and the first other one ends it (its words are its own arguments:
    ``sudo -u app /start.sh --mode parallel``)."""
    pos = _command_start(argv)
    while pos < len(argv):
        name = argv[pos].rsplit("/", 1)[-1]
        yield name
        if not any_launches and name not in _LAUNCHERS:
            return
        valued = _LAUNCHERS.get(name, set())
        pos = _options_end(argv, pos + 1, valued)
        if name in _RUNNERS and argv[pos : pos + 1] == ["run"]:
            pos = _options_end(argv, pos + 1, valued)
        pos = _command_start(argv, pos)


def _options_end(argv: list[str], pos: int, valued: set[str]) -> int:
    """Index of the first word from argv[pos] that is no option, no value of one in ``valued`` (the next word, after
    the option alone, ``-u app``, or last in a group of letters as getopt reads them, ``-Eu app``; ``-uapp`` and
    ``--user=app`` hold theirs) and no ``NAME=value``; the word after a ``--``."""
    while pos < len(argv) and (argv[pos].startswith("-") and argv[pos] != "-" or _ASSIGNMENT.fullmatch(argv[pos])):
        option = argv[pos]
        pos += 1
        if option == "--":
            break
        if option.startswith("--") or not option.startswith("-"):
            pos += option in valued
        else:
            pos += next((k for k, letter in enumerate(option[1:]) if f"-{letter}" in valued), None) == len(option) - 2
    return pos


def _shell_script_index(argv: list[str], shell: int) -> int | None:
    """Index in argv of the ``-c`` script of the shell at argv[shell]; None when it runs no -c script."""
    pos, letters = _shell_options(argv, shell + 1)
    if "c" not in letters:
        return None
    if pos == len(argv):
        raise CommandLineError("shell started with -c but no command string follows")
    return pos


def _shell_options(words: list[str], pos: int) -> tuple[int, str]:
    """Read the options of ``sh`` or of the ``set`` builtin from words[pos]: the index of the first operand,
    and the option letters given. ``-o NAME`` and ``+o NAME`` (bash's ``-O``/``+O`` too) take the next word,
    also in a group (``-eo pipefail``); ``--`` or ``-`` ends the options."""
    letters = ""
    while pos < len(words):
        word = words[pos]
        pos += 1
        if word in ("--", "-"):
            break
        if word.startswith("--"):  # bash's long options
            pos += 1 if word in ("--rcfile", "--init-file") else 0
        elif len(word) > 1 and word[0] in "-+":
            letters += word[1:]
            pos += sum(word[1:].count(letter) for letter in "oO")
        else:
            return pos - 1, letters
    return min(pos, len(words)), letters  # an option's value missing at the end


# Programs among _WRAPPERS that stay the container's first process and pass a signal on, to their child or its process
# group, rather than run the command in their place.
_INITS = {"tini", "dumb-init", "catatonit", "timeout"}
# Programs whose ``run`` runs the command as the child of a shell of their own and passes no signal on (among
# _LAUNCHERS, with their options): conda 26.7 (``conda run -n env vllm serve``) and hatch 1.18 (``hatch -e prod run
# vllm serve``), measured as PID 1 and behind tini. poetry 2.5 and pipenv 2026.10 run the command in their place,
# pdm 2.29 and uv 0.13 pass the signal on and wait: they let it reach vLLM.
_HOLDERS = {"conda", "hatch"}
# The shell's builtins that run vLLM in a script (``exec vllm serve``, ``command vllm serve``: one of _WRAPPERS), which
# no shell reads in list form (``_refuse_builtin``).
_BUILTINS = {"command", "exec"}
# Launchers the wrappers do not read past, known to run the rest of their argv, and those of their options that take a
# value as the next word, read only to find the program one starts, for _APPENDERS (``_launched``), and a holder's
# ``run`` (``_runs_holder``): sudo 1.9's (no wrapper: its -i and -s run the command in a shell, its -l lists it),
# runuser's (util-linux 2.38; a watcher, not read past for the SIGTERM), setpriv's (2.38, and 2.40's landlock and
# seccomp ones), and the ``run`` of conda, mamba, micromamba (2.0) and hatch (``_RUNNERS``), their options before and
# after ``run``.
_LAUNCHERS = {
    "sudo": {"-u", "--user", "-g", "--group", "-C", "--close-from", "-D", "--chdir", "-h", "--host", "-p", "--prompt",
             "-R", "--chroot", "-T", "--command-timeout", "-U", "--other-user", "-r", "--role", "-t", "--type"},
    "runuser": {"-u", "--user", "-g", "--group", "-G", "--supp-group", "-s", "--shell", "-w",
                "--whitelist-environment"},
    "setpriv": {"--ambient-caps", "--inh-caps", "--bounding-set", "--ruid", "--euid", "--reuid", "--rgid", "--egid",
                "--regid", "--groups", "--securebits", "--pdeathsig", "--selinux-label", "--apparmor-profile",
                "--landlock-access", "--landlock-rule", "--seccomp-filter"},
    "conda": {"-n", "--name", "-p", "--prefix", "--cwd"},
    "mamba": {"-n", "--name", "-p", "--prefix", "-r", "--root-prefix", "--cwd"},
    "micromamba": {"-n", "--name", "-p", "--prefix", "-r", "--root-prefix", "--cwd"},
    "hatch": {"-e", "--env", "-p", "--project", "--data-dir", "--cache-dir", "--config"},
}
# Those among _LAUNCHERS that run the command with a ``run`` subcommand.
_RUNNERS = {"conda", "mamba", "micromamba", "hatch"}
# User switches that stay the parent of the command they run, as util-linux's runuser and su do (a watching parent,
# which holds the PAM session): on a SIGTERM they pass it on, and kill the command WATCHER_KILL_SECONDS later.
_WATCHERS = {"runuser", "su"}
WATCHER_KILL_SECONDS = 2.0
WATCHER_ADVICE = (f"runuser and su stay vLLM's parent and kill it {WATCHER_KILL_SECONDS:g} s after the SIGTERM the "
                  "kubelet sends, whatever its --shutdown-timeout; run vLLM as its user with the container's "
                  "securityContext.runAsUser, or switch with setpriv, gosu or su-exec, which run it in their place")
# Their option that gives a shell a command to run (-c, bundled after options without a value, or --command,
# --session-command): before ``--``, as their getopt reads options anywhere among the operands.
_WATCHER_SCRIPT = re.compile(r"-[flmpP]*c|--(session-)?command(=|$)")


class Sigterm(StrEnum):
    """What the SIGTERM the kubelet sends a stopping container's first process does to vLLM
    (``CommandLine.sigterm``)."""

    REACHES = "Reaches"
    """vLLM gets it, and drains as ``--shutdown-timeout`` says."""
    IGNORED = "Ignored"
    """A shell that runs vLLM as its child, or ``conda run`` or ``hatch run``, is the first process, PID 1 of the
    container's PID namespace, which ignores a signal it set no handler for: vLLM serves on until the SIGKILL at the
    end of the grace period."""
    KILLS = "Kills"
    """An init in front of such a shell or runner (tini, dumb-init, catatonit, timeout) passes the signal on, that
    process dies of it, the init exits with it, and the kernel kills what is left of the PID namespace, vLLM with
    it, at once: no request in flight finishes, whatever the timeout."""
    CUT_SHORT = "CutShort"
    """vLLM gets it from a user switch that stays its parent (util-linux's runuser and su), which kills it
    ``WATCHER_KILL_SECONDS`` later: vLLM drains for at most that, whatever its ``--shutdown-timeout``."""


# What ``sh`` is in images whose base the operator knows, by repository (any registry or mirror path in front, any
# tag or digest): vLLM's own images build on Ubuntu, whose /bin/sh is dash (docker/Dockerfile: nvidia/cuda's
# ubuntu22.04 images for vllm/vllm-openai; docker/Dockerfile.cpu: ubuntu:22.04 for the CPU images its Kubernetes
# guide runs with ``/bin/sh -c``; AMD's rocm/vllm: rocm/dev-ubuntu images). Red Hat AI Inference Server's images
# (registry.redhat.io/rhaiis/vllm-cuda-rhel9, its documented name, and the rhaiis-preview one) build on UBI 9, whose
# /bin/sh is bash (5.1): it runs a script of one command in its place, as bash has since 2.0.
_IMAGE_SH = {
    "vllm/vllm-openai": "dash",
    "q9t5s3a7/vllm-cpu-release-repo": "dash",
    "q9t5s3a7/vllm-arm64-cpu-release-repo": "dash",
    "rocm/vllm": "dash",
    "rhaiis/vllm-cuda-rhel9": "bash",
    "rhaiis-preview/vllm-cuda-rhel9": "bash",
}
# Operators that put the command beside them in a child of the shell: a pipeline, the background, a subshell.
_CHILD_OPERATORS = {"|", "|&", "&", "(", ")"}
# Programs and builtins that only name the words after them (print, log, search for, signal, test, fetch or wait
# for them), never start them: ``vllm serve`` behind one of them is an argument (``echo waiting for vllm serve``,
# ``pkill -f vllm serve``, ``command -v vllm``); behind any other program it is taken to run (``python3 -m``,
# ``conda run``, a tracer such as ``ddtrace-run`` or ``opentelemetry-instrument``, ``nsys profile``, ``torchrun``).
_NAMERS = {"echo", "printf", "logger", "pkill", "pgrep", "pidof", "killall", "kill", "ps", "grep", "egrep", "fgrep",
           "test", "[", "[[", "curl", "wget", "cat", "tee", "true", "false", ":", "sleep", "which", "type", "for",
           "case", "command", "wait"}
# Programs that start the command in their argv with words they read as they run appended to it (from their input,
# xargs' or parallel's -a file, parallel's ``:::`` arguments): vLLM, or a script that may run it, started by one
# (``cat /args | xargs vllm serve M``, ``xargs -a /args /start.sh``) gets flags the operator cannot see, after its own.
_APPENDERS = {"xargs", "parallel"}
# Builtins and programs that prepare what a script runs next and start nothing: a script's command of one of them
# (``cd /app; exec /start.sh``, ``set -e; ...``) is no candidate for the one the image's entrypoint may run vLLM in.
_SETUP = {"set", "cd", "export", "source", ".", "trap", "ulimit", "umask", "mkdir", "unset", "shopt", "readonly",
          "declare", "chmod", "chown", "ln", "cp", "mv", "rm", "touch"}
# The shell's reserved words that may come before a command's name (``then vllm serve``, ``do vllm serve``), and those
# that close a compound command, its last word: none is a program (flags written after ``done`` break the script).
_RESERVED_WORDS = {"!", "{", "if", "then", "elif", "else", "while", "until", "do", "time", "done", "fi", "esac", "}"}
# The reserved words that open a compound command at a command's start, and the word that closes each (bash's select
# too: a loop, wherever the shell reads it); for case, the word its patterns follow (``_compound_commands`` reads
# its patterns and their commands to esac).
_COMPOUNDS = {"if": "fi", "while": "done", "until": "done", "for": "done", "select": "done", "case": "in", "{": "}"}
# A variable assignment before a command's name (``VAR=value vllm serve``).
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)

# A name a ConfigMap or Secret key can spell, so that a container's ``envFrom`` may set it.
_SOURCE_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class _Part:
    """A stretch of a command or args element after kubelet's ``$(VAR)`` expansion."""

    at: int  # where it starts in the expanded text
    text: str
    written: tuple[int, int]  # the characters of the element as written that it stands for
    variable: str | None = None  # the variable it is the value of; None: the element's own characters (or a $$)
    known: bool = True  # False: a variable whose value the operator cannot read, left as written

    @property
    def verbatim(self) -> bool:
        """Whether it is the element's own characters, one for one, so that an edit there edits them."""
        return self.variable is None and len(self.text) == self.written[1] - self.written[0]


class _Environment:
    """A container's variables as kubelet substitutes them for ``$(VAR)`` in its command and args.

    Kubelet sets the ``env`` entries in order, each ``value`` expanded with
    the variables before it, and leaves a reference to an undefined variable
    as written. The operator knows the literal values only: a variable set
    from a Secret, ConfigMap, field or resource (``valueFrom``), any name a
    ConfigMap or Secret key can spell when the container has ``envFrom``
    (literal ``env`` entries override those), and a value that refers to
    either, is unknown (None). Service links (``<SERVICE>_PORT``...) count as
    undefined: they hold addresses and ports, never flags.
    """

    def __init__(self, container: dict[str, Any]) -> None:
        self.values: dict[str, str | None] = {}
        self.from_sources = bool(container.get("envFrom"))
        for entry in container.get("env") or []:
            value = str(entry.get("value") or "")
            if value:
                parts = self.expand(value)
                self.values[entry["name"]] = "".join(p.text for p in parts) if all(p.known for p in parts) else None
            else:
                self.values[entry["name"]] = None if entry.get("valueFrom") else ""

    def expand(self, text: str) -> list[_Part]:
        """``text`` as kubelet expands it (Kubernetes' ``expansion.Expand``), in parts: ``$(VAR)`` is VAR's value,
        ``$$`` a ``$``; an undefined VAR, an unclosed ``$(`` and a ``$`` before any other character stay as written.
        A VAR whose value is unknown stays as written too, in a part marked not ``known``."""
        parts: list[_Part] = []

        def add(piece: str, lo: int, hi: int, variable: str | None = None, known: bool = True) -> None:
            part = _Part(parts[-1].at + len(parts[-1].text) if parts else 0, piece, (lo, hi), variable, known)
            if parts and parts[-1].verbatim and part.verbatim:  # one stretch of the element's own characters
                last = parts.pop()
                part = _Part(last.at, last.text + piece, (last.written[0], hi))
            parts.append(part)

        checkpoint = cursor = 0
        while cursor < len(text):
            if text[cursor] == "$" and cursor + 1 < len(text):
                add(text[checkpoint:cursor], checkpoint, cursor)
                close = text.find(")", cursor + 2) if text[cursor + 1] == "(" else -1
                if text[cursor + 1] == "$":
                    add("$", cursor, cursor + 2)
                    cursor += 1
                elif close < 0:  # not a reference: kept with the character after the $
                    add(text[cursor : cursor + 2], cursor, cursor + 2)
                    cursor += 1
                else:
                    name, written = text[cursor + 2 : close], text[cursor : close + 1]
                    if name in self.values:
                        value = self.values[name]
                        add(written if value is None else value, cursor, close + 1, name, value is not None)
                    elif self.from_sources and _SOURCE_KEY.fullmatch(name):
                        add(written, cursor, close + 1, name, known=False)
                    else:
                        add(written, cursor, close + 1)
                    cursor = close
                checkpoint = cursor + 1
            cursor += 1
        add(text[checkpoint:], checkpoint, len(text))
        return parts


@dataclass(frozen=True)
class CommandLine:
    """The vLLM command line of one container, parsed; ``with_flags`` rewrites it."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    words: tuple[Word, ...]
    shell_script: tuple[str, int] | None  # (field, index) of the shell script element
    script_parts: tuple[_Part, ...] = ()  # the shell script after kubelet's $(VAR) expansion, part by part
    sh: str | None = None  # what ``sh`` is in the container's image (``image_sh``); None: not known

    @classmethod
    def parse(cls, container: dict[str, Any]) -> CommandLine:
        """Parse ``command`` and ``args`` of a container (a dict as the API returns it), expanded with its ``env``
        as kubelet expands them. Raises CommandLineError for a form that cannot be read with certainty."""
        cmd = cls._split(container)
        # args alone are the image entrypoint's: where their first is vLLM's model (they name no vLLM command), no
        # program; where they hold one (exec vllm serve M, exec python3 -m vllm.entrypoints.openai.api_server, whose
        # model is no positional), that is how they are read, and refused alike
        if cmd.command or cmd.runs_vllm() or cmd._model_index() != 0:
            _refuse_builtin([*cmd.command, *cmd.args])
        if cmd.shell_script is not None:  # the script's command that gets the flags
            _refuse_watcher_script(cmd._segment_argv())
            cmd._refuse_function_arguments()
        cmd.flags()  # refuses now what cannot be read as flags, before anyone acts on the command
        return cmd

    @classmethod
    def _split(cls, container: dict[str, Any]) -> CommandLine:
        """The words of ``command`` and ``args``, not yet read as flags."""
        environment = _Environment(container)
        command = [str(w) for w in container.get("command") or []]
        args = [str(w) for w in container.get("args") or []]
        argv: list[Word] = []
        expanded: list[list[_Part]] = []
        for field, elements in (("command", command), ("args", args)):
            for i, element in enumerate(elements):
                expanded.append(parts := environment.expand(element))
                argv.append(Word("".join(p.text for p in parts), field, i, expands=not all(p.known for p in parts)))
        script_at = _script_position([w.text for w in argv])
        if script_at is None:
            return cls(tuple(command), tuple(args), tuple(argv), None)
        script, parts = argv[script_at], expanded[script_at]
        unknown = [(p.at, p.at + len(p.text)) for p in parts if not p.known]
        words = _script_words(script, argv[script_at + 2 :], unknown)
        return cls(tuple(command), tuple(args), tuple(words), (script.field, script.index), tuple(parts),
                   image_sh(str(container.get("image") or "")))

    def runs_vllm(self) -> bool:
        """True when the command invokes vLLM's server (``vllm serve`` or the api_server module)."""
        return any(self._is_vllm_word(i) for i in range(len(self.words)))

    def _simple_commands(self) -> list[tuple[int, int]]:
        """[start, end) word indices of each simple command of the script, between its operators (everything in
        list form)."""
        if self.shell_script is None:
            return [(0, len(self.words))]
        operators = [i for i, word in enumerate(self.words) if word.operator]
        return list(zip([0, *(i + 1 for i in operators)], [*operators, len(self.words)], strict=True))

    @functools.cached_property
    def _vllm_segment(self) -> tuple[int, int]:
        """[start, end) word indices of the simple command that runs vLLM; where none shows it, the only command
        (the image's entrypoint, or a script of its own, may run vLLM: ``exec /start.sh --max-num-seqs 64``).
        Raises CommandLineError for a script that runs vLLM in several commands (``vllm serve M || vllm serve M
        --enforce-eager``, one in each branch of an ``if``): the operator would read and rewrite only one of them;
        and for a script of several commands none of which shows it, where it cannot tell which one gets the
        flags (su's or runuser's own -c script among them is refused as such, ``_refuse_watcher_script``); and
        for the command chosen started by xargs (_APPENDERS), vLLM or one that may run it, which appends to it flags
        the operator cannot see, after the ones it would write.
        Read once, as ``_flags`` is (the command line is immutable): ``parse`` reads it first, so it raises there,
        and it is not read again for each flag, ``sigterm`` or ``with_flags``."""
        commands = self._simple_commands()
        vllm_words = {c: next((j for j in range(*c) if self._is_vllm_word(j)), None) for c in commands}
        running = [c for c in commands if vllm_words[c] is not None]
        if len(running) > 1:
            shown = " and ".join(repr(" ".join(w.text for w in self.words[slice(*c)])) for c in running)
            raise CommandLineError(
                f"the shell script runs vLLM in {len(running)} commands ({shown}), and the operator reads and rewrites "
                f"the flags of one only; start vLLM from a single command in the script (exec vllm serve ...), or "
                f"start it directly in the container's command and args"
            )
        segment = running[0] if running else self._only_command(commands)
        if (program := self._appender(segment, vllm_words[segment])) is not None:
            raise CommandLineError(
                f"{'vLLM' if running else 'the command that may run vLLM'} is started by {program}, which appends "
                f"the words it reads (its input, the file of -a, parallel's ::: arguments) to its command: flags the "
                f"operator cannot see, which may set the knobs again; write the flags in the vLLM command, and start "
                f"vLLM without {program}"
            )
        return segment

    def _appender(self, segment: tuple[int, int], vllm: int | None) -> str | None:
        """The program among _APPENDERS that starts the simple command ``segment``, whose vLLM word is at ``vllm``
        (None: it shows none), as ``_vllm_segment`` found it; None when none does. Its program, or one behind a
        launcher the wrappers do not read past (``sudo -u app xargs``), not an option's value (``_launched``): in
        front of vLLM's word, behind any launcher; where the command shows none, behind those known to run the rest
        of their argv (``sudo -u app xargs -a /args /start.sh``, as ``xargs -a /args /start.sh``)."""
        first, end = segment
        argv = self._argv(first, end if vllm is None else vllm)
        return next((name for name in _launched(argv, vllm is not None) if name in _APPENDERS), None)

    def _only_command(self, commands: list[tuple[int, int]]) -> tuple[int, int]:
        """The simple command that may run vLLM where none shows it, the image's entrypoint or a script of its own
        (``_vllm_segment``, which then refuses it as it refuses vLLM's own); raises CommandLineError where the script
        runs several programs, and where the one found is a word of a case pattern (``a|b)``), no command at all."""
        filled = [c for c in commands if c[0] < c[1]]
        programs = [c for c in filled if not self._prepares(c)]
        if len(programs) > 1 or (not programs and len(filled) > 1):
            for first, end in filled:  # su's own -c script is refused as such, with its own advice
                _refuse_watcher_script(self._argv(first, end))
            # a reserved word alone (fi, done, }) closes a compound command and is none
            count = len(programs) or sum(any(w.text not in _RESERVED_WORDS for w in self.words[first:end])
                                         for first, end in filled)
            raise CommandLineError(
                f"the shell script runs {count} command{'s' * (count != 1)} and none starts vLLM (vllm serve or "
                f"the api_server module), so the operator cannot tell which one would get the flags; start vLLM in "
                f"the script as exec vllm serve ... (any launcher in front of vllm may stay), or, where another "
                f"container runs vLLM, name that one in spec.targetRef.container"
            )
        chosen = (programs or filled or commands[-1:])[0]
        if chosen[0] in self._compound[1]:  # a word after a pattern's | or ( or a newline: no command
            raise CommandLineError(
                f"the only command the operator finds in the shell script, {self.words[chosen[0]].text!r}, is a "
                f"pattern of a case statement, where flags would break the script; run vLLM outside the case "
                f"statement (exec vllm serve ... after esac), or write the flags in the command it runs"
            )
        return chosen

    def _prepares(self, command: tuple[int, int]) -> bool:
        """Whether a script's simple command starts no program that could run vLLM: a builtin or program that
        prepares (``cd``, ``set -e``, ``export``: _SETUP), or one that only names what follows (_NAMERS)."""
        program = self._program(*command)
        return program is None or program in _SETUP | _NAMERS

    def _segment_argv(self) -> list[str]:
        """The words of the simple command that runs vLLM, from the program it starts (``_program_words``); all of
        argv in list form."""
        return self._argv(*self._vllm_segment)

    def _argv(self, first: int, end: int) -> list[str]:
        """The texts of words[first:end], a simple command: in a script from the program it starts
        (``_program_words``), in list form all of them."""
        texts = [w.text for w in self.words[first:end]]
        return texts if self.shell_script is None else _program_words(texts)

    def _program(self, first: int, end: int) -> str | None:
        """The name (no path) of the program that the simple command in words[first:end] starts (``_argv``), behind
        any _WRAPPERS: one reading for ``_is_vllm_word`` and ``_prepares``, which tell programs apart by it. None where
        it starts none (``env X=1``, ``VAR=1``)."""
        argv = self._argv(first, end)
        start = _command_start(argv)
        return argv[start].rsplit("/", 1)[-1] if start < len(argv) else None

    def _refuse_function_arguments(self) -> None:
        """Raises CommandLineError where the script's vLLM command passes on ``"$@"`` within a function's body, where
        it holds the arguments the function is called with (``_script_words`` leaves it as written, the word marked
        with the function it lies in)."""
        first, end = self._vllm_segment
        passed = next((w for w in self.words[first:end] if w.span and w.expands and w.text == "$@"), None)
        if passed is None:
            return
        raise CommandLineError(
            f'the script passes on "$@" within function {passed.function}, where it holds the arguments the function '
            f'is called with, which the operator does not follow; write the flags in the vLLM command, and run it '
            f'outside a function (exec vllm serve ... "$@" passes on the container\'s args)'
        )

    def _traps_term(self) -> bool:
        """Whether the script sets a ``trap`` on SIGTERM: then the shell handles the signal, may pass it to vLLM
        running as its child, and ends when its action and the script do (one ``wait`` for vLLM: at once, vLLM with
        it; a second: when vLLM has drained), which the operator does not read."""
        for start, end in self._simple_commands():
            texts = [w.text for w in self.words[start:end]]
            if texts[:1] == ["trap"] and {"TERM", "SIGTERM", "15"} & {t.upper() for t in texts[2:]}:  # bash: term
                return True
        return False

    def _is_vllm_word(self, i: int) -> bool:
        """Whether word ``i`` starts vLLM's server: the api_server module, or ``vllm`` (any path) before ``serve``,
        in a simple command whose program (``_program``) is vLLM or any program but one of _NAMERS, which only name
        it (``echo waiting for vllm serve``)."""
        if self.words[i].operator:
            return False
        text = self.words[i].text
        if text not in _VLLM_ENTRYPOINTS and not (
                text.rsplit("/", 1)[-1] == "vllm" and i + 1 < len(self.words) and self.words[i + 1].text == "serve"):
            return False
        start = next((j + 1 for j in range(i - 1, -1, -1) if self.words[j].operator), 0)
        return self._program(start, i) not in _NAMERS

    def _vllm_arguments(self) -> tuple[int, int]:
        """[start, end) word indices of vLLM's own arguments: those after ``vllm serve`` or the api_server module
        in the simple command that runs vLLM; all of it when neither is there (the image's entrypoint runs vLLM)."""
        start, end = self._vllm_segment
        for i in range(start, end):
            if self._is_vllm_word(i):
                return i + (1 if self.words[i].text in _VLLM_ENTRYPOINTS else 2), end
        return start, end

    def sigterm(self) -> Sigterm | None:
        """What the SIGTERM the kubelet sends a stopping container's first process does to vLLM.

        REACHES when vLLM is that process, or an init's child: started as a
        list (behind wrappers that run it in their place, or pass signals on),
        or by a ``-c`` script that replaces the shell with it (``exec vllm
        serve ...``, also in a compound command the shell runs itself, ``then
        exec vllm serve ...; fi``, or a bash script of that one command, which
        bash runs without forking). Not where a child of the shell runs it, exec
        or not: a pipeline, the background or a subshell holds vLLM's command,
        the and-or list it starts (``exec vllm serve ... || exit 1 &``) or a
        compound command or function call around it (``{ newline exec vllm
        serve ... newline } | tee log``, ``f &``, ``$(f)``), whose exec only
        replaces that child; those elsewhere in the script leave it in the
        shell's place. Otherwise the shell runs vLLM as its child: in a
        pipeline, the background or a subshell (``vllm serve ... | tee log``),
        or under dash (Debian's and Ubuntu's ``/bin/sh``), which forks for
        every command. Then it is IGNORED where the shell is the first
        process, and KILLS vLLM at once behind an init. ``sh`` is read as what
        it is in the image where the operator knows that (``image_sh``: dash
        in vLLM's own images, which vLLM's Kubernetes guide starts with
        ``/bin/sh -c``; bash in Red Hat's). None where it depends on what
        ``sh`` is in another image, or on the shell's version (bash 5.2 also
        replaces itself with the last command of ``a && b`` or ``a; b``), and
        where the script traps SIGTERM and so may pass it to its child
        (``_traps_term``).
        What each does was measured with dash 0.5.12, bash 5.2.15, tini
        0.19, dumb-init 1.2.5, catatonit 0.1.7 and coreutils' timeout as PID
        1 of a PID namespace (``tests/unit/test_cmdline_sigterm.py``).
        Where it would reach vLLM through runuser or su (util-linux 2.38
        measured), which stay vLLM's parent and kill it 2 s after passing it
        on, it is CUT_SHORT; uv's ``uv run`` (0.13 measured) passes it on and
        waits. ``conda run`` and ``hatch run`` (_HOLDERS) start vLLM from a
        shell of their own and pass no signal on: vLLM under them is IGNORED,
        KILLS behind an init, whatever a shell around them does.
        """
        first, end = self._vllm_segment
        vllm = next((i for i in range(first, end) if self._is_vllm_word(i)), None)
        reaches = (Sigterm.CUT_SHORT if vllm is not None and any(_is_watcher(w.text) for w in self.words[first:vllm])
                   else Sigterm.REACHES)
        argv = [*self.command, *self.args]
        start = _command_start(argv)
        segment = self._segment_argv()
        if reaches is Sigterm.REACHES and (vllm is not None or self.shell_script is None) and _runs_holder(segment):
            wrappers = [*(argv[:start] if self.shell_script is not None else []), *segment[:_command_start(segment)]]
            return Sigterm.KILLS if any(map(_is_init, wrappers)) else Sigterm.IGNORED
        if self.shell_script is None:
            return reaches
        shell = argv[start].rsplit("/", 1)[-1]
        if shell == "sh" and self.sh:
            shell = self.sh
        if vllm is None:  # the script runs vLLM by a name the operator does not know (the image's entrypoint)
            return None
        child = Sigterm.KILLS if any(map(_is_init, argv[:start])) else Sigterm.IGNORED
        if self._traps_term():  # the shell may pass the signal on to its child, and may wait for it or not
            child = None
        depths, patterns, _ = self._compound
        # a case pattern's ) before it (a) exec vllm serve M;;) opens no subshell
        around = {self.words[k].text for k in (first - 1, end) if 0 <= k < len(self.words) and k not in patterns}
        # a pipeline's or a background command runs in a child, exec or not; so does the whole and-or list vLLM's
        # command starts when it ends in & (exec vllm serve M || exit 1 &)
        if around & _CHILD_OPERATORS or self._forked(first, end, depths[vllm]):
            return child
        # exec puts vLLM in the shell's place, within a compound command or function too (then exec vllm serve),
        # unless one of those runs in a child, which the operator does not follow (_in_child)
        if _command_words([w.text for w in self.words[first:vllm]])[:1] == ["exec"] and not self._in_child(vllm):
            return reaches
        if shell == "bash" and not any(w.operator for w in self.words):
            return reaches
        return child if shell == "dash" else None

    def _forked(self, first: int, end: int, depth: int) -> bool:
        """Whether the shell runs the command of words[first:end], at ``depth`` compound commands deep, in a child:
        a pipeline's (a ``|`` or ``|&`` beside it, ``!`` or ``time`` before a compound command let through), or
        the background's, where the and-or list it is in (``&&``, ``||``, with any pipeline and deeper words) ends
        in ``&``. A case pattern's ``|`` is none."""
        words, (depths, patterns, _) = self.words, self._compound
        before = first - 1
        while before >= 0 and not words[before].operator and words[before].text in ("!", "time"):
            before -= 1
        if before >= 0 and words[before].text in ("|", "|&") and words[before].operator and before not in patterns:
            return True
        chain = ("&&", "||", "|", "|&")
        for k in range(end, len(words)):
            # a subshell's ( and ) within the list (``|| (echo failed; exit 1) &``) neither end it nor fork it
            if not words[k].operator or depths[k] > depth or k in patterns or words[k].text in ("(", ")"):
                continue
            if words[k].text in ("|", "|&", "&") and (k == end or words[k].text == "&"):
                return True
            # a newline after && or || (or a pipe's |) goes on with the list
            if words[k].text not in chain and not (words[k].text == "\n" and words[k - 1].text in chain):
                return False
        return False

    def _in_child(self, k: int) -> bool:
        """Whether the shell runs word ``k`` in a child because of a compound command around it: a ``( )``
        subshell, or one piped or in the background (``_forked``: ``{ newline exec vllm serve ... newline } | tee
        log``); within a function, also where the script calls the function so (``f | tee log``, ``f &``), or in a
        command substitution (``$(f)``), which the operator does not tell from a call of it in the shell itself. A
        sibling compound command or function definition ``()`` elsewhere in the script leaves it where it is."""
        depths, _, spans = self._compound
        if any(opens < k < closes and (closer == ")" or self._forked(opens, closes + 1, depths[opens]))
               for opens, closes, closer in spans):
            return True
        function = self.words[k].function
        if function is None:
            return False
        substituted = re.compile(rf"(\$\(|`)\s*{re.escape(function)}\b")
        for j, word in enumerate(self.words):
            if word.operator or word.function == function:
                continue
            if substituted.search(word.text):
                return True
            first, end = self._command_at(j)
            called = _command_words([w.text for w in self.words[first : j + 1]]) == [function]
            # not its definition, name ( ) { ...; }
            if called and all(w.text != "(" for w in self.words[j + 1 : j + 2]) and (
                    self._forked(first, end, depths[j]) or self._in_child(j)):
                return True
        return False

    def _command_at(self, k: int) -> tuple[int, int]:
        """[start, end) word indices of the simple command that holds word ``k``."""
        return next(c for c in self._simple_commands() if c[0] <= k < c[1])

    @functools.cached_property
    def _compound(self) -> tuple[list[int], set[int], list[tuple[int, int, str]]]:
        """``_compound_commands`` of the words, read once."""
        return _compound_commands(list(self.words))

    def _model_index(self) -> int | None:
        """Index of the word vLLM takes as the model: the positional argument of ``vllm serve``, or in args-only
        form (the image's entrypoint is ``vllm serve``) a leading one; None when there is none."""
        start, end = self._vllm_segment
        index = next((i + 2 for i in range(start, end - 2)
                      if self.words[i + 1].text == "serve" and self._is_vllm_word(i)), None)
        if index is None and self.shell_script is None and not self.command and self.args:
            index = 0
        if index is None or self.words[index].operator or self.words[index].text.startswith("-"):
            return None
        return index

    def flags(self) -> list[Flag]:
        """Every ``--flag`` (and known one-dash alias) vLLM gets, in order.

        Raises CommandLineError for an abbreviation of several flags, and for
        an expansion vLLM gets where it takes flags: anything but a flag's
        value or the model (``vllm serve M $VLLM_ARGS``) may expand to any
        flags, the data-parallel size and chunked prefill among them.
        """
        return list(self._flags)

    @functools.cached_property
    def _flags(self) -> tuple[Flag, ...]:
        """:meth:`flags`, read once: the command line is immutable, and each ``get`` reads from here."""
        start, end = self._vllm_arguments()
        found: list[Flag] = []
        readable = {self._model_index()}  # words whose expansion stands for the model or a flag's value
        i = start
        while i < end:
            word = self.words[i]
            spelling, eq, inline = word.text.partition("=")
            name = None if word.operator else _flag_name(spelling)
            if name is None:
                i += 1
                continue
            if not any(c in spelling for c in _EXPANSION_CHARACTERS):
                readable.add(i)
            if eq:
                found.append(Flag(name, inline, word, None, spelling))
            elif i + 1 < end and self._is_value(self.words[i + 1]) and (
                    self._takes_value(name) or self.words[i + 1].text.lower() in ("true", "false")):
                # a boolean flag's True/False after a space: older vLLM's `--enable-chunked-prefill False`
                # (argparse nargs='?' with vLLM's StoreBoolean action)
                found.append(Flag(name, self.words[i + 1].text, word, self.words[i + 1], spelling))
                i += 1
                readable.add(i)
            else:
                found.append(Flag(name, None, word, None, spelling))
            i += 1
        for i in range(start, end):
            if self.words[i].expands and i not in readable:
                raise CommandLineError(
                    f"{self.words[i].text} in the vLLM command is expanded as the container starts, where vLLM takes "
                    f"flags: it may hold flags the operator cannot read (the knobs, --data-parallel-size, "
                    f"--no-enable-chunked-prefill, --max-model-len); write the flags literally in the command or "
                    f"args (an expansion may stand only for a flag's value or the model)"
                )
        return tuple(found)

    @staticmethod
    def _takes_value(name: str) -> bool:
        return name not in _BOOLEAN_FLAGS and not name.startswith(_BOOLEAN_PREFIXES)

    @staticmethod
    def _is_value(word: Word) -> bool:
        text = word.text
        return not word.operator and not text.startswith("--") and text.partition("=")[0] not in _SHORT_ALIASES

    def get(self, name: str) -> Flag | None:
        """The effective occurrence of a flag (the last one, as argparse takes it), or None."""
        name = normalise(name)
        matches = [f for f in self.flags() if f.name == name]
        return matches[-1] if matches else None

    def values(self, name: str) -> list[str]:
        """The values of the effective occurrence of a flag that takes several (argparse's ``nargs='+'``:
        ``--lora-modules a=/p b=/q``): its value and the words after it up to the next flag (``--name=value`` takes
        that one only, as argparse does); empty when absent."""
        flag = self.get(name)
        if flag is None or flag.value is None:
            return []
        found = [flag.value]
        if flag.value_word is not None:
            _, end = self._vllm_arguments()
            i = next(i for i, word in enumerate(self.words) if word is flag.value_word) + 1
            while i < end and self._is_value(self.words[i]):
                found.append(self.words[i].text)
                i += 1
        return found

    def get_int(self, name: str) -> int | None:
        """An integer flag's value, read with the type vLLM gives the flag: None when absent, ``None`` or empty
        where vLLM reads that as absent, and for --max-model-len ``auto``. Raises CommandLineError for a value vLLM
        refuses or one below 1."""
        flag = self.get(name)
        if flag is None or flag.value in ("", "None") and flag.name in _OPTIONAL_INTS:
            return None
        parse = int_type(flag.name)
        if flag.value is not None:
            with contextlib.suppress(ValueError):
                value = parse(flag.value)
                if value is None or value >= 1:
                    return value
        example = "a plain number such as 64 (vLLM takes no k or K suffix here)" if parse is int else (
            "a size such as 8192, 8k or 8K")
        raise CommandLineError(
            f"{flag.spelling} has value {flag.value!r}, not a positive integer as vLLM reads this flag; write "
            f"{example} (environment or shell expansions cannot be tuned)"
        )

    def get_bool(self, name: str) -> bool | None:
        """A ``--name`` / ``--no-name`` boolean flag: True, False, or None when absent."""
        name = normalise(name)
        result: bool | None = None
        for flag in self.flags():
            if flag.name == name:
                result = flag.value is None or flag.value.lower() in ("true", "1", "yes")
            elif flag.name == f"no-{name}":
                result = False
        return result

    def model(self) -> str | None:
        """The model vLLM loads: the positional argument of ``vllm serve`` (which vLLM prefers), else ``--model``."""
        index = self._model_index()
        if index is not None:
            return self.words[index].text
        flag = self.get("model")
        return flag.value if flag is not None else None

    def with_flags(self, values: dict[str, int]) -> dict[str, list[str]]:
        """``command`` and ``args`` with the given integer flags set, changing nothing else.

        Existing occurrences (all of them) get the new value in their own
        spelling and style; absent flags are added after the vLLM command,
        ``--name value`` or ``--name=value`` like the other flags there.
        Raises CommandLineError where that would change what kubelet puts in
        for a ``$(VAR)``: the operator changes the command line only.
        """
        values = {normalise(name): value for name, value in values.items()}
        fields = {"command": list(self.command), "args": list(self.args)}
        script_edits: list[tuple[tuple[int, int], str]] = []  # (span as written, replacement) in the shell script
        flags = self.flags()
        for flag in flags:
            if flag.name in values:
                new = str(values[flag.name])
                word, text = (flag.value_word, new) if flag.value_word else (flag.flag_word, f"{flag.spelling}={new}")
                if word.span is None:
                    fields[word.field][word.index] = text
                else:
                    script_edits.append((self._as_written(word.span, flag.spelling), _shell_quote(text)))
        present = {f.name for f in flags}
        added = [w for name, v in values.items() if name not in present for w in self._new_flag_words(name, str(v))]
        if added:
            _, end = self._vllm_segment
            if end == 0 and self.shell_script is not None:
                raise CommandLineError("the shell's -c script is empty: there is no vLLM command to set flags on")
            last = self.words[end - 1] if end else Word("", "args", -1)  # no command or args: the image runs vLLM
            if last.span is None:  # an element: list form, or a positional parameter passed to the script
                fields[last.field][last.index + 1 : last.index + 1] = added
            else:
                at = self._as_written((last.span[1], last.span[1]), "the end of the vLLM command")
                script_edits.append((at, " " + " ".join(map(_shell_quote, added))))
        if self.shell_script is not None:
            field, index = self.shell_script
            script = fields[field][index]
            for (lo, hi), text in sorted(script_edits, reverse=True):
                script = script[:lo] + text + script[hi:]
            fields[field][index] = script
        return fields

    def _as_written(self, span: tuple[int, int], what: str) -> tuple[int, int]:
        """Where ``span`` of the expanded shell script (an empty one: a place to insert) is in the script as
        written. Raises CommandLineError, saying ``what`` is there, when it lies in a variable's value."""
        lo, hi = span
        for part in self.script_parts:
            end = part.at + len(part.text)
            if part.verbatim and part.at <= lo and hi <= end:
                return part.written[0] + lo - part.at, part.written[0] + hi - part.at
            if lo == hi == end:  # just after a variable's value
                return part.written[1], part.written[1]
        names = sorted({f"$({p.variable})" for p in self.script_parts
                        if p.variable is not None and p.at <= hi and lo <= p.at + len(p.text)})
        raise CommandLineError(
            f"{what} comes from {' and '.join(names) or 'a $$ escape'} of the container's env, which the operator "
            f"does not change; write it literally in the command or args"
        )

    def _new_flag_words(self, name: str, value: str) -> list[str]:
        flags = self.flags()
        equals_style = bool(flags) and all(f.value_word is None and f.value is not None for f in flags if f.value)
        spelling = f"--{normalise(name)}"
        return [f"{spelling}={value}"] if equals_style else [spelling, value]


def _script_words(script: Word, positional: list[Word], unknown: list[tuple[int, int]]) -> list[Word]:
    """The words of a ``-c`` script, those that overlap a span in ``unknown`` (a variable whose value the operator
    cannot read) marked as expansions. A ``"$@"`` word stands for the positional parameters, the argv words after
    ``$0`` (``sh -c 'exec vllm serve "$@"' -- M --max-num-seqs 64``): those reach vLLM as they are, so they are
    read and rewritten as elements. Within a function's body they are the function's arguments: a ``"$@"`` there is
    left as written (``CommandLine._refuse_function_arguments`` refuses it in vLLM's command), and its words are not
    checked. Raises CommandLineError where the script uses them in another way: reads them one by one (``$1``), or
    changes them (``set --``, ``shift``; also where the container passes none, as the script passes on what it
    sets)."""
    shell_words = split_shell(script.text)
    bodies = _function_bodies(shell_words)
    words: list[Word] = []
    passes_on = False  # the script passes its arguments on as "$@"
    for text, (lo, hi), operator, expands in shell_words:
        function = _function_at(bodies, (lo, hi))
        if operator or script.text[lo:hi] not in ('"$@"', "$@") or function is not None:
            expands = expands or any(a < hi and lo < b for a, b in unknown)
            words.append(Word(text, script.field, script.index, (lo, hi), operator, expands, function))
            continue
        if script.text[lo:hi] == "$@" and any(re.search(r"[\s*?[]", w.text) or not w.text for w in positional):
            raise CommandLineError('unquoted $@ splits and expands its arguments; write "$@"')
        words.extend(positional)
        passes_on = True
    if not positional and not passes_on:
        return words
    for k, word in enumerate(words):
        if word.span is None or word.function is not None:
            continue
        if re.search(r"\$\{?[1-9@*]", word.text):
            raise CommandLineError(f'the script uses its arguments as {word.text}; pass them to vLLM as "$@"')
        if word.text == "shift" or word.text == "set" and _sets_positionals(words, k):
            raise CommandLineError(
                f"the script changes its arguments ({word.text}), which the operator does not follow; write the flags "
                f'in the vLLM command, and pass the container\'s args to it unchanged as "$@"'
            )
    return words


def _function_bodies(words: list[ShellWord]) -> list[tuple[str, tuple[int, int]]]:
    """The name and character span of the body of each function a script defines (``name() { ...; }``,
    ``name() ( ... )``, bash's ``function name { ...; }``): to the word that closes it, or to the end of the script
    for a body of another kind."""
    bodies: list[tuple[str, tuple[int, int]]] = []
    kinds = [(text, operator) for text, _, operator, _ in words]
    parentheses = [("(", True), (")", True)]
    for k, (text, operator) in enumerate(kinds):
        if kinds[k + 1 : k + 3] == parentheses and not operator:
            name, body = text, k + 3
        elif (text, operator) == ("function", False) and (k == 0 or kinds[k - 1][1]) and k + 1 < len(words):
            name, body = words[k + 1][0], k + 2 + 2 * (kinds[k + 2 : k + 4] == parentheses)
        else:
            continue
        while body < len(words) and kinds[body] == ("\n", True):
            body += 1
        if body == len(words):
            continue
        closer = {("{", False): ("}", False), ("(", True): (")", True)}.get(kinds[body])
        depth, end = 0, len(words) - 1
        for j in range(body, len(words) if closer else body):
            depth += (kinds[j] == kinds[body]) - (kinds[j] == closer)
            if depth == 0:
                end = j
                break
        bodies.append((name, (words[body][1][0], words[end][1][1])))
    return bodies


def _function_at(bodies: list[tuple[str, tuple[int, int]]], span: tuple[int, int]) -> str | None:
    """The name of the function among ``bodies`` (``_function_bodies``) whose body holds ``span``; None if none."""
    return next((name for name, (a, b) in bodies if a <= span[0] and span[1] <= b), None)


def _compound_commands(words: list[Word]) -> tuple[list[int], set[int], list[tuple[int, int, str]]]:
    """How many compound commands hold each of a script's words (``if``, a loop, ``case``, ``{ }``, a ``( )``
    subshell), read from the words at a command's start that open and close them, however many lines they span; the
    indices of the words and operators of case patterns (``a|b)``), which are no command, pipeline or subshell; and
    where each compound command opens and closes (word indices) and what closed it (``)``: a subshell), not a
    function's ``name ( )``. ``sigterm`` reads from them whether exec puts vLLM in the shell's place: not where the
    compound command it runs in is a subshell, or is piped or in the background (``{ newline exec vllm serve ...
    newline } | tee log``); a sibling one that is (``ray start &`` in another branch) leaves it there."""
    depths: list[int] = []
    patterns: set[int] = set()
    spans: list[tuple[int, int, str]] = []
    stack: list[tuple[str, int]] = []  # what closes each open one, and where it opened: its word; ")" a subshell,
    # "()" a function's parentheses; a case's state: "in" (its word, then its patterns), "pattern" (to its ")"), "esac"
    # (a pattern's commands)
    command = True  # the word is at a command's start, where the shell reads reserved words

    def close(k: int) -> None:
        closer, opens = stack.pop()
        if closer != "()":
            spans.append((opens, k, closer))

    for k, word in enumerate(words):
        depths.append(len(stack))
        top = stack[-1][0] if stack else None
        if top == "in":
            if (word.text, word.operator) == ("in", False):
                stack[-1] = ("pattern", stack[-1][1])
        elif top == "pattern":
            patterns.add(k)
            if (word.text, word.operator) == (")", True):
                stack[-1], command = ("esac", stack[-1][1]), True
            elif (word.text, word.operator) == ("esac", False):
                close(k)
                command = False
        elif word.operator:
            if word.text == ";;" and top == "esac":
                stack[-1] = ("pattern", stack[-1][1])
            elif word.text == "(":  # a subshell at a command's start; after a name, a function's ``()``
                stack.append((")" if command else "()", k))
            elif word.text == ")" and top in (")", "()"):
                close(k)
            command = True
        elif command and word.text in _COMPOUNDS:
            stack.append((_COMPOUNDS[word.text], k))
            command = word.text not in ("for", "select", "case")  # their name and words come first
        elif command and word.text == top:
            close(k)
            command = False
        else:
            command = command and (word.text in _RESERVED_WORDS or bool(_ASSIGNMENT.fullmatch(word.text)))
    return depths, patterns, spans


def _sets_positionals(words: list[Word], k: int) -> bool:
    """Whether the ``set`` at words[k] sets the positional parameters (``set -- a``, ``set a``), not only options."""
    pos, _ = _shell_options([w.text for w in words], k + 1)
    return words[pos - 1].text in ("--", "-") or (pos < len(words) and not words[pos].operator)


def _shell_quote(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_./=:,+-]+", text) else "'" + text.replace("'", "'\"'\"'") + "'"


def find_vllm_container(pod_spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The container that runs vLLM: the named one, else the one whose command runs vLLM, else the only container
    whose image is a vLLM image. Raises CommandLineError saying what to set where that is not one container, and
    where one runs vLLM beside a vLLM image with no command, whose entrypoint may run vLLM too."""
    containers = pod_spec.get("containers") or []
    names = ", ".join(c.get("name", "?") for c in containers) or "none"
    if name is not None:
        for container in containers:
            if container.get("name") == name:
                return container
        raise CommandLineError(f"no container named {name!r} in the pod template (containers: {names})")
    running = [c for c in containers if _runs_vllm(c)]
    by_image = [c for c in containers if "vllm" in str(c.get("image", "")).lower()]
    entrypoints = [c for c in by_image if not c.get("command") and all(c is not r for r in running)]
    candidates = [*running, *entrypoints] if running else by_image
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise CommandLineError(f"no container runs vLLM (vllm serve or the api_server module); set "
                               f"spec.targetRef.container to one of: {names}")
    described = [c.get("name", "?") + (" (its command runs vLLM)" if any(c is r for r in running) else
                                       " (a vLLM image, whose entrypoint may run vLLM)") for c in candidates]
    raise CommandLineError(f"several containers may run vLLM: {', '.join(described)}; the operator does not choose "
                           f"between them: set spec.targetRef.container to the one to tune")


def _runs_vllm(container: dict[str, Any]) -> bool:
    """Whether the container's command runs vLLM; a command that cannot be read is taken not to (a sidecar's
    must not stop the search, and vLLM's own then fails to parse with its own message)."""
    try:
        return CommandLine._split(container).runs_vllm()
    except CommandLineError:
        return False


def with_container_command(container: dict[str, Any], fields: dict[str, list[str]]) -> dict[str, Any]:
    """A copy of the container with new ``command``/``args`` (absent ones stay absent)."""
    out = copy.deepcopy(container)
    for key, value in fields.items():
        if value or key in container:
            out[key] = value
    return out
