"""Benchmark: peak memory of training on graph random features, per coalesced entry and slot.

``gp_couple.features.graph_random_features.expected_feature_bytes`` caps the walkers a GRF
kernel draws at what training on their features holds in memory, counting
``training_bytes_per_entry(dtype)`` bytes per coalesced ``(row, column, step)`` entry
(``TRAINING_ENTRY_COPIES`` copies of its step and weight) and ``TRAINING_BYTES_PER_SLOT`` per
``(row, column)`` slot, beside ``TRAINING_FIXED_BYTES`` that do not grow with the walks. This
measures what they cost: each configuration runs in a fresh interpreter, builds ``bench_graph_gp.py``'s problem (10^4
observed nodes), resets the peak-RSS counter, then samples the walks of every node (the
constructor's walk configuration at the given walker count and termination probability)
and runs one marginal-likelihood evaluation of ``ScaleKernel(GRFKernel)`` and its gradient
by CG/Lanczos under ``grf_gp_settings``. It reports the peak above the baseline against the
estimate ``TRAINING_FIXED_BYTES + training_bytes_per_entry(dtype) * entries + TRAINING_BYTES_PER_SLOT * slots``.
By default the kernel's rows are the training and test nodes, in float32; ``--rows train``
keeps the training nodes only (the training rows' step matrix then copies every entry) and
``--dtype float64`` trains in double precision: together, the case the per-entry constant is
set for.

``--use predict`` measures instead what predicting from the features holds, which the same
estimate must bound (the schedule's last prediction walks are capped by it): the walks of every
node, then ``gp_couple.models.predict``'s means and exact variances at the test nodes. Its peak
also holds the dense factor of the training covariance, which does not grow with the walks, so
each configuration is compared by its growth above a run with 16 walkers per node, and the
intercept and per-entry and per-slot bytes that fit the three runs are reported.

    python benchmarks/bench_feature_memory.py --json-out benchmarks/results/feature_memory.json
    python benchmarks/bench_feature_memory.py --rows train --dtype float64 \
        --json-out benchmarks/results/feature_memory_float64.json
    python benchmarks/bench_feature_memory.py --use predict --dtype float64 \
        --json-out benchmarks/results/feature_memory_predict_float64.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402
from bench_graph_gp import problem  # noqa: E402

#: (graph, walkers per node, termination probability): the walker counts of the prediction walks
#: that the schedule draws on icosphere:5.
CONFIGURATIONS = (("icosphere:5", 910, 0.056), ("icosphere:5", 2608, 0.049))
#: The fewest walkers a prediction's peak is measured with: what the others grow from.
PREDICTION_BASELINE = ("icosphere:5", 16, 0.056)
#: Output scale, range and noise of the predictions (icosphere:5's, learnt by the constructor's defaults).
PREDICTION_HYPERPARAMETERS = (76.0, 5.7, 0.0099)


def _measured_model(spec: str, walkers: int, p_halt: float, rows: str, dtype: str,
                    hyperparameters: tuple[float, float, float] | None = None) -> tuple[Any, Any, float, Any]:
    """``ScaleKernel(GRFKernel)`` GP of ``bench_graph_gp.py``'s problem, its walks sampled after the peak-RSS
    counter is reset: ``(model, kernel, baseline, test nodes)``.

    :param rows: ``"all"`` (the kernel's rows are the training and test nodes) or ``"train"``.
    :param dtype: ``"float32"`` or ``"float64"`` (the default dtype of this worker's own process, which
        the kernel samples its walks in).
    :param hyperparameters: Output scale, γ and noise (default: the modules' initial values).
    """
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import GRFKernel
    from gp_couple.kernel_families import Diffusion
    from gp_couple.models import GraphGP

    graph, _, observed, train, test = problem(spec, 0)
    precision = getattr(torch, dtype)
    torch.set_default_dtype(precision)
    targets = torch.as_tensor(observed[train], dtype=precision)
    family = None if hyperparameters is None else Diffusion(hyperparameters[1])
    baseline = reset_peak()
    kernel = GRFKernel(graph, nodes=train if rows == "train" else np.union1d(train, test), num_walkers=walkers,
                       p_halt=p_halt, seed=0, schedule=None, kernel_family=family)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    scaled = gpytorch.kernels.ScaleKernel(kernel)
    if hyperparameters is not None:
        scaled.outputscale, likelihood.noise = hyperparameters[0], hyperparameters[2]
    return GraphGP(train, targets, likelihood, scaled).to(precision), kernel, baseline, test


def training_memory(spec: str, walkers: int, p_halt: float, rows: str = "all",
                    dtype: str = "float32") -> dict[str, Any]:
    """Peak memory of sampling ``walkers`` walkers per node of ``spec`` and one training evaluation.

    :param rows: ``"all"`` (the kernel's rows are the training and test nodes) or ``"train"``.
    :param dtype: ``"float32"`` or ``"float64"``.
    """
    import torch

    from gp_couple import grf_gp_settings
    from gp_couple.features.graph_random_features import (
        TRAINING_BYTES_PER_SLOT,
        TRAINING_FIXED_BYTES,
        training_bytes_per_entry,
    )
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood

    model, kernel, baseline, _ = _measured_model(spec, walkers, p_halt, rows, dtype)
    model.train()
    with grf_gp_settings():
        loss = -DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
        loss.backward()
    peak = peak_increase(baseline)
    entries, slots = int(kernel.features_steps.numel()), int(kernel.features_columns.numel())
    entry_bytes = training_bytes_per_entry(getattr(torch, dtype), entries)
    estimate = (TRAINING_FIXED_BYTES + entry_bytes * entries + TRAINING_BYTES_PER_SLOT * slots) / 1e9
    return {"graph": spec, "walkers": walkers, "p_halt": p_halt, "rows": rows, "dtype": dtype,
            "training_points": int(model.train_targets.numel()),
            "entries": entries, "slots": slots, "peak_gb": peak, "estimate_gb": estimate,
            "peak_vs_estimate": peak / estimate}


def prediction_memory(spec: str, walkers: int, p_halt: float, dtype: str = "float32") -> dict[str, Any]:
    """Peak memory of sampling ``walkers`` walkers per node of ``spec`` and predicting with them, and the
    prediction's wall time.

    The kernel's rows are the training and test nodes; ``gp_couple.models.predict`` computes
    the predictive means and variances of the test nodes (the path of the benchmarks'
    predictions) at the output scale, range and noise :data:`PREDICTION_HYPERPARAMETERS`.
    """
    from gp_couple import grf_gp_settings
    from gp_couple.models import predict

    model, kernel, baseline, test = _measured_model(spec, walkers, p_halt, "all", dtype, PREDICTION_HYPERPARAMETERS)
    model.eval()
    start = time.perf_counter()
    with grf_gp_settings():
        predict(model, model.likelihood, test, seed=0)
    predict_s = time.perf_counter() - start
    peak = peak_increase(baseline)
    return {"graph": spec, "walkers": walkers, "p_halt": p_halt, "use": "predict", "dtype": dtype,
            "training_points": int(model.train_targets.numel()), "test_points": int(test.size),
            "entries": int(kernel.features_steps.numel()), "slots": int(kernel.features_columns.numel()),
            "peak_gb": peak, "predict_s": predict_s}


def _prediction_report(rows: list[dict[str, Any]], entry_bytes: int, slot_bytes: int) -> dict[str, Any]:
    """Each row's growth above the first (fewest walkers) against the per-entry and per-slot estimate,
    and the intercept and per-entry and per-slot bytes that fit the rows (least squares)."""
    import numpy as np

    measured = [row for row in rows if "error" not in row]
    if not measured:
        return {}
    first = measured[0]
    for row in measured[1:]:
        grown = row["peak_gb"] - first["peak_gb"]
        estimated = (entry_bytes * (row["entries"] - first["entries"])
                     + slot_bytes * (row["slots"] - first["slots"])) / 1e9
        row.update(increase_gb=grown, estimated_increase_gb=estimated, increase_vs_estimate=grown / estimated)
    if len(measured) < 3:
        return {}
    design = np.array([[1.0, row["entries"], row["slots"]] for row in measured])
    fit = np.linalg.lstsq(design, np.array([row["peak_gb"] * 1e9 for row in measured]), rcond=None)[0]
    return {"fitted_intercept_gb": fit[0] / 1e9, "fitted_bytes_per_entry": fit[1], "fitted_bytes_per_slot": fit[2]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--use", choices=("train", "predict"), default="train",
                        help="train on the features (one likelihood evaluation and its gradient) or predict from them")
    parser.add_argument("--rows", choices=("all", "train"), default="all",
                        help="the kernel's rows when training: the training and test nodes, or the training nodes only")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    from gp_couple.features import graph_random_features as constants

    report: dict[str, Any] = {"benchmark": "feature_memory", "use": args.use, "dtype": args.dtype,
                              "TRAINING_ENTRY_COPIES": constants.TRAINING_ENTRY_COPIES,
                              "TRAINING_BYTES_PER_SLOT": constants.TRAINING_BYTES_PER_SLOT,
                              "TRAINING_FIXED_BYTES": constants.TRAINING_FIXED_BYTES}
    if args.use == "train":
        rows = [run_in_subprocess(__file__, training_memory, *configuration, args.rows, args.dtype)
                for configuration in CONFIGURATIONS]
    else:
        import torch

        rows = [run_in_subprocess(__file__, prediction_memory, *configuration, args.dtype)
                for configuration in (PREDICTION_BASELINE, *CONFIGURATIONS)]
        report.update(_prediction_report(rows, constants.training_bytes_per_entry(getattr(torch, args.dtype)),
                                         constants.TRAINING_BYTES_PER_SLOT))
    report["rows"] = rows
    return emit_report(report, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
