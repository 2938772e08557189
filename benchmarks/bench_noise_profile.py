r"""Benchmark (a diagnosis): how well do the data fix the noise, and where is the exact likelihood's optimum?

On a problem of :mod:`bench_graph_gp_accuracy` (e.g. ``prior:GAMMA:GRAPH@N``), the exact
training covariance at the kernel family and hyperparameters of an exact row of
``bench_convergence.py`` (``--exact-from``) is

.. math::

    \mathbf C(s, \sigma^2) = s\,\mathbf K_{XX} + \sigma^2\mathbf I,

with :math:`\mathbf K_{XX}` (e.g. :math:`\exp(-\gamma^2\widetilde{\mathbf L})_{XX}` for the
diffusion kernel) computed in float64 by :func:`gp_couple.exact.exact_kernel_columns` on
blocks of columns (no dense matrix of the whole graph), and diagonalised once, so the exact
negative log-likelihood (zero mean) is a closed form in the output scale :math:`s` and the
noise :math:`\sigma^2`. Reported, with the family's hyperparameters held:

* the float64 optimum in :math:`(\log s, \log\sigma^2)`, with Laplace standard deviations (the
  inverse Hessian; the family's hyperparameters held, so they are lower bounds);
* for every row of ``--compare`` (``bench_convergence.py`` rows, e.g. a GRF-GP's and the exact
  GP's own, whose loss may be a float32 CG estimate) its noise, its distance from the optimum in
  log-noise and in Laplace standard deviations, and the excess of the exact likelihood at that
  noise with :math:`s` re-optimised (nats).

This separates a GRF-GP that misses the exact GP's noise from an exact reference that stopped
away from its own optimum, and shows how far a noise may move at no cost in likelihood. The
training set must fit a dense float64 eigendecomposition (about 10^4 points: 0.8 GB per
matrix). ``--cache`` keeps the spectrum (two vectors) for later runs that place more rows.

Run::

    python benchmarks/bench_noise_profile.py --problem prior:3:grid:316x316@10000 \
        --exact-from benchmarks/results/graph_gp_choice_observed10000_grid316_seed0_exact.json \
        --compare benchmarks/results/graph_gp_choice_observed10000_grid316_seed0_defaults.json \
        --cache /tmp/spectrum_grid316.npz --json-out benchmarks/results/noise_profile_grid316_observed10000.json
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
from bench_convergence import hyperparameter_names  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402

#: Columns per :func:`gp_couple.exact.exact_kernel_columns` call.
BLOCK = 500


def _family_hyperparameters(row: dict[str, Any]) -> dict[str, Any]:
    """A row's kernel family and its learnt hyperparameters (neither output scale nor noise)."""
    return {"kernel_family": row.get("kernel_family", "diffusion"),
            **{name: row[name] for name in hyperparameter_names(row) if name not in ("outputscale", "noise")}}


def exact_family(row: dict[str, Any]) -> Any:
    """The kernel family of a ``bench_convergence.py`` row at its learnt hyperparameters, in float64."""
    from gp_couple import get_kernel_family

    hyperparameters = _family_hyperparameters(row)
    family = get_kernel_family(hyperparameters.pop("kernel_family")).double()
    for name, value in hyperparameters.items():
        setattr(family, name, value)
    return family


def exact_training_kernel(graph: Any, train: Any, family: Any) -> Any:
    """The exact kernel of ``family`` at the training nodes, float64, symmetrised, from blocks of
    :data:`BLOCK` columns of :func:`gp_couple.exact.exact_kernel_columns`."""
    import numpy as np

    from gp_couple.exact import exact_kernel_columns

    kernel = np.empty((train.size, train.size))
    for start in range(0, train.size, BLOCK):
        kernel[:, start:start + BLOCK] = exact_kernel_columns(family, graph, train[start:start + BLOCK])[train]
    return (kernel + kernel.T) / 2


def _rows(path: str, spec: str, seed: int) -> list[dict[str, Any]]:
    """The rows of a ``bench_convergence.py`` JSON on problem ``spec`` with ``seed`` (without failed ones)."""
    with open(path) as handle:
        return [row for row in json.load(handle)["rows"]
                if row.get("problem") == spec and row.get("seed") == seed and "error" not in row]


def _spectrum(spec: str, seed: int, exact: dict[str, Any], cache: str | None) -> tuple[Any, Any, int]:
    """Eigenvalues of the exact training kernel and the squared projections of the targets on its
    eigenvectors (read from ``cache`` where it holds those of this problem, seed, kernel family and
    hyperparameters; else computed, and written there)."""
    import numpy as np

    family = exact_family(exact)
    key = np.array([spec, str(seed), json.dumps(_family_hyperparameters(exact), sort_keys=True)])
    if cache is not None and os.path.exists(cache):
        with np.load(cache) as stored:
            if np.array_equal(stored["key"], key):
                return stored["eigenvalues"], stored["projected"], int(stored["eigenvalues"].size)
    graph, _, observed, train, _ = problem(spec, seed)
    eigenvalues, vectors = np.linalg.eigh(exact_training_kernel(graph, train, family))
    projected = (vectors.T @ observed[train]) ** 2
    if cache is not None:
        partial = f"{cache}.partial.npz"
        np.savez(partial, key=key, eigenvalues=eigenvalues, projected=projected)
        os.replace(partial, cache)
    return eigenvalues, projected, int(train.size)


def run(spec: str, seed: int, exact_from: str, compare: list[str], cache: str | None = None,
        method: str = "exact") -> dict[str, Any]:
    import numpy as np
    from scipy.optimize import minimize

    exact_rows = [row for row in _rows(exact_from, spec, seed) if row.get("method") == method]
    if len(exact_rows) != 1:
        raise ValueError(f"{exact_from} must hold one {method} row of {spec} with seed {seed}, "
                         f"found {len(exact_rows)}")
    (exact,) = exact_rows
    began = time.process_time()
    eigenvalues, projected, points = _spectrum(spec, seed, exact, cache)

    def nll(log_scale: float, log_noise: float) -> float:
        covariance = math.exp(log_scale) * eigenvalues + math.exp(log_noise)
        constant = 0.5 * points * math.log(2 * math.pi)
        return 0.5 * float(np.sum(projected / covariance + np.log(covariance))) + constant

    start = [math.log(exact["outputscale"]), math.log(exact["noise"])]
    best = minimize(lambda point: nll(*point), start, method="Nelder-Mead",
                    options={"xatol": 1e-9, "fatol": 1e-9, "maxiter": 4000})
    step, hessian = 1e-3, np.empty((2, 2))
    for i in range(2):
        for j in range(2):
            e, f = np.eye(2)[i] * step, np.eye(2)[j] * step
            hessian[i, j] = (nll(*(best.x + e + f)) - nll(*(best.x + e - f)) - nll(*(best.x - e + f))
                             + nll(*(best.x - e - f))) / (4 * step**2)
    deviations = np.sqrt(np.diag(np.linalg.inv(hessian)))
    log_scale, log_noise = (float(value) for value in best.x)
    compared = []
    for path in compare:
        for row in _rows(path, spec, seed):
            noise = float(row["noise"])
            profile = minimize(lambda point, noise=noise: nll(point[0], math.log(noise)), [log_scale],
                               method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-9})
            shift = math.log(noise) - log_noise
            compared.append({"source": os.path.basename(path), "method": row["method"], "noise": noise,
                             "family": _family_hyperparameters(row), "outputscale": float(row["outputscale"]),
                             "log_noise_from_optimum": shift, "laplace_deviations": shift / float(deviations[1]),
                             "nll_excess_nats": float(profile.fun - best.fun),
                             # At the row's own output scale too: its excess where its family's
                             # hyperparameters are those of the profile.
                             "nll_excess_at_row_nats": float(nll(math.log(row["outputscale"]), math.log(noise))
                                                             - best.fun)})
    return {"problem": spec, "seed": seed, "train": points, "profile_method": method,
            "exact_family": _family_hyperparameters(exact),
            "optimum": {"outputscale": math.exp(log_scale), "noise": math.exp(log_noise), "nll": float(best.fun)},
            "laplace_sd": {"log_outputscale": float(deviations[0]), "log_noise": float(deviations[1])},
            "compared": compared, "cpu_s": time.process_time() - began}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", required=True,
                        help="a bench_graph_gp_accuracy.py problem, e.g. prior:GAMMA:GRAPH@N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-from", required=True,
                        help="bench_convergence.py JSON with the exact row (its kernel family and hyperparameters)")
    parser.add_argument("--method", default="exact",
                        help="the method of the --exact-from row whose kernel family and hyperparameters the profile "
                             "holds (default exact; e.g. defaults: the exact likelihood at a GRF-GP's range)")
    parser.add_argument("--compare", nargs="*", default=[], help="bench_convergence.py JSON files whose rows to place")
    parser.add_argument("--cache", default=None,
                        help=".npz of the spectrum, reused by later runs on the same problem, seed and family")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    result = run(args.problem, args.seed, args.exact_from, [args.exact_from, *args.compare], args.cache, args.method)
    return emit_report({"benchmark": "noise_profile", **result}, args.json_out)


if __name__ == "__main__":
    main()
