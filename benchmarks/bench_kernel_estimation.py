"""Benchmark: one split of ``gp-couple kernel-estimation``, the former protocol against the current one.

Both run in the same process on the same split of a UCI dataset (default boston, split
0 of seed 0, every default coupling, 100 draws each), so the ratio cancels the load of
the machine at the time:

* ``former``: what the command did before: the exact GP fitted by Adam (learning rate
  1e-2, at most 5000 steps, loss change < 1e-5 per 100 steps), torch and BLAS threads at
  their defaults, and for every draw the dense posterior (SciPy Cholesky of the
  ``N x N`` Gram blocks) and the dense KL divergence;
* ``current``: :func:`gp_couple.experiments.kernel_estimation.run_kernel_estimation`:
  L-BFGS-B on the marginal likelihood, one thread, low-rank (Woodbury) posteriors and
  KLs of a whole batch of draws at once.

The former protocol is slow: one split did not finish within 11.7 minutes of wall time on
the shared 2-core development machine (load average 6-9), nor within 50 minutes at load
25-30. The frequencies are the same draws in both, so the kernel RMSEs agree exactly; the KL
and predictive RMSE differ only through the fitted hyperparameters (reported). Prints
one JSON document (also written to ``--json-out``).

Run: ``python benchmarks/bench_kernel_estimation.py --json-out benchmarks/results/speed_kernel_estimation.json``
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402


def _former_split(x_all: Any, y_all: Any, couplings: dict[str, tuple[str, ...]], draws: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from gp_couple.couplings import get_frequency_coupling
    from gp_couple.evaluation.metrics import rmse
    from gp_couple.evaluation.posterior import gp_posterior_from_blocks, posterior_kl
    from gp_couple.experiments._exact_gp import fit_gp_hyperparameters, rlf_lengthscale
    from gp_couple.experiments._splits import random_split, split_stream, standardise
    from gp_couple.features.fourier import feature_map, gaussian_kernel
    from gp_couple.optimize import Convergence

    train, test = random_split(len(x_all), 256, 256, seed=split_stream(0, 0, "split"))
    x_train, x_test = standardise(x_all[train], x_all[test])
    y_train, y_test = standardise(y_all[train, None], y_all[test, None])
    y_train, y_test = y_train[:, 0], y_test[:, 0]
    points = torch.as_tensor(np.concatenate([x_train, x_test]))
    n = len(train)
    fit_seconds, rows, fits = 0.0, {}, {}
    for kind, names in couplings.items():
        start = time.perf_counter()
        # The former fit: Adam, stopping when the loss moved less than 1e-5 per 100 steps (the
        # parameters unchecked), default threads (threads=None keeps torch's setting).
        hyper = fit_gp_hyperparameters(x_train, y_train, optimizer="adam",
                                       convergence=Convergence(loss_tolerance=1e-5, parameter_tolerance=1.0,
                                                               window=100),
                                       lengthscale=rlf_lengthscale(x_train) if kind == "rlf" else None,
                                       threads=torch.get_num_threads())
        fit_seconds += time.perf_counter() - start
        fits[kind] = {"lengthscale": hyper.lengthscale, "outputscale": hyper.outputscale,
                      "noise": hyper.noise, "iterations": hyper.iterations}
        scaled = points / hyper.lengthscale
        gram = gaussian_kernel(scaled).numpy()
        blocks = hyper.outputscale * gram
        exact = gp_posterior_from_blocks(blocks[:n, :n], blocks[n:, :n], blocks[n:, n:], y_train, hyper.noise)
        for name in names:
            coupling = get_frequency_coupling(name, dim=x_all.shape[1])
            rng = split_stream(0, 0, kind, name)
            frequencies = coupling.sample(x_all.shape[1] * (1 if kind == "rff" else 2), x_all.shape[1],
                                          batch_shape=(draws,), seed=rng, dtype=torch.float64)
            with torch.no_grad():
                features = feature_map(kind)(scaled, frequencies).numpy()
            squared, kls, errors = [], [], []
            for phi in features:
                approx = phi @ phi.T
                squared.append(float(((approx[n:, n:] - gram[n:, n:]) ** 2).mean()))
                k = hyper.outputscale * approx
                posterior = gp_posterior_from_blocks(k[:n, :n], k[n:, :n], k[n:, n:], y_train, hyper.noise)
                kls.append(posterior_kl(exact, posterior) / len(test))
                errors.append(rmse(posterior.mean, y_test))
            rows[f"{kind}/{name}"] = {"kernel_rmse": math.sqrt(float(np.mean(squared))),
                                      "kl_per_test_point": float(np.mean(kls)),
                                      "predictive_rmse": float(np.mean(errors))}
    return {"rows": rows, "fits": fits, "fit_seconds": fit_seconds}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="boston")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import warnings

    import torch

    from gp_couple.datasets.uci import load_uci
    from gp_couple.experiments.kernel_estimation import DEFAULT_COUPLINGS, run_kernel_estimation

    warnings.simplefilter("ignore", RuntimeWarning)
    x_all, y_all = load_uci(args.dataset, data_dir=args.data_dir)
    couplings = {kind: tuple(names) for kind, names in DEFAULT_COUPLINGS.items()}

    start_cpu, start = time.process_time(), time.perf_counter()
    current = run_kernel_estimation(x_all, y_all, splits=1, draws=args.draws, seed=0, couplings=couplings)
    current_wall, current_cpu = time.perf_counter() - start, time.process_time() - start_cpu

    start_cpu, start = time.process_time(), time.perf_counter()
    former = _former_split(x_all, y_all, couplings, args.draws)
    former_wall, former_cpu = time.perf_counter() - start, time.process_time() - start_cpu

    agreement = []
    for row in current["results"]:
        reference = former["rows"][f"{row['features']}/{row['coupling']}"]
        agreement.append({"features": row["features"], "coupling": row["coupling"],
                          **{f"{metric}_current": row[metric]["mean"] for metric in reference},
                          **{f"{metric}_former": value for metric, value in reference.items()}})
    report = {
        "benchmark": "kernel_estimation_speed",
        "dataset": args.dataset,
        "split": 0,
        "draws": args.draws,
        "couplings": {kind: list(names) for kind, names in couplings.items()},
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
                    "torch_default_threads": torch.get_num_threads()},
        "former": {"wall_s": former_wall, "cpu_s": former_cpu, "gp_fit_wall_s": former["fit_seconds"],
                   "fits": former["fits"]},
        "current": {"wall_s": current_wall, "cpu_s": current_cpu,
                    "fits": {kind: {key: current["exact_gp"][kind][key]["mean"]
                                    for key in ("lengthscale", "outputscale", "noise", "gp_iterations")}
                             for kind in couplings}},
        "speedup_wall": former_wall / current_wall,
        "speedup_cpu": former_cpu / current_cpu,
        "max_kernel_rmse_difference": max(abs(a["kernel_rmse_current"] - a["kernel_rmse_former"])
                                          for a in agreement),
        "results": agreement,
    }
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    main()
