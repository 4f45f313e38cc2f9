"""``vllm-autotuner sim ...``: commands of the local simulated environment.

Kept apart from the top-level CLI so the operator's own commands never import
the simulator. Each sub-command imports its module lazily, so the arguments
are declared here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SCENARIOS = ("steady", "bursty", "chat-rag-shift", "diurnal")
"""``sim load``'s scenarios (:func:`vllm_autotuner.sim.load.build_scenario`)."""


def _cmd_up(args: argparse.Namespace) -> int:
    from vllm_autotuner.sim import localenv

    try:
        print(localenv.up())
    except localenv.StartError as exc:
        print(f"sim up: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from vllm_autotuner.sim import localenv

    print(localenv.down())
    return 0


def _cmd_fleet(args: argparse.Namespace) -> int:
    from vllm_autotuner.sim import fleet

    return fleet.main(args)


def _cmd_load(args: argparse.Namespace) -> int:
    from vllm_autotuner.sim import load

    return load.main(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from vllm_autotuner.sim.demo import run

    return run.main(args)


def _kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="the cluster's kubeconfig (default: $KUBECONFIG)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sim`` command group to the top-level parser."""
    sim = sub.add_parser("sim", help="the local simulated cluster, GPU fleet and traffic")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")
    up = simsub.add_parser("up", help="start the local control plane, Prometheus and the simulated GPU fleet in "
                           "the background; settings in .local/env")
    up.set_defaults(func=_cmd_up)
    down = simsub.add_parser("down", help="stop everything `sim up` started")
    down.set_defaults(func=_cmd_down)

    fleet = simsub.add_parser("fleet", help="simulated GPU nodes and their kubelet: run vLLM pods, serve their "
                              "metrics and OpenAI API; prints READY when the nodes are Ready")
    _kubeconfig(fleet)
    fleet.add_argument("--targets-file", type=Path, default=os.environ.get("FLEET_TARGETS"),
                       help="Prometheus file-SD targets file to maintain (default: $FLEET_TARGETS)")
    fleet.add_argument("--pool", dest="pools", action="append", metavar="PROFILE[:N[:GPUS]]",
                       help="N nodes (default 1) with GPUS GPUs each (default: the profile's tensor-parallel "
                            "size) of a simulator profile; repeatable (default: llama3-8b-h100:4)")
    fleet.add_argument("--name-prefix", default="sim", help="node names are PREFIX-PROFILE-I (default: sim)")
    fleet.add_argument("--time-scale", type=float, default=1.0,
                       help="multiplies start-up times, probe periods and crash back-off; 0.05 makes a 100 s "
                            "vLLM start-up take 5 s (default: 1, real time)")
    fleet.add_argument("--tick", type=float, default=0.05,
                       help="seconds between engine advances: the granularity of token timing (default: 0.05)")
    fleet.add_argument("--seed", type=int, default=0, help="seeds each pod's engine (with the pod's name)")
    fleet.set_defaults(func=_cmd_fleet)

    load = simsub.add_parser("load", help="send a workload scenario to a Deployment's Ready pods on the fleet")
    _kubeconfig(load)
    load.add_argument("--namespace", "-n", default="default")
    load.add_argument("--deployment", required=True, help="the vLLM Deployment to drive")
    load.add_argument("--scenario", choices=SCENARIOS, default="steady")
    load.add_argument("--mix", default="chat", help="request lengths for `steady`: chat, rag, code, "
                                                    "summarization or sharegpt (default: chat)")
    load.add_argument("--rate", type=float, required=True, help="main request rate, requests/s")
    load.add_argument("--duration", type=float, required=True, help="seconds to send for")
    load.add_argument("--start-hour", type=float, default=0.0, help="where in the scenario's day to start")
    load.add_argument("--max-requests", type=int, default=100_000, help="send at most this many")
    load.add_argument("--max-in-flight", type=int, default=2_000,
                      help="arrivals beyond this many open requests are dropped (and counted)")
    load.add_argument("--stream", action="store_true", help="ask for streamed answers (server-sent events), and "
                      "report the time to the first token and per output token as the clients see them")
    load.add_argument("--timeout", type=float, help="seconds without a byte of the answer before a client gives up "
                      "(default: the OpenAI Python client's, sim.workload.CLIENT_TIMEOUT_S)")
    load.add_argument("--drain", type=float, default=60.0, help="seconds open requests get at the end")
    load.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    load.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a Ready pod")
    load.add_argument("--seed", type=int, default=0, help="seeds the scenario")
    load.add_argument("--model", dest="models", action="append", metavar="NAME",
                      help="the requests' model, in turn when repeated: LoRA adapters' names (--lora-modules) or the "
                           "served model's (default: none named, the served model)")
    load.set_defaults(func=_cmd_load)

    demo = simsub.add_parser("demo", help="one compressed day on the local cluster: two identical vLLM Deployments, "
                             "one tuned by the operator, the same traffic; writes a report comparing them")
    demo.add_argument("--duration", default="10m",
                      help="wall-clock time the 24 simulated hours take, e.g. 10m, 3m (the least), 600 (default: 10m)")
    demo.add_argument("--report-dir", type=Path, default=None,
                      help="where report.md, report.json and the charts go (default: demo-report/ in the repository)")
    demo.add_argument("--seed", type=int, default=1, help="seeds the requests both Deployments get")
    demo.add_argument("--kubeconfig", help="a running cluster to use (with --prometheus-url and "
                                           "--prometheus-targets-dir); default: `make up`'s, else the demo's own")
    demo.add_argument("--prometheus-url", help="the Prometheus that scrapes that cluster's simulated pods")
    demo.add_argument("--prometheus-targets-dir", type=Path,
                      help="the directory of file-SD target files that Prometheus reads (the demo adds its own file)")
    demo.set_defaults(func=_cmd_demo)
