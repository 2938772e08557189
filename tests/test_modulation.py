"""Tests for graph kernels as power series and their modulation functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gpytorch.priors import GammaPrior

from gp_couple.modulation import (
    Diffusion,
    InverseCosine,
    PowerSeries,
    PStepRandomWalk,
    RegularisedLaplacian,
    convolutional_sqrt,
    convolve_series,
    get_graph_kernel,
)


def families() -> dict[str, object]:
    return {
        "diffusion": Diffusion(1.7),
        "reg-laplacian-2": RegularisedLaplacian(1.0, 2),
        "reg-laplacian-3": RegularisedLaplacian(0.6, 3),
        "reg-laplacian-real": RegularisedLaplacian(2.0, 1.5),
        "p-step-even": PStepRandomWalk(2.5, 4),
        "p-step-odd": PStepRandomWalk(2.0, 3),
        "inverse-cosine": InverseCosine(),
        "power-series": PowerSeries([1.0, -0.3, 0.2, 0.05, 0.01]),
    }


@pytest.mark.parametrize("name", list(families()))
def test_modulation_is_a_convolutional_square_root(name: str) -> None:
    series = families()[name].double()
    with torch.no_grad():
        alpha = series.coefficients(80)
        f = series.modulation(80)
    scale = alpha.abs().max()
    torch.testing.assert_close(convolve_series(f), alpha, atol=1e-13 * scale, rtol=0)
    # The closed forms agree with the generic numerical square root.
    torch.testing.assert_close(convolutional_sqrt(alpha), f, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", list(families()))
def test_spectrum_is_the_series_on_eigenvalues(name: str) -> None:
    series = families()[name].double()
    eigenvalues = torch.linspace(-1, 1, 21, dtype=torch.float64)
    with torch.no_grad():
        alpha = series.coefficients(200).reshape(-1)
        spectrum = series.spectrum(eigenvalues).reshape(-1)
    powers = eigenvalues.unsqueeze(-1) ** torch.arange(200, dtype=torch.float64)
    torch.testing.assert_close(spectrum, powers @ alpha, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("series, parameter", [
    (Diffusion(1.3), "raw_gamma"), (RegularisedLaplacian(0.8, 2), "raw_sigma"),
    (PStepRandomWalk(2.7, 3), "raw_alpha")])
def test_modulation_gradients_match_finite_differences(series, parameter) -> None:
    series = series.double()
    raw = getattr(series, parameter)
    weights = torch.linspace(0.5, 2.0, 30, dtype=torch.float64)

    def objective() -> torch.Tensor:
        return (series.modulation(30) * weights).sum() + series.spectrum(weights - 1.5).sum()

    objective().backward()
    eps = 1e-6
    with torch.no_grad():
        raw += eps
        up = objective().item()
        raw -= 2 * eps
        down = objective().item()
    assert raw.grad.item() == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_known_coefficients() -> None:
    # Set hyperparameters after .double(): a float32 initial value is not exactly 1.2.
    gamma = 1.2
    diffusion = Diffusion().double()
    diffusion.gamma = gamma
    alpha = diffusion.coefficients(5).detach().reshape(-1)
    expected = [math.exp(-gamma**2) * gamma ** (2 * k) / math.factorial(k) for k in range(5)]
    np.testing.assert_allclose(alpha.numpy(), expected, rtol=1e-12)
    s2, d = 1.5, 2
    c = s2 / (1 + s2)
    laplacian = RegularisedLaplacian(degree=d).double()
    laplacian.sigma = math.sqrt(s2)
    alpha = laplacian.coefficients(5).detach().reshape(-1)
    expected = [(1 + s2) ** -d * math.comb(k + d - 1, k) * c**k for k in range(5)]
    np.testing.assert_allclose(alpha.numpy(), expected, rtol=1e-12)
    p_step = PStepRandomWalk(steps=2).double()
    p_step.alpha = 3.0
    alpha = p_step.coefficients(4).detach().reshape(-1)
    np.testing.assert_allclose(alpha.numpy(), [4.0, 4.0, 1.0, 0.0], atol=1e-12)


def test_batched_hyperparameters() -> None:
    series = Diffusion(batch_shape=torch.Size([2])).double()
    series.gamma = torch.tensor([[0.5], [1.0]], dtype=torch.float64)
    f = series.modulation(10)
    assert f.shape == (2, 10)
    torch.testing.assert_close(f[1], Diffusion(1.0).double().modulation(10).reshape(-1))


def test_priors_and_constraints() -> None:
    series = Diffusion(1.0, gamma_prior=GammaPrior(2.0, 2.0))
    assert [name for name, *_ in series.named_priors()] == ["gamma_prior"]
    series.gamma = 2.5
    assert series.gamma.item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="constraint"):
        series.gamma = -1.0
    with pytest.raises(TypeError, match="prior"):
        Diffusion(1.0, gamma_prior="gamma")
    alpha_series = PStepRandomWalk(2.0, 2)
    assert alpha_series.alpha.item() >= 2.0


def test_convolutional_sqrt_is_stable_for_fast_growing_series() -> None:
    # Geometric growth rate 3: coefficients span many orders of magnitude.
    f = torch.tensor([2.0 * 3.0**k / math.factorial(k) for k in range(60)], dtype=torch.float64)
    alpha = convolve_series(f)
    torch.testing.assert_close(convolutional_sqrt(alpha), f, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("build, error, message", [
    (lambda: RegularisedLaplacian(1.0, 0), ValueError, "degree"),
    (lambda: RegularisedLaplacian(1.0, "2"), TypeError, "degree"),
    (lambda: PStepRandomWalk(2.0, 0), ValueError, "steps"),
    (lambda: PStepRandomWalk(2.0, 1.5), TypeError, "steps"),
    (lambda: InverseCosine(1.0), ValueError, "beta"),
    (lambda: PowerSeries([0.0, 1.0]), ValueError, "zeroth"),
    (lambda: PowerSeries([[1.0]]), ValueError, "1-D"),
    (lambda: PowerSeries([1.0, float("nan")]), ValueError, "finite"),
    (lambda: Diffusion(float("nan")), ValueError, "finite"),
    (lambda: Diffusion(1.0).modulation(0), ValueError, "num_terms"),
    (lambda: Diffusion(1.0).modulation(2.0), TypeError, "num_terms"),
    (lambda: convolutional_sqrt(torch.tensor([-1.0, 1.0])), ValueError, "zeroth"),
    (lambda: get_graph_kernel("heat"), ValueError, "unknown"),
    (lambda: get_graph_kernel(3), TypeError, "kernel"),
])
def test_errors(build, error, message) -> None:
    with pytest.raises(error, match=message):
        build()


def test_registry_and_reprs() -> None:
    assert isinstance(get_graph_kernel("diffusion", gamma=2.0), Diffusion)
    assert isinstance(get_graph_kernel("regularised-laplacian"), RegularisedLaplacian)
    assert "gamma=" in repr(Diffusion(1.0))
    assert PowerSeries([1.0, 0.5], learnable=True).series_coefficients.requires_grad
