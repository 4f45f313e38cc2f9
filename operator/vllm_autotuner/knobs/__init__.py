"""The two knobs as vLLM sees them: command-line flags, defaults and start-up rules.

Shared by the operator (read the knobs from a Deployment, write new ones),
the decision core (feasibility) and the simulated fleet (parse a pod's
command exactly as vLLM would), so each rule about vLLM's flags exists once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_autotuner.api.spec import Knobs
from vllm_autotuner.knobs.cmdline import (
    CommandLine,
    CommandLineError,
    Sigterm,
    WATCHER_KILL_SECONDS,
    find_vllm_container,
    with_container_command,
)
from vllm_autotuner.knobs.defaults import AssumedDefaults, Hardware, engine_knobs, parse_version, vllm_defaults
from vllm_autotuner.knobs.feasibility import startup_errors, startup_warnings

TOKENS_FLAG = "max-num-batched-tokens"
SEQS_FLAG = "max-num-seqs"
#: Engines across the data-parallel group, and in this pod. Above 1, one server fronts several engines: its
#: metrics carry one series per engine (``engine="0"``, ``"1"``...) and --max-num-seqs caps each engine, while
#: the operator's queries and model take a pod for one engine, so such a target would be mis-tuned.
DATA_PARALLEL_FLAGS = ("data-parallel-size", "data-parallel-size-local")
#: What a ``--config`` file may set that the operator must know, and the flags that say it on the command line (which
#: take precedence over the file): the knobs, chunked prefill (off, vLLM refuses a budget below max_model_len) and the
#: data-parallel size (a file's data-parallel-size-local cannot exceed the command line's --data-parallel-size 1).
#: A max_model_len left to the file is unknown, as a model's own is: with chunked prefill off that is refused.
CONFIG_FILE_FLAGS = {
    TOKENS_FLAG: f"--{TOKENS_FLAG}",
    SEQS_FLAG: f"--{SEQS_FLAG}",
    "enable-chunked-prefill": "--enable-chunked-prefill or --no-enable-chunked-prefill",
    "data-parallel-size": "--data-parallel-size",
}
#: Flags and values that make vLLM run a pooling model (embedding, classification, scoring, reward): for one, vLLM
#: leaves chunked prefill on only where the model's pooling supports it, which only vLLM reads (off, it refuses a
#: budget below max_model_len), so chunked prefill must be on the command line. ``--task`` is older releases' spelling.
POOLING_FLAGS = {
    "runner": ("pooling",),
    "convert": ("embed", "classify", "reward"),
    "task": ("embed", "embedding", "classify", "score", "reward"),
}


@dataclass(frozen=True)
class EngineArgs:
    """What a container's command line says about the engine, flags absent as None."""

    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    max_model_len: int | None  # None also for ``auto``/``-1``: vLLM fits it to the memory left
    chunked_prefill: bool | None  # None: vLLM's default (on in the V1 engine; a pooling model's is refused)
    performance_mode: str | None
    #: ``--shutdown-timeout``: how long vLLM serves its requests in flight after SIGTERM (``rollout.drain``); 0, its
    #: default (abort them), also for a value it would refuse, which is no reason to refuse tuning the knobs; None
    #: when not on the command line but a ``--config`` file may set it, where the operator cannot read it.
    shutdown_timeout: int | None = 0
    #: What the kubelet's SIGTERM does to vLLM by the container's command (``CommandLine.sigterm``; in the pod:
    #: ``rollout.drain.sigterm_fate``): it reaches vLLM, a shell that runs vLLM as its child (or ``conda run``,
    #: ``hatch run``) ignores it (vLLM serves until the SIGKILL), or dies of it and takes vLLM with it (an init in
    #: front), or runuser or su passes it on and kills vLLM 2 s later; None when not known.
    sigterm: Sigterm | None = Sigterm.REACHES

    @classmethod
    def from_container(cls, container: dict[str, Any]) -> EngineArgs:
        """Read a container's command and args. Raises CommandLineError for unreadable values, for a
        data-parallel engine, which the operator cannot tune, for a ``--config`` file that may set what the
        operator must know, for a pooling model (``POOLING_FLAGS``) that does not say whether chunked prefill is on,
        and for chunked prefill off without ``--max-model-len`` (the budget's floor)."""
        cmd = CommandLine.parse(container)
        for name in DATA_PARALLEL_FLAGS:
            size = cmd.get_int(name)
            if size is not None and size > 1:
                flag = cmd.get(name)
                assert flag is not None
                raise CommandLineError(
                    f"{flag.spelling} {size}: vLLM runs data-parallel engines, whose metrics and --max-num-seqs "
                    f"count per engine, while this operator tunes one engine per pod; run one engine per pod "
                    f"(data-parallel size 1, one replica per engine) or tune this Deployment by hand"
                )
        config = cmd.get("config")
        missing = [name for name in CONFIG_FILE_FLAGS if cmd.get(name) is None and cmd.get(f"no-{name}") is None]
        if config is not None and missing:
            first, *rest = missing
            also = f", and also {' and '.join(CONFIG_FILE_FLAGS[name] for name in rest)}" if rest else ""
            raise CommandLineError(
                f"vLLM reads --config {config.value}, which may set {_listed(['--' + name for name in missing])} "
                f"where the operator cannot read {'them' if rest else 'it'}; put {CONFIG_FILE_FLAGS[first]} on the "
                f"command line{also} (flags there take precedence over the file)"
            )
        mode = cmd.get("performance-mode")
        chunked_prefill, max_model_len = cmd.get_bool("enable-chunked-prefill"), cmd.get_int("max-model-len")
        pooling = next((flag for name, values in POOLING_FLAGS.items()
                        if (flag := cmd.get(name)) is not None and flag.value in values), None)
        if pooling is not None and chunked_prefill is None:
            raise CommandLineError(
                f"{pooling.spelling} {pooling.value} runs a pooling model, for which vLLM turns chunked prefill off "
                f"unless the model's pooling supports it, and then refuses any budget below max_model_len; the "
                f"operator cannot read which, so add --enable-chunked-prefill or --no-enable-chunked-prefill (with "
                f"--max-model-len) to the command line"
            )
        if chunked_prefill is False and max_model_len is None:
            raise CommandLineError(
                "chunked prefill is off and --max-model-len is not set: vLLM then refuses any budget below the "
                "model's maximum length, which only vLLM reads, so no budget change is known to be safe; set "
                "--max-model-len on the command line (or leave chunked prefill on)"
            )
        return cls(
            max_num_batched_tokens=cmd.get_int(TOKENS_FLAG),
            max_num_seqs=cmd.get_int(SEQS_FLAG),
            max_model_len=max_model_len,
            chunked_prefill=chunked_prefill,
            performance_mode=mode.value if mode else None,
            shutdown_timeout=None if config is not None and cmd.get("shutdown-timeout") is None else (
                _lenient_int(cmd, "shutdown-timeout")),
            sigterm=cmd.sigterm(),
        )

    def effective(self, defaults: AssumedDefaults) -> tuple[Knobs, bool]:
        """The knobs vLLM runs with, and whether any came from its defaults (``engine_knobs``: vLLM ties an absent
        one to the other and to max_model_len)."""
        tokens, seqs = engine_knobs(self.max_num_batched_tokens, self.max_num_seqs, defaults.knobs, self.max_model_len,
                                    self.chunked_prefill is not False)
        from_defaults = self.max_num_batched_tokens is None or self.max_num_seqs is None
        return Knobs(max_num_batched_tokens=tokens, max_num_seqs=seqs), from_defaults


def _lenient_int(cmd: CommandLine, name: str) -> int:
    """An integer flag's value, 0 when it is absent or vLLM would refuse it."""
    try:
        return cmd.get_int(name) or 0
    except CommandLineError:
        return 0


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(items[:-1]), items[-1])))


def set_knobs(container: dict[str, Any], knobs: Knobs) -> dict[str, Any]:
    """A copy of the container whose command line sets these knobs; every other token unchanged."""
    fields = CommandLine.parse(container).with_flags(
        {TOKENS_FLAG: knobs.max_num_batched_tokens, SEQS_FLAG: knobs.max_num_seqs}
    )
    return with_container_command(container, fields)


__all__ = [
    "TOKENS_FLAG", "SEQS_FLAG", "EngineArgs", "set_knobs", "CommandLine", "CommandLineError", "Sigterm",
    "WATCHER_KILL_SECONDS", "find_vllm_container", "AssumedDefaults", "Hardware", "engine_knobs", "parse_version",
    "vllm_defaults", "startup_errors", "startup_warnings",
]
