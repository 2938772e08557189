r"""``gp-couple demo``: mesh interpolation on the built-in mesh, in well under a minute, no data needed.

Trains a GRF-GP (diffusion kernel, 8 i.i.d. walkers) on 95 % of the faces of the
built-in bumpy icosphere, then compares i.i.d., antithetic and :math:`\sigma`-coupled
walkers on the held-out faces against the exact GP: Gram-matrix error, test RMSE and
KL divergence to the exact posterior. Finally trains and predicts end to end with the
recommended configuration (:func:`gp_couple.recipes.fit_grf_gp`) and reports its test
RMSE and NLPD.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from ..datasets import default_mesh, split_test_nodes
from ..evaluation import nlpd, rmse
from ..models import predict
from ..recipes import RECOMMENDED_PREDICT_WALKERS, RECOMMENDED_TRAIN_WALKERS, fit_grf_gp
from ..settings import grf_gp_settings
from ._report import add_common_arguments, emit, figure_folder, log_figures, non_negative_int, positive_int
from ._couplings import add_walk_arguments
from ._runtime import add_device_argument
from .graph_gp import GraphGPProtocol, run_protocol
from .mesh import mesh_figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo protocol on the built-in mesh."""
    start = time.perf_counter()
    folder = figure_folder(args)
    dataset = default_mesh()
    train, test = split_test_nodes(dataset.graph.num_nodes, seed=args.seed)
    protocol = GraphGPProtocol(train_iterations=args.train_iterations, walkers=tuple(args.walkers),
                               repeats=args.repeats, sigma_fit_samples=40, seed=args.seed,
                               proposal=args.proposal, directions=tuple(args.directions),
                               device=args.device)
    report = run_protocol(dataset.graph, dataset.targets, train, test, protocol,
                          node_posterior=folder is not None)
    if folder is not None:
        log_figures(mesh_figures(dataset, test, report, folder))
    report["recommended"] = recommended_end_to_end(dataset, train, test, args.train_iterations, args.seed,
                                                   device=args.device)
    trained = report["trained"]
    report.update(experiment=f"demo: GRF-GP interpolation of face normals on {dataset.name} "
                             f"({report['nodes']} faces, {report['test']} held out)")
    report["notes"] = [
        f"trained with 8 iid walkers in {trained['seconds']:.1f}s: outputscale={trained['outputscale']:.3g}, "
        f"gamma={trained['hyperparameters']['gamma']:.3g}, noise={trained['noise']:.3g}",
        f"exact kernel at these hyperparameters, test RMSE: {report['exact_at_trained']['test_rmse']:.4f}",
    ] + report["notes"] + [
        "recommended GRF-GP end to end (gp_couple.recipes.fit_grf_gp: "
        f"{RECOMMENDED_TRAIN_WALKERS} antithetic repelling walkers, "
        f"predictions with {RECOMMENDED_PREDICT_WALKERS} sigma-coupled ones) in {report['recommended']['seconds']:.1f}s: "
        f"test RMSE {report['recommended']['test_rmse']:.4f}, NLPD {report['recommended']['test_nlpd']:.3f}",
        f"total time {time.perf_counter() - start:.1f}s"]
    return report


def recommended_end_to_end(dataset: Any, train: np.ndarray, test: np.ndarray, iterations: int,
                           seed: int, *, device: str = "cpu") -> dict[str, float]:
    """Train and predict with the recommended configuration (:func:`gp_couple.recipes.fit_grf_gp`).

    Targets are standardised with the training mean and standard deviation; the test RMSE
    is in the targets' units and the NLPD is that of the held-out observations.
    """
    start = time.perf_counter()
    values = np.asarray(dataset.targets, dtype=np.float64)
    shift, scale = float(values[train].mean()), float(values[train].std()) or 1.0
    model, likelihood = fit_grf_gp(dataset.graph, train, (values[train] - shift) / scale, predict_nodes=test,
                                   iterations=iterations, sigma_fit_samples=40, seed=seed, device=device)
    with grf_gp_settings():
        mean, variance = predict(model, likelihood, test, seed=seed)
    mean = mean.double().cpu().numpy() * scale + shift
    variance = variance.double().cpu().numpy() * scale ** 2
    return {"test_rmse": rmse(mean, values[test]), "test_nlpd": nlpd(mean, variance, values[test]),
            "seconds": time.perf_counter() - start}


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    parser = subparsers.add_parser("demo", help="quick mesh-interpolation demo on a built-in mesh",
                                   description="GRF-GP mesh interpolation demo (no data needed).")
    parser.add_argument("--walkers", nargs="+", type=positive_int, default=[16, 32, 64],
                        help="walkers per node compared after training (even, for the paired couplings)")
    parser.add_argument("--train-iterations", type=non_negative_int, default=300,
                        help="Adam iterations on the marginal likelihood (8 i.i.d. walkers)")
    add_walk_arguments(parser)
    add_device_argument(parser)
    add_common_arguments(parser, repeats=10)
    parser.set_defaults(func=lambda args: emit(run(args), as_json=args.json, columns=(
        "walkers", "coupling", "directions", "gram_error", "test_rmse", "kl"), stream=sys.stdout))
