"""Benchmark: peak memory of training on graph random features, per coalesced entry and slot.

``gp_couple.features.graph_random_features.expected_feature_bytes`` caps the walkers a GRF
kernel draws at what training on their features holds in memory, counting
``TRAINING_BYTES_PER_ENTRY`` bytes per coalesced ``(row, column, step)`` entry and
``TRAINING_BYTES_PER_SLOT`` per ``(row, column)`` slot, beside ``TRAINING_FIXED_BYTES`` that do
not grow with the walks. This measures what they cost: each
configuration runs in a fresh interpreter, builds ``bench_graph_gp.py``'s problem (10^4
observed nodes), resets the peak-RSS counter, then samples the walks of every node (the
constructor's walk configuration at the given walker count and termination probability)
and runs one marginal-likelihood evaluation of ``ScaleKernel(GRFKernel)`` and its gradient
by CG/Lanczos under ``grf_gp_settings``. It reports the peak above the baseline against the
estimate ``TRAINING_FIXED_BYTES + TRAINING_BYTES_PER_ENTRY * entries + TRAINING_BYTES_PER_SLOT * slots``.
By default the kernel's rows are the training and test nodes, in float32; ``--rows train``
keeps the training nodes only (the training rows' step matrix then copies every entry) and
``--dtype float64`` trains in double precision: together, the case the per-entry constant is
set for.

    python benchmarks/bench_feature_memory.py --json-out benchmarks/results/feature_memory.json
    python benchmarks/bench_feature_memory.py --rows train --dtype float64 \
        --json-out benchmarks/results/feature_memory_float64.json
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import dispatch_worker, emit_report, peak_increase, reset_peak, run_in_subprocess  # noqa: E402
from bench_graph_gp import problem  # noqa: E402

#: (graph, walkers per node, termination probability): the walker counts of the prediction walks
#: that the schedule draws on icosphere:5.
CONFIGURATIONS = (("icosphere:5", 910, 0.056), ("icosphere:5", 2608, 0.049))


def training_memory(spec: str, walkers: int, p_halt: float, rows: str = "all",
                    dtype: str = "float32") -> dict[str, Any]:
    """Peak memory of sampling ``walkers`` walkers per node of ``spec`` and one training evaluation.

    :param rows: ``"all"`` (the kernel's rows are the training and test nodes) or ``"train"``.
    :param dtype: ``"float32"`` or ``"float64"``.
    """
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import GRFKernel, grf_gp_settings
    from gp_couple.features.graph_random_features import (
        TRAINING_BYTES_PER_ENTRY,
        TRAINING_BYTES_PER_SLOT,
        TRAINING_FIXED_BYTES,
    )
    from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood
    from gp_couple.models import GraphGP

    graph, _, observed, train, test = problem(spec, 0)
    precision = getattr(torch, dtype)
    # The kernel samples its walks in the default dtype (this worker's own process).
    torch.set_default_dtype(precision)
    targets = torch.as_tensor(observed[train], dtype=precision)
    baseline = reset_peak()
    kernel = GRFKernel(graph, nodes=train if rows == "train" else np.union1d(train, test), num_walkers=walkers,
                       p_halt=p_halt, seed=0, schedule=None)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).to(precision)
    model.train()
    with grf_gp_settings():
        loss = -DenseMarginalLogLikelihood(likelihood, model)(model(*model.train_inputs), model.train_targets)
        loss.backward()
    peak = peak_increase(baseline)
    entries, slots = int(kernel.features_steps.numel()), int(kernel.features_columns.numel())
    estimate = (TRAINING_FIXED_BYTES + TRAINING_BYTES_PER_ENTRY * entries + TRAINING_BYTES_PER_SLOT * slots) / 1e9
    return {"graph": spec, "walkers": walkers, "p_halt": p_halt, "rows": rows, "dtype": dtype,
            "training_points": int(train.size),
            "entries": entries, "slots": slots, "peak_gb": peak, "estimate_gb": estimate,
            "peak_vs_estimate": peak / estimate}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", choices=("all", "train"), default="all",
                        help="the kernel's rows: the training and test nodes, or the training nodes only")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    from gp_couple.features.graph_random_features import (
        TRAINING_BYTES_PER_ENTRY,
        TRAINING_BYTES_PER_SLOT,
        TRAINING_FIXED_BYTES,
    )

    rows = [run_in_subprocess(__file__, training_memory, *configuration, args.rows, args.dtype)
            for configuration in CONFIGURATIONS]
    return emit_report({"benchmark": "feature_memory", "TRAINING_BYTES_PER_ENTRY": TRAINING_BYTES_PER_ENTRY,
                        "TRAINING_BYTES_PER_SLOT": TRAINING_BYTES_PER_SLOT,
                        "TRAINING_FIXED_BYTES": TRAINING_FIXED_BYTES, "rows": rows}, args.json_out)


if __name__ == "__main__":
    if not dispatch_worker(sys.argv[1:], globals()):
        main()
