r"""``gp-couple demo``: mesh interpolation on the built-in mesh, no data needed.

On 95 % of the faces of the built-in bumpy icosphere (1280 faces):

1. the exact GP (diffusion kernel, :class:`~gp_couple.kernels.ExactGraphKernel`) is trained
   to convergence by L-BFGS on its marginal likelihood, the reference of every number;
2. the paper's comparison (Section 4.2 "Experiments with σ-coupled GRFs"
   [sec:graph_gp_experiments]): a GRF-GP with 8 i.i.d. walkers is trained to convergence,
   its hyperparameters are frozen, and i.i.d., antithetic and :math:`\sigma`-coupled
   walkers (independent or repelling directions) are compared on the held-out faces
   against the exact kernel at those hyperparameters: Gram-matrix error, test RMSE and KL
   divergence to the exact posterior;
3. the recommended GRF-GP (:func:`gp_couple.recipes.fit_grf_gp`, its walker counts and its
   training rounds on the prediction walks capped for a quick run) is trained and predicts
   end to end; its test RMSE and NLPD (variances to a stated accuracy,
   :func:`gp_couple.models.predict`) stand beside the exact GP's.

Every stage logs a progress line (to the terminal or a log file).
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from typing import Any

import gpytorch
import numpy as np
import torch

from ..datasets import default_mesh, split_test_nodes
from ..evaluation import nlpd, rmse
from ..kernel_families import Diffusion
from ..kernels import ExactGraphKernel
from ..kernels.walk_schedule import BiasCorrectionWarning, GramToleranceWarning
from ..models import GraphGP, fit_gp, predict
from ..recipes import fit_grf_gp
from ..settings import grf_gp_settings
from ._report import figure_folder, log_figures
from .graph_gp import GraphGPProtocol, run_protocol
from .mesh import mesh_figures

_LOG = logging.getLogger(__name__)

def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo protocol on the built-in mesh."""
    start = time.perf_counter()
    folder = figure_folder(args)
    dataset = default_mesh()
    train, test = split_test_nodes(dataset.graph.num_nodes, seed=args.seed)
    _LOG.info("demo: exact GP on %d faces (%d held out)", dataset.graph.num_nodes, test.size)
    exact = end_to_end(dataset, train, test, args.train_iterations, args.seed, exact=True, device=args.device)
    _LOG.info("demo: exact GP trained and predicted in %.1fs; coupling comparison", exact["seconds"])
    protocol = GraphGPProtocol(train_iterations=args.train_iterations, train_optimizer="lbfgs",
                               walkers=tuple(args.walkers), repeats=args.repeats, sigma_fit_samples=40,
                               seed=args.seed, proposal=args.proposal, directions=tuple(args.directions),
                               device=args.device)
    report = run_protocol(dataset.graph, dataset.targets, train, test, protocol,
                          node_posterior=folder is not None)
    if folder is not None:
        log_figures(mesh_figures(dataset, test, report, folder))
    _LOG.info("demo: recommended GRF-GP end to end")
    report["exact_gp"] = exact
    report["recommended"] = end_to_end(dataset, train, test, args.train_iterations, args.seed, exact=False,
                                       device=args.device, max_walkers=(args.max_train_walkers,
                                                                        args.max_predict_walkers),
                                       refits=args.refits)
    trained, recommended = report["trained"], report["recommended"]
    report.update(experiment=f"demo: GRF-GP interpolation of face normals on {dataset.name} "
                             f"({report['nodes']} faces, {report['test']} held out)")
    report["notes"] = [
        f"exact GP trained to convergence (L-BFGS) in {exact['seconds']:.1f}s: test RMSE {exact['test_rmse']:.4f}, "
        f"NLPD {exact['test_nlpd']:.3f}",
        f"comparison: GRF-GP with 8 iid walkers trained to convergence in {trained['seconds']:.1f}s: "
        f"outputscale={trained['outputscale']:.3g}, gamma={trained['hyperparameters']['gamma']:.3g}, "
        f"noise={trained['noise']:.3g}",
        f"exact kernel at these hyperparameters, test RMSE: {report['exact_at_trained']['test_rmse']:.4f}",
    ] + report["notes"] + [
        f"recommended GRF-GP end to end (gp_couple.recipes.fit_grf_gp, at most {args.max_train_walkers} training "
        f"and {args.max_predict_walkers} prediction walkers, at most {args.refits} training round(s) on the latter) "
        f"in {recommended['seconds']:.1f}s: test RMSE "
        f"{recommended['test_rmse']:.4f} ({recommended['test_rmse'] / exact['test_rmse']:.2f}x the exact GP's), "
        f"NLPD {recommended['test_nlpd']:.3f} ({recommended['test_nlpd'] - exact['test_nlpd']:+.3f}); "
        f"{recommended['walkers']} prediction walkers at p_halt {recommended['p_halt']:.3g}"
        + "".join(f"; capped for speed: {note}" for note in recommended["capped_walks"]),
        f"total time {time.perf_counter() - start:.1f}s"]
    return report


def end_to_end(dataset: Any, train: np.ndarray, test: np.ndarray, iterations: int, seed: int, *, exact: bool,
               device: str = "cpu", max_walkers: tuple[int, int] = (256, 1024), refits: int = 1) -> dict[str, Any]:
    """Train to convergence and predict: the exact GP, or the recommended GRF-GP (:func:`gp_couple.recipes.fit_grf_gp`).

    Targets are standardised with the training mean and standard deviation; the test RMSE
    is in the targets' units and the NLPD is that of the held-out observations.
    ``max_walkers`` caps the recipe's training and prediction walkers per node, and
    ``refits`` its training rounds on the prediction walks.
    """
    start = time.perf_counter()
    values = np.asarray(dataset.targets, dtype=np.float64)
    shift, scale = float(values[train].mean()), float(values[train].std()) or 1.0
    standardised = (values[train] - shift) / scale
    result: dict[str, Any] = {}
    if exact:
        kernel = gpytorch.kernels.ScaleKernel(ExactGraphKernel(dataset.graph, Diffusion(1.0))).to(device)
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device)
        model = GraphGP(train, torch.as_tensor(standardised, dtype=torch.float32), likelihood, kernel)
        with grf_gp_settings():
            fit_gp(model, likelihood, iterations=iterations, optimizer="lbfgs", seed=seed)
    else:
        # The walker caps are the demo's choice, for speed: walks they keep noisier than the
        # schedule's tolerances, and the training on one draw they lead to, are reported in
        # the result, not as warnings.
        noted = (GramToleranceWarning, BiasCorrectionWarning)
        with warnings.catch_warnings(record=True) as capped:
            warnings.simplefilter("always", GramToleranceWarning)
            warnings.simplefilter("always", BiasCorrectionWarning)
            model, likelihood = fit_grf_gp(dataset.graph, train, standardised, predict_nodes=test,
                                           iterations=iterations, max_train_walkers=max_walkers[0],
                                           max_predict_walkers=max_walkers[1], sigma_fit_samples=40,
                                           refits=refits, seed=seed,
                                           device=device)
        for caught in capped:
            if not issubclass(caught.category, noted):
                warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)
        base = model.covar_module.base_kernel
        result.update(walkers=base.num_walkers, p_halt=base.p_halt, gram_error_estimate=base.gram_error_estimate,
                      # The last word of each stage (training phases may warn more than once).
                      capped_walks=list({str(caught.message).split()[1]: str(caught.message).split(":")[0]
                                         for caught in capped
                                         if issubclass(caught.category, noted)}.values()))
    with grf_gp_settings():
        mean, variance = predict(model, likelihood, test, seed=seed)
    mean = mean.double().cpu().numpy() * scale + shift
    variance = variance.double().cpu().numpy() * scale ** 2
    family = model.covar_module.base_kernel.kernel_family
    result.update(test_rmse=rmse(mean, values[test]), test_nlpd=nlpd(mean, variance, values[test]),
                  outputscale=float(model.covar_module.outputscale.detach()), noise=float(likelihood.noise.detach()),
                  hyperparameters=family.hyperparameters(), seconds=time.perf_counter() - start)
    return result
