"""pyro.contrib.gp adapters: same matrices as the gpytorch kernels, and they train in Pyro's GP models."""

from __future__ import annotations

from collections.abc import Callable

import gpytorch
import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.nn.module import PyroSample

from gp_couple import CoupledRFFKernel, CoupledRLFKernel, GRFKernel
from gp_couple.bayes.contrib import GPyTorchKernel, PyroCoupledRFFKernel, PyroCoupledRLFKernel, PyroGRFKernel

from .conftest import GRID, graph_signal

STEPS = 15


@pytest.fixture(autouse=True)
def fresh_param_store() -> None:
    # Pyro keeps PyroParams in a global store keyed by name: start every test empty.
    pyro.clear_param_store()


def _graph_data(grid) -> tuple[torch.Tensor, torch.Tensor]:
    nodes = torch.arange(grid.num_nodes, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    targets = torch.as_tensor(graph_signal(grid.num_nodes, GRID)) + 0.1 * torch.randn(
        grid.num_nodes, generator=generator, dtype=torch.float64)
    return nodes, targets


def _euclidean_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(16, 2, generator=generator, dtype=torch.float64) * 0.6
    return x, torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(16, generator=generator, dtype=torch.float64)


def _adapters(grid) -> dict[str, tuple[Callable[[], GPyTorchKernel], Callable[[], gpytorch.kernels.Kernel], str]]:
    def grf_reference() -> gpytorch.kernels.Kernel:
        reference = gpytorch.kernels.ScaleKernel(GRFKernel(grid, num_walkers=16, p_halt=0.4, seed=3))
        reference.outputscale = 1.5
        return reference

    def random_feature_reference(kernel_class: type) -> Callable[[], gpytorch.kernels.Kernel]:
        def build() -> gpytorch.kernels.Kernel:
            reference = gpytorch.kernels.ScaleKernel(kernel_class(32, 2, seed=3))
            reference.outputscale, reference.base_kernel.lengthscale = 1.5, 0.8
            return reference
        return build

    return {
        "grf": (lambda: PyroGRFKernel(grid, num_walkers=16, p_halt=0.4, seed=3, variance=1.5), grf_reference,
                "graph"),
        "rff": (lambda: PyroCoupledRFFKernel(32, 2, seed=3, variance=1.5, lengthscale=0.8),
                random_feature_reference(CoupledRFFKernel), "euclidean"),
        "rlf": (lambda: PyroCoupledRLFKernel(32, 2, seed=3, variance=1.5, lengthscale=0.8),
                random_feature_reference(CoupledRLFKernel), "euclidean"),
    }


@pytest.mark.parametrize("name", ["grf", "rff", "rlf"])
def test_kernel_matrix_equals_the_gpytorch_kernel(grid, name: str) -> None:
    with torch.random.fork_rng():
        torch.set_default_dtype(torch.float64)
        try:
            build, reference_build, kind = _adapters(grid)[name]
            adapter, reference = build(), reference_build()
        finally:
            torch.set_default_dtype(torch.float32)
    x, _ = _graph_data(grid) if kind == "graph" else _euclidean_data()
    reference_input = x.unsqueeze(-1) if kind == "graph" else x
    expected = reference(reference_input).to_dense()
    torch.testing.assert_close(adapter(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adapter(x[:5], x[3:]), reference(reference_input[:5], reference_input[3:]).to_dense(),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adapter(x, diag=True), expected.diagonal(), rtol=1e-12, atol=1e-12)


def _fit(model: gp.parameterized.Parameterized) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    elbo = pyro.infer.TraceMeanField_ELBO()
    losses = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = elbo.differentiable_loss(model.model, model.guide)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("name", ["grf", "rff", "rlf"])
@pytest.mark.parametrize("model_name", ["GPRegression", "SparseGPRegression", "VariationalGP"])
def test_adapter_trains_in_pyro_gp_models(grid, name: str, model_name: str) -> None:
    build, _, kind = _adapters(grid)[name]
    with torch.random.fork_rng():
        torch.set_default_dtype(torch.float64)
        try:
            kernel = build()
        finally:
            torch.set_default_dtype(torch.float32)
    x, y = _graph_data(grid) if kind == "graph" else _euclidean_data()
    if model_name == "GPRegression":
        model = gp.models.GPRegression(x, y, kernel, noise=torch.tensor(0.2, dtype=torch.float64))
        before = -_marginal_log_likelihood(model)
    elif model_name == "SparseGPRegression":
        model = gp.models.SparseGPRegression(x, y, kernel, Xu=x[::3].clone(),
                                             noise=torch.tensor(0.2, dtype=torch.float64))
    else:
        model = gp.models.VariationalGP(x, y, kernel, likelihood=gp.likelihoods.Gaussian(), whiten=True)
    losses = _fit(model)
    assert all(torch.isfinite(torch.tensor(losses)))
    if model_name == "GPRegression":
        # Exact marginal likelihood: deterministic, so it must improve outright.
        assert -_marginal_log_likelihood(model) < before
    else:
        # Monte Carlo ELBOs: compare averages of the first and last few steps.
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4


def _marginal_log_likelihood(model: gp.models.GPRegression) -> float:
    with torch.no_grad():
        return -float(pyro.infer.Trace_ELBO().differentiable_loss(model.model, model.guide))


def test_hyperparameter_names_and_priors(grid) -> None:
    kernel = PyroGRFKernel(grid, num_walkers=4, seed=0)
    assert kernel.hyperparameter_names == ("variance", "gamma")
    kernel.gamma = PyroSample(dist.Gamma(3.0, 2.0))  # fits Positive()
    with pytest.raises(ValueError, match=r"PyroGRFKernel.variance \(Normal\).*Positive\(\)"):
        kernel.variance = PyroSample(dist.Normal(0.0, 1.0))
    # Raw gpytorch parameters are not Pyro parameters: only the adapter's attributes train.
    names = {name for name, _ in kernel.named_parameters()}
    assert "variance_unconstrained" in names and not any("raw_" in name for name in names)


def test_adapter_requires_a_gpytorch_kernel() -> None:
    with pytest.raises(TypeError, match="kernel must be a gpytorch Kernel"):
        GPyTorchKernel(gp.kernels.RBF(1), 1)


def test_sum_of_graph_kernels_gets_unambiguous_names_and_the_same_matrix(grid) -> None:
    from gp_couple import Diffusion, ExactGraphKernel

    with torch.random.fork_rng():
        torch.set_default_dtype(torch.float64)
        try:
            kernel = (gpytorch.kernels.ScaleKernel(GRFKernel(grid, num_walkers=8, seed=1))
                      + gpytorch.kernels.ScaleKernel(ExactGraphKernel(grid, kernel_family=Diffusion(0.5))))
        finally:
            torch.set_default_dtype(torch.float32)
    adapter = GPyTorchKernel(kernel, 1)
    assert adapter.hyperparameter_names == ("kernels_0_outputscale", "kernels_0_base_kernel_kernel_family_gamma",
                                            "kernels_1_outputscale", "kernels_1_base_kernel_kernel_family_gamma")
    nodes = torch.arange(grid.num_nodes, dtype=torch.float64)
    torch.testing.assert_close(adapter(nodes), kernel(nodes.unsqueeze(-1)).to_dense(), rtol=1e-12, atol=1e-12)
