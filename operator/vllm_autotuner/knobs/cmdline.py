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
list form each element is a word. In shell form the script string is split
into words by a small POSIX-shell tokenizer that remembers each word's
character span, so a value can be replaced in place. Flags are then read the
way vLLM's argument parser reads them: names normalised (underscores ->
dashes), ``--flag=value`` or ``--flag value``, the one-dash aliases of the
flags read here (``-dp 2``), the last occurrence wins.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

SHELLS = {"sh", "bash", "ash", "dash", "zsh"}

# Words that show a command runs vLLM's OpenAI server.
_VLLM_ENTRYPOINTS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

# vLLM flags that take no value. Any other flag followed by a non-flag word
# takes that word as its value (argparse's behaviour for vLLM's options).
_BOOLEAN_PREFIXES = ("enable-", "disable-", "no-")
_BOOLEAN_FLAGS = {"trust-remote-code", "enforce-eager", "async-scheduling", "headless", "api-server-count-auto"}

# vLLM's one-dash aliases of flags read here (argparse takes ``-dp 2`` and ``-dp=2`` as ``--data-parallel-size 2``).
_SHORT_ALIASES = {"-tp": "tensor-parallel-size", "-dp": "data-parallel-size", "-dpl": "data-parallel-size-local"}

# Shell metacharacters that end a simple command (``;``, ``&&``, ``|``, ...).
_OPERATOR_CHARS = set(";&|()<>\n")


def human_readable_int(text: str) -> int | None:
    """An integer as vLLM's argument parser reads its size flags (``--max-num-batched-tokens``,
    ``--max-model-len``): plain (``8192``), with a decimal suffix k/m/g/t (``8k`` = 8000, ``25.6k``) or a binary
    one K/M/G/T (``8K`` = 8192, whole numbers only); None when it is none of these."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmgtKMGT]?)", text.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    if "." in number:
        return None
    return int(number) * (1024 ** ("KMGT".index(suffix) + 1) if suffix else 1)


class CommandLineError(ValueError):
    """The container's command cannot be read or rewritten; the message says what to change."""


@dataclass(frozen=True)
class Word:
    """One argv word: its text after shell unquoting, and where it came from."""

    text: str
    field: str  # "command" or "args"
    index: int  # element index within that field
    span: tuple[int, int] | None = None  # character span within a shell script element
    operator: bool = False  # a shell operator (;, &&, |, >...), not an argv word


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
    """The normalised name of the flag spelled ``spelling`` (the part before any ``=``); None when no flag."""
    if spelling.startswith("--"):
        return normalise(spelling) if spelling != "--" else None
    return _SHORT_ALIASES.get(spelling)


def split_shell(script: str) -> list[tuple[str, tuple[int, int], bool]]:
    """Split a POSIX shell script into (text, span, is_operator) words.

    Handles single and double quotes, backslash escapes, and the operators
    that separate commands; a digit-only word glued to a redirection (``2>``)
    is part of the operator. Expansions (``$VAR``) are kept literally: the
    operator only ever reads integer flag values.
    """
    words: list[tuple[str, tuple[int, int], bool]] = []
    i, n = 0, len(script)
    while i < n:
        ch = script[i]
        if ch in " \t":
            i += 1
            continue
        start = i
        if ch in _OPERATOR_CHARS:
            i = _operator_end(script, i)
            words.append((script[start:i], (start, i), True))
            continue
        text = []
        while i < n and script[i] not in " \t" and script[i] not in _OPERATOR_CHARS:
            ch = script[i]
            if ch == "\\" and i + 1 < n:
                if script[i + 1] != "\n":
                    text.append(script[i + 1])
                i += 2
            elif ch in "'\"":
                end = script.find(ch, i + 1)
                if end < 0:
                    raise CommandLineError(f"unbalanced {ch} quote in shell command: {script!r}")
                text.append(script[i + 1 : end])
                i = end + 1
            else:
                text.append(ch)
                i += 1
        word = "".join(text)
        if i < n and script[i] in "<>" and word.isdigit():
            i = _operator_end(script, i)
            words.append((script[start:i], (start, i), True))
            continue
        words.append((word, (start, i), False))
    return words


def _operator_end(script: str, i: int) -> int:
    """End of the operator starting at i; a duplication (``>&1``, ``<&-``) includes its target."""
    n = len(script)
    while i < n and script[i] in _OPERATOR_CHARS:
        i += 1
    if script[i - 2 : i] in (">&", "<&"):
        while i < n and (script[i].isdigit() or script[i] == "-"):
            i += 1
    return i


def _is_shell(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in SHELLS


def _shell_script_position(command: list[str], args: list[str]) -> tuple[str, int] | None:
    """Where the ``-c`` script of a shell invocation is: (field, index), or None for list form."""
    argv = [("command", i, w) for i, w in enumerate(command)] + [("args", i, w) for i, w in enumerate(args)]
    if not argv:
        return None
    first = 1 if argv[0][2].rsplit("/", 1)[-1] == "env" and len(argv) > 1 else 0
    if not _is_shell(argv[first][2]):
        return None
    for pos in range(first + 1, len(argv)):
        word = argv[pos][2]
        if not word.startswith("-"):
            return None
        if "c" in word.lstrip("-") and not word.startswith("--"):
            if pos + 1 < len(argv):
                return argv[pos + 1][0], argv[pos + 1][1]
            raise CommandLineError("shell started with -c but no command string follows")
    return None


@dataclass(frozen=True)
class CommandLine:
    """The vLLM command line of one container, parsed; ``with_flags`` rewrites it."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    words: tuple[Word, ...]
    shell_script: tuple[str, int] | None  # (field, index) of the shell script element

    @classmethod
    def parse(cls, container: dict[str, Any]) -> CommandLine:
        """Parse ``command`` and ``args`` of a container (a dict as the API returns it)."""
        command = [str(w) for w in container.get("command") or []]
        args = [str(w) for w in container.get("args") or []]
        script_at = _shell_script_position(command, args)
        words: list[Word] = []
        if script_at is None:
            words = [Word(w, "command", i) for i, w in enumerate(command)] + [
                Word(w, "args", i) for i, w in enumerate(args)
            ]
        else:
            field, index = script_at
            script = (command if field == "command" else args)[index]
            words = [
                Word(text, field, index, span, op) for text, span, op in split_shell(script)
            ]
        return cls(tuple(command), tuple(args), tuple(words), script_at)

    def runs_vllm(self) -> bool:
        """True when the command invokes vLLM's server (``vllm serve`` or the api_server module)."""
        texts = [w.text for w in self.words if not w.operator]
        for i, text in enumerate(texts):
            if text.rsplit("/", 1)[-1] == "vllm" and i + 1 < len(texts) and texts[i + 1] == "serve":
                return True
            if text in _VLLM_ENTRYPOINTS:
                return True
        return False

    def _vllm_segment(self) -> tuple[int, int]:
        """[start, end) word indices of the simple command that runs vLLM (everything in list form)."""
        if self.shell_script is None:
            return 0, len(self.words)
        start = 0
        for i, word in enumerate(self.words):
            if word.operator:
                if any(self._is_vllm_word(j) for j in range(start, i)):
                    return start, i
                start = i + 1
        return start, len(self.words)

    def _is_vllm_word(self, i: int) -> bool:
        text = self.words[i].text
        return text in _VLLM_ENTRYPOINTS or (
            text.rsplit("/", 1)[-1] == "vllm" and i + 1 < len(self.words) and self.words[i + 1].text == "serve"
        )

    def flags(self) -> list[Flag]:
        """Every ``--flag`` (and known one-dash alias) of the vLLM command, in order."""
        start, end = self._vllm_segment()
        found: list[Flag] = []
        i = start
        while i < end:
            word = self.words[i]
            spelling, eq, inline = word.text.partition("=")
            name = None if word.operator else _flag_name(spelling)
            if name is None:
                i += 1
                continue
            if eq:
                found.append(Flag(name, inline, word, None, spelling))
            elif self._takes_value(name) and i + 1 < end and self._is_value(self.words[i + 1]):
                found.append(Flag(name, self.words[i + 1].text, word, self.words[i + 1], spelling))
                i += 1
            else:
                found.append(Flag(name, None, word, None, spelling))
            i += 1
        return found

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

    def get_int(self, name: str) -> int | None:
        """An integer flag's value, or None when absent. Raises CommandLineError when not an integer."""
        flag = self.get(name)
        if flag is None:
            return None
        value = None if flag.value is None else human_readable_int(flag.value)
        if value is None:
            raise CommandLineError(
                f"{flag.spelling} has value {flag.value!r}, not an integer; write a literal number such as 8192, "
                f"8k or 8K (environment or shell expansions cannot be tuned)"
            )
        return value

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
        """The model vLLM loads: the positional argument of ``vllm serve`` (which
        vLLM prefers), else ``--model``; in args-only form (the image's
        entrypoint is ``vllm serve``) a leading non-flag word is the positional."""
        start, end = self._vllm_segment()
        positional = None
        for i in range(start, end - 2):
            if self.words[i + 1].text == "serve" and self._is_vllm_word(i):
                positional = i + 2
                break
        else:
            if self.shell_script is None and not self.command and self.args:
                positional = 0
        if positional is not None:
            word = self.words[positional]
            if not word.operator and not word.text.startswith("-"):
                return word.text
        flag = self.get("model")
        return flag.value if flag is not None else None

    def with_flags(self, values: dict[str, int]) -> dict[str, list[str]]:
        """``command`` and ``args`` with the given integer flags set, changing nothing else.

        Existing occurrences (all of them) get the new value in their own
        spelling and style; absent flags are added after the vLLM command,
        ``--name value`` or ``--name=value`` like the other flags there.
        """
        values = {normalise(name): value for name, value in values.items()}
        fields = {"command": list(self.command), "args": list(self.args)}
        present = {f.name for f in self.flags()}
        edits: list[tuple[Word, str]] = []  # (word, replacement text) for list form and shell spans
        for flag in self.flags():
            if flag.name in values:
                new = str(values[flag.name])
                if flag.value_word is not None:
                    edits.append((flag.value_word, new))
                else:
                    edits.append((flag.flag_word, f"{flag.spelling}={new}"))
        missing = [(name, str(v)) for name, v in values.items() if name not in present]
        if self.shell_script is None:
            for word, text in edits:
                fields[word.field][word.index] = text
            tail = "args" if fields["args"] or not fields["command"] else "command"
            for name, value in missing:
                fields[tail].extend(self._new_flag_words(name, value))
        else:
            field, index = self.shell_script
            script = fields[field][index]
            inserts: list[tuple[tuple[int, int], str]] = [(w.span, _shell_quote(t)) for w, t in edits]
            if missing:
                _, end = self._vllm_segment()
                last = self.words[end - 1] if end > 0 else None
                at = last.span[1] if last is not None and last.span else len(script)
                added = " ".join(" ".join(_shell_quote(t) for t in self._new_flag_words(n, v)) for n, v in missing)
                inserts.append(((at, at), " " + added))
            for (lo, hi), text in sorted(inserts, key=lambda e: e[0], reverse=True):
                script = script[:lo] + text + script[hi:]
            fields[field][index] = script
        return fields

    def _new_flag_words(self, name: str, value: str) -> list[str]:
        flags = self.flags()
        equals_style = bool(flags) and all(f.value_word is None and f.value is not None for f in flags if f.value)
        spelling = f"--{normalise(name)}"
        return [f"{spelling}={value}"] if equals_style else [spelling, value]


def _shell_quote(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_./=:,+-]+", text) else "'" + text.replace("'", "'\"'\"'") + "'"


def find_vllm_container(pod_spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The container that runs vLLM: the named one, else the one whose command runs vLLM,
    else the only container whose image is a vLLM image. Raises CommandLineError saying what to set."""
    containers = pod_spec.get("containers") or []
    if name is not None:
        for container in containers:
            if container.get("name") == name:
                return container
        names = ", ".join(c.get("name", "?") for c in containers) or "none"
        raise CommandLineError(f"no container named {name!r} in the pod template (containers: {names})")
    running = [c for c in containers if CommandLine.parse(c).runs_vllm()]
    if len(running) == 1:
        return running[0]
    by_image = [c for c in containers if "vllm" in str(c.get("image", "")).lower()]
    candidates = running or by_image
    if len(candidates) == 1:
        return candidates[0]
    names = ", ".join(c.get("name", "?") for c in containers) or "none"
    why = "several containers run vLLM" if candidates else "no container runs vLLM (vllm serve or the api_server module)"
    raise CommandLineError(f"{why}; set spec.targetRef.container to one of: {names}")


def with_container_command(container: dict[str, Any], fields: dict[str, list[str]]) -> dict[str, Any]:
    """A copy of the container with new ``command``/``args`` (absent ones stay absent)."""
    out = copy.deepcopy(container)
    for key, value in fields.items():
        if value or key in container:
            out[key] = value
    return out
