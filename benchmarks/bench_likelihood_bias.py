r"""Benchmark (a diagnosis): the GRF likelihood's second-order bias, and its correction from two walk sets.

A GRF kernel estimate :math:`\widehat{\mathbf K} = \mathbf K + \mathbf E` is unbiased,
:math:`\mathbb E\,\mathbf E = 0`, but the negative log marginal likelihood
:math:`\ell(\mathbf C) = \tfrac12\mathbf y^\top\mathbf C^{-1}\mathbf y + \tfrac12\log\det\mathbf C`
of :math:`\mathbf C = s\widehat{\mathbf K} + \sigma^2\mathbf I` is not linear in it. To second
order, with :math:`\mathbf H = s\mathbf E` and :math:`\boldsymbol\alpha = \mathbf C^{-1}\mathbf y`,

.. math::

    \mathbb E\,\ell(\mathbf C) - \ell(s\mathbf K + \sigma^2\mathbf I) \approx
    \tfrac12\,\mathbb E\,\boldsymbol\alpha^\top\mathbf H\mathbf C^{-1}\mathbf H\boldsymbol\alpha
    - \tfrac14\,\mathbb E \operatorname{tr}(\mathbf C^{-1}\mathbf H\mathbf C^{-1}\mathbf H),

and where the data follow the model (:math:`\mathbb E\,\boldsymbol\alpha\boldsymbol\alpha^\top
\approx \mathbf C^{-1}`) this is :math:`+\tfrac14\operatorname{tr}(\mathbf C^{-1}\mathbf H
\mathbf C^{-1}\mathbf H) > 0`: a penalty that grows like :math:`(s/\sigma^2)^2` in the
eigendirections of the kernel below the noise. The likelihood pays it by a lower output
scale, which is where the GRF-GP's remaining hyperparameter drift lies.

Two independent walk sets give :math:`\widehat{\mathbf K}_1, \widehat{\mathbf K}_2` and
:math:`\mathbf D = \widehat{\mathbf K}_1 - \widehat{\mathbf K}_2`, whose second moment is
four times that of the error of their mean :math:`\bar{\mathbf K} = (\widehat{\mathbf K}_1
+ \widehat{\mathbf K}_2)/2`. So, with :math:`\mathbf H_D = s\mathbf D`, the bias-corrected
objective

.. math::

    \ell(s\bar{\mathbf K} + \sigma^2\mathbf I)
    - \tfrac18\,\boldsymbol\alpha^\top\mathbf H_D\mathbf C^{-1}\mathbf H_D\boldsymbol\alpha
    + \tfrac1{16}\operatorname{tr}(\mathbf C^{-1}\mathbf H_D\mathbf C^{-1}\mathbf H_D)

is unbiased for the exact likelihood to second order in the estimate's error.

Per problem: the exact GP (dense eigendecomposition, trained by :func:`gp_couple.models.fit_gp`
with L-BFGS from gpytorch's start and from the defaults' point, the lower loss kept), and the
constructor's defaults with the plain likelihood (``GRFKernel(graph, nodes=..., schedule=
WalkSchedule(bias_correction=False, max_predict_walkers=4096))``: the walk schedule with the
prediction walker cap its recorded results were measured with, L-BFGS; the default schedule now
trains on the ``bias_corrected`` objective below, from a second draw at the training nodes). Then,
on the defaults' final (prediction) walks held fixed, and from the defaults' point, L-BFGS
(:func:`gp_couple.optimize.minimize`, the model's constraints, its stopping rule) on four
dense float64 objectives per training point: ``walks`` (the GRF likelihood itself, which
the defaults ended on), ``two_sets`` (:math:`\bar{\mathbf K}` with a second, independent
walk set of the same configuration), ``bias_corrected`` (the objective above) and ``exact``.
Reported: each end point's hyperparameters as ratios to the exact GP's, and the exact
likelihood there above the exact GP's optimum (per training point).

Run::

    python benchmarks/bench_likelihood_bias.py --problems prior:6:grid:40x40 --seed 1 \
        --json-out benchmarks/results/likelihood_bias_grid40_seed1.json
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_convergence import _hyper, _model, _set  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

OBJECTIVES = ("walks", "two_sets", "bias_corrected", "exact")
HYPERPARAMETERS = ("outputscale", "gamma", "noise")
#: The schedule's prediction walker cap when the recorded results of this benchmark were measured.
RECORDED_WALKER_CAP = 4096


def _loss(kernel: Any, targets: Any, outputscale: Any, noise: Any, difference: Any = None) -> Any:
    """Negative log marginal likelihood per point of ``s K + noise I`` (float64, dense), optionally bias-corrected."""
    import torch
    from linear_operator.utils.errors import NotPSDError

    n = targets.numel()
    covariance = outputscale * kernel + noise * torch.eye(n, dtype=kernel.dtype)
    factor, info = torch.linalg.cholesky_ex(covariance)
    if int(info) != 0:
        raise NotPSDError("the covariance is not positive definite")
    alpha = torch.cholesky_solve(targets.unsqueeze(-1), factor).squeeze(-1)
    value = 0.5 * (targets * alpha).sum() + factor.diagonal().log().sum() + 0.5 * n * math.log(2 * math.pi)
    if difference is not None:
        perturbation = outputscale * difference
        solved = torch.cholesky_solve(perturbation, factor)  # C^-1 H_D
        moved = perturbation @ alpha
        quadratic = moved @ torch.cholesky_solve(moved.unsqueeze(-1), factor).squeeze(-1)
        trace = (solved * solved.mT).sum()
        value = value - quadratic / 8 + trace / 16
    return value / n


def run(spec: str, seed: int, second_seed: int, iterations: int) -> dict[str, Any]:
    import torch

    from gp_couple import Diffusion, ExactGraphKernel, GRFKernel, WalkSchedule, fit_gp, grf_gp_settings
    from gp_couple.optimize import minimize, parameter_constraints

    graph, _, observed, train, test = problem(spec, seed)
    targets = torch.as_tensor(observed[train], dtype=torch.float32)
    result: dict[str, Any] = {"problem": spec, "seed": seed, "train": int(train.size)}

    began = time.process_time()
    defaults = GRFKernel(graph, nodes=np.union1d(train, test), seed=seed,
                         schedule=WalkSchedule(bias_correction=False, max_predict_walkers=RECORDED_WALKER_CAP))
    model, likelihood = _model(graph, train, observed, defaults)
    with grf_gp_settings():
        history = fit_gp(model, likelihood, iterations=iterations, optimizer="lbfgs", seed=seed)
    found = _hyper(model, likelihood)
    result["defaults"] = {**found, "converged": history.converged, "walkers": defaults.num_walkers,
                          "p_halt": defaults.p_halt, "gram_error_estimate": defaults.gram_error_estimate,
                          "cpu_s": time.process_time() - began}

    exact_runs = []
    for start in (None, found):
        exact_model, exact_likelihood = _model(graph, train, observed, ExactGraphKernel(graph, Diffusion(1.0)))
        if start is not None:
            _set(exact_model, exact_likelihood, start)
        with grf_gp_settings():
            exact_history = fit_gp(exact_model, exact_likelihood, iterations=iterations, optimizer="lbfgs", seed=seed)
        exact_runs.append((exact_history[-1], _hyper(exact_model, exact_likelihood),
                           "default" if start is None else "defaults' point"))
    exact_runs.sort(key=lambda run: run[0])
    exact_hyper = exact_runs[0][1]
    result["exact_gp"] = {**exact_hyper, "start": exact_runs[0][2]}

    second = copy.deepcopy(defaults)
    second.kernel_family = defaults.kernel_family  # one gamma for both walk sets
    second.resample(seed=second_seed)
    exact_kernel = ExactGraphKernel(graph, defaults.kernel_family)
    inputs = model.train_inputs[0]
    y = targets.double()

    def objective(name: str) -> Any:
        def evaluate() -> Any:
            scale = model.covar_module.outputscale.double()
            noise = likelihood.noise.double()
            if name == "exact":
                return _loss(exact_kernel(inputs).to_dense().double(), y, scale, noise)
            first = defaults(inputs).to_dense().double()
            if name == "walks":
                return _loss(first, y, scale, noise)
            other = second(inputs).to_dense().double()
            return _loss((first + other) / 2, y, scale, noise, first - other if name == "bias_corrected" else None)
        return evaluate

    parameters = dict(model.named_parameters())
    kept = {name: parameter.detach().clone() for name, parameter in parameters.items()}
    with torch.no_grad():
        _set(model, likelihood, exact_hyper)
        exact_optimum = float(objective("exact")())
        for name, parameter in parameters.items():
            parameter.copy_(kept[name])
    result["exact_optimum_loss"] = exact_optimum
    for name in OBJECTIVES:
        began = time.process_time()
        fitted = minimize(objective(name), parameters, iterations=iterations, optimizer="lbfgs",
                          constraints=parameter_constraints(model), seed=seed)
        with torch.no_grad():
            exact_here = float(objective("exact")())
        hyper = _hyper(model, likelihood)
        result[name] = {**hyper, "ratio_to_exact": {key: hyper[key] / exact_hyper[key] for key in HYPERPARAMETERS},
                        "exact_loss_above_optimum": exact_here - exact_optimum, "converged": fitted.converged,
                        "iterations": len(fitted), "cpu_s": time.process_time() - began}
        with torch.no_grad():
            for parameter_name, parameter in parameters.items():
                parameter.copy_(kept[parameter_name])
    result["defaults"]["ratio_to_exact"] = {key: found[key] / exact_hyper[key] for key in HYPERPARAMETERS}
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["prior:6:grid:40x40"])
    parser.add_argument("--seed", type=int, default=0, help="problem draw, split and walks")
    parser.add_argument("--second-seed", type=int, default=987654, help="the second walk set")
    parser.add_argument("--iterations", type=int, default=200, help="most L-BFGS iterations per run")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    results = []
    for spec in args.problems:
        result = run(spec, args.seed, args.second_seed, args.iterations)
        results.append(result)
        for name in ("defaults", *OBJECTIVES):
            row = result[name]
            ratios = " / ".join(f"{row['ratio_to_exact'][key]:.3f}" for key in HYPERPARAMETERS)
            above = row.get("exact_loss_above_optimum")
            print(f"{spec} {name:15s} outputscale / gamma / noise vs exact GP {ratios}"
                  + ("" if above is None else f"; exact loss {above:+.2e} above its optimum"), file=sys.stderr)
    return emit_report({"benchmark": "likelihood_bias", "results": results}, args.json_out)


if __name__ == "__main__":
    main()
