r"""Benchmark (a diagnosis): the CG/Lanczos likelihood's gradient against the dense float64 one.

On a problem of :mod:`bench_graph_gp_accuracy` (e.g. ``prior:GAMMA:GRAPH@N``), a GP with the
kernel of ``--kernel`` (``grf``: a ``GRFKernel`` with the constructor's defaults and
prediction walks drawn for the given hyperparameters, as in the training rounds on them;
``matrix-free``: the exact ``MatrixFreeGraphKernel``) is set to the hyperparameters of
``--hyper`` and evaluated in float64:

* densely: the training covariance is diagonalised once, and the total negative
  log-likelihood, its derivatives in the logarithms of the output scale and the noise, and its
  curvature in log-noise follow in closed form (``grf`` only, or ``matrix-free`` up to 12,000
  training points);
* by CG/Lanczos (``max_cholesky_size`` 0, the recommended ``grf_gp_settings`` otherwise),
  once per probe seed, with each objective of ``--objectives``: ``ours``
  (:class:`gp_couple.marginal_likelihood.DenseMarginalLogLikelihood`, whose preconditioner's
  diagonal is held fixed in the gradient) and ``gpytorch`` (gpytorch's
  ``ExactMarginalLogLikelihood``, whose preconditioner is also a control variate for the noise).

The error of a CG derivative in log-noise, divided by the dense curvature there, is how far
L-BFGS on that objective, with those probes fixed, ends from the dense optimum in log-noise.

Run::

    python benchmarks/bench_likelihood_gradient.py --problem prior:3:grid:316x316@10000 \
        --hyper '{"outputscale": 26.07, "gamma": 2.9826, "noise": 0.006}' --seeds 0 1 2 3 \
        --json-out benchmarks/results/likelihood_gradient_grid316_observed10000.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_convergence import _model, _set  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

#: Largest training set whose matrix-free kernel matrix is made dense for the reference.
DENSE_LIMIT = 12_000


def _log_derivatives(model: Any, likelihood: Any) -> dict[str, float]:
    """The gradient's entries in the logarithms of the output scale and the noise (softplus raw parameters)."""
    import torch

    derivatives = {}
    for name, raw, value in (("outputscale", model.covar_module.raw_outputscale, model.covar_module.outputscale),
                             ("noise", likelihood.noise_covar.raw_noise, likelihood.noise)):
        derivatives[f"d_log_{name}"] = float(raw.grad.sum() / torch.sigmoid(raw.detach()).sum() * value.detach().sum())
    return derivatives


def _dense(model: Any, likelihood: Any, hyper: dict[str, float]) -> dict[str, float]:
    """Value, log-derivatives and log-noise curvature of the total negative log-likelihood, in closed form."""
    import torch

    from gp_couple import grf_gp_settings

    inputs = model.train_inputs[0]
    with torch.no_grad(), grf_gp_settings():
        gram = model.covar_module.base_kernel(inputs).to_dense().double()
        residual = (model.train_targets - model.mean_module(inputs)).double()
    eigenvalues, vectors = torch.linalg.eigh(gram)
    projected = (vectors.mT @ residual) ** 2
    scale, noise = hyper["outputscale"], hyper["noise"]
    covariance = scale * eigenvalues + noise
    share = noise / covariance
    return {
        "value": float(0.5 * (covariance.log().sum() + (projected / covariance).sum())
                       + 0.5 * residual.numel() * math.log(2 * math.pi)),
        "d_log_outputscale": float(0.5 * ((1 - share).sum() - (projected * (1 - share) / covariance).sum())),
        "d_log_noise": float(0.5 * (share.sum() - (projected * share / covariance).sum())),
        "curvature_log_noise": float((0.5 * share * (1 - share)).sum()
                                     + (projected * share / covariance * (share - 0.5)).sum()),
    }


def run(spec: str, hyper: dict[str, float], kernel: str, seeds: list[int], objectives: list[str],
        settings: dict[str, Any]) -> dict[str, Any]:
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import GRFKernel, grf_gp_settings
    from gp_couple._random import seeded_torch_rng
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood

    torch.set_default_dtype(torch.float64)
    graph, _, observed, train, test = problem(spec, 0)
    start = time.process_time()
    base = (GRFKernel(graph, nodes=np.union1d(train, test), seed=0) if kernel == "grf"
            else MatrixFreeGraphKernel(graph))
    model, likelihood = _model(graph, train, observed, base)
    _set(model, likelihood, hyper)
    if kernel == "grf":
        base.resample_for_prediction(seed=0)
    result: dict[str, Any] = {"problem": spec, "kernel": kernel, "hyper": hyper, "train": int(train.size),
                              "settings": settings, "setup_cpu_s": time.process_time() - start}
    if kernel == "grf" or train.size <= DENSE_LIMIT:
        start = time.process_time()
        result["dense"] = {**_dense(model, likelihood, hyper), "cpu_s": time.process_time() - start}
    classes = {"ours": DenseMarginalLogLikelihood, "gpytorch": gpytorch.mlls.ExactMarginalLogLikelihood}
    model.train()
    rows = []
    for objective in objectives:
        for seed in seeds:
            model.zero_grad()
            start = time.process_time()
            with grf_gp_settings(**{"max_cholesky_size": 0, **settings}), seeded_torch_rng(seed):
                loss = -classes[objective](likelihood, model)(model(*model.train_inputs), model.train_targets)
                loss = loss * train.size
                loss.backward()
            row = {"objective": objective, "seed": seed, "value": float(loss.detach()),
                   **_log_derivatives(model, likelihood), "cpu_s": time.process_time() - start}
            if "dense" in result:
                dense = result["dense"]
                row["noise_error"] = row["d_log_noise"] - dense["d_log_noise"]
                row["log_noise_shift"] = -row["noise_error"] / dense["curvature_log_noise"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    result["rows"] = rows
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", required=True, help="a bench_graph_gp_accuracy.py problem")
    parser.add_argument("--hyper", required=True,
                        help="JSON of the output scale, the noise and the kernel family's hyperparameters")
    parser.add_argument("--kernel", choices=("grf", "matrix-free"), default="grf")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="probe seeds")
    parser.add_argument("--objectives", nargs="+", choices=("ours", "gpytorch"), default=["ours", "gpytorch"])
    parser.add_argument("--settings", default="{}", help="JSON of grf_gp_settings overrides (e.g. num_trace_samples)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    result = run(args.problem, json.loads(args.hyper), args.kernel, args.seeds, args.objectives,
                 json.loads(args.settings))
    return emit_report({"benchmark": "likelihood_gradient", **result}, args.json_out)


if __name__ == "__main__":
    main()
