r"""Benchmark: a GRF-GP's marginal likelihood and gradient by each path, and its dense cross-covariance.

Three ways to evaluate the negative marginal log-likelihood per point and its gradient,
timed on the same model, walks and hyperparameters, one after the other in one process
(median of ``--repeats`` after one warm-up):

* ``cg``: CG and stochastic Lanczos quadrature on the sparse operator
  (``grf_gp_settings(max_cholesky_size=0)``, the same probe vectors every time);
* ``gpytorch_cholesky``: gpytorch's ``ExactMarginalLogLikelihood`` through a dense
  Cholesky factor, autograd through the factorisation;
* ``dense``: :class:`gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`, the same
  dense factor and the closed-form gradient (one ``cholesky_inverse``), forced here;
  ``dense_chosen`` says whether the kernel's cost rule
  (:meth:`gp_couple.kernels.grf_kernel.GRFKernel.dense_solves_pay`) chooses it.

The two dense paths must agree to rounding; the CG path's loss and gradient are
stochastic estimates of theirs, and the report gives how far they are.

On the same walks, the dense test-by-train cross-covariance :math:`\Phi_*\Phi^\top` that
prediction's exact variances start from (``cross_*``, median of ``--repeats``): by the
compiled column loop (``cross_compiled_seconds``, the library's choice) and by
densified blocks of the training rows (``cross_blocks_seconds``, the path for features
the loop does not take), with their largest difference.

Problems are ``prior:GAMMA:GRAPH`` draws of ``bench_graph_gp_accuracy.py`` (half the nodes
observed); the kernel is ``GRFKernel`` with ``--walkers`` antithetic repelling walkers at
p_halt 0.1, at the generating γ, output scale ``--outputscale`` and noise ``--noise``
(near where the defaults converge on a γ = 3 grid draw), float32.

Run: ``python benchmarks/bench_likelihood_paths.py --problems prior:3:grid:100x100 --walkers 48 1024 3222
--json-out benchmarks/results/likelihood_paths.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

PATHS = ("cg", "gpytorch_cholesky", "dense")


def measure(spec: str, walkers: int, outputscale: float, noise: float, repeats: int, seed: int) -> dict[str, Any]:
    """Median seconds, loss and gradient of one evaluation by each path."""
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import Diffusion, GraphGP, GRFKernel, grf_gp_settings
    from gp_couple._random import seeded_torch_rng
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood

    graph, _, observed, train, test = problem(spec, seed)
    gamma = float(spec.split(":")[1])
    base = GRFKernel(graph, kernel_family=Diffusion(gamma), nodes=np.union1d(train, test), num_walkers=walkers,
                     seed=seed, schedule=None)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood,
                    gpytorch.kernels.ScaleKernel(base))
    model.covar_module.outputscale = outputscale
    likelihood.noise = noise
    model.train()
    inputs, targets = model.train_inputs[0], model.train_targets
    setups = {"cg": (DenseMarginalLogLikelihood, 0),
              "gpytorch_cholesky": (gpytorch.mlls.ExactMarginalLogLikelihood, train.size),
              "dense": (DenseMarginalLogLikelihood, train.size)}
    result: dict[str, Any] = {"problem": spec, "train": int(train.size), "walkers": walkers,
                              "entries_per_row": base.feature_operator(torch.as_tensor(train)).pattern.nnz / train.size}
    gradients: dict[str, torch.Tensor] = {}
    result["dense_chosen"] = base.dense_solves_pay(inputs)
    for path, (mll_class, max_cholesky_size) in setups.items():
        mll = mll_class(likelihood, model)
        times = []
        with grf_gp_settings(max_cholesky_size=max_cholesky_size), \
                mock.patch.object(GRFKernel, "dense_solves_pay", return_value=True):
            for repeat in range(repeats + 1):
                model.zero_grad()
                began = time.perf_counter()
                with seeded_torch_rng(seed):
                    loss = -mll(model(inputs), targets)
                    loss.backward()
                if repeat:
                    times.append(time.perf_counter() - began)
        gradients[path] = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        result[f"{path}_seconds"] = statistics.median(times)
        result[f"{path}_loss"] = float(loss.detach())
    for path in ("cg", "gpytorch_cholesky"):
        result[f"{path}_gradient_difference"] = float((gradients[path] - gradients["dense"]).norm()
                                                      / gradients["dense"].norm())
    result.update(_cross_covariance(base, torch.as_tensor(test), torch.as_tensor(train), repeats))
    return result


def _cross_covariance(base: Any, test: Any, train: Any, repeats: int) -> dict[str, Any]:
    """Median seconds of the dense test-by-train GRF Gram, by the compiled loop and by densified blocks."""
    import torch

    from gp_couple.operators import grf_gram

    dense: dict[str, Any] = {}
    result: dict[str, Any] = {}
    with torch.no_grad():
        operator = base(test.float().unsqueeze(-1), train.float().unsqueeze(-1)).evaluate_kernel()
        for path, dtypes in (("compiled", grf_gram._COMPILED_DTYPES), ("blocks", ())):
            times = []
            with mock.patch.object(grf_gram, "_COMPILED_DTYPES", dtypes):
                for repeat in range(repeats + 1):
                    began = time.perf_counter()
                    dense[path] = grf_gram._dense_product(operator.left, operator.right)
                    if repeat:
                        times.append(time.perf_counter() - began)
            result[f"cross_{path}_seconds"] = statistics.median(times)
    result["cross_max_difference"] = float((dense["compiled"] - dense["blocks"]).abs().max())
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["prior:3:grid:100x100"])
    parser.add_argument("--walkers", type=int, nargs="+", default=[48, 1024])
    parser.add_argument("--outputscale", type=float, default=20.0)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    import torch

    rows = []
    for spec in args.problems:
        for walkers in args.walkers:
            row = measure(spec, walkers, args.outputscale, args.noise, args.repeats, args.seed)
            row["torch_threads"] = torch.get_num_threads()
            rows.append(row)
            print(", ".join(f"{path} {row[f'{path}_seconds']:.2f} s (loss {row[f'{path}_loss']:.6g})"
                            for path in PATHS) + f"; cross-covariance {row['cross_compiled_seconds']:.2f} s "
                  f"(blocks {row['cross_blocks_seconds']:.2f} s): {spec}, {walkers} walkers", flush=True)
    return emit_report({"benchmark": "likelihood_paths", "machine": platform.platform(), "cpus": os.cpu_count(),
                        "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
