r"""``gp-couple mesh``: probabilistic mesh interpolation with coupled GRFs (sec:graph_gp_experiments, app:grf_gp_details).

Faces are nodes; the target is the :math:`z`-component of each face normal, with
:math:`\lfloor 0.05 N\rfloor` random faces held out. Runs the protocol of
:mod:`gp_couple.experiments.graph_gp` on each mesh.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..datasets import default_mesh, load_mesh, split_test_nodes
from ._report import add_common_arguments, emit, positive_int, probability
from .graph_gp import COUPLINGS, GraphGPProtocol, run_protocol

PAPER_MESHES = ("teapot", "fuze", "sphere", "idler_riser", "busted", "torus")


def add_protocol_arguments(parser: argparse.ArgumentParser, *, walkers: list[int],
                           train_iterations: int, repeats: int) -> None:
    """Options shared by the graph-GP experiments."""
    parser.add_argument("--walkers", nargs="+", type=positive_int, default=walkers,
                        help="walkers per node compared after training (default %(default)s)")
    parser.add_argument("--couplings", nargs="+", choices=COUPLINGS, default=list(COUPLINGS))
    parser.add_argument("--p-halt", type=probability, default=0.4)
    parser.add_argument("--order", type=positive_int, default=50, help="sigma permutation order")
    parser.add_argument("--fit-samples", type=positive_int, default=100,
                        help="walks per node and quantile bin when fitting sigma")
    parser.add_argument("--train-walkers", type=positive_int, default=8)
    parser.add_argument("--train-iterations", type=int, default=train_iterations,
                        help="Adam iterations on the marginal likelihood (default %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    add_common_arguments(parser, repeats=repeats)


def protocol_from_args(args: argparse.Namespace) -> GraphGPProtocol:
    """The protocol settings chosen on the command line."""
    return GraphGPProtocol(
        train_walkers=args.train_walkers, train_iterations=args.train_iterations,
        learning_rate=args.learning_rate, walkers=tuple(args.walkers), couplings=tuple(args.couplings),
        p_halt=args.p_halt, sigma_order=args.order, sigma_fit_samples=args.fit_samples,
        repeats=args.repeats, seed=args.seed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol on every requested mesh."""
    protocol = protocol_from_args(args)
    meshes, results = {}, []
    for name in args.mesh:
        dataset = default_mesh() if name == "default" else load_mesh(name, args.data_dir)
        train, test = split_test_nodes(dataset.graph.num_nodes, seed=args.seed)
        report = run_protocol(dataset.graph, dataset.targets, train, test, protocol)
        meshes[dataset.name] = {key: report[key] for key in ("nodes", "train", "test", "trained",
                                                             "exact_test_rmse")}
        results.extend({"mesh": dataset.name, **row} for row in report["results"])
        notes = report["notes"]
    return {"experiment": "mesh", "meshes": meshes, "protocol": report["protocol"],
            "notes": notes, "results": results}


def register(subparsers: Any) -> None:
    """Add the ``mesh`` sub-command."""
    parser = subparsers.add_parser("mesh", help="mesh interpolation with iid / antithetic / sigma GRF-GPs",
                                   description="Probabilistic mesh interpolation (app:grf_gp_details).")
    parser.add_argument("--mesh", nargs="+", default=["default"],
                        help="mesh files or names in <data-dir>/meshes "
                             f"(paper: {' '.join(PAPER_MESHES)}); 'default' is the built-in mesh")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    add_protocol_arguments(parser, walkers=[16, 32, 64], train_iterations=1000, repeats=10)
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "mesh", "walkers", "coupling", "gram_error", "test_rmse", "kl")))
