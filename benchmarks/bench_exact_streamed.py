"""Benchmark: the matrix-free exact GP streamed to every node, on ``bench_predict_graph.py``'s fields.

:func:`gp_couple.recipes.fit_graph_kernel` trains a ``MatrixFreeGraphKernel`` from gpytorch's
start (the stopping rule of ``fit_gp``), and :class:`gp_couple.streaming.ExactStreamedPredictor`
predicts every node in chunks; scored at the unobserved nodes as ``bench_predict_graph.py``
scores the command and the dense exact GP (compare with its JSON for the same field and seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from bench_predict_graph import add_field_arguments, field, score


def main(argv: list[str] | None = None) -> int:
    from gp_couple import Diffusion
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels.matrix_free import MatrixFreeGraphKernel
    from gp_couple.recipes import fit_graph_kernel
    from gp_couple.streaming import ExactStreamedPredictor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_field_arguments(parser)
    args = parser.parse_args(argv)
    nodes, values, latent, noisy = field(args.grid, args.observed, args.seed, args.field)
    test = np.setdiff1d(np.arange(args.grid ** 2), nodes)
    offset, scale = float(values.mean()), float(values.std())
    start = time.perf_counter()
    model, likelihood, history = fit_graph_kernel(MatrixFreeGraphKernel(grid_graph(args.grid, args.grid),
                                                                        Diffusion(1.0)),
                                                  nodes, torch.as_tensor((values - offset) / scale))
    trained = time.perf_counter() - start
    mean, variance = ExactStreamedPredictor(model, likelihood, target_offset=offset,
                                            target_scale=scale).predict_all()
    covariance = model.covar_module
    result = {"grid": args.grid, "observed": args.observed, "seed": args.seed, "field": args.field,
              **score(mean, variance, test, latent, noisy),
              "hyperparameters": {"outputscale": float(covariance.outputscale.detach()) * scale ** 2,
                                  "noise variance": float(likelihood.noise.detach()) * scale ** 2,
                                  "gamma": float(covariance.base_kernel.kernel_family.gamma.detach())},
              "converged": bool(history.converged), "iterations": len(history),
              "training seconds": trained, "total seconds": time.perf_counter() - start}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
