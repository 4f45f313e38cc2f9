"""A pod's vLLM container -> the engine the fleet runs, read as vLLM reads it."""

from __future__ import annotations

import pytest

from vllm_autotuner.knobs import Sigterm
from vllm_autotuner.sim.podlaunch import LaunchError, serving_port, vllm_launch
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.serving import QueueLimits
from vllm_autotuner.sim.startup import EngineConfig, check_startup

H100, TP4 = get_profile("llama3-8b-h100"), get_profile("llama3-70b-h100-tp4")
ONE_GPU = {"limits": {"nvidia.com/gpu": "1"}}


def container(**fields):
    return {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "resources": ONE_GPU, **fields}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"command": ["vllm", "serve", "m", "--max-num-batched-tokens", "4096", "--max-num-seqs=64"]},
            EngineConfig(max_num_batched_tokens=4096, max_num_seqs=64),
        ),
        (
            {
                "args": [
                    "m",
                    "--max_num_batched_tokens=2048",
                    "--max-model-len",
                    "4096",
                    "--gpu-memory-utilization",
                    "0.85",
                    "--block-size",
                    "32",
                ]
            },
            EngineConfig(max_num_batched_tokens=2048, max_model_len=4096, gpu_memory_utilization=0.85, block_size=32),
        ),
        (
            {
                "command": [
                    "sh",
                    "-c",
                    "exec vllm serve m --no-enable-prefix-caching --enable-chunked-prefill=false "
                    "--max-num-seqs 8 2>&1 | tee /log",
                ]
            },
            EngineConfig(max_num_seqs=8, enable_prefix_caching=False, enable_chunked_prefill=False),
        ),
        ({"args": ["--model", "m"]}, EngineConfig()),  # absent flags stay absent: vLLM's defaults apply
        (  # the types vLLM reads these with: sizes, and the model's own length
            {"args": ["m", "--max-num-batched-tokens", "8k", "--max-model-len", "auto"]},
            EngineConfig(max_num_batched_tokens=8000),
        ),
        (
            {"args": ["m", "--performance-mode", "throughput", "--max-num-seqs", "100"]},  # doubles only the defaults
            EngineConfig(max_num_seqs=100, performance_mode="throughput"),
        ),
        ({"args": ["m", "--enable-mfu-metrics"]}, EngineConfig(enable_mfu_metrics=True)),
    ],
)
def test_engine_config_from_the_command_line(fields, expected):
    assert vllm_launch(container(**fields), H100).config == expected


def test_throughput_mode_doubles_the_defaults_before_vllm_ties_them():
    config = vllm_launch(container(args=["m", "--performance-mode", "throughput", "--max-num-seqs", "100"]), H100).config
    resolved = config.resolve(H100)
    assert (resolved.max_num_batched_tokens, resolved.max_num_seqs) == (16384, 100)
    tied = vllm_launch(container(args=["m", "--performance-mode=throughput", "--max-num-batched-tokens", "1024"]), H100)
    assert tied.config.resolve(H100).max_num_seqs == 1024  # min(2 * 1024, 1024)


def test_served_model_name_and_port():
    launch = vllm_launch(container(args=["org/m", "--port", "9000"]), H100)
    assert (launch.served_model_name, launch.port) == ("org/m", 9000)
    named = vllm_launch(container(args=["org/m", "--served-model-name", "chat", "other"]), H100)
    assert (named.served_model_name, named.port) == ("chat", 8000)
    assert vllm_launch(container(args=["--max-num-seqs", "8"]), H100).served_model_name == H100.served_model_name
    assert serving_port(container(args=["--port=8123"])) == 8123
    assert serving_port(container(args=["--port", "x"])) == 8000


def test_queue_limits_from_the_command_line():
    limited = vllm_launch(container(args=["m", "--max-num-queued-reqs", "64", "--max_num_queued_tokens=20000"]), H100)
    assert limited.limits == QueueLimits(max_num_queued_reqs=64, max_num_queued_tokens=20000)
    assert vllm_launch(container(args=["m"]), H100).limits == QueueLimits()
    with pytest.raises(LaunchError, match="argument --max-num-queued-reqs: invalid int value: 'many'"):
        vllm_launch(container(args=["m", "--max-num-queued-reqs", "many"]), H100)


@pytest.mark.parametrize(("command", "fields", "sigterm"), [
    (["/bin/sh", "-c", "exec vllm serve m --shutdown-timeout 30"], {}, Sigterm.REACHES),
    (["/bin/sh", "-c", "vllm serve m --shutdown-timeout 30"], {}, Sigterm.IGNORED),  # vLLM's image: sh is dash
    (["tini", "--", "/bin/sh", "-c", "vllm serve m --shutdown-timeout 30"], {}, Sigterm.KILLS),
    (["runuser", "-u", "vllm", "--", "vllm", "serve", "m", "--shutdown-timeout", "30"], {}, Sigterm.CUT_SHORT),
    (["/bin/sh", "-c", "vllm serve m --shutdown-timeout 30"], {"image": "example.com/acme/vllm:1"}, None),
])
def test_the_simulated_vllm_takes_the_sigterm_as_its_command_says(command, fields, sigterm):
    launch = vllm_launch(container(command=command, **fields), H100)
    assert (launch.sigterm, launch.shutdown_timeout) == (sigterm, 30)


def test_lora_adapters_and_their_batch_limit_from_the_command_line():
    served = vllm_launch(container(args=["m", "--enable-lora", "--max-loras", "2", "--lora-modules", "sql=/a/sql",
                                         '{"name": "chat", "path": "/a/chat"}', "--max-num-seqs", "8"]), H100)
    assert served.lora_modules == ("sql", "chat") and served.config.max_loras == 2
    assert served.config.max_num_seqs == 8  # the word after the adapters is a flag again
    one = vllm_launch(container(args=["m", "--enable-lora", "--lora-modules=sql=/a/sql", "other=/b"]), H100)
    assert one.lora_modules == ("sql",) and one.config.max_loras == 1  # "=" takes one value, as argparse does
    assert vllm_launch(container(args=["m"]), H100).config.max_loras is None
    with pytest.raises(LaunchError, match="--lora-modules needs --enable-lora"):
        vllm_launch(container(args=["m", "--lora-modules", "sql=/a/sql"]), H100)
    with pytest.raises(LaunchError, match="argument --lora-modules: invalid value 'sql'"):
        vllm_launch(container(args=["m", "--enable-lora", "--lora-modules", "sql"]), H100)


@pytest.mark.parametrize(
    ("fields", "profile", "message", "exit_code"),
    [
        (
            {"args": ["--max-num-seqs", "lots"]},
            H100,
            "vllm serve: error: argument --max-num-seqs: invalid int value: 'lots'",
            2,
        ),
        ({"args": ["--gpu-memory-utilization", "high"]}, H100, "invalid float value: 'high'", 2),
        ({"args": ["--max-num-batched-tokens", "2.5K"]}, H100, "invalid human_readable_int value: '2.5K'", 2),
        ({"args": ["--max-num-seqs"]}, H100, "argument --max-num-seqs: expected one argument", 2),
        ({"args": ["--gpu-memory-utilization", "1.5"]}, H100, "Input should be less than or equal to 1", 1),
        ({"args": ["m"], "resources": {}}, H100, "RuntimeError: Failed to infer device type", 1),
        ({"args": ["m", "--tensor-parallel-size", "4"]}, TP4, "needs 4 GPUs but the container has 1", 1),
        (
            {"args": ["m"], "resources": {"limits": {"nvidia.com/gpu": "4"}}},
            TP4,
            "simulate tensor-parallel size 4, this container asks for 1",
            1,
        ),
        ({"command": ["sh", "-c", "vllm serve 'm"]}, H100, "sh: unbalanced ' quote", 2),
    ],
)
def test_refusals_carry_what_vllm_prints(fields, profile, message, exit_code):
    with pytest.raises(LaunchError, match=None) as refused:
        vllm_launch(container(**fields), profile)
    assert message in str(refused.value)
    assert refused.value.exit_code == exit_code


def test_tensor_parallel_container_on_its_profile():
    launch = vllm_launch(
        container(args=["m", "-O3", "--tensor-parallel-size", "4"], resources={"limits": {"nvidia.com/gpu": "4"}}), TP4
    )
    assert check_startup(TP4, launch.config).ok


def test_infeasible_budget_on_l4_is_left_to_the_start_up_check():
    l4 = get_profile("llama3-8b-l4")
    launch = vllm_launch(container(args=["m", "--max-num-batched-tokens", "65536", "--max-num-seqs", "256"]), l4)
    outcome = check_startup(l4, launch.config)
    assert not outcome.ok and "No available memory for the cache blocks" in (outcome.error or "")


@pytest.mark.parametrize(("args", "env", "sleep_mode"), [
    (["m", "--enable-sleep-mode"], [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}], True),
    (["m", "--enable-sleep-mode"], [], False),  # vLLM serves the sleep routes in dev mode only
    (["m", "--enable-sleep-mode"], [{"name": "VLLM_SERVER_DEV_MODE", "value": "0"}], False),
    (["m", "--enable-sleep-mode"], [{"name": "VLLM_SERVER_DEV_MODE", "valueFrom": {"configMapKeyRef": {}}}], False),
    (["m", "--enable-sleep-mode", "--no-enable-sleep-mode"], [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}], False),
    (["m"], [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}], False),  # no sleep mode to enter
])
def test_sleep_mode_needs_the_flag_and_the_dev_mode(args, env, sleep_mode):
    assert vllm_launch(container(args=args, env=env), H100).sleep_mode is sleep_mode


@pytest.mark.parametrize(("args", "timeout"), [(["m"], 0), (["m", "--shutdown-timeout", "45"], 45),
                                               (["m", "--shutdown-timeout=0"], 0)])
def test_the_shutdown_timeout_is_read_and_zero_by_default(args, timeout):
    assert vllm_launch(container(args=args), H100).shutdown_timeout == timeout
