"""Benchmark: a GRF Gram estimate's whitened error, and what is left of it outside the kernel's leading eigenspace.

The bias-corrected likelihood needs the estimate's error small against the covariance,
:math:`e = \\|\\mathbf L^{-1} s(\\widehat{\\mathbf K} - \\mathbf K)\\mathbf L^{-\\top}\\|_2` with
:math:`\\mathbf L\\mathbf L^\\top = s\\mathbf K + \\sigma^2\\mathbf I` on the training nodes
(``BIAS_EXPANSION_LIMIT``). This measures :math:`e` at given hyperparameters for one draw
of prediction walks (:math:`\\Phi_1\\Phi_1^\\top`) and for the mean of two independent draws
(:math:`\\tfrac12(\\Phi_1\\Phi_2^\\top + \\Phi_2\\Phi_1^\\top)`, as the corrected rounds pair
them), and again with the exact part of the estimate in the leading ``r`` eigenvectors
:math:`\\mathbf U_r` of the kernel: with :math:`\\mathbf P = \\mathbf U_r\\mathbf U_r^\\top`
and the exact feature matrix :math:`\\mathbf F` (:math:`\\mathbf F^2 = \\mathbf K`),

.. math::

    \\widehat{\\mathbf K}_r = \\mathbf F\\mathbf P\\mathbf F + \\Phi_1(\\mathbf I - \\mathbf P)\\Phi_2^\\top,

unbiased off the diagonal, whose first-order error term only sees the kernel outside
:math:`\\mathbf U_r`. It also counts the eigenvalues of :math:`s\\mathbf K` above the noise
variance. Dense and exact (float64); graphs of a few thousand nodes.

Run: ``python benchmarks/bench_spectral_projection.py --data-dir ../shared/datasets --problem mesh:sphere
--outputscale 26.67 --gamma 10.95 --noise 1e-4 --json-out benchmarks/results/spectral_projection_sphere.json``
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit_report  # noqa: E402


def _whitened(factor: np.ndarray, perturbation: np.ndarray) -> float:
    """:math:`\\|\\mathbf L^{-1}\\mathbf H\\mathbf L^{-\\top}\\|_2` of a symmetric ``perturbation``, exactly."""
    import scipy.linalg

    left = scipy.linalg.solve_triangular(factor, perturbation, lower=True)
    both = scipy.linalg.solve_triangular(factor, left.T, lower=True)
    return float(np.abs(np.linalg.eigvalsh((both + both.T) / 2)).max())


def measure(spec: str, outputscale: float, gamma: float, noise: float, walkers: int, ranks: list[int],
            seed: int) -> dict[str, Any]:
    """The whitened errors of one problem's training block at the given hyperparameters."""
    import torch
    from bench_graph_gp_accuracy import problem

    from gp_couple import Diffusion, GRFKernel
    from gp_couple.exact import normalized_adjacency_eigh

    graph, _, _, train, _ = problem(spec, seed)
    # The kernel's eigenvectors are the normalised adjacency's (those of its numerically zero
    # eigenvalues would be rounding noise from an eigendecomposition of the kernel itself).
    adjacency_values, adjacency_vectors = normalized_adjacency_eigh(graph)
    with torch.no_grad():
        spectrum = Diffusion(gamma).double().spectrum(adjacency_values).numpy()
    order = np.argsort(spectrum)[::-1]
    values, vectors = np.clip(spectrum[order], 0.0, None), adjacency_vectors.numpy()[:, order]
    kernel = (vectors * values) @ vectors.T
    features = (vectors * np.sqrt(values)) @ vectors.T
    exact = kernel[np.ix_(train, train)]
    factor = np.linalg.cholesky(outputscale * exact + noise * np.eye(len(train)))
    draws = []
    for draw in (1, 2):
        estimate = GRFKernel(graph, kernel_family=Diffusion(gamma), nodes=np.arange(graph.num_nodes),
                             seed=seed + 100 * draw)
        estimate.resample_for_prediction(walkers, seed=seed + 100 * draw)
        with torch.no_grad():
            draws.append(estimate.feature_operator(torch.as_tensor(train)).to_dense().double().numpy())
    first, second = draws
    row: dict[str, Any] = {
        "problem": spec, "nodes": graph.num_nodes, "training_nodes": len(train), "outputscale": outputscale,
        "gamma": gamma, "noise": noise, "walkers": walkers, "p_halt": estimate.p_halt,
        "feature_relative_error": float(np.linalg.norm(first - features[train]) / np.linalg.norm(features[train])),
        "eigenvalues_above_noise": int((outputscale * values > noise).sum()),
        "one_draw": _whitened(factor, outputscale * (first @ first.T - exact)),
        "paired": _whitened(factor, outputscale * ((first @ second.T + second @ first.T) / 2 - exact)),
        "projected": []}
    for rank in ranks:
        basis = vectors[:, :rank]
        low = features[train] @ basis
        one, two = first @ basis, second @ basis
        paired = (first @ second.T - one @ two.T + second @ first.T - two @ one.T) / 2 + low @ low.T
        row["projected"].append({
            "rank": rank, "next_eigenvalue_over_noise": float(outputscale * values[rank] / noise),
            "one_draw": _whitened(factor, outputscale * (first @ first.T - one @ one.T + low @ low.T - exact)),
            "paired": _whitened(factor, outputscale * (paired - exact))})
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default="mesh:sphere", help="a bench_graph_gp_accuracy problem spec")
    parser.add_argument("--data-dir", default=None, help="datasets directory (default $GP_COUPLE_DATA)")
    parser.add_argument("--outputscale", type=float, required=True)
    parser.add_argument("--gamma", type=float, required=True)
    parser.add_argument("--noise", type=float, required=True)
    parser.add_argument("--walkers", type=int, default=8192, help="sigma-coupled prediction walkers per node")
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 32, 128, 512])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    if args.data_dir is not None:
        os.environ["GP_COUPLE_DATA"] = os.path.abspath(args.data_dir)
    row = measure(args.problem, args.outputscale, args.gamma, args.noise, args.walkers, args.ranks, args.seed)
    return emit_report({"benchmark": "spectral_projection", "rows": [row]}, args.json_out)


if __name__ == "__main__":
    main()
