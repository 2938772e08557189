"""The graph-GP protocol evaluates the trained model itself: one path from the graph to every number."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gp_couple.evaluation import gp_posterior, model_posterior, relative_frobenius_error
from gp_couple.exact import exact_kernel_matrix
from gp_couple.experiments.graph_gp import GraphGPProtocol, exact_counterpart, run_protocol, train_model
from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.models import predict

GRAPH = grid_graph(6, 6)
NODES = np.random.default_rng(0).permutation(GRAPH.num_nodes)
TRAIN, TEST = np.sort(NODES[:28]), np.sort(NODES[28:])


@pytest.fixture(scope="module")
def trained():
    rows, cols = np.divmod(np.arange(GRAPH.num_nodes), 6)
    targets = np.sin(rows / 2.0) + np.cos(cols / 3.0)
    protocol = GraphGPProtocol(train_iterations=3, walkers=(4,), repeats=1, sigma_order=4, sigma_fit_samples=3)
    model, hyperparameters = train_model(GRAPH, TRAIN, targets[TRAIN], protocol)
    model.double()  # what run_protocol does before comparing
    return model, hyperparameters


def test_the_model_keeps_the_trained_hyperparameters(trained) -> None:
    model, hyperparameters = trained
    assert isinstance(model.covar_module.base_kernel, GRFKernel)
    assert float(model.covar_module.outputscale.detach()) == pytest.approx(hyperparameters.outputscale, rel=1e-6)
    assert float(model.likelihood.noise.detach()) == pytest.approx(hyperparameters.noise, rel=1e-6)


def test_exact_counterpart_is_the_exact_kernel_at_the_trained_hyperparameters(trained) -> None:
    model, _ = trained
    exact_model = exact_counterpart(model)
    assert isinstance(exact_model.covar_module.base_kernel, ExactGraphKernel)
    assert isinstance(model.covar_module.base_kernel, GRFKernel)  # the model itself is unchanged
    # The previous implementation's reference: outputscale * the dense exact kernel.
    with torch.no_grad():
        gram = float(model.covar_module.outputscale) * exact_kernel_matrix(
            model.covar_module.base_kernel.kernel_family, GRAPH).numpy()
    noise = float(model.likelihood.noise.detach())
    expected = gp_posterior(gram, TRAIN, TEST, model.train_targets.numpy(), noise)
    actual = model_posterior(exact_model, TEST)
    np.testing.assert_allclose(actual.mean, expected.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(actual.covariance, expected.covariance, rtol=1e-10, atol=1e-12)
    assert relative_frobenius_error(gram, exact_model) == pytest.approx(0.0, abs=1e-12)


def test_the_protocols_evaluation_equals_the_models_predictions(trained) -> None:
    model, _ = trained
    # run_protocol's step 3: fresh walks from every node, evaluated through the model.
    model.covar_module.base_kernel.resample(np.random.default_rng(1), nodes=None, num_walkers=4,
                                            coupling="antithetic", directions="repelling")
    posterior = model_posterior(model, TEST)
    with gpytorch.settings.max_cholesky_size(10_000):
        mean, variance = predict(model, model.likelihood, TEST)
    np.testing.assert_allclose(posterior.mean, mean.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(posterior.variance, variance.numpy(), rtol=1e-8, atol=1e-10)


def test_node_posterior_covers_every_node_with_the_noise_floor() -> None:
    rows, cols = np.divmod(np.arange(GRAPH.num_nodes), 6)
    targets = 3.0 + 2.0 * np.sin(rows / 2.0)
    protocol = GraphGPProtocol(train_iterations=1, walkers=(2,), repeats=1, couplings=("iid",),
                               directions=("independent",))
    report = run_protocol(GRAPH, targets, TRAIN, TEST, protocol, node_posterior=True)
    posterior = report["node_posterior"]
    assert posterior["mean"].shape == posterior["std"].shape == (GRAPH.num_nodes,)
    assert np.all(np.isfinite(posterior["mean"]))
    # Predictive standard deviations of noisy observations, in the targets' units.
    floor = np.sqrt(report["trained"]["noise"]) * targets[TRAIN].std()
    assert np.all(posterior["std"] >= floor * (1 - 1e-6))
