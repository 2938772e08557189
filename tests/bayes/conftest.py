"""Small fully Bayesian GP models shared by the tests of gp_couple.bayes."""

from __future__ import annotations

from collections.abc import Callable

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.constraints import Positive
from gpytorch.priors import GammaPrior

from gp_couple import CoupledRFFKernel, Diffusion, ExactGraphKernel, GraphGP, GRFKernel, grid_graph
from gp_couple.graphs import Graph

GRID = 4


@pytest.fixture(scope="module")
def grid() -> Graph:
    return grid_graph(GRID, GRID)


def graph_signal(num_nodes: int, width: int) -> np.ndarray:
    rows, cols = np.divmod(np.arange(num_nodes), width)
    return np.sin(rows / 1.5) * np.cos(cols / 2.0)


def noise_likelihood() -> gpytorch.likelihoods.GaussianLikelihood:
    return gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(2.0, 20.0), noise_constraint=Positive())


@pytest.fixture
def graph_model(grid: Graph) -> Callable[[str], GraphGP]:
    """A GRF-GP (or exact graph GP) on 10 of the 16 grid nodes, float64, with priors on κ, γ, σ²."""
    def build(kind: str = "grf") -> GraphGP:
        kernel_family = Diffusion(1.0, gamma_prior=GammaPrior(3.0, 2.0))
        base = (GRFKernel(grid, num_walkers=16, p_halt=0.4, seed=0, kernel_family=kernel_family) if kind == "grf"
                else ExactGraphKernel(grid, kernel_family=kernel_family))
        kernel = gpytorch.kernels.ScaleKernel(base, outputscale_prior=GammaPrior(2.0, 2.0))
        rng = np.random.default_rng(0)
        train = np.sort(rng.choice(grid.num_nodes, 10, replace=False))
        targets = graph_signal(grid.num_nodes, GRID)[train] + 0.05 * rng.normal(size=train.size)
        return GraphGP(train, targets, noise_likelihood(), kernel).double()
    return build


class EuclideanGP(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, kernel: gpytorch.kernels.Kernel) -> None:
        super().__init__(x, y, noise_likelihood())
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.fixture
def rff_model() -> EuclideanGP:
    """A coupled-RFF GP on 12 points in 2-D, float64, with priors on the amplitude, lengthscale and noise."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, generator=generator, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + 0.05 * torch.randn(12, generator=generator, dtype=torch.float64)
    base = CoupledRFFKernel(8, 2, seed=0, lengthscale_prior=GammaPrior(3.0, 6.0))
    kernel = gpytorch.kernels.ScaleKernel(base, outputscale_prior=GammaPrior(2.0, 2.0))
    return EuclideanGP(x, y, kernel).double()
