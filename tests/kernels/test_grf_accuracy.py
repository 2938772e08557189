"""The recommended GRF-GP configuration (:mod:`gp_couple.recipes`): unbiased kernel estimates, and
predictions closer to the exact GP's than the previous default's.

It trains with 48 antithetic, repelling walkers per node at ``p_halt = 0.1`` and predicts
after redrawing 512 sigma-coupled repelling walkers fitted at the learnt hyperparameters
(measured in ``benchmarks/bench_graph_gp_accuracy.py``).
"""

from __future__ import annotations

from copy import deepcopy

import gpytorch
import numpy as np
import scipy.sparse as sp
import torch

from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, fit_gp, grf_gp_settings, predict
from gp_couple.features.sigma_fit import fit_sigma_coupling
from gp_couple.datasets import default_mesh, split_test_nodes
from gp_couple.graphs import Graph, grid_graph
from gp_couple.recipes import RECOMMENDED_P_HALT as P_HALT, fit_grf_gp
from tests.stats import assert_unbiased



def half_kernel(graph: Graph, family: Diffusion, terms: int = 80) -> np.ndarray:
    r"""Dense :math:`\mathbf H = \sum_t f(t)\widetilde{\mathbf W}^t` with :math:`\mathbf H\mathbf H^\top = \mathbf K`."""
    walk = graph.normalized_adjacency().toarray()
    with torch.no_grad():
        f = family.modulation(terms).double().numpy()
    power, total = np.eye(graph.num_nodes), np.zeros((graph.num_nodes, graph.num_nodes))
    for value in f:
        total += value * power
        power = power @ walk
    return total


def test_recommended_walks_estimate_the_gram_matrix_without_bias_off_the_diagonal():
    # Identical disconnected copies give one independent estimate per copy and seed.
    block, copies, seeds = grid_graph(3, 4), 12, 16
    size = block.num_nodes
    graph = Graph(sp.block_diag([block.adjacency] * copies, format="csr"))
    family = Diffusion(1.5).double()
    half = half_kernel(block, family)
    exact = half @ half.T
    sigma = fit_sigma_coupling(Diffusion(1.5), P_HALT, order=8, samples_per_bin=10, seed=0)
    kernel = GRFKernel(graph, num_walkers=4, p_halt=P_HALT, coupling=sigma, directions="repelling",
                       kernel_family=deepcopy(family), seed=0).double()
    nodes = torch.arange(graph.num_nodes, dtype=torch.float64).unsqueeze(-1)
    grams, residual_diagonals = [], []
    with torch.no_grad():
        for seed in range(seeds):
            kernel.resample(seed=seed)
            gram = kernel(nodes).to_dense().numpy()
            features = kernel.feature_operator(nodes[:, 0].long()).to_dense().numpy()
            for c in range(copies):
                rows = slice(c * size, (c + 1) * size)
                grams.append(gram[rows, rows])
                error = features[rows, rows] - half
                residual_diagonals.append(np.diag(gram[rows, rows]) - (error ** 2).sum(axis=1))
    off_diagonal = ~np.eye(size, dtype=bool)
    # 132 + 12 simultaneous comparisons: z = 5 keeps the family-wise false alarm below 1e-4.
    assert_unbiased(np.stack(grams)[:, off_diagonal], exact[off_diagonal], z=5.0)
    # The diagonal ||phi_i||^2 is biased upwards by exactly the feature variance
    # E||phi_i - h_i||^2 (the features are unbiased for the rows h_i of H): removing it
    # leaves an unbiased estimate of K_ii.
    assert_unbiased(np.stack(residual_diagonals), np.diag(exact), z=5.0)


def _fitted(kernel: gpytorch.kernels.Kernel, train: np.ndarray, targets: torch.Tensor,
            iterations: int) -> tuple[GraphGP, gpytorch.likelihoods.GaussianLikelihood]:
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel))
    with grf_gp_settings():
        fit_gp(model, likelihood, iterations=iterations, lr=0.05, seed=0)
    return model, likelihood


def test_recommended_configuration_predicts_closer_to_the_exact_gp_than_the_previous_default():
    mesh = default_mesh()
    train, test = split_test_nodes(mesh.graph.num_nodes, seed=0)
    targets = torch.as_tensor(mesh.targets[train], dtype=torch.float32)
    iterations = 40

    exact, exact_likelihood = _fitted(ExactGraphKernel(mesh.graph, Diffusion(1.0)), train, targets, iterations)
    with grf_gp_settings():
        exact_mean = predict(exact, exact_likelihood, test, seed=0)[0].numpy()

    # The previous README default: 16 sigma-coupled walkers fitted at gamma = 1, p_halt = 0.4.
    previous_sigma = fit_sigma_coupling(Diffusion(1.0), 0.4, order=50, samples_per_bin=20, seed=0)
    previous, previous_likelihood = _fitted(GRFKernel(
        mesh.graph, num_walkers=16, p_halt=0.4, coupling=previous_sigma, kernel_family=Diffusion(1.0),
        nodes=np.concatenate([train, test]), seed=0), train, targets, iterations)
    with grf_gp_settings():
        previous_mean = predict(previous, previous_likelihood, test, seed=0)[0].numpy()

    recommended, recommended_likelihood = fit_grf_gp(mesh.graph, train, targets, predict_nodes=test,
                                                     iterations=iterations, sigma_fit_samples=20, seed=0)
    with grf_gp_settings():
        recommended_mean = predict(recommended, recommended_likelihood, test, seed=0)[0].numpy()

    previous_error = np.sqrt(np.mean((previous_mean - exact_mean) ** 2))
    recommended_error = np.sqrt(np.mean((recommended_mean - exact_mean) ** 2))
    # Margin: at least a halving of the distance to the exact posterior mean.
    assert recommended_error < 0.5 * previous_error, (recommended_error, previous_error)
