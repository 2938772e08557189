"""Benchmark: predictive variances against a float64 dense posterior, by method.

For each problem (a draw from an exact diffusion-GP prior on a grid, 80 % of the nodes
observed, hyperparameters fixed at the generating ones), the latent posterior variances at
the held-out nodes are computed

* by gpytorch's ``fast_pred_var`` with a Lanczos cache of rank 300 (what
  ``grf_gp_settings()`` + ``predict(fast=True)`` did before),
* by :func:`gp_couple.models.predict` with ``variance="auto"`` (dense float64 Cholesky up
  to 10,000 training points; above, the sparse LU factor for GRF kernels, else Krylov),
  ``variance="sparse"`` (GRF kernels only) and ``variance="lanczos"`` (block Krylov grown
  until the residual bound on 64 probed points is within the tolerance, 0.01),

and compared with a float64 Cholesky posterior of the same kernel blocks: median and
largest ratio to the truth, the reported error estimate, the Krylov rank and wall time.

Run: ``python benchmarks/bench_variance.py --json-out benchmarks/results/variance.json``
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, run_in_subprocess  # noqa: E402

#: ``KIND:SIDE:WALKERS``: kernel (exact, matrix_free, grf), grid side, GRF walkers.
PROBLEMS = ("exact:52:0", "grf:52:64", "matrix_free:70:0", "grf:70:64", "matrix_free:100:0", "grf:150:64")


def run_problem(spec: str, seed: int) -> dict[str, Any]:
    """Every method's variances on one problem against the float64 dense posterior."""
    import gpytorch
    import scipy.linalg
    import scipy.sparse as sp
    import torch
    from scipy.sparse.linalg import expm_multiply
    from threadpoolctl import threadpool_limits

    from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, grf_gp_settings, predict
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel

    kind, side, walkers = spec.split(":")
    graph = grid_graph(int(side), int(side))
    rng = np.random.default_rng(seed)
    laplacian = sp.identity(graph.num_nodes, format="csr") - graph.normalized_adjacency()
    signal = expm_multiply(-0.5 * 9.0 * laplacian, rng.normal(size=graph.num_nodes))
    observed = (signal - signal.mean()) / signal.std() + 0.1 * rng.normal(size=graph.num_nodes)
    order = rng.permutation(graph.num_nodes)
    cut = int(0.8 * graph.num_nodes)
    train, test = np.sort(order[:cut]), np.sort(order[cut:])
    family = Diffusion(3.0)
    if kind == "exact":
        base = ExactGraphKernel(graph, family)
    elif kind == "matrix_free":
        base = MatrixFreeGraphKernel(graph, family)
    else:
        base = GRFKernel(graph, num_walkers=int(walkers), kernel_family=family, nodes=np.arange(graph.num_nodes),
                         seed=seed, schedule=None)
    kernel = gpytorch.kernels.ScaleKernel(base)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood, kernel)
    kernel.outputscale, likelihood.noise = 1.0, 0.01
    start = time.perf_counter()
    x_train = torch.as_tensor(train, dtype=torch.float32).unsqueeze(-1)
    x_test = torch.as_tensor(test, dtype=torch.float32).unsqueeze(-1)
    with torch.no_grad():
        k_train = kernel(x_train).to_dense().double().numpy()
        k_cross = kernel(x_test, x_train).to_dense().double().numpy()
        prior = kernel(x_test, diag=True).double().numpy()
    k_train[np.diag_indices_from(k_train)] += 0.01
    # One BLAS thread: the multi-threaded Cholesky of OpenBLAS 0.3.31 (numpy's and SciPy's wheels)
    # segfaulted on 18,000 x 18,000 matrices on the 2-core development machine; one thread does not.
    with threadpool_limits(1, user_api="blas"):
        factor = scipy.linalg.cholesky(k_train, lower=True, overwrite_a=True, check_finite=False)
        truth = prior - (scipy.linalg.solve_triangular(factor, k_cross.T, lower=True, check_finite=False) ** 2).sum(0)
    result: dict[str, Any] = {"problem": spec, "train": int(train.size), "test": int(test.size),
                              "truth_s": time.perf_counter() - start, "methods": []}

    def record(name: str, variance: Any, seconds: float, estimate: Any = None) -> None:
        ratio = np.asarray(variance, dtype=np.float64) / truth
        row = {"method": name, "median_ratio": float(np.median(ratio)), "max_ratio": float(ratio.max()),
               "min_ratio": float(ratio.min()), "seconds": seconds}
        if estimate is not None:
            row.update(chosen=estimate.method, rank=estimate.rank, estimated_error=estimate.relative_error,
                       converged=estimate.converged)
        result["methods"].append(row)

    model.eval()
    start = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(), grf_gp_settings(max_root_decomposition_size=300), \
            gpytorch.settings.max_cholesky_size(0):
        cached = model(model.node_inputs(test)).variance.double().numpy()
    record("fast_pred_var_rank_300", cached, time.perf_counter() - start)
    model.prediction_strategy = None
    for method in ("auto", "sparse", "lanczos") if kind == "grf" else ("auto", "lanczos"):
        start = time.perf_counter()
        with grf_gp_settings():
            prediction = predict(model, likelihood, test, noise=False, variance=method, seed=seed)
        record(f"predict_{method}", prediction.variance.double().numpy(), time.perf_counter() - start,
               prediction.estimate)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for spec in args.problems:
        row = run_in_subprocess(__file__, run_problem, spec, args.seed)
        row.update(problem=spec, load=os.getloadavg()[0])
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    return emit_report({"benchmark": "variance", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
