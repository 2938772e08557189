"""Benchmark: Chebyshev dense blocks and diagonals on the nodes each recurrence reaches.

On a ``--grid`` × ``--grid`` grid with ``--observed`` nodes drawn uniformly at random, for each
Chebyshev degree in ``--degrees``, one thread, each measurement in a fresh basis:

* ``whole_graph_s``: the block :math:`\\sum_j c_j T_j(\\widetilde{\\mathbf W})_{AA}` by one-hot
  recurrences on the whole graph, in chunks of ``BLOCK_ENTRIES // (3N)`` columns, summed on the
  rows of :math:`A` (how :meth:`ChebyshevBasis.block` computed its terms before it ran on
  the reached nodes): the baseline of the same run;
* ``local_s``: the same block by :meth:`gp_couple.operators.ChebyshevBasis.summed_block`, with
  ``--column-blocks`` columns per local recurrence (``_COLUMN_BLOCK``), and its largest
  difference from the baseline;
* ``kept_s``: :meth:`ChebyshevBasis.block` (terms kept, the default column blocks), first call;
* ``diagonal_s``: the diagonal table of the same nodes to that degree with
  ``--scattered-blocks`` nodes per block (``_SCATTERED_BLOCK``).

With ``--evaluation-gammas``, instead, a training evaluation of the matrix-free exact GP on the
observed nodes (value and gradient of :class:`gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`,
the objective of ``fit_gp``, under ``grf_gp_settings()``) at each diffusion :math:`\\gamma`, in a fresh
process: ``first_s`` (the kept terms' recurrences included), ``evaluation_s`` (the mean of
``--evaluations`` more at :math:`\\gamma(1 + 0.01k)`, on the kept terms, as L-BFGS's next points) and
``peak_gb`` (peak resident memory above the graph's). Compare library versions by running it with
``PYTHONPATH`` at each.

Run: ``python benchmarks/bench_local_blocks.py --grid 316 --observed 1000 --degrees 40 190
--json-out benchmarks/results/local_blocks_grid316.json``; ``python benchmarks/bench_local_blocks.py
--grid 1000 --observed 8000 --evaluation-gammas 2.83``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402


def measure(side: int, observed: int, degree: int, column_blocks: list[int], scattered_blocks: list[int],
            seed: int) -> dict[str, Any]:
    """Every timing of one grid, node set and degree (process CPU seconds, one thread)."""
    import torch

    import gp_couple.operators.chebyshev_basis as chebyshev_basis
    from gp_couple.graphs import grid_graph
    from gp_couple.operators.chebyshev_basis import BLOCK_ENTRIES, ChebyshevBasis, one_hot_columns

    torch.set_num_threads(1)
    graph = grid_graph(side, side)
    adjacency = graph.normalized_adjacency()
    generator = torch.Generator().manual_seed(seed)
    nodes = torch.sort(torch.randperm(graph.num_nodes, generator=generator)[:observed]).values
    coefficients = torch.randn(degree + 1, dtype=torch.float64, generator=generator)

    def fresh() -> ChebyshevBasis:
        basis = ChebyshevBasis(adjacency)
        basis._locality_rank()  # a one-off per graph, outside every timing
        return basis

    def timed(function: Any) -> tuple[float, Any]:
        start = time.process_time()
        result = function()
        return time.process_time() - start, result

    basis = fresh()

    def whole_graph() -> torch.Tensor:
        chunk = max(1, BLOCK_ENTRIES // (3 * graph.num_nodes))
        parts = []
        for first in range(0, nodes.numel(), chunk):
            block = one_hot_columns(nodes[first:first + chunk], graph.num_nodes, torch.float64)
            part = None
            for j, term in enumerate(basis.terms(block, degree)):
                rows = term.index_select(0, nodes)
                part = rows * coefficients[j] if part is None else part.add_(rows, alpha=float(coefficients[j]))
            parts.append(part)
        return torch.cat(parts, dim=-1)

    whole_s, reference = timed(whole_graph)
    row: dict[str, Any] = {"grid": side, "nodes": graph.num_nodes, "observed": observed, "degree": degree,
                           "whole_graph_s": whole_s, "local_s": {}, "local_max_difference": {}, "diagonal_s": {}}
    default_columns = chebyshev_basis._COLUMN_BLOCK
    for size in column_blocks:
        chebyshev_basis._COLUMN_BLOCK = size
        seconds, block = timed(lambda: fresh().summed_block(coefficients, nodes, nodes))
        row["local_s"][str(size)] = seconds
        row["local_max_difference"][str(size)] = float((block - reference).abs().max())
    chebyshev_basis._COLUMN_BLOCK = default_columns
    kept = fresh()
    row["kept_s"], _ = timed(lambda: kept.block(coefficients, nodes, nodes, 1 << 40))
    default_scattered = chebyshev_basis._SCATTERED_BLOCK
    for size in scattered_blocks:
        chebyshev_basis._SCATTERED_BLOCK = size
        row["diagonal_s"][str(size)], _ = timed(lambda: fresh().diagonal(nodes, degree))
    chebyshev_basis._SCATTERED_BLOCK = default_scattered
    return row


def measure_evaluation(side: int, observed: int, gamma: float, evaluations: int, seed: int) -> dict[str, Any]:
    """CPU seconds and peak memory of the matrix-free exact GP's training evaluations (one thread)."""
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import GraphGP, grf_gp_settings
    from gp_couple.graphs import grid_graph
    from gp_couple.kernel_families import Diffusion
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood

    torch.set_num_threads(1)
    graph = grid_graph(side, side)
    rng = np.random.default_rng(seed)
    nodes = np.sort(rng.permutation(graph.num_nodes)[:observed])
    family = Diffusion(gamma)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(nodes, torch.as_tensor(rng.normal(size=observed), dtype=torch.float32), likelihood,
                    gpytorch.kernels.ScaleKernel(MatrixFreeGraphKernel(graph, family)))
    objective = DenseMarginalLogLikelihood(likelihood, model)
    model.train()
    baseline = reset_peak()

    def evaluate(value: float) -> float:
        family.gamma = value
        model.zero_grad()
        start = time.process_time()
        loss = -objective(model(*model.train_inputs), model.train_targets)
        loss.backward()
        return time.process_time() - start

    with grf_gp_settings():
        first = evaluate(gamma)
        later = [evaluate(gamma * (1 + 0.01 * step)) for step in range(1, evaluations + 1)]
    import gp_couple

    return {"library": os.path.dirname(gp_couple.__file__), "grid": side, "nodes": graph.num_nodes,
            "observed": observed, "gamma": gamma, "first_s": first,
            "evaluation_s": sum(later) / len(later), "evaluations": later, "peak_gb": peak_increase(baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=316)
    parser.add_argument("--observed", type=int, default=1000)
    parser.add_argument("--degrees", type=int, nargs="+", default=[40])
    parser.add_argument("--column-blocks", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--scattered-blocks", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--evaluation-gammas", type=float, nargs="+", default=None,
                        help="time the matrix-free exact GP's training evaluations at these gammas instead")
    parser.add_argument("--evaluations", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    if args.evaluation_gammas is not None:
        rows = [run_in_subprocess(__file__, measure_evaluation, args.grid, args.observed, gamma, args.evaluations,
                                  args.seed) for gamma in args.evaluation_gammas]
        emit_report({"benchmark": "matrix_free_evaluation", "rows": rows}, args.json_out)
        return
    rows = [measure(args.grid, args.observed, degree, args.column_blocks, args.scattered_blocks, args.seed)
            for degree in args.degrees]
    emit_report({"benchmark": "local_blocks", "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
