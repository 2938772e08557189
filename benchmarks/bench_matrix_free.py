"""Benchmark: the matrix-free exact graph kernel (Chebyshev recurrences) at 10^4-10^5 nodes.

For each graph and diffusion lengthscale gamma (tolerance ``--tolerance``) this measures,
in one process:

* ``degree``, ``tail_bound``: the Chebyshev degree J and the reported bound on
  ``||K - K_J||_2``;
* ``product_s[t]``: one product ``K v`` over all nodes with t right-hand sides
  (``MatrixFreeGraphKernel`` operator, forward only), against two baselines measured in the
  same run: ``sparse_product_s[t]``, one product ``W~ X`` with the same torch sparse CSR
  matrix (``product_vs_sparse`` = product / sparse product, ideally about J), and
  ``expm_multiply_s[t]``, the column reference of ``gp_couple.exact`` (scipy's
  ``expm_multiply``, float64) for the same right-hand sides (``expm_multiply_vs_product``);
* ``gradient_s``: forward and backward of ``u^T K v`` (t = 33) with respect to gamma;
* ``diagonal_s``: the one-off diagonal table for ``--diagonal-nodes`` random nodes
  (``diagonal_per_node_ms``), and ``diagonal_cached_s``, the diagonal of those nodes
  once the table exists;
* accuracy against the same kernel at tolerance 1e-13 (``product_error[t]``, the largest
  ``||K_J v - K v||_2 / ||v||_2`` over the product columns; ``max_error``, the largest
  entry of ``K[:, S] - K_ref[:, S]`` over ``--check-columns`` columns; ``diagonal_error``
  at those nodes), all at most ``tail_bound`` (``error_within_bound``), and the same
  errors against ``gp_couple.exact.exact_kernel_columns`` (scipy's expm_multiply,
  ``*_vs_expm_multiply``), whose own error is ``expm_multiply_error[t]``.

Timings are the best of ``--repeats`` runs. With ``--gp GRAPH`` it instead times an exact
GP (``GraphGP`` + ``fit_gp`` + ``predict`` on CG, ``grf_gp_settings(max_cholesky_size=0)``):
the one-off training diagonal, each Adam step, and predictions at held-out nodes with
Lanczos (``fast``) and exact variances. Prints one JSON document.

Run: ``python benchmarks/bench_matrix_free.py --json-out benchmarks/results/matrix_free.json`` and
``python benchmarks/bench_matrix_free.py --gp grid:316x316 --json-out
benchmarks/results/matrix_free_gp_grid316x316.json``
(likewise ``grid:100x100``)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report, peak_increase, reset_peak  # noqa: E402


def best_time(function: Callable[[], Any], repeats: int) -> float:
    return min(timeit.repeat(function, number=1, repeat=repeats))


def measure(spec: str, gamma: float, args: argparse.Namespace) -> dict[str, Any]:
    from gp_couple.datasets import resolve_graph
    from gp_couple.exact import exact_kernel_columns
    from gp_couple.kernel_families import Diffusion
    from gp_couple.kernels import MatrixFreeGraphKernel

    graph = resolve_graph(spec)
    n = graph.num_nodes
    kernel = MatrixFreeGraphKernel(graph, Diffusion(gamma).double(), tolerance=args.tolerance)
    truncation = kernel.truncation()
    basis = kernel.basis
    all_nodes = torch.arange(n, dtype=torch.float64).unsqueeze(-1)
    generator = torch.Generator().manual_seed(0)
    result: dict[str, Any] = {"graph": spec, "num_nodes": n, "nnz": basis.nnz, "gamma": gamma,
                              "tolerance": args.tolerance, "degree": truncation["degree"],
                              "tail_bound": truncation["tail_bound"],
                              "product_s": {}, "sparse_product_s": {}, "expm_multiply_s": {}}
    # A tight expansion (tolerance 1e-13) is the accuracy reference: scipy's expm_multiply,
    # which gp_couple.exact uses for diffusion columns, is itself only accurate to ~1e-9 here.
    tight = MatrixFreeGraphKernel(graph, kernel.kernel_family, tolerance=1e-13)
    tight_operator = tight(all_nodes).evaluate_kernel()
    adjacency = graph.normalized_adjacency()
    from scipy.sparse.linalg import expm_multiply

    def column_error(approximate: np.ndarray, reference: np.ndarray, block: np.ndarray) -> float:
        # max over columns of ||approximate - reference||_2 / ||v||_2 (<= the operator-norm error)
        return float((np.linalg.norm(approximate - reference, axis=0) / np.linalg.norm(block, axis=0)).max())

    for width in args.widths:
        rhs = torch.randn(n, width, dtype=torch.float64, generator=generator)
        block = rhs.numpy()
        g2 = gamma**2
        with torch.no_grad():
            operator = kernel(all_nodes).evaluate_kernel()
            result["product_s"][width] = best_time(lambda: operator @ rhs, args.repeats)  # noqa: B023 - called in this iteration
            matrix = basis.matrix(rhs)
            result["sparse_product_s"][width] = best_time(lambda: matrix @ rhs, args.repeats)  # noqa: B023 - called in this iteration
            ours, reference = (operator @ rhs).numpy(), (tight_operator @ rhs).numpy()
        result["expm_multiply_s"][width] = best_time(
            lambda: np.exp(-g2) * expm_multiply(g2 * adjacency, block), args.repeats)  # noqa: B023 - called in this iteration
        expm = np.exp(-g2) * expm_multiply(g2 * adjacency, block)
        result.setdefault("product_error", {})[width] = column_error(ours, reference, block)
        result.setdefault("product_error_vs_expm_multiply", {})[width] = column_error(ours, expm, block)
        result.setdefault("expm_multiply_error", {})[width] = column_error(expm, reference, block)
    result["product_vs_sparse"] = {w: result["product_s"][w] / result["sparse_product_s"][w] for w in args.widths}
    result["expm_multiply_vs_product"] = {w: result["expm_multiply_s"][w] / result["product_s"][w]
                                          for w in args.widths}

    left = torch.randn(n, 33, dtype=torch.float64, generator=generator)
    right = torch.randn(n, 33, dtype=torch.float64, generator=generator)

    def gradient() -> None:
        kernel.zero_grad()
        operator = kernel(all_nodes).evaluate_kernel()
        (left * (operator @ right)).sum().backward()

    result["gradient_s"] = best_time(gradient, args.repeats)

    rng = np.random.default_rng(0)
    diagonal_nodes = torch.from_numpy(np.sort(rng.choice(n, size=min(args.diagonal_nodes, n), replace=False)))
    x_diagonal = diagonal_nodes.double().unsqueeze(-1)
    baseline = reset_peak()
    start = time.perf_counter()
    with torch.no_grad():
        kernel(x_diagonal, diag=True)
    result["diagonal_s"] = time.perf_counter() - start
    result["diagonal_peak_gb"] = peak_increase(baseline)
    result["diagonal_nodes"] = int(diagonal_nodes.numel())
    result["diagonal_per_node_ms"] = 1e3 * result["diagonal_s"] / diagonal_nodes.numel()
    with torch.no_grad():
        result["diagonal_cached_s"] = best_time(lambda: kernel(x_diagonal, diag=True), args.repeats)

    columns = np.sort(rng.choice(n, size=args.check_columns, replace=False))
    x_columns = torch.from_numpy(columns).double().unsqueeze(-1)
    expm_columns = exact_kernel_columns(kernel.kernel_family, graph, columns)
    with torch.no_grad():
        ours = kernel(all_nodes, x_columns).evaluate_kernel().to_dense().numpy()
        reference = tight(all_nodes, x_columns).evaluate_kernel().to_dense().numpy()
        diagonal = kernel(x_columns, diag=True).numpy()
    on_diagonal = (columns, np.arange(columns.size))
    result["max_error"] = float(np.abs(ours - reference).max())
    result["diagonal_error"] = float(np.abs(diagonal - reference[on_diagonal]).max())
    result["max_error_vs_expm_multiply"] = float(np.abs(ours - expm_columns).max())
    result["diagonal_error_vs_expm_multiply"] = float(np.abs(diagonal - expm_columns[on_diagonal]).max())
    result["error_within_bound"] = bool(max(result["max_error"], result["diagonal_error"],
                                            *result["product_error"].values()) <= result["tail_bound"])
    return result


def measure_gp(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """Exact GP with the matrix-free kernel on CG: training steps, then mean and variances."""
    import gpytorch

    from gp_couple.datasets import resolve_graph
    from gp_couple.kernel_families import Diffusion
    from gp_couple.kernels import MatrixFreeGraphKernel
    from gp_couple.models import GraphGP, fit_gp, predict
    from gp_couple.settings import grf_gp_settings

    graph = resolve_graph(spec)
    n = graph.num_nodes
    rng = np.random.default_rng(0)
    nodes = rng.permutation(n)
    train, test = np.sort(nodes[:args.gp_train]), np.sort(nodes[args.gp_train:args.gp_train + args.gp_test])
    # A smooth signal: a few diffusion-smoothed spikes (any signal works for timing).
    kernel = MatrixFreeGraphKernel(graph, Diffusion(3.0).double(), tolerance=args.tolerance)
    spikes = torch.zeros(n, 1, dtype=torch.float64)
    spikes[torch.from_numpy(rng.choice(n, 50, replace=False))] = torch.from_numpy(rng.normal(size=(50, 1)))
    with torch.no_grad():
        signal = (kernel(torch.arange(n, dtype=torch.float64).unsqueeze(-1)).evaluate_kernel() @ spikes).squeeze(-1)
    signal = signal / signal.std()
    targets = signal[torch.from_numpy(train)] + 0.1 * torch.from_numpy(rng.normal(size=train.size))
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(
        MatrixFreeGraphKernel(graph, Diffusion(2.0).double(), tolerance=args.tolerance))).double()
    result: dict[str, Any] = {"graph": spec, "num_nodes": n, "train": int(train.size), "test": int(test.size),
                              "tolerance": args.tolerance}
    with grf_gp_settings(max_cholesky_size=0):
        start = time.perf_counter()
        with torch.no_grad():
            model.covar_module(model.train_inputs[0], diag=True)
        result["train_diagonal_s"] = time.perf_counter() - start
        step_times: list[float] = []
        last = [time.perf_counter()]

        def timer(step: int, loss: float) -> None:
            now = time.perf_counter()
            step_times.append(now - last[0])
            last[0] = now

        history = fit_gp(model, likelihood, iterations=args.gp_iterations, lr=0.05, seed=0, callback=timer)
        result["step_s"] = step_times
        result["losses"] = history
        result["degree"] = model.covar_module.base_kernel.truncation()["degree"]
        for method in ("auto", "dense"):
            start = time.perf_counter()
            prediction = predict(model, likelihood, test, variance=method, seed=0)
            mean, variance = prediction
            result[f"predict_{method}_s"] = time.perf_counter() - start
            result[f"variance_estimate_{method}"] = vars(prediction.estimate)
            truth = signal[torch.from_numpy(test)]
            result[f"test_rmse_{method}"] = float((mean - truth).square().mean().sqrt())
            result[f"mean_variance_{method}"] = float(variance.mean())
            if args.gp_skip_exact_variance:
                break
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["grid:100x100", "grid:316x316", "icosphere:6"])
    parser.add_argument("--gammas", nargs="+", type=float, default=[1.0, 3.0])
    parser.add_argument("--tolerance", type=float, default=1e-8)
    parser.add_argument("--widths", nargs="+", type=int, default=[1, 33])
    parser.add_argument("--diagonal-nodes", type=int, default=1000)
    parser.add_argument("--check-columns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: this shared 2-core box oversubscribes parallel sparse "
                             "kernels; scipy's expm_multiply baseline is single-threaded too)")
    parser.add_argument("--gp", default=None, metavar="GRAPH",
                        help="instead: time an exact GP (fit_gp + predict, CG) on this graph")
    parser.add_argument("--gp-train", type=int, default=5000)
    parser.add_argument("--gp-test", type=int, default=1000)
    parser.add_argument("--gp-iterations", type=int, default=3)
    parser.add_argument("--gp-skip-exact-variance", action="store_true",  # the dense float64 reference
                        help="only fast_pred_var (Lanczos) variances")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {"benchmark": "matrix_free", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "settings": vars(args)}
    if args.gp:
        report["gp"] = measure_gp(args.gp, args)
    else:
        report["results"] = [measure(spec, gamma, args) for spec in args.graphs for gamma in args.gammas]
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
