"""The two knobs as vLLM sees them: command-line flags, defaults and start-up rules.

Shared by the operator (read the knobs from a Deployment, write new ones),
the decision core (feasibility) and the simulated fleet (parse a pod's
command exactly as vLLM would), so each rule about vLLM's flags exists once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_autotuner.api.spec import Knobs
from vllm_autotuner.knobs.cmdline import CommandLine, CommandLineError, find_vllm_container, with_container_command
from vllm_autotuner.knobs.defaults import AssumedDefaults, Hardware, vllm_defaults
from vllm_autotuner.knobs.feasibility import startup_errors, startup_warnings

TOKENS_FLAG = "max-num-batched-tokens"
SEQS_FLAG = "max-num-seqs"
#: Engines across the data-parallel group, and in this pod. Above 1, one server fronts several engines: its
#: metrics carry one series per engine (``engine="0"``, ``"1"``...) and --max-num-seqs caps each engine, while
#: the operator's queries and model take a pod for one engine, so such a target would be mis-tuned.
DATA_PARALLEL_FLAGS = ("data-parallel-size", "data-parallel-size-local")


@dataclass(frozen=True)
class EngineArgs:
    """What a container's command line says about the engine, flags absent as None."""

    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    max_model_len: int | None  # None also for ``auto``/``-1``: vLLM fits it to the memory left
    chunked_prefill: bool | None  # None: vLLM's default (always on in the V1 engine)
    performance_mode: str | None
    config_file: str | None  # --config YAML: flags in it are not visible to the operator

    @classmethod
    def from_container(cls, container: dict[str, Any]) -> EngineArgs:
        """Read a container's command and args. Raises CommandLineError for unreadable values, and for a
        data-parallel engine, which the operator cannot tune."""
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
        mode = cmd.get("performance-mode")
        config = cmd.get("config")
        model_len = cmd.get("max-model-len")
        return cls(
            max_num_batched_tokens=cmd.get_int(TOKENS_FLAG),
            max_num_seqs=cmd.get_int(SEQS_FLAG),
            max_model_len=None if model_len and model_len.value in ("auto", "-1") else cmd.get_int("max-model-len"),
            chunked_prefill=cmd.get_bool("enable-chunked-prefill"),
            performance_mode=mode.value if mode else None,
            config_file=config.value if config else None,
        )

    def effective(self, defaults: AssumedDefaults) -> tuple[Knobs, bool]:
        """The knobs vLLM runs with, and whether any came from its defaults. Raises CommandLineError when a knob is
        left to a ``--config`` file, which may set it where the operator cannot read it."""
        missing = [f"--{flag}" for flag, value in ((TOKENS_FLAG, self.max_num_batched_tokens),
                                                   (SEQS_FLAG, self.max_num_seqs)) if value is None]
        if self.config_file is not None and missing:
            raise CommandLineError(
                f"vLLM reads --config {self.config_file}, which may set {' and '.join(missing)} where the operator "
                f"cannot read it; put {' and '.join(missing)} on the command line (it takes precedence over the file)"
            )
        tokens = self.max_num_batched_tokens or defaults.knobs.max_num_batched_tokens
        seqs = self.max_num_seqs or defaults.knobs.max_num_seqs
        from_defaults = self.max_num_batched_tokens is None or self.max_num_seqs is None
        return Knobs(max_num_batched_tokens=tokens, max_num_seqs=seqs), from_defaults


def set_knobs(container: dict[str, Any], knobs: Knobs) -> dict[str, Any]:
    """A copy of the container whose command line sets these knobs; every other token unchanged."""
    fields = CommandLine.parse(container).with_flags(
        {TOKENS_FLAG: knobs.max_num_batched_tokens, SEQS_FLAG: knobs.max_num_seqs}
    )
    return with_container_command(container, fields)


__all__ = [
    "TOKENS_FLAG", "SEQS_FLAG", "EngineArgs", "set_knobs", "CommandLine", "CommandLineError",
    "find_vllm_container", "AssumedDefaults", "Hardware", "vllm_defaults", "startup_errors", "startup_warnings",
]
