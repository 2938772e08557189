"""MatrixFreeGraphKernel: agreement with the dense exact kernel, gpytorch's contract, GPs and state."""

from __future__ import annotations

import unittest

import gpytorch
import pytest
import torch

from gp_couple.exact import exact_kernel_matrix
from gp_couple.graphs import grid_graph
from gp_couple.kernel_families import (
    Diffusion,
    InverseCosine,
    PowerSeries,
    PStepRandomWalk,
    RegularisedLaplacian,
)
from gp_couple.kernels import ExactGraphKernel, GRFKernel, MatrixFreeGraphKernel
from gp_couple.models import GraphGP, fit_gp, predict
from gp_couple.operators import ChebyshevKernelLinearOperator
from gp_couple.settings import grf_gp_settings

from .test_graph_kernel_contract import GRAPH, _GraphKernelContract

TOLERANCE = 1e-9
FAMILIES = [
    pytest.param(lambda: Diffusion(2.2), id="diffusion"),
    pytest.param(lambda: RegularisedLaplacian(1.7, 2), id="regularised-laplacian"),
    pytest.param(lambda: PStepRandomWalk(2.4, 3), id="p-step"),
    pytest.param(lambda: InverseCosine(0.6), id="inverse-cosine"),
    pytest.param(lambda: PowerSeries([1.0, 0.3, 0.2, -0.05], learnable=True), id="power-series"),
]


class TestMatrixFreeGraphKernelContract(_GraphKernelContract, unittest.TestCase):
    def create_kernel_no_ard(self, **kwargs):  # type: ignore[no-untyped-def]
        return MatrixFreeGraphKernel(GRAPH, **kwargs)


def _pair(make, graph=GRAPH):
    """The matrix-free and the dense kernel, in float64, with shared hyperparameters."""
    family = make().double()
    matrix_free = MatrixFreeGraphKernel(graph, family, tolerance=TOLERANCE)
    return matrix_free, ExactGraphKernel(graph, family)


def _nodes(*indices: int) -> torch.Tensor:
    return torch.tensor(indices, dtype=torch.float64).unsqueeze(-1)


@pytest.mark.parametrize("make", FAMILIES)
def test_products_diagonal_and_gradients_match_the_dense_kernel(make):
    matrix_free, exact = _pair(make)
    bound = matrix_free.truncation()["tail_bound"]
    assert bound <= TOLERANCE * 10  # sum |c_j| is of order one for these kernels
    x1, x2 = _nodes(0, 5, 17, 33, 63, 5), _nodes(2, 9, 40, 41)
    covar = matrix_free(x1, x2).evaluate_kernel()
    assert isinstance(covar, ChebyshevKernelLinearOperator)
    # ExactGraphKernel computes in its parameters' dtype (float32 for parameter-free families).
    dense = exact_kernel_matrix(matrix_free.kernel_family, GRAPH).detach()
    rows, columns = x1.squeeze(-1).long(), x2.squeeze(-1).long()
    reference = dense[rows][:, columns]
    rhs = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # |K_J - K| <= tail_bound entrywise and in operator norm; products scale with |rhs|.
    torch.testing.assert_close(covar.to_dense(), reference, rtol=0, atol=bound + 1e-13)
    torch.testing.assert_close(covar @ rhs, reference @ rhs, rtol=0,
                               atol=(bound + 1e-13) * float(rhs.norm(dim=0).max()))
    torch.testing.assert_close(matrix_free(x1, diag=True), dense[rows, rows], rtol=0, atol=bound + 1e-13)
    torch.testing.assert_close(matrix_free(x1[:4], x2, diag=True), dense[rows[:4], columns], rtol=0,
                               atol=bound + 1e-13)
    # Gradients with respect to every hyperparameter, through products and the diagonal.
    parameters = list(matrix_free.kernel_family.parameters())
    if not parameters:
        return
    weights = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(kernel):
        square = kernel(x1).evaluate_kernel()
        return (weights * (kernel(x1, x2).evaluate_kernel() @ torch.eye(4, dtype=torch.float64))).sum() \
            + (square @ weights[:, :1]).square().sum() + kernel(x1, diag=True).sum()

    actual = torch.autograd.grad(loss(matrix_free), parameters)
    expected = torch.autograd.grad(loss(exact), parameters)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_gradient_through_the_marginal_likelihood_with_cg_matches_cholesky():
    family = Diffusion(1.5).double()
    train = torch.arange(0, 64, 3, dtype=torch.float64).unsqueeze(-1)
    targets = torch.sin(train.squeeze(-1) / 5)
    grads = []
    for kernel, size in ((ExactGraphKernel(GRAPH, family), 10_000), (MatrixFreeGraphKernel(GRAPH, family), 0)):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        model = GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        with gpytorch.settings.max_cholesky_size(size), gpytorch.settings.cg_tolerance(1e-8), \
                gpytorch.settings.skip_logdet_forward(False), gpytorch.settings.fast_computations(
                    log_prob=False):
            # log_prob=False keeps the exact log-determinant; inv-quad gradients come from CG solves.
            loss = -mll(model(train), targets)
        grads.append(torch.autograd.grad(loss, [family.raw_gamma, model.covar_module.raw_outputscale]))
        family.raw_gamma.grad = None
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_hyperparameter_batches_and_batched_nodes():
    family = Diffusion(batch_shape=torch.Size([2])).double()
    family.gamma = torch.tensor([[0.8], [2.0]], dtype=torch.float64)
    matrix_free = MatrixFreeGraphKernel(GRAPH, family, batch_shape=torch.Size([2]))
    exact = ExactGraphKernel(GRAPH, family, batch_shape=torch.Size([2]))
    shared = _nodes(1, 2, 30)
    torch.testing.assert_close(matrix_free(shared).to_dense(), exact(shared).to_dense(), rtol=0, atol=1e-7)
    different = torch.stack([_nodes(1, 2, 30), _nodes(4, 50, 60)])
    torch.testing.assert_close(matrix_free(different).to_dense(), exact(different).to_dense(), rtol=0, atol=1e-7)
    torch.testing.assert_close(matrix_free(different, diag=True), exact(different, diag=True), rtol=0, atol=1e-7)
    assert matrix_free.truncation()["degree"] == chebyshev_degree(2.0)


def chebyshev_degree(gamma: float) -> int:
    return MatrixFreeGraphKernel(GRAPH, Diffusion(gamma).double()).truncation()["degree"]


def test_gp_trained_on_cg_predicts_like_the_dense_exact_gp():
    train = torch.arange(0, 64, 2)
    targets = torch.cos(train.double() / 7)
    test = torch.arange(1, 64, 4)

    def gp(kernel):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        return GraphGP(train, targets, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double(), likelihood

    model, likelihood = gp(MatrixFreeGraphKernel(GRAPH, Diffusion(1.0)))
    # (gpytorch's CG stalls near a relative residual of 1e-6 here: a tighter tolerance only
    # runs it to max_cg_iterations.)
    with grf_gp_settings(max_cholesky_size=0, eval_cg_tolerance=1e-4):
        fit_gp(model, likelihood, iterations=3, lr=0.05, seed=0)
        mean, variance = predict(model, likelihood, test, seed=0)
    assert float(model.covar_module.base_kernel.kernel_family.gamma.detach()) != 1.0
    # The same hyperparameters in the dense exact GP, solved by Cholesky.
    reference, reference_likelihood = gp(ExactGraphKernel(GRAPH, Diffusion(1.0)))
    reference.load_state_dict(model.state_dict())
    with grf_gp_settings(max_cholesky_size=10_000):
        expected_mean, expected_variance = predict(reference, reference_likelihood, test)
    # CG stops at a relative residual of 1e-4; the system's condition number is below 10.
    torch.testing.assert_close(mean, expected_mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(variance, expected_variance, rtol=1e-3, atol=1e-3)


def test_state_dicts_transfer_between_graph_kernels():
    grf = GRFKernel(GRAPH, num_walkers=2, kernel_family=Diffusion(1.9), seed=0)
    matrix_free = MatrixFreeGraphKernel(GRAPH, Diffusion(1.0))
    result = matrix_free.load_state_dict(grf.state_dict(), strict=False)
    assert not result.missing_keys
    assert float(matrix_free.kernel_family.gamma.detach()) == pytest.approx(1.9)
    exact = ExactGraphKernel(GRAPH, Diffusion(0.5))
    exact.load_state_dict(matrix_free.state_dict())
    fresh = MatrixFreeGraphKernel(GRAPH, Diffusion(0.3))
    fresh.load_state_dict(matrix_free.state_dict())
    x = _nodes(3, 4, 9)
    torch.testing.assert_close(fresh(x).to_dense(), matrix_free(x).to_dense())
    with pytest.raises(ValueError, match="different graph"):
        MatrixFreeGraphKernel(grid_graph(3, 3)).load_state_dict(matrix_free.state_dict())


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="tolerance"):
        MatrixFreeGraphKernel(GRAPH, tolerance=-1e-3)
    with pytest.raises(TypeError, match="tolerance"):
        MatrixFreeGraphKernel(GRAPH, tolerance=None)
    with pytest.raises(ValueError, match="max_degree"):
        MatrixFreeGraphKernel(GRAPH, max_degree=0)
    kernel = MatrixFreeGraphKernel(GRAPH, RegularisedLaplacian(300.0, 2), max_degree=50)
    with pytest.raises(ValueError, match=r"RegularisedLaplacian\(sigma=300.0.*max_degree=50"):
        kernel(_nodes(1, 2)).to_dense()
    with pytest.raises(ValueError, match="equal length"):
        MatrixFreeGraphKernel(GRAPH)(_nodes(1, 2), _nodes(3), diag=True).to_dense()
