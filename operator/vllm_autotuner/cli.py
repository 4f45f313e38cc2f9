"""The ``vllm-autotuner`` command.

One entry point for everything a person or a script runs: the operator
itself (``run``), a one-shot ``recommend``, the CRD generator (``crd``) and
the local simulated environment (``sim ...``). Sub-commands import their
modules lazily so that ``vllm-autotuner crd`` does not pay for kopf or the
simulator.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_crd(args: argparse.Namespace) -> int:
    from vllm_autotuner.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-autotuner",
        description="Keeps vLLM's --max-num-batched-tokens and --max-num-seqs tuned to live traffic.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = sub.add_parser("crd", help="print the VllmTuning CustomResourceDefinition (YAML)")
    crd.set_defaults(func=_cmd_crd)

    from vllm_autotuner.sim import cli as sim_cli

    sim_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
