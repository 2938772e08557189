"""Benchmark: walk lengths and Gram products for training nodes scattered over a large graph.

Two costs of GRF-GP training that depend on how the observed nodes lie on the graph, each against
its baseline in the same run (process CPU seconds, the best of ``--repeats``, one thread per
library recommended):

* **Walk lengths** (:func:`gp_couple.features.walks.sample_walk_lengths`): lengths are drawn per
  block of 64 node ids. The baseline is :meth:`WalkLengthCoupling.sample_rows` of the base class,
  which draws the whole block and keeps the rows of the start nodes; the built-in couplings draw
  only those rows. Both must give the same lengths.
* **Gram products** (:class:`gp_couple.operators.GRFGramLinearOperator`): one product
  :math:`\\Phi(\\Phi^\\top X)` with 33 columns (CG's right-hand sides and probe vectors), against
  assembling the sparse :math:`\\Phi\\Phi^\\top` once and multiplying by it. Reports the
  stored entries of both, :math:`\\sum_c n_c^2`, and the assembly's cost per multiply-add in
  multiply-adds of the product with :math:`\\Phi` (the library's ``_ASSEMBLY_COST``).

::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/bench_scattered_starts.py --json-out benchmarks/results/scattered_starts.json

(``--parts lengths`` or ``--parts grams`` runs one of the two.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import best_cpu, emit_report  # noqa: E402


def measure_lengths(graph: Any, starts: Any, walkers: int, p_halt: float, coupling: Any,
                    repeats: int) -> dict[str, Any]:
    """Drawing the lengths of ``starts`` by the coupling's rows against the whole blocks."""
    import numpy as np

    from gp_couple.couplings import WalkLengthCoupling, get_walk_length_coupling
    from gp_couple.features.walks import _draw_lengths

    instance = get_walk_length_coupling(coupling)
    rows_s, rows = best_cpu(lambda: _draw_lengths(graph, walkers, p_halt, instance, starts, None, 7), repeats)
    # The baseline: the base class's whole-block draw, set on the instance for this run only.
    instance.sample_rows = WalkLengthCoupling.sample_rows.__get__(instance)
    try:
        blocks_s, blocks = best_cpu(lambda: _draw_lengths(graph, walkers, p_halt, instance, starts, None, 7),
                                    repeats)
    finally:
        del instance.sample_rows
    return {"coupling": instance.name, "walkers": walkers, "rows_cpu_s": rows_s, "whole_blocks_cpu_s": blocks_s,
            "speedup": blocks_s / rows_s, "same_lengths": bool(np.array_equal(rows, blocks))}


def measure_gram(graph: Any, nodes: Any, walkers: int, p_halt: float, repeats: int) -> dict[str, Any]:
    """One product with Phi against assembling the sparse Gram and one product with it."""
    import torch

    from gp_couple.kernels import GRFKernel
    from gp_couple.operators import GRFGramLinearOperator, grf_gram
    from gp_couple.operators.sparse_products import spmm

    kernel = GRFKernel(graph, num_walkers=walkers, p_halt=p_halt, schedule=None, nodes=nodes)
    kernel.kernel_family.gamma = 3.0
    features = kernel.feature_operator(nodes).detach()
    gram = GRFGramLinearOperator(features)
    pattern = features.pattern.compact()[0]
    rhs = torch.randn(nodes.numel(), 33, generator=torch.Generator().manual_seed(0))
    left, right = gram._product_factors()
    with torch.no_grad():
        # Once untimed: the first product also builds the compact pattern, its transpose and the
        # transposed values, which every later product of a solve reuses.
        left.compact_product(right.compact_product(rhs, transpose=True), transpose=False)
        grf_gram._gram_entries(pattern)
        product_s, by_features = best_cpu(
            lambda: left.compact_product(right.compact_product(rhs, transpose=True), transpose=False), repeats)
        assembly_s, assembled = best_cpu(lambda: grf_gram._assembled_gram(features), repeats)
        assembled_s, by_gram = best_cpu(lambda: spmm(*assembled, rhs), repeats)
    multiply_adds = grf_gram._assembly_multiply_adds(pattern)
    product_multiply_adds = 2 * pattern.nnz * rhs.shape[-1]
    return {"walkers": walkers, "features_nnz": pattern.nnz, "gram_entries": int(assembled[1].numel()),
            "counted_gram_entries": grf_gram._gram_entries(pattern), "assembly_multiply_adds": multiply_adds,
            "product_cpu_s": product_s, "assembly_cpu_s": assembly_s, "assembled_product_cpu_s": assembled_s,
            "product_speedup": product_s / assembled_s,
            "assembly_cost_per_multiply_add": (assembly_s / multiply_adds) / (product_s / product_multiply_adds),
            "largest_relative_difference": float((by_gram - by_features).abs().max() / by_features.abs().max())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=1000, help="side of the square grid graph")
    parser.add_argument("--observed", type=int, default=10_000, help="start nodes, uniformly at random")
    parser.add_argument("--walkers", type=int, nargs="+", default=[48, 1024, 3600])
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", nargs="+", choices=("lengths", "grams"), default=["lengths", "grams"])
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    from gp_couple.couplings import SigmaCoupling
    from gp_couple.graphs import grid_graph

    graph = grid_graph(args.grid, args.grid)
    starts = np.sort(np.random.default_rng(0).choice(graph.num_nodes, args.observed, replace=False))
    sigma = SigmaCoupling(np.random.default_rng(1).permutation(50), args.p_halt)
    couplings = ("iid", "antithetic", sigma) if "lengths" in args.parts else ()
    lengths = [measure_lengths(graph, starts, walkers, args.p_halt, coupling, args.repeats)
               for walkers in args.walkers for coupling in couplings]
    grams = [measure_gram(graph, torch.as_tensor(starts), walkers, args.p_halt, args.repeats)
             for walkers in args.walkers] if "grams" in args.parts else []
    return emit_report({"benchmark": "scattered_starts", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(), "graph": f"grid:{args.grid}x{args.grid}",
                        "observed": args.observed, "p_halt": args.p_halt, "lengths": lengths, "grams": grams},
                       args.json_out)


if __name__ == "__main__":
    main()
