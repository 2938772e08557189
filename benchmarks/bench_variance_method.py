"""Benchmark: the dense against the sparse factor for exact predictive variances up to 10^4 training points.

:func:`gp_couple.predictive_variance.posterior_variance` with ``method="auto"`` factors a
training covariance of up to ``DENSE_VARIANCE_SIZE`` points sparsely where the symbolic
cost of the sparse factor (:func:`gp_couple.sparse_factor.factor_cost`), weighted by
``SPARSE_WORK_COST``, is below the dense factor's. For each problem, ``--observed`` nodes
of ``--graph`` (a random choice) carry a GRF training covariance
:math:`s\\Phi\\Phi^\\top + \\sigma^2\\mathbf I` (``--walkers`` walkers at p_halt 0.1,
diffusion γ, output scale 1, noise 0.01) and ``--test`` other nodes its cross-covariance.
In one process, one thread per library, the benchmark records:

* the CPU seconds of ``method="dense"`` (the baseline) and ``method="auto"`` (the ordering,
  the symbolic count and whichever factor it chose), the method chosen, and the largest
  relative difference of the variances and the mean corrections between the two;
* the symbolic count: the sparse factor's entries and multiply-adds against the dense
  factor's :math:`n^3/3`, and the CPU seconds per multiply-add of each factor
  (``method="sparse"`` is timed too), from which ``SPARSE_WORK_COST`` is read.

Run (one thread per library, an otherwise idle machine):

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/bench_variance_method.py --json-out benchmarks/results/variance_method.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402

NOISE = 0.01
DEFAULT_PROBLEMS = ["grid:1000x1000:10000:3", "grid:300x300:10000:3", "grid:200x200:10000:3",
                    "grid:150x150:10000:2", "icosphere:5:10000:3", "erdos-renyi:6000:0.0007:4000:1"]


def _problem(spec: str, walkers: int, test: int, seed: int) -> tuple[Any, Any, Any, Any, int]:
    """Training covariance, cross-covariance, prior diagonal, residual and size for ``GRAPH:OBSERVED:GAMMA``."""
    import torch
    from linear_operator.operators import DiagLinearOperator

    from gp_couple import Diffusion, GRFKernel
    from gp_couple.datasets import resolve_graph
    from gp_couple.operators.grf_gram import GRFGramLinearOperator

    graph_spec, observed, gamma = spec.rsplit(":", 2)
    graph = resolve_graph(graph_spec)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(graph.num_nodes, int(observed) + test, replace=False)
    train, test_nodes = np.sort(chosen[:int(observed)]), np.sort(chosen[int(observed):])
    kernel = GRFKernel(graph, num_walkers=walkers, p_halt=0.1, kernel_family=Diffusion(float(gamma)), seed=seed,
                       nodes=np.concatenate([train, test_nodes]), schedule=None)
    with torch.no_grad():
        train_rows = kernel.feature_operator(torch.as_tensor(train))
        test_rows = kernel.feature_operator(torch.as_tensor(test_nodes))
        covariance = GRFGramLinearOperator(train_rows) + DiagLinearOperator(torch.full((train.size,), NOISE))
        cross = GRFGramLinearOperator(test_rows, train_rows)
        prior = GRFGramLinearOperator(test_rows)._diagonal()
    residual = torch.from_numpy(rng.standard_normal(train.size)).float()
    return covariance, cross, prior, residual, int(train.size)


def run(spec: str, walkers: int, test: int, seed: int) -> dict[str, Any]:
    """Time the three variance methods on one problem; return the row."""
    import torch

    from gp_couple.predictive_variance import SPARSE_WORK_COST, posterior_variance, sparse_form
    from gp_couple.sparse_factor import factor_cost

    covariance, cross, prior, residual, size = _problem(spec, walkers, test, seed)
    row: dict[str, Any] = {"problem": spec, "walkers": walkers, "observed": size, "test": test}
    dense_work = size ** 3 / 3 + test * size ** 2
    with torch.no_grad():
        matrix = sparse_form(covariance)
    start = time.process_time()
    # A sparse factor of more than four times the dense factor's work is not timed.
    cost = factor_cost(matrix, int(4 * dense_work))
    row["symbolic_cpu_s"] = time.process_time() - start
    row.update(gram_entries=int(matrix.nnz), dense_multiply_adds=dense_work, sparse_work_cost=SPARSE_WORK_COST,
               factor_entries=None if cost is None else cost.entries,
               factor_multiply_adds=None if cost is None else cost.multiply_adds + test * cost.entries)
    results = {}
    for method in ("dense", "auto", "sparse"):
        if method == "sparse" and cost is None:
            continue
        start = time.process_time()
        variance, estimate, shift = posterior_variance(covariance, cross, prior, NOISE, method=method,
                                                       residual=residual)
        row[f"{method}_cpu_s"] = time.process_time() - start
        results[method] = (variance, shift)
        if method == "auto":
            row["auto_method"] = estimate.method
    for method in results.keys() - {"dense"}:
        variance, shift = results[method]
        row[f"{method}_variance_max_rel_diff"] = float(((variance - results["dense"][0]).abs()
                                                        / results["dense"][0].abs().clamp_min(1e-300)).max())
        row[f"{method}_mean_max_abs_diff"] = float((shift - results["dense"][1]).abs().max())
    row["auto_over_dense"] = row["auto_cpu_s"] / row["dense_cpu_s"]
    if cost is not None:
        row["sparse_over_dense"] = row["sparse_cpu_s"] / row["dense_cpu_s"]
        # Seconds per multiply-add of each method, and their ratio: what SPARSE_WORK_COST stands for.
        row["measured_work_cost"] = ((row["sparse_cpu_s"] / row["factor_multiply_adds"])
                                     / (row["dense_cpu_s"] / dense_work))
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=DEFAULT_PROBLEMS,
                        help="GRAPH:OBSERVED:GAMMA (a resolve_graph spec, training nodes, diffusion gamma)")
    parser.add_argument("--walkers", type=int, default=512)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    # Every compiled loop of both paths (the walks, the Gram-entry count, the symbolic count, the
    # sparse solves) compiled or loaded from numba's cache outside the timings.
    run("grid:60x60:1500:1", 16, 50, args.seed)
    rows = []
    for spec in args.problems:
        rows.append(run(spec, args.walkers, args.test, args.seed))
        print(rows[-1], file=sys.stderr, flush=True)
    return emit_report({"benchmark": "variance_method", "threads": os.environ.get("OMP_NUM_THREADS"),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
