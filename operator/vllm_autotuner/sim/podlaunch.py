"""What a pod asks of vLLM, read from its spec the way vLLM would read it.

The simulated fleet runs an engine for every vLLM container scheduled onto
its nodes. The flags come from the container's command line, parsed by
:mod:`vllm_autotuner.knobs` (the operator's own parser, so both sides agree
on every spelling); the GPU physics come from the node's profile. A command
line vLLM itself would refuse (a flag value that is not a number, no GPU)
becomes a :class:`LaunchError` carrying the text vLLM or its argument parser
prints, so the pod crash-loops with that message as a real one would.

The model named on the command line only names the served model (the
``model_name`` label, ``/v1/models``); how fast it runs is the node profile's
model. A tensor-parallel size other than the profile's cannot be simulated
faithfully, so it is refused with a message saying which node pool fits.
"""

from __future__ import annotations

import json

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from vllm_autotuner.knobs import SEQS_FLAG, TOKENS_FLAG, CommandLine, CommandLineError, Sigterm
from vllm_autotuner.knobs.cmdline import int_type
from vllm_autotuner.sim.profiles import Profile
from vllm_autotuner.sim.serving import QueueLimits
from vllm_autotuner.sim.startup import EngineConfig

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_PORT = 8000
"""vLLM's ``--port`` default."""
ARGPARSE_EXIT = 2
"""argparse exits with 2 on a bad command line; vLLM's start-up errors exit with 1."""
USAGE = "usage: vllm serve [model_tag] [options]"


class LaunchError(Exception):
    """vLLM exits at once with this text on its console (``str(err)``)."""

    def __init__(self, text: str, exit_code: int = 1) -> None:
        super().__init__(text)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """One vLLM container as the fleet starts it."""

    config: EngineConfig
    served_model_name: str
    """What ``/v1/models`` lists and the metrics' ``model_name`` label says."""
    port: int
    limits: QueueLimits = QueueLimits()
    """The API server's admission limits (``--max-num-queued-reqs``, ``--max-num-queued-tokens``)."""
    lora_modules: tuple[str, ...] = ()
    """The LoRA adapters it serves by name (``--lora-modules name=path`` or JSON ``{"name": ..., "path": ...}``, with
    ``--enable-lora``): a request whose ``model`` is one runs with that adapter."""
    sleep_mode: bool = False
    """Whether it takes sleep and wake-up calls: ``--enable-sleep-mode``, and ``VLLM_SERVER_DEV_MODE`` a non-zero
    integer in the container's environment (vLLM serves /sleep, /wake_up and /is_sleeping only in dev mode)."""
    shutdown_timeout: int = 0
    """Seconds it waits on SIGTERM for the requests in flight to finish, refusing new ones (``--shutdown-timeout``,
    vllm-project/vllm#36666); 0, vLLM's default: it aborts them at once."""
    sigterm: Sigterm | None = Sigterm.REACHES
    """What the SIGTERM a stopping pod gets does to it by the container's command (``CommandLine.sigterm``; in the
    pod, ``rollout.drain.sigterm_fate``): it reaches it, the container's shell ignores it, or kills it at once, or
    runuser or su kill it 2 s after passing it on. A form whose answer is not known (``sh -c`` in an image whose
    ``sh`` the operator does not know) is taken to pass it on."""


def serving_port(container: dict[str, Any]) -> int:
    """The port vLLM listens on (``--port``, default 8000): where the fleet
    serves the pod, and where ``sim load`` sends requests."""
    try:
        return _int(CommandLine.parse(container), "port") or DEFAULT_PORT
    except (CommandLineError, LaunchError):
        return DEFAULT_PORT  # such a vLLM never starts: nothing listens anywhere


def gpus_requested(container: dict[str, Any]) -> int:
    """The container's ``nvidia.com/gpu`` limit (the device plugin's count), or
    its request when only that is set."""
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        value = (resources.get(key) or {}).get(GPU_RESOURCE)
        if value is not None:
            return int(value)
    return 0


def vllm_launch(container: dict[str, Any], profile: Profile) -> VllmLaunch:
    """The engine a vLLM container runs on a node of ``profile``.

    Raises :class:`LaunchError` with what vLLM would print when it refuses the
    command line before touching the GPU. Memory and scheduler-flag checks are
    not done here: :func:`vllm_autotuner.sim.startup.check_startup` does them,
    with vLLM's timing.
    """
    try:
        cmd = CommandLine.parse(container)
    except CommandLineError as exc:
        raise LaunchError(f"sh: {exc}", ARGPARSE_EXIT) from None  # the shell refuses the script
    gpus = gpus_requested(container)
    if gpus == 0:
        raise LaunchError("RuntimeError: Failed to infer device type")
    tp = _int(cmd, "tensor-parallel-size") or 1
    if tp > gpus:
        raise LaunchError(
            f"simulator: --tensor-parallel-size {tp} needs {tp} GPUs but the container has {gpus} "
            f"({GPU_RESOURCE} limit); raise the limit or lower the tensor-parallel size"
        )
    if tp != profile.tp:
        raise LaunchError(
            f"simulator: nodes of profile {profile.name} simulate tensor-parallel size {profile.tp}, "
            f"this container asks for {tp}; schedule it onto a pool whose profile matches"
        )
    tokens, seqs = _int(cmd, TOKENS_FLAG), _int(cmd, SEQS_FLAG)
    mode = cmd.get("performance-mode")
    utilization = _typed(cmd, "gpu-memory-utilization", float)
    if utilization is not None and not 0 < utilization <= 1:
        bound = "greater than 0" if utilization <= 0 else "less than or equal to 1"
        kind = "greater_than" if utilization <= 0 else "less_than_equal"
        raise LaunchError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
            f"gpu_memory_utilization\n  Input should be {bound} [type={kind}, input_value={utilization}, "
            "input_type=float]"
        )
    present = {
        "max_num_batched_tokens": tokens,
        "max_num_seqs": seqs,
        "max_model_len": _int(cmd, "max-model-len"),
        "gpu_memory_utilization": utilization,
        "enable_chunked_prefill": cmd.get_bool("enable-chunked-prefill"),
        "enable_prefix_caching": cmd.get_bool("enable-prefix-caching"),
        "block_size": _int(cmd, "block-size"),
        "performance_mode": mode.value if mode is not None else None,
        "max_loras": (_int(cmd, "max-loras") or 1) if cmd.get_bool("enable-lora") else None,
        "enable_mfu_metrics": cmd.get_bool("enable-mfu-metrics"),
    }
    config = EngineConfig(**{k: v for k, v in present.items() if v is not None})  # absent: vLLM's default
    served = cmd.get("served-model-name")
    name = served.value if served is not None and served.value else cmd.model() or profile.served_model_name
    limits = QueueLimits(_int(cmd, "max-num-queued-reqs"), _int(cmd, "max-num-queued-tokens"))
    sleep_mode = bool(cmd.get_bool("enable-sleep-mode")) and _dev_mode(container)
    adapters = tuple(_lora_name(module) for module in cmd.values("lora-modules"))
    if adapters and config.max_loras is None:
        raise LaunchError("simulator: --lora-modules needs --enable-lora (vLLM fails to load the adapters: LoRA is "
                          "not enabled)")
    return VllmLaunch(config=config, served_model_name=name, port=_int(cmd, "port") or DEFAULT_PORT, limits=limits,
                      lora_modules=adapters, sleep_mode=sleep_mode,
                      shutdown_timeout=max(_int(cmd, "shutdown-timeout") or 0, 0), sigterm=cmd.sigterm())


def _lora_name(module: str) -> str:
    """The name a ``--lora-modules`` value serves its adapter as: ``name=path``, or JSON with ``name`` and ``path``
    (and optionally ``base_model_name``)."""
    if module.lstrip().startswith("{"):
        try:
            return str(json.loads(module)["name"])
        except (ValueError, KeyError, TypeError):
            pass
    elif "=" in module:
        return module.partition("=")[0]
    raise LaunchError(f"{USAGE}\nvllm serve: error: argument --lora-modules: invalid value {module!r}: give name=path "
                      f"or JSON with name and path", ARGPARSE_EXIT)


def _dev_mode(container: dict[str, Any]) -> bool:
    """``VLLM_SERVER_DEV_MODE`` as vLLM reads it (``bool(int(value))``) from a literal value of the container's
    ``env``; one from a ConfigMap or Secret is not resolved here, and counts as unset."""
    for var in container.get("env") or []:
        if var.get("name") == "VLLM_SERVER_DEV_MODE":
            try:
                return bool(int(var.get("value") or "0"))
            except ValueError:
                return False
    return False


def _int(cmd: CommandLine, name: str) -> int | None:
    """An integer flag's value as vLLM's parser reads it (``--max-num-batched-tokens 8k``; ``--max-model-len
    auto``, None: the model's own); ``None`` when absent."""
    return _typed(cmd, name, int_type(name))


def _typed(cmd: CommandLine, name: str, kind: Callable[[str], Any]) -> Any:
    """A flag's value as argparse reads it with type ``kind``; ``None`` when absent."""
    flag = cmd.get(name)
    if flag is None:
        return None
    if flag.value is None:
        raise LaunchError(f"{USAGE}\nvllm serve: error: argument {flag.spelling}: expected one argument",
                          ARGPARSE_EXIT)
    try:
        return kind(flag.value)
    except ValueError:
        raise LaunchError(f"{USAGE}\nvllm serve: error: argument {flag.spelling}: invalid {kind.__name__} value: "
                          f"{flag.value!r}", ARGPARSE_EXIT) from None
