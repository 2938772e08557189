"""Benchmark: the sparse factor of a GRF training covariance in two orderings.

The training covariance :math:`\\mathbf A = \\Phi\\Phi^\\top + \\sigma^2\\mathbf I` of
``--observed`` nodes scattered over ``--graph`` (the problem of ``bench_device.py``: 16
i.i.d. walkers at p_halt 0.1, diffusion γ = 1, noise 0.5) is factorised

* by :class:`gp_couple.sparse_factor.SparseFactor` (METIS nested dissection, then SuperLU
  in that order), and
* by SuperLU with its own minimum-degree ordering of :math:`\\mathbf A + \\mathbf A^\\top`
  (``permc_spec="MMD_AT_PLUS_A"``), what ``SparseFactor`` used before,

each in a fresh subprocess (its own peak memory). Recorded: the factor's stored entries
(both triangles), the wall time (the ordering included), the time of the inverse
quadratic forms :math:`\\mathbf k^\\top\\mathbf A^{-1}\\mathbf k` of ``--test`` other nodes'
cross-covariance rows (what a predictive variance needs; by the same compiled sparse
triangular solves in both orderings) and their sum (equal in both, to rounding), and the
peak resident-memory increase.

Run: ``python benchmarks/bench_sparse_factor.py --graph grid:3163x3163 --observed 100000
300000 1000000 --json-out benchmarks/results/sparse_factor.json`` (the 10^7-node graph and
its signal are built once and shared through ``--cache-dir``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402
from bench_device import _cached_problem  # noqa: E402

NOISE = 0.5


def _covariances(graph_spec: str, observed: int, test: int, seed: int, cache_dir: str) -> tuple[Any, Any]:
    """The training covariance and the test-by-train cross-covariance, as SciPy sparse matrices."""
    import scipy.sparse as sp
    import torch

    from gp_couple import Diffusion, GRFKernel
    from gp_couple.operators.grf_gram import GRFGramLinearOperator
    from gp_couple.predictive_variance import sparse_form

    graph, _, _ = _cached_problem(graph_spec, seed, cache_dir)
    chosen = np.random.default_rng(seed + 1).choice(graph.num_nodes, observed + test, replace=False)
    train, test_nodes = np.sort(chosen[:observed]), np.sort(chosen[observed:])
    kernel = GRFKernel(graph, num_walkers=16, p_halt=0.1, kernel_family=Diffusion(1.0), seed=seed,
                       nodes=np.concatenate([train, test_nodes]), schedule=None)
    with torch.no_grad():
        train_rows = kernel.feature_operator(torch.as_tensor(train))
        train_covariance = sparse_form(GRFGramLinearOperator(train_rows))
        cross = sparse_form(GRFGramLinearOperator(kernel.feature_operator(torch.as_tensor(test_nodes)), train_rows))
    return (train_covariance + NOISE * sp.identity(observed)).tocsc(), cross.tocsr()


def factor_row(ordering: str, graph_spec: str, observed: int, test: int, seed: int, cache_dir: str
               ) -> dict[str, Any]:
    """Factor the training covariance in ``ordering`` (``nested_dissection`` or ``minimum_degree``)."""
    import scipy.sparse.linalg as spla
    from numba import get_num_threads

    from gp_couple import _sparse_factor_compiled as compiled
    from gp_couple.sparse_factor import SparseFactor

    matrix, cross = _covariances(graph_spec, observed, test, seed, cache_dir)
    row: dict[str, Any] = {"matrix_nnz_per_row": matrix.nnz / matrix.shape[0]}
    baseline = reset_peak()
    start = time.perf_counter()
    if ordering == "minimum_degree":
        import scipy.sparse as sp

        lu = spla.splu(matrix, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
        row.update(factor_s=time.perf_counter() - start, factor_nnz=int(lu.nnz))
        pivots, lower = lu.U.diagonal(), sp.csc_matrix(lu.L)
        lower.sort_indices()
        permutation = np.asarray(lu.perm_r, dtype=np.int64)
        del lu

        def forms_of(rows: Any) -> np.ndarray:
            out = np.empty(rows.shape[0])
            compiled.inverse_quadratic_forms(lower.indptr, lower.indices, lower.data, pivots, permutation,
                                             rows.indptr, rows.indices, rows.data, 4 * get_num_threads(), out)
            return out
    else:
        factor = SparseFactor(matrix)
        row.update(factor_s=time.perf_counter() - start, factor_nnz=2 * factor.nnz - factor.size)
        forms_of = factor.inverse_quadratic_forms
    start = time.perf_counter()
    forms = forms_of(cross)
    row.update(quadratic_forms_s=time.perf_counter() - start, test_rows=int(cross.shape[0]),
               quadratic_forms_sum=float(forms.sum()))
    row["peak_increase_gb"] = peak_increase(baseline)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch_worker(argv, globals()):
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="grid:1000x1000")
    parser.add_argument("--observed", nargs="+", type=int, default=[100_000])
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--orderings", nargs="+", default=["nested_dissection", "minimum_degree"],
                        choices=["nested_dissection", "minimum_degree"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "gp_couple_bench_device"))
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for observed in args.observed:
        for ordering in args.orderings:
            config = {"graph": args.graph, "observed": observed, "test": args.test, "ordering": ordering}
            result = run_in_subprocess(__file__, factor_row, ordering, args.graph, observed, args.test, args.seed,
                                       args.cache_dir)
            rows.append({"config": config, "result": result})
            print(rows[-1], file=sys.stderr, flush=True)
    return emit_report({"benchmark": "sparse_factor", "threads": os.environ.get("OMP_NUM_THREADS"),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
