"""Benchmark: the time of fitting a σ-coupling, and of its matching cost against the full cost matrix.

A GRF kernel fits a σ-coupling (order :data:`gp_couple.kernels.grf_kernel.SIGMA_ORDER`) each time it
draws prediction walks. The fit simulates walks per quantile bin on the fitting graph
(:func:`gp_couple.features.sigma_fit._bin_projections`) and computes the matching cost
:func:`gp_couple.couplings.sigma_matching.grf_matching_cost`. The baseline, in the same run, is the
cost computed on every ordered pair of bins, as the cost's definition reads; both must give the same
matrix. Times are process CPU seconds, the best of ``--repeats``:

    python benchmarks/bench_sigma_fit.py --json-out benchmarks/results/sigma_fit.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import best_cpu, emit_report  # noqa: E402


def full_matching_cost(projections: Any) -> Any:
    """The cost on every ordered pair of bins, :math:`C[q, q'] = \\|A_{qq'}A_{qq'}^\\top\\|_F^2` (the baseline)."""
    import torch

    psi = torch.as_tensor(projections, dtype=torch.float64)
    order = psi.shape[0]
    cost = torch.empty(order, order, dtype=torch.float64)
    for q in range(order):
        summed = psi[q].unsqueeze(0) + psi
        cost[q] = ((summed @ summed.transpose(1, 2)) ** 2).sum(dim=(1, 2))
    return cost.numpy()


def measure(gamma: float, p_halt: float, order: int, samples_per_bin: int, repeats: int) -> dict[str, Any]:
    """The fit's and the matching cost's CPU time for a diffusion kernel of range ``gamma``."""
    import numpy as np

    from gp_couple import Diffusion
    from gp_couple.couplings.sigma_matching import default_fitting_graph, grf_matching_cost
    from gp_couple.features.sigma_fit import _bin_projections, fit_sigma_coupling

    family = Diffusion(gamma)
    fit_s, coupling = best_cpu(lambda: fit_sigma_coupling(family, p_halt, order, samples_per_bin=samples_per_bin,
                                                          seed=0), repeats)
    projections = _bin_projections(default_fitting_graph(), family, p_halt, order, samples_per_bin,
                                   np.random.default_rng(0))
    cost_s, cost = best_cpu(lambda: grf_matching_cost(projections), repeats)
    baseline_s, baseline = best_cpu(lambda: full_matching_cost(projections), repeats)
    return {"gamma": gamma, "p_halt": p_halt, "order": order, "samples_per_bin": samples_per_bin,
            "fit_cpu_s": fit_s, "matching_cost_cpu_s": cost_s, "full_matrix_cpu_s": baseline_s,
            "speedup": baseline_s / cost_s, "same_cost": bool(np.array_equal(cost, baseline)),
            "largest_relative_difference": float(np.max(np.abs(cost - baseline) / np.abs(baseline))),
            "permutation": coupling.permutation.tolist()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gammas", type=float, nargs="+", default=[1.0, 3.0, 6.0])
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--order", type=int, default=50)
    parser.add_argument("--samples-per-bin", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    import torch

    rows = [measure(gamma, args.p_halt, args.order, samples, args.repeats)
            for gamma in args.gammas for samples in args.samples_per_bin]
    return emit_report({"benchmark": "sigma_fit", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(), "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
