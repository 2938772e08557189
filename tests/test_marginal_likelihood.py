"""DenseMarginalLogLikelihood: gpytorch's exact marginal likelihood, value and gradient, with a cheaper backward."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from linear_operator.operators import LowRankRootAddedDiagLinearOperator

from gp_couple._random import seeded_torch_rng
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import Diffusion
from gp_couple.kernels import CoupledRFFKernel, ExactGraphKernel, GRFKernel
from gp_couple.marginal_likelihood import DenseMarginalLogLikelihood
from gp_couple.models import GraphGP

GRAPH = grid_graph(7, 7)
TRAIN = np.arange(0, 49, 2)


def _model(kernel: gpytorch.kernels.Kernel, dtype: torch.dtype, batch_shape: torch.Size = torch.Size()) -> GraphGP:
    generator = torch.Generator().manual_seed(0)
    targets = torch.sin(torch.as_tensor(TRAIN, dtype=dtype) / 3) + 0.1 * torch.randn(TRAIN.size, generator=generator,
                                                                                       dtype=dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch_shape)
    model = GraphGP(TRAIN, targets, likelihood,
                    gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch_shape)).to(dtype)
    model.covar_module.outputscale = torch.full(batch_shape, 1.7)
    likelihood.noise = torch.full((*batch_shape, 1), 0.05)
    model.train()
    return model


def _loss_and_gradients(model: GraphGP, mll_class: type, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    mll = mll_class(model.likelihood, model)
    with seeded_torch_rng(seed):
        loss = -mll(model(*model.train_inputs), model.train_targets).sum()
    loss.backward()
    return loss.detach(), [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]


def _assert_same(model: GraphGP, rtol: float, atol: float) -> None:
    expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)
    loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
    assert len(gradients) == len(expected_gradients) == 3
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=rtol, atol=atol)


@pytest.mark.parametrize("batch_shape", [torch.Size(), torch.Size([2])])
def test_the_exact_kernel_gets_gpytorchs_value_and_gradient(batch_shape):
    kernel = ExactGraphKernel(GRAPH, Diffusion(1.5, batch_shape=batch_shape), batch_shape=batch_shape)
    model = _model(kernel, torch.float64, batch_shape)
    with gpytorch.settings.max_cholesky_size(10_000):
        _assert_same(model, rtol=1e-10, atol=1e-12)


def test_a_grf_kernel_gets_gpytorchs_value_and_gradient():
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), num_walkers=64, seed=0, schedule=None)
    model = _model(kernel, torch.float32)
    with gpytorch.settings.max_cholesky_size(10_000):
        _assert_same(model, rtol=1e-5, atol=1e-6)


def test_the_value_is_the_gaussian_log_density_per_point_plus_the_priors():
    model = _model(ExactGraphKernel(GRAPH, Diffusion(1.5)), torch.float64)
    model.covar_module.register_prior("outputscale_prior", gpytorch.priors.GammaPrior(2.0, 1.0), "outputscale")
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10_000):
        value = DenseMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
        covariance = model.likelihood(model(*model.train_inputs)).covariance_matrix
    density = torch.distributions.MultivariateNormal(torch.zeros(TRAIN.size, dtype=torch.float64), covariance)
    prior = gpytorch.priors.GammaPrior(2.0, 1.0).log_prob(torch.tensor(1.7, dtype=torch.float64))
    expected = (density.log_prob(model.train_targets) + prior) / TRAIN.size
    torch.testing.assert_close(value, expected)


def test_larger_training_sets_and_masked_targets_take_gpytorchs_path():
    model = _model(ExactGraphKernel(GRAPH, Diffusion(1.5)), torch.float64)
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
        _assert_same(model, rtol=0, atol=0)   # the same CG probes, the same arithmetic
    targets = model.train_targets.clone()
    targets[3] = math.nan
    model.set_train_data(targets=targets, strict=False)
    with gpytorch.settings.max_cholesky_size(10_000), gpytorch.settings.observation_nan_policy("mask"):
        _assert_same(model, rtol=0, atol=0)


def test_a_kernel_that_finds_cg_cheaper_gets_gpytorchs_cg_path(monkeypatch):
    kernel = GRFKernel(GRAPH, kernel_family=Diffusion(1.5), num_walkers=16, seed=0, schedule=None)
    model = _model(kernel, torch.float64)
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.cg_tolerance(1e-3):
        expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)
    monkeypatch.setattr(GRFKernel, "dense_solves_pay", lambda self, nodes: False)
    with gpytorch.settings.max_cholesky_size(10_000), gpytorch.settings.cg_tolerance(1e-3):
        loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=0)


def test_grf_kernels_factorise_dense_features_and_leave_sparse_ones_on_many_points_to_cg():
    graph = grid_graph(60, 60)
    train = torch.arange(0, 3600, 2, dtype=torch.float64).unsqueeze(-1)
    sparse = GRFKernel(graph, kernel_family=Diffusion(1.0), num_walkers=2, seed=0, schedule=None)
    dense = GRFKernel(graph, kernel_family=Diffusion(1.0), num_walkers=512, p_halt=0.05, seed=0, schedule=None)
    # 1,800 points: 5.8e9 operations for the factor, against 1.5e5 x nnz(Phi).
    assert not sparse.dense_solves_pay(train)
    assert dense.dense_solves_pay(train)
    assert sparse.dense_solves_pay(train[:200])
    assert ExactGraphKernel(GRAPH).dense_solves_pay(torch.as_tensor(TRAIN, dtype=torch.float64).unsqueeze(-1))


class _EuclideanGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood) -> None:
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(CoupledRFFKernel(num_features=8, num_dims=2, seed=0))

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_a_low_rank_covariance_keeps_its_woodbury_solver(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(300, 2, generator=generator, dtype=torch.float64)
    model = _EuclideanGP(x, torch.sin(x.sum(-1)), gpytorch.likelihoods.GaussianLikelihood()).double()
    model.train()
    expected, expected_gradients = _loss_and_gradients(model, gpytorch.mlls.ExactMarginalLogLikelihood)

    def forbidden(self):
        raise AssertionError("a low-rank covariance was made dense")

    monkeypatch.setattr(LowRankRootAddedDiagLinearOperator, "to_dense", forbidden)
    with gpytorch.settings.max_cholesky_size(10_000):
        loss, gradients = _loss_and_gradients(model, DenseMarginalLogLikelihood)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert len(gradients) == len(expected_gradients) > 0
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=0)
