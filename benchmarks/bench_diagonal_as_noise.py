r"""Benchmark (a diagnosis): does the GRF diagonal's error take the place of the noise?

Two GPs on one problem, each trained by :func:`gp_couple.models.fit_gp` with L-BFGS to its
stopping rule from the same start (γ = 1, output scale 1, noise 0.1 of the standardised
targets): the exact diffusion kernel (dense eigendecomposition), and a GRF kernel on fixed
walks (``--walkers`` antithetic repelling walkers at ``--p-halt``, ``schedule=None``: the
recipe's first training phase). Reported: the learnt output scale, γ and noise and their
ratios, and, at the GRF model's learnt hyperparameters, the diagonal excess
:math:`s\,\overline{(\widehat K_{ii} - K_{ii})}` (``s`` the output scale) of the training
nodes, and its mean absolute value. If the GRF model's noise plus that excess is about the
exact GP's noise, the likelihood has spent the estimator's diagonal error as noise.

(Replacing the GRF diagonal by the exact one during training, the oracle version of this
test, failed in a trial: :math:`\Phi\Phi^\top` with another diagonal need not be positive
definite, and L-BFGS reached such a matrix within its first iterations.)

Run: ``python benchmarks/bench_diagonal_as_noise.py --json-out benchmarks/results/diagonal_as_noise.json``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402


def run(spec: str, walkers: int, p_halt: float, iterations: int, seed: int) -> dict[str, Any]:
    import gpytorch
    import torch

    from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, fit_gp

    graph, _, observed, train, _ = problem(spec, seed)
    targets = torch.as_tensor(observed[train], dtype=torch.float32)
    rows: dict[str, Any] = {}
    trained: dict[str, Any] = {}
    for name in ("exact", "grf"):
        family = Diffusion(1.0)
        if name == "exact":
            base = ExactGraphKernel(graph, family)
        else:
            base = GRFKernel(graph, num_walkers=walkers, p_halt=p_halt, coupling="antithetic", directions="repelling",
                             kernel_family=family, nodes=train, seed=seed, schedule=None)
        kernel = gpytorch.kernels.ScaleKernel(base)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = 0.1
        model = GraphGP(train, targets, likelihood, kernel)
        start = time.perf_counter()
        losses = fit_gp(model, likelihood, iterations=iterations, optimizer="lbfgs", seed=seed)
        rows[name] = {"outputscale": float(kernel.outputscale.detach()), "gamma": float(family.gamma.detach()),
                      "noise": float(likelihood.noise.detach()), "iterations": len(losses),
                      "final_loss": float(losses[-1]), "seconds": time.perf_counter() - start}
        trained[name] = (model, kernel)
    grf = rows["grf"]
    rows["grf"]["ratio_to_exact"] = {key: grf[key] / rows["exact"][key] for key in ("outputscale", "gamma", "noise")}
    model, kernel = trained["grf"]
    inputs = model.train_inputs[0]
    with torch.no_grad():
        estimated = kernel.base_kernel(inputs, diag=True).double()
        exact = ExactGraphKernel(graph, Diffusion(grf["gamma"]))(inputs, diag=True).double()
    excess = grf["outputscale"] * float((estimated - exact).mean())
    rows["grf"].update(diagonal_excess=excess, noise_plus_diagonal_excess=grf["noise"] + excess,
                       diagonal_mean_absolute_error=grf["outputscale"] * float((estimated - exact).abs().mean()),
                       relative_diagonal_bias=float(estimated.mean() / exact.mean() - 1))
    return {"problem": spec, "walkers": walkers, "p_halt": p_halt, "train": int(train.size), "models": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["prior:3:grid:40x40", "prior:6:grid:40x40"])
    parser.add_argument("--walkers", type=int, default=48)
    parser.add_argument("--p-halt", type=float, default=0.1)
    parser.add_argument("--iterations", type=int, default=200, help="most L-BFGS iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    results = []
    for spec in args.problems:
        result = run(spec, args.walkers, args.p_halt, args.iterations, args.seed)
        results.append(result)
        for name, row in result["models"].items():
            print(f"{spec} {name:6s} outputscale {row['outputscale']:.4g} gamma {row['gamma']:.4g} "
                  f"noise {row['noise']:.4g} ({row['iterations']} iterations, {row['seconds']:.1f} s) "
                  f"{ {key: value for key, value in row.items() if 'diagonal' in key or key == 'ratio_to_exact'} }",
                  file=sys.stderr)
    return emit_report({"benchmark": "diagonal_as_noise", "results": results}, args.json_out)


if __name__ == "__main__":
    main()
