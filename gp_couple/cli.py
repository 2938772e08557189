"""The ``gp-couple`` command line: one sub-command per experiment."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# Each module in gp_couple.experiments defines register(subparsers).
EXPERIMENT_MODULES: tuple[str, ...] = (
    "grf_gram",
    "pagerank",
    "mesh",
    "traffic",
    "demo",
    "kernel_estimation",
    "attention",
    "copula",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every experiment registered."""
    parser = argparse.ArgumentParser(
        prog="gp-couple",
        description="Variance-reducing couplings for random features (Reid et al., ICLR 2025).")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in EXPERIMENT_MODULES:
        importlib.import_module(f"gp_couple.experiments.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gp-couple`` and ``python -m gp_couple``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"gp-couple {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
