"""Benchmark: peak memory of one bias-corrected training evaluation, in dense n x n matrices.

A GRF kernel's training rounds on its prediction walks evaluate the likelihood corrected for
the estimator's second-order bias, through a dense factor of the training covariance
(``gp_couple.marginal_likelihood``). Those rounds factorise densely above gpytorch's
``max_cholesky_size`` while ``gp_couple.kernels.grf_kernel.paired_factor_fits`` says the
evaluation fits in memory, counting ``PAIRED_DENSE_MATRICES`` matrices of n x n entries.
This measures that count: each configuration runs in a fresh interpreter, builds a GP on a
grid with a paired kernel, draws the second walks, then resets the peak-RSS counter and runs
one evaluation, value and gradient, in float64. The peak above the baseline, divided by
8 n^2 bytes, is the count.

    python benchmarks/bench_paired_memory.py --json-out benchmarks/results/paired_memory.json
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402

#: (grid side, training points, prediction walkers per node, diffusion range): features dense enough for a
#: dense factor to pay (longer walks at longer ranges).
CONFIGURATIONS = ((80, 3000, 64, 2.0), (100, 5000, 1024, 2.0), (110, 7000, 2048, 6.0))


def paired_evaluation(side: int, rows: int, walkers: int, gamma: float) -> dict[str, Any]:
    """Peak memory of one paired evaluation (value and gradient) on ``rows`` nodes of a ``side`` x ``side`` grid."""
    import gpytorch
    import numpy as np
    import torch

    from gp_couple.graphs import grid_graph
    from gp_couple.kernel_families import Diffusion
    from gp_couple.kernels import GRFKernel, WalkSchedule
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood
    from gp_couple.models import GraphGP

    graph = grid_graph(side, side)
    train = np.sort(np.random.default_rng(0).choice(side * side, rows, replace=False))
    kernel = GRFKernel(graph, kernel_family=Diffusion(gamma), seed=0,
                       schedule=WalkSchedule(predict_walkers=walkers, predict_tolerance=0.5, sigma_fit_samples=5))
    targets = torch.sin(torch.as_tensor(train, dtype=torch.float64) / 30)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
    model.train()
    kernel.prepare_prediction(0)
    reports: list[Any] = []
    kernel.record_evaluation = reports.append
    inputs = model.train_inputs[0]
    kernel._pair_draw(kernel.node_indices(inputs))        # the second draw, made before the measurement
    mll = DenseMarginalLogLikelihood(likelihood, model)
    baseline = reset_peak()
    with gpytorch.settings.max_cholesky_size(rows):
        loss = -mll(model(inputs), model.train_targets)
        loss.backward()
    peak = peak_increase(baseline)
    return {"grid_side": side, "training_points": rows, "walkers": walkers, "gamma": gamma,
            "paired": reports[-1].expansion_error is not None, "peak_gb": peak,
            "dense_matrices": peak * 1e9 / (8 * rows ** 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    from gp_couple.kernels.grf_kernel import PAIRED_DENSE_MATRICES

    rows = [run_in_subprocess(__file__, paired_evaluation, *configuration) for configuration in CONFIGURATIONS]
    return emit_report({"benchmark": "paired_memory", "PAIRED_DENSE_MATRICES": PAIRED_DENSE_MATRICES,
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
