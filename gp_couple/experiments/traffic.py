r"""``gp-couple traffic``: probabilistic interpolation of San Jose traffic speeds (sec:traffic_expt).

The 1016-node highway graph has speeds at 325 sensor nodes; 250 random sensors train
and 75 test. GRF-GP hyperparameters are trained with 8 i.i.d. walkers, then 4, 8 and 16
i.i.d., antithetic and :math:`\sigma`-coupled walkers are compared (protocol of
:mod:`gp_couple.experiments.graph_gp`).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ..datasets import load_traffic, traffic_split
from ._report import emit, positive_int
from .graph_gp import run_protocol
from .mesh import add_protocol_arguments, protocol_from_args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol on the traffic graph."""
    data = load_traffic(args.data_dir)
    train, test = traffic_split(data.observed_nodes.size, args.train, args.test, seed=args.seed)
    targets = np.full(data.graph.num_nodes, np.nan)
    targets[data.observed_nodes] = data.speeds
    report = run_protocol(data.graph, targets, data.observed_nodes[train], data.observed_nodes[test],
                          protocol_from_args(args))
    report.update(experiment="traffic", dataset=data.name)
    report["notes"].append("speeds in mph")
    return report


def register(subparsers: Any) -> None:
    """Add the ``traffic`` sub-command."""
    parser = subparsers.add_parser("traffic", help="San Jose traffic-speed interpolation with GRF-GPs",
                                   description="Probabilistic traffic interpolation (sec:traffic_expt).")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    parser.add_argument("--train", type=positive_int, default=250, help="training sensors")
    parser.add_argument("--test", type=positive_int, default=75, help="test sensors")
    add_protocol_arguments(parser, walkers=[4, 8, 16], train_iterations=1000, repeats=10)
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "walkers", "coupling", "gram_error", "test_rmse", "kl")))
