"""Benchmark: the matrix-free exact GP streamed to every node, on ``bench_predict_graph.py``'s fields.

:func:`gp_couple.recipes.fit_graph_kernel` trains a ``MatrixFreeGraphKernel`` from gpytorch's
start (the stopping rule of ``fit_gp``), and :class:`gp_couple.streaming.ExactStreamedPredictor`
predicts every node in chunks; scored at the unobserved nodes as ``bench_predict_graph.py``
scores the command and the dense exact GP (compare with its JSON for the same field and seed).

With ``--hyperparameters OUTPUTSCALE GAMMA NOISE`` (the data's units) the model is built at
them instead of trained. With ``--compare-paths`` the predictor also predicts every node block by
block (:meth:`~gp_couple.streaming.StreamedPosterior.predict`: each block's cross-covariances
on their own) beside :meth:`~gp_couple.streaming.StreamedPosterior.predict_all` (every node's
terms in one pass), timing both in the same run (after the prior variances, which both share
and which are timed apart) and reporting their largest differences.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import gpytorch
import numpy as np
import torch
from bench_predict_graph import add_field_arguments, field, score


def main(argv: list[str] | None = None) -> int:
    from gp_couple import Diffusion
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
    from gp_couple.models import GraphGP
    from gp_couple.recipes import fit_graph_kernel
    from gp_couple.streaming import ExactStreamedPredictor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_field_arguments(parser)
    parser.add_argument("--hyperparameters", type=float, nargs=3, metavar=("OUTPUTSCALE", "GAMMA", "NOISE"),
                        help="build the model at these (data units) instead of training it")
    parser.add_argument("--compare-paths", action="store_true",
                        help="also predict block by block, and time both paths")
    args = parser.parse_args(argv)
    nodes, values, latent, noisy = field(args.grid, args.observed, args.seed, args.field)
    test = np.setdiff1d(np.arange(args.grid ** 2), nodes)
    offset, scale = float(values.mean()), float(values.std())
    targets = torch.as_tensor((values - offset) / scale)
    kernel = MatrixFreeGraphKernel(grid_graph(args.grid, args.grid), Diffusion(1.0))
    start = time.perf_counter()
    if args.hyperparameters is None:
        model, likelihood, history = fit_graph_kernel(kernel, nodes, targets)
        training = {"converged": bool(history.converged), "iterations": len(history)}
    else:
        outputscale, gamma, noise = args.hyperparameters
        kernel.kernel_family.gamma = gamma
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = noise / scale ** 2
        model = GraphGP(nodes, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel))
        model.covar_module.outputscale = outputscale / scale ** 2
        training = {"trained": False}
    trained = time.perf_counter() - start
    predictor = ExactStreamedPredictor(model, likelihood, target_offset=offset, target_scale=scale)
    timings: dict[str, float] = {}
    if args.compare_paths:
        # The prior variances (the Chebyshev basis keeps its diagonal table) first, timed apart: both paths share them.
        begin = time.perf_counter()
        with torch.no_grad():
            predictor.covariance(torch.arange(args.grid ** 2, dtype=torch.float64).unsqueeze(-1), diag=True)
        timings["prior variances seconds"] = time.perf_counter() - begin
        begin = time.perf_counter()
        block_mean, block_variance = predictor.predict(np.arange(args.grid ** 2))
        timings["block by block seconds"] = time.perf_counter() - begin
    begin = time.perf_counter()
    mean, variance = predictor.predict_all()
    timings["predict_all seconds"] = time.perf_counter() - begin
    if args.compare_paths:
        timings["ratio"] = timings["predict_all seconds"] / timings["block by block seconds"]
        timings["largest mean difference"] = float(np.max(np.abs(mean - block_mean)))
        timings["largest relative variance difference"] = float(np.max(np.abs(variance / block_variance - 1)))
    covariance = model.covar_module
    result = {"grid": args.grid, "observed": args.observed, "seed": args.seed, "field": args.field,
              **score(mean, variance, test, latent, noisy),
              "hyperparameters": {"outputscale": float(covariance.outputscale.detach()) * scale ** 2,
                                  "noise variance": float(likelihood.noise.detach()) * scale ** 2,
                                  "gamma": float(covariance.base_kernel.kernel_family.gamma.detach())},
              **training, "block size": predictor.block_size, **timings,
              "training seconds": trained, "total seconds": time.perf_counter() - start}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
