"""``vllm-autotuner sim ...``: commands of the local simulated environment.

Kept apart from the top-level CLI so the operator's own commands never import
the simulator. Each sub-command imports its module lazily.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sim`` command group to the top-level parser."""
    sim = sub.add_parser("sim", help="the local simulated cluster, GPU fleet and traffic")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")
    del simsub  # sub-commands are added by the modules that implement them
