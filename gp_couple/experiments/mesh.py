r"""``gp-couple mesh``: probabilistic mesh interpolation with coupled GRFs (Section 4.2 "Experiments
with σ-coupled GRFs" [sec:graph_gp_experiments], Appendix F.2 "Scalable GPs on graphs", paragraph
"Training GRF-GPs: technical details" [app:grf_gp_details]).

Faces are nodes; the target is the :math:`z`-component of each face normal, with
:math:`\lfloor 0.05 N\rfloor` random faces held out. Runs the protocol of
:mod:`gp_couple.experiments.graph_gp` on each mesh.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from ..datasets import MeshDataset, default_mesh, load_mesh, split_test_nodes
from ._report import (add_common_arguments, emit, figure_folder, log_figures, non_negative_int, positive_float,
                      positive_int, probability, probability_or_auto, walkers_int)
from ._couplings import COUPLINGS, add_walk_arguments, coupling_choices
from ._runtime import add_device_argument
from ..couplings.directions import DIRECTION_COUPLINGS
from .exact_baseline import RANGE_HYPERPARAMETERS
from .graph_gp import GraphGPProtocol, run_protocol

#: Kernel families the graph-GP commands train (those with an exact maximum-likelihood baseline).
GRAPH_KERNEL_FAMILIES = tuple(RANGE_HYPERPARAMETERS)

PAPER_MESHES = ("teapot", "fuze", "sphere", "idler_riser", "busted", "torus")


def add_protocol_arguments(parser: argparse.ArgumentParser, *, walkers: list[int],
                           train_iterations: int, repeats: int, p_halt: Any = 0.4,
                           p_halt_help: str = "termination probability of every walk") -> None:
    """Options shared by the graph-GP experiments.

    ``p_halt="auto"`` lets ``--p-halt`` also take ``auto`` (the command must resolve it).
    """
    parser.add_argument("--walkers", nargs="+", type=walkers_int, default=walkers,
                        help="walkers per node compared after training (default %(default)s)")
    parser.add_argument("--couplings", nargs="+", choices=coupling_choices(), default=list(COUPLINGS),
                        help="walk-length couplings compared")
    add_walk_arguments(parser)
    parser.add_argument("--p-halt", type=probability_or_auto if p_halt == "auto" else probability,
                        default=p_halt, help=f"{p_halt_help} (default %(default)s)")
    parser.add_argument("--kernel", choices=GRAPH_KERNEL_FAMILIES, default="diffusion",
                        help="graph kernel family trained and used as the exact reference (default %(default)s)")
    parser.add_argument("--train-directions", choices=DIRECTION_COUPLINGS.names(), default="independent",
                        help="direction coupling of the training walkers (default %(default)s, the paper's)")
    parser.add_argument("--order", type=positive_int, default=50, help="sigma permutation order")
    parser.add_argument("--fit-samples", type=positive_int, default=100,
                        help="walks per node and quantile bin when fitting sigma")
    parser.add_argument("--train-walkers", type=walkers_int, default=8,
                        help="i.i.d. walkers per node while training the hyperparameters")
    parser.add_argument("--train-iterations", type=non_negative_int, default=train_iterations,
                        help="Adam iterations on the marginal likelihood (default %(default)s)")
    parser.add_argument("--learning-rate", type=positive_float, default=0.05,
                        help="Adam learning rate of the hyperparameter training")
    add_device_argument(parser)
    add_common_arguments(parser, repeats=repeats)


def protocol_from_args(args: argparse.Namespace, **overrides: Any) -> GraphGPProtocol:
    """The protocol settings chosen on the command line (``overrides`` replace fields, e.g. a resolved ``p_halt``)."""
    settings = dict(
        train_walkers=args.train_walkers, train_iterations=args.train_iterations,
        learning_rate=args.learning_rate, walkers=tuple(args.walkers), couplings=tuple(args.couplings),
        proposal=args.proposal, directions=tuple(args.directions),
        p_halt=args.p_halt, sigma_order=args.order, sigma_fit_samples=args.fit_samples,
        repeats=args.repeats, seed=args.seed, kernel=args.kernel, train_directions=args.train_directions,
        device=args.device)
    return GraphGPProtocol(**(settings | overrides))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol on every requested mesh."""
    protocol = protocol_from_args(args)
    folder = figure_folder(args)
    meshes, results = {}, []
    for name in args.mesh:
        dataset = default_mesh() if name == "default" else load_mesh(name, args.data_dir)
        train, test = split_test_nodes(dataset.graph.num_nodes, seed=args.seed)
        report = run_protocol(dataset.graph, dataset.targets, train, test, protocol,
                              node_posterior=folder is not None)
        if folder is not None:
            log_figures(mesh_figures(dataset, test, report, folder))
        meshes[dataset.name] = {key: report[key] for key in ("nodes", "train", "test", "trained",
                                                             "exact_at_trained")}
        results.extend({"mesh": dataset.name, **row} for row in report["results"])
        notes = report["notes"]
    return {"experiment": "mesh", "meshes": meshes, "protocol": report["protocol"],
            "notes": notes, "results": results}


def mesh_figures(dataset: MeshDataset, test: np.ndarray, report: dict[str, Any], folder: Path) -> list[Path]:
    """The mesh coloured by truth / posterior mean / std, metrics against walkers, training curve.

    :param dataset: The mesh.
    :param test: Held-out faces.
    :param report: :func:`~gp_couple.experiments.graph_gp.run_protocol`'s report, run with
        ``node_posterior=True``; its ``node_posterior`` entry is removed once drawn.
    :param folder: Output folder.
    :return: The PNG files written.
    """
    from .. import plotting
    from .graph_gp import protocol_figures

    posterior = report.pop("node_posterior")  # drawn here; too long to print with the report
    mesh_figure = plotting.plot_mesh_posterior(
        dataset.mesh.vertices, dataset.mesh.faces, dataset.targets, posterior["mean"], posterior["std"],
        folder / f"{dataset.name}_posterior.png", test_faces=test,
        title=f"{dataset.name}: normal z, GRF-GP with {posterior['walkers']} {posterior['coupling']} "
              f"walkers per face; {len(test)} held-out faces outlined")
    return [mesh_figure, *protocol_figures(report, folder, dataset.name)]


def register(subparsers: Any) -> None:
    """Add the ``mesh`` sub-command."""
    parser = subparsers.add_parser("mesh", help="mesh interpolation with iid / antithetic / sigma GRF-GPs",
                                   description="Probabilistic mesh interpolation (paper, Section 4.2 and Appendix F.2).")
    parser.add_argument("--mesh", nargs="+", default=["default"],
                        help="mesh files or names in <data-dir>/meshes "
                             f"(paper: {' '.join(PAPER_MESHES)}); 'default' is the built-in mesh")
    parser.add_argument("--data-dir", default=None, help="dataset directory (default $GP_COUPLE_DATA)")
    add_protocol_arguments(parser, walkers=[16, 32, 64], train_iterations=1000, repeats=10)
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "mesh", "walkers", "coupling", "directions", "gram_error", "test_rmse", "kl")))
