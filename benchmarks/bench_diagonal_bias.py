"""Benchmark: the upward bias of a GRF kernel's diagonal against the exact kernel, and against the noise.

A GRF estimate :math:`\\widehat K = \\Phi\\Phi^\\top` is unbiased off the diagonal, but its
diagonal :math:`\\|\\phi(v_i)\\|^2` squares one set of walks and is biased upwards (paper,
footnote in Appendix C.1 "Constructing graph random features"). In a GP the bias acts as
an extra, node-dependent noise variance. For each grid, diffusion range γ and walker
configuration this reports, on every node of the grid (one seed, the kernel's walks as drawn):

* ``diagonal_bias``: mean of :math:`\\widehat K_{ii}` over mean of :math:`K_{ii}`, minus one;
* ``off_diagonal_ratio``: mean of the off-diagonal :math:`\\widehat K_{ij}` over the exact mean
  (1 up to sampling noise: the unbiased part, for comparison);
* ``bias_over_noise``: the mean absolute bias :math:`\\widehat K_{ii} - K_{ii}` in units of
  ``--noise-ratio`` (a noise variance relative to the output scale; 3e-4 is what the exact
  GP learnt on icosphere:5, 0.01 a noisier problem).

Run: ``python benchmarks/bench_diagonal_bias.py --json-out benchmarks/results/diagonal_bias.json``
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402

#: ``WALKERS:P_HALT:COUPLING:DIRECTIONS``; the first is the recipe's training walks.
CONFIGS = ("48:0.1:antithetic:repelling", "256:0.1:antithetic:repelling", "1024:0.05:antithetic:repelling",
           "48:0.1:iid:independent")


def measure(side: int, gamma: float, config: str, noise_ratios: list[float], seed: int) -> dict[str, Any]:
    """The diagonal bias of one walker configuration on a ``side`` x ``side`` grid."""
    import torch

    from gp_couple import Diffusion, ExactGraphKernel, GRFKernel
    from gp_couple.graphs import grid_graph

    walkers, p_halt, coupling, directions = config.split(":")
    graph = grid_graph(side, side)
    nodes = torch.arange(graph.num_nodes, dtype=torch.float32).unsqueeze(-1)
    exact = ExactGraphKernel(graph, Diffusion(gamma))
    estimate = GRFKernel(graph, num_walkers=int(walkers), p_halt=float(p_halt), coupling=coupling,
                         directions=directions, kernel_family=Diffusion(gamma), seed=seed, schedule=None)
    with torch.no_grad():
        truth = exact(nodes).to_dense().double().numpy()
        approx = estimate(nodes).to_dense().double().numpy()
    diagonal, approx_diagonal = np.diag(truth), np.diag(approx)
    off = ~np.eye(graph.num_nodes, dtype=bool)
    bias = approx_diagonal - diagonal
    return {"grid": side, "gamma": gamma, "config": config, "mean_exact_diagonal": float(diagonal.mean()),
            "diagonal_bias": float(approx_diagonal.mean() / diagonal.mean() - 1),
            "off_diagonal_ratio": float(approx[off].mean() / truth[off].mean()),
            "bias_over_noise": {str(ratio): float(np.abs(bias).mean() / (ratio * diagonal.mean()))
                                for ratio in noise_ratios}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=int, default=30, help="grid side (exact kernel by dense eigendecomposition)")
    parser.add_argument("--gammas", nargs="+", type=float, default=[1.0, 3.0, 6.0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--noise-ratios", nargs="+", type=float, default=[3e-4, 1e-2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    rows = [measure(args.grid, gamma, config, args.noise_ratios, args.seed)
            for gamma in args.gammas for config in args.configs]
    for row in rows:
        print(f"gamma {row['gamma']:4g}  {row['config']:32s} diagonal bias {row['diagonal_bias']:+.4f}  "
              f"off-diagonal ratio {row['off_diagonal_ratio']:.4f}  bias / noise {row['bias_over_noise']}",
              file=sys.stderr)
    return emit_report({"benchmark": "diagonal_bias", "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
