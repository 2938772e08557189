r"""The exact GP's log-likelihood in float64, profiled over the range: the reference for trained hyperparameters.

For each :math:`\gamma` the exact diffusion kernel's training block
:math:`\mathbf K_\gamma` (:func:`gp_couple.exact.exact_kernel_columns`, float64) is
diagonalised once, :math:`\mathbf K_\gamma = \mathbf Q\,\mathrm{diag}(\mu)\,\mathbf Q^\top`,
after which the negative log marginal likelihood per point at output scale :math:`s` and
noise :math:`\sigma^2`,

.. math::

    \frac1n\Big(\tfrac12\sum_i \log(s\mu_i + \sigma^2)
    + \tfrac12\sum_i \frac{(\mathbf Q^\top\mathbf y)_i^2}{s\mu_i + \sigma^2}\Big) + \tfrac12\log 2\pi,

costs :math:`O(n)`: it is minimised over :math:`(s, \sigma^2)` (Nelder-Mead from nine
starts, the noise above gpytorch's floor of :math:`10^{-4}`). No probe vectors, no CG, no
Lanczos quadrature: this is what the stochastic training objective estimates, and what
:mod:`bench_convergence`'s trained hyperparameters are checked against. ``--points``
evaluates given hyperparameters (e.g. a trained model's) at the same :math:`\gamma`.

Run: ``python benchmarks/bench_exact_profile.py --problem icosphere:5 --gammas 5.3145 5.6563 6.0
--json-out benchmarks/results/exact_profile_icosphere5.json``. One :math:`\gamma` of a
10,000-point training set costs one block of exact kernel columns and one float64
eigendecomposition (several minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

NOISE_FLOOR = 1e-4


def negative_log_likelihood(eigenvalues: np.ndarray, projected: np.ndarray, outputscale: float,
                            noise: float) -> float:
    """Negative log marginal likelihood per point from the training block's eigenvalues and projected targets."""
    variances = outputscale * eigenvalues + noise
    return float((0.5 * np.log(variances).sum() + 0.5 * (projected ** 2 / variances).sum()) / eigenvalues.size
                 + 0.5 * np.log(2 * np.pi))


def training_spectrum(graph: Any, train: np.ndarray, targets: np.ndarray,
                      gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of the exact diffusion kernel's training block and the targets in its eigenbasis."""
    import torch

    from gp_couple import Diffusion
    from gp_couple.exact import exact_kernel_columns

    block = exact_kernel_columns(Diffusion(gamma), graph, train)[train]
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.from_numpy(0.5 * (block + block.T)))
    return eigenvalues.clamp_min(0).numpy(), (eigenvectors.T @ torch.from_numpy(targets)).numpy()


def profile(eigenvalues: np.ndarray, projected: np.ndarray) -> dict[str, float]:
    """The output scale and noise that minimise the likelihood at this range, and the minimum."""
    from scipy.optimize import minimize

    def objective(z: np.ndarray) -> float:
        return negative_log_likelihood(eigenvalues, projected, float(np.exp(z[0])), NOISE_FLOOR + float(np.exp(z[1])))

    best = None
    for outputscale in (1.0, 10.0, 100.0):
        for noise in (1e-4, 1e-3, 1e-2):
            result = minimize(objective, [np.log(outputscale), np.log(noise)], method="Nelder-Mead",
                              options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000})
            if best is None or result.fun < best.fun:
                best = result
    return {"loss": float(best.fun), "outputscale": float(np.exp(best.x[0])),
            "noise": NOISE_FLOOR + float(np.exp(best.x[1]))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", required=True, help="a problem of bench_convergence.py")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gammas", type=float, nargs="+", required=True)
    parser.add_argument("--points", default="[]",
                        help='JSON list of [gamma, outputscale, noise] to evaluate; gamma must be one of --gammas')
    parser.add_argument("--data-dir", default=None, help="data directory of mesh and traffic problems")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    if args.data_dir is not None:
        os.environ["GP_COUPLE_DATA"] = args.data_dir
    points = json.loads(args.points)
    if not all(any(abs(point[0] - gamma) < 1e-9 for gamma in args.gammas) for point in points):
        parser.error("every --points entry's gamma must be one of --gammas")
    import torch

    graph, _, observed, train, _ = problem(args.problem, args.seed)
    # The models train on float32 targets: the same values here.
    targets = torch.as_tensor(observed[train], dtype=torch.float32).double().numpy()
    rows = []
    for gamma in args.gammas:
        began = time.perf_counter()
        eigenvalues, projected = training_spectrum(graph, train, targets, gamma)
        row: dict[str, Any] = {"gamma": gamma, **profile(eigenvalues, projected)}
        row["points"] = [{"outputscale": outputscale, "noise": noise,
                          "loss": negative_log_likelihood(eigenvalues, projected, outputscale, noise)}
                         for point_gamma, outputscale, noise in points if abs(point_gamma - gamma) < 1e-9]
        row["seconds"] = time.perf_counter() - began
        print(json.dumps(row), flush=True)
        rows.append(row)
    return emit_report({"benchmark": "exact_profile", "problem": args.problem, "seed": args.seed,
                        "training_points": int(len(train)), "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
