"""Benchmark: one training step of a GRF-GP (loss and gradient), with subnormal floats kept or flushed.

A training step of :func:`gp_couple.models.fit_gp` evaluates the negative marginal
log-likelihood and its gradient. GRF and diffusion Gram matrices hold entries many
orders of magnitude apart, and their Cholesky factors decay further, into float32's
subnormal range (below 1.2e-38), where x86 CPUs compute many times slower.
:func:`gp_couple.settings.flush_denormals` (entered by ``fit_gp``, ``predict`` and
``grf_gp_settings``) flushes them to zero; this benchmark times the same step with
subnormals kept (``flush_denormals(False)``) and flushed, alternating in one process,
and counts the subnormal entries of the dense training covariance and of its Cholesky
factor.

Problems are ``prior:GAMMA:GRAPH`` draws of ``bench_graph_gp_accuracy.py`` (half the nodes
observed); the kernel is ``GRFKernel`` with ``--walkers`` antithetic repelling walkers at
p_halt 0.1 and the generating γ, float32, under ``grf_gp_settings()`` (dense Cholesky up to
``GRFGPSettings.max_cholesky_size`` training points, CG/Lanczos above; runs before that
limit was raised from 2,048 to 8,192 timed the 100 x 100 grid's 5,000 points by CG).

Run: ``python benchmarks/bench_training_step.py --problems prior:3:grid:50x50 prior:3:grid:100x100
--json-out benchmarks/results/training_step.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402
from bench_graph_gp_accuracy import problem  # noqa: E402


def measure(spec: str, walkers: int, repeats: int, seed: int) -> dict[str, Any]:
    """Median seconds of a loss-and-gradient step with subnormals kept and flushed."""
    import gpytorch
    import numpy as np
    import torch

    from gp_couple import Diffusion, GraphGP, GRFGPSettings, GRFKernel, grf_gp_settings
    from gp_couple._random import seeded_torch_rng
    from gp_couple.settings import flush_denormals

    graph, _, observed, train, test = problem(spec, seed)
    gamma = float(spec.split(":")[1])
    base = GRFKernel(graph, kernel_family=Diffusion(gamma), nodes=np.union1d(train, test), num_walkers=walkers,
                     seed=seed, schedule=None)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, torch.as_tensor(observed[train], dtype=torch.float32), likelihood,
                    gpytorch.kernels.ScaleKernel(base))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    inputs, targets = model.train_inputs[0], model.train_targets

    losses: dict[bool, float] = {}
    gradients: dict[bool, torch.Tensor] = {}

    def step(flush: bool) -> float:
        model.zero_grad()
        began = time.perf_counter()
        with seeded_torch_rng(seed):  # the same CG probe vectors in both modes
            loss = -mll(model(inputs), targets)
            loss.backward()
        elapsed = time.perf_counter() - began
        losses[flush] = float(loss.detach())
        gradients[flush] = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        return elapsed

    times: dict[bool, list[float]] = {False: [], True: []}
    with grf_gp_settings():
        for flush in (False, True):  # warm-up: caches, pivots, the step matrix's transpose
            with flush_denormals(flush):
                step(flush)
        for _ in range(repeats):
            for flush in (False, True):
                with flush_denormals(flush):
                    times[flush].append(step(flush))
        with torch.no_grad(), flush_denormals(False):
            covariance = likelihood(model(inputs)).lazy_covariance_matrix.to_dense() \
                if train.size <= GRFGPSettings().max_cholesky_size else None
    result: dict[str, Any] = {"problem": spec, "walkers": walkers, "train": int(train.size), "nnz": base.features.nnz,
                              "seconds_subnormals_kept": statistics.median(times[False]),
                              "seconds_subnormals_flushed": statistics.median(times[True]), "repeats": repeats}
    result["speedup"] = result["seconds_subnormals_kept"] / result["seconds_subnormals_flushed"]
    # What flushing changes: the loss and its gradient (the same up to rounding, or the speed-up is no gain).
    result.update(loss_subnormals_kept=losses[False], loss_subnormals_flushed=losses[True],
                  gradient_relative_difference=float((gradients[True] - gradients[False]).norm()
                                                     / gradients[False].norm()))
    if covariance is not None:
        tiny = torch.finfo(covariance.dtype).tiny

        def subnormal(matrix: torch.Tensor) -> int:
            return int(((matrix.abs() < tiny) & (matrix != 0)).sum())

        with flush_denormals(False):
            factor = torch.linalg.cholesky(covariance)
        result.update(subnormal_in_covariance=subnormal(covariance), subnormal_in_factor=subnormal(factor),
                      entries=covariance.numel())
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["prior:3:grid:50x50", "prior:3:grid:100x100"])
    parser.add_argument("--walkers", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    import torch

    rows = []
    for spec in args.problems:
        row = measure(spec, args.walkers, args.repeats, args.seed)
        row["torch_threads"] = torch.get_num_threads()
        rows.append(row)
        print(f"{spec}: {row['seconds_subnormals_kept']:.3f} s kept, {row['seconds_subnormals_flushed']:.3f} s "
              f"flushed ({row['speedup']:.2f}x); loss {row['loss_subnormals_kept']:.8g} / "
              f"{row['loss_subnormals_flushed']:.8g}, gradient difference {row['gradient_relative_difference']:.2g}",
              flush=True)
    report = {"benchmark": "training_step", "machine": platform.machine(), "rows": rows}
    emit_report(report, args.json_out)
    return report


if __name__ == "__main__":
    main()
