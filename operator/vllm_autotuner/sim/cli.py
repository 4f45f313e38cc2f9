"""``vllm-autotuner sim ...``: commands of the local simulated environment.

Kept apart from the top-level CLI so the operator's own commands never import
the simulator. Each sub-command imports its module lazily.
"""

from __future__ import annotations

import argparse
import sys


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


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sim`` command group to the top-level parser."""
    sim = sub.add_parser("sim", help="the local simulated cluster, GPU fleet and traffic")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")
    up = simsub.add_parser("up", help="start the local control plane and Prometheus in the background; "
                           "settings in .local/env")
    up.set_defaults(func=_cmd_up)
    down = simsub.add_parser("down", help="stop everything `sim up` started")
    down.set_defaults(func=_cmd_down)
