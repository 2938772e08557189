"""The evaluators on linear operators, kernels and trained models give the numbers of the dense arrays."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gp_couple.evaluation import (
    gp_posterior,
    gram_source,
    model_marginals,
    model_posterior,
    relative_frobenius_error,
    sources,
)
from gp_couple.graphs import grid_graph
from gp_couple.kernels import ExactGraphKernel, GRFKernel
from gp_couple.models import GraphGP, predict

GRAPH = grid_graph(5, 6)
NODES = GRAPH.num_nodes
TRAIN = np.arange(0, NODES, 2)
TEST = np.array([1, 5, 11, 17, 29])
NOISE = 0.15


def build_model(mean_module: gpytorch.means.Mean | None = None, *, nodes: np.ndarray | None = None) -> GraphGP:
    kernel = gpytorch.kernels.ScaleKernel(GRFKernel(GRAPH, num_walkers=8, p_halt=0.4, seed=3, nodes=nodes))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    targets = np.sin(TRAIN / 4.0) + 0.3 * np.cos(TRAIN)
    model = GraphGP(TRAIN, targets, likelihood, kernel, mean_module).double()
    kernel.outputscale = 1.3
    likelihood.noise = NOISE
    return model


def dense_gram(kernel: gpytorch.kernels.Kernel) -> np.ndarray:
    every = torch.arange(NODES, dtype=torch.float64).unsqueeze(-1)
    with torch.no_grad():
        return kernel(every, every).to_dense().numpy()


def lazy_gram(kernel: gpytorch.kernels.Kernel):
    every = torch.arange(NODES, dtype=torch.float64).unsqueeze(-1)
    with torch.no_grad():
        return kernel(every, every).evaluate_kernel()


def model_targets(model: GraphGP) -> np.ndarray:
    return model.train_targets.detach().numpy()


def model_noise(model: GraphGP) -> float:
    # gpytorch rounds the assigned noise through the default dtype (float32).
    return float(model.likelihood.noise.detach())


@pytest.fixture
def model() -> GraphGP:
    return build_model()


@pytest.mark.parametrize("kind", ["operator", "kernel", "model", "sparse"])
def test_gp_posterior_on_every_source_equals_the_dense_one(model: GraphGP, kind: str) -> None:
    dense = dense_gram(model.covar_module)
    source = {"operator": lambda: lazy_gram(model.covar_module), "kernel": lambda: model.covar_module,
              "model": lambda: model, "sparse": lambda: sp.csr_matrix(dense)}[kind]()
    for include_noise in (True, False):
        expected = gp_posterior(dense, TRAIN, TEST, model_targets(model), NOISE, include_noise=include_noise)
        actual = gp_posterior(source, TRAIN, TEST, model_targets(model), NOISE, include_noise=include_noise)
        np.testing.assert_allclose(actual.mean, expected.mean, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(actual.covariance, expected.covariance, rtol=1e-12, atol=1e-13)


def test_the_lazy_operator_is_a_grf_gram_operator(model: GraphGP) -> None:
    # The evaluators read the kernel's own estimate, never a rebuilt one.
    assert type(lazy_gram(model.covar_module)).__name__ == "GRFGramLinearOperator"


def test_model_posterior_uses_the_models_data_noise_and_mean() -> None:
    mean = gpytorch.means.ConstantMean()
    model = build_model(mean)
    mean.constant = 0.7
    constant = float(mean.constant.detach())  # 0.7 rounded like the noise
    dense = dense_gram(model.covar_module)
    shifted = gp_posterior(dense, TRAIN, TEST, model_targets(model) - constant, model_noise(model),
                           include_noise=False)
    posterior = model_posterior(model, TEST, include_noise=False)
    np.testing.assert_allclose(posterior.mean, shifted.mean + constant, rtol=1e-12)
    np.testing.assert_allclose(posterior.covariance, shifted.covariance, rtol=1e-12, atol=1e-14)


def test_model_posterior_equals_gpytorchs_predictions(model: GraphGP) -> None:
    posterior = model_posterior(model, TEST)
    with gpytorch.settings.max_cholesky_size(10_000):
        mean, variance = predict(model, model.likelihood, TEST)
    np.testing.assert_allclose(posterior.mean, mean.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(posterior.variance, variance.numpy(), rtol=1e-8, atol=1e-10)


def test_the_evaluators_follow_resample(model: GraphGP) -> None:
    before = model_posterior(model, TEST)
    model.covar_module.base_kernel.resample(11, num_walkers=4, coupling="antithetic")
    after = model_posterior(model, TEST)
    assert not np.allclose(before.mean, after.mean)
    expected = gp_posterior(dense_gram(model.covar_module), TRAIN, TEST, model_targets(model), model_noise(model))
    np.testing.assert_allclose(after.mean, expected.mean, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("block_entries", [sources.BLOCK_ENTRIES, 75])
def test_model_marginals_are_the_posterior_diagonal(model: GraphGP, monkeypatch, block_entries: int) -> None:
    monkeypatch.setattr(sources, "BLOCK_ENTRIES", block_entries)  # 75: 5 nodes x 15 training nodes
    nodes = np.arange(NODES)
    for include_noise in (True, False):
        full = model_posterior(model, nodes, include_noise=include_noise)
        mean, variance = model_marginals(model, nodes, include_noise=include_noise)
        np.testing.assert_allclose(mean, full.mean, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(variance, full.variance, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block_entries", [sources.BLOCK_ENTRIES, 300])
def test_relative_frobenius_error_of_lazy_sources(model: GraphGP, monkeypatch, block_entries: int) -> None:
    monkeypatch.setattr(sources, "BLOCK_ENTRIES", block_entries)  # 300: 10 of the 30 rows per block
    exact_kernel = gpytorch.kernels.ScaleKernel(ExactGraphKernel(GRAPH)).double()
    exact = dense_gram(exact_kernel)
    estimate = dense_gram(model.covar_module)
    expected = relative_frobenius_error(exact, estimate)
    for exact_source in (exact, exact_kernel):
        for estimate_source in (lazy_gram(model.covar_module), model.covar_module, model):
            assert relative_frobenius_error(exact_source, estimate_source) == pytest.approx(expected, rel=1e-12)
    block = np.ix_(TEST, TEST)
    assert relative_frobenius_error(exact, model, nodes=TEST) == pytest.approx(
        relative_frobenius_error(exact[block], estimate[block]), rel=1e-12)


def test_gram_source_blocks_and_diagonal(model: GraphGP) -> None:
    dense = dense_gram(model.covar_module)
    for value in (dense, torch.from_numpy(dense), sp.csr_matrix(dense), lazy_gram(model.covar_module),
                  model.covar_module, model):
        source = gram_source(value)
        assert source.size == NODES
        np.testing.assert_allclose(source.block(TEST, TRAIN), dense[np.ix_(TEST, TRAIN)], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(source.diagonal(TEST), np.diag(dense)[TEST], rtol=1e-12, atol=1e-14)


def test_errors_name_the_problem(model: GraphGP) -> None:
    with pytest.raises(ValueError, match="gram must be square"):
        gp_posterior(np.ones((3, 4)), [0], [1], [1.0], 0.1)
    with pytest.raises(ValueError, match=rf"test_nodes contains node index {NODES} outside \[0, {NODES}\)"):
        gp_posterior(model, TRAIN, [NODES], model_targets(model), NOISE)
    with pytest.raises(ValueError, match="test_nodes contains node index 30 outside"):
        model_posterior(model, [NODES])
    with pytest.raises(TypeError, match="model must be a gpytorch ExactGP"):
        model_posterior(model.covar_module, TEST)
    with pytest.raises(ValueError, match="pass nodes"):
        relative_frobenius_error(gpytorch.kernels.RBFKernel(), gpytorch.kernels.RBFKernel())
    with pytest.raises(ValueError, match="shapes differ"):
        relative_frobenius_error(np.eye(3), model)
    partial = build_model(nodes=TRAIN)
    with pytest.raises(ValueError, match="without GRF features"):
        model_posterior(partial, TEST)
    partial.likelihood = gpytorch.likelihoods.BernoulliLikelihood()
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        model_posterior(partial, TRAIN)
