"""Tests for the kernel families: graph kernels as power series and their modulation functions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gpytorch.priors import GammaPrior

from gp_couple.kernel_families import (
    KERNEL_FAMILIES,
    Diffusion,
    InverseCosine,
    PowerSeries,
    PStepRandomWalk,
    RegularisedLaplacian,
    convolutional_sqrt,
    convolve_series,
    get_kernel_family,
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
    family = families()[name].double()
    with torch.no_grad():
        alpha = family.coefficients(80)
        f = family.modulation(80)
    scale = alpha.abs().max()
    torch.testing.assert_close(convolve_series(f), alpha, atol=1e-13 * scale, rtol=0)
    # The closed forms agree with the generic numerical square root.
    torch.testing.assert_close(convolutional_sqrt(alpha), f, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", list(families()))
def test_spectrum_is_the_series_on_eigenvalues(name: str) -> None:
    family = families()[name].double()
    eigenvalues = torch.linspace(-1, 1, 21, dtype=torch.float64)
    with torch.no_grad():
        alpha = family.coefficients(200).reshape(-1)
        spectrum = family.spectrum(eigenvalues).reshape(-1)
    powers = eigenvalues.unsqueeze(-1) ** torch.arange(200, dtype=torch.float64)
    torch.testing.assert_close(spectrum, powers @ alpha, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("family, parameter", [
    (Diffusion(1.3), "raw_gamma"), (RegularisedLaplacian(0.8, 2), "raw_sigma"),
    (PStepRandomWalk(2.7, 3), "raw_alpha")])
def test_modulation_gradients_match_finite_differences(family, parameter) -> None:
    family = family.double()
    raw = getattr(family, parameter)
    weights = torch.linspace(0.5, 2.0, 30, dtype=torch.float64)

    def objective() -> torch.Tensor:
        return (family.modulation(30) * weights).sum() + family.spectrum(weights - 1.5).sum()

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
    family = Diffusion(batch_shape=torch.Size([2])).double()
    family.gamma = torch.tensor([[0.5], [1.0]], dtype=torch.float64)
    f = family.modulation(10)
    assert f.shape == (2, 10)
    torch.testing.assert_close(f[1], Diffusion(1.0).double().modulation(10).reshape(-1))


def test_priors_and_constraints() -> None:
    family = Diffusion(1.0, gamma_prior=GammaPrior(2.0, 2.0))
    assert [name for name, *_ in family.named_priors()] == ["gamma_prior"]
    family.gamma = 2.5
    assert family.gamma.item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="constraint"):
        family.gamma = -1.0
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
    (lambda: get_kernel_family("heat"), ValueError, "unknown"),
    (lambda: get_kernel_family(3), TypeError, "family must be a str or KernelFamily"),
])
def test_errors(build, error, message) -> None:
    with pytest.raises(error, match=message):
        build()


def test_families_register_by_name_and_describe_themselves() -> None:
    assert set(KERNEL_FAMILIES.names()) >= {"diffusion", "regularised-laplacian", "p-step", "inverse-cosine",
                                            "power-series"}
    family = RegularisedLaplacian(1.5, 3)
    assert family.to_dict() == {"type": "regularised-laplacian", "sigma": pytest.approx(1.5), "degree": 3}
    rebuilt = KERNEL_FAMILIES.from_dict(family.to_dict())
    assert isinstance(rebuilt, RegularisedLaplacian) and rebuilt.hyperparameters() == family.hyperparameters()

    class Doubled(Diffusion):  # a user's family: naming it registers it
        name = "test-doubled-diffusion"

    try:
        assert isinstance(get_kernel_family("test-doubled-diffusion", gamma=0.5), Doubled)
    finally:
        KERNEL_FAMILIES.unregister("test-doubled-diffusion")
    with pytest.raises(ValueError, match="cannot be built"):
        get_kernel_family("diffusion", gama=2.0)
    with pytest.raises(ValueError, match="only be given with a kernel family name"):
        get_kernel_family(Diffusion(), gamma=2.0)


def test_registry_and_reprs() -> None:
    assert isinstance(get_kernel_family("diffusion", gamma=2.0), Diffusion)
    assert isinstance(get_kernel_family("regularised-laplacian"), RegularisedLaplacian)
    assert "gamma=" in repr(Diffusion(1.0))
    assert PowerSeries([1.0, 0.5], learnable=True).series_coefficients.requires_grad


# ------------------------------------------------ hyperparameters at the edges of float range
EXTREMES = {
    "diffusion-tiny": lambda: Diffusion(1e-30),
    "diffusion-huge": lambda: Diffusion(1e20),
    "reg-laplacian-tiny": lambda: RegularisedLaplacian(1e-30, 2),
    "reg-laplacian-huge": lambda: RegularisedLaplacian(1e20, 3),
    "p-step-large": lambda: PStepRandomWalk(1e5, 3),
    "inverse-cosine-tiny": lambda: InverseCosine(1e-30),
    "power-series-tiny": lambda: PowerSeries([1.0, 1e-30, 0.0, 1e-30], learnable=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(EXTREMES))
def test_extreme_hyperparameters_give_finite_series_and_gradients(name: str, dtype: torch.dtype) -> None:
    family = EXTREMES[name]().to(dtype)
    coefficients, modulation = family.coefficients(40), family.modulation(40)
    spectrum = family.spectrum(torch.linspace(-1, 1, 9, dtype=dtype))
    for values in (coefficients, modulation, spectrum):
        assert values.dtype == dtype and bool(torch.isfinite(values).all())
    # f * f = alpha still holds, up to the dtype's resolution relative to the largest term.
    # Term k of the Cauchy product sums k + 1 rounded products: allow a few eps each,
    # relative to the largest term (terms below the dtype's smallest normal may flush to 0).
    scale = max(float(coefficients.detach().abs().max()), torch.finfo(dtype).tiny)
    tolerance = 4 * coefficients.shape[-1] * torch.finfo(dtype).eps * scale
    torch.testing.assert_close(convolve_series(modulation.detach().double()), coefficients.detach().double(),
                               atol=tolerance, rtol=0)
    parameters = [p for p in family.parameters() if p.requires_grad]
    if parameters:
        gradients = torch.autograd.grad((modulation.sum() + coefficients.sum() + spectrum.sum()),
                                        parameters, allow_unused=True)
        assert all(g is None or bool(torch.isfinite(g).all()) for g in gradients)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tiny_regulariser_gives_the_identity_kernel(dtype: torch.dtype) -> None:
    # (I + sigma^2 L)^-2 = I + O(sigma^2): with sigma = 1e-30 every term beyond the first
    # is below either dtype's smallest normal number relative to alpha_0 = 1.
    family = RegularisedLaplacian(sigma=1e-30).to(dtype)
    expected = torch.zeros(6, dtype=dtype)
    expected[0] = 1.0
    tiny = torch.finfo(torch.float64).tiny if dtype == torch.float64 else 0.0
    torch.testing.assert_close(family.coefficients(6).detach().reshape(-1)[:1], expected[:1])
    assert float(family.coefficients(6).detach()[..., 1:].abs().max()) <= max(tiny, 3e-60)
    torch.testing.assert_close(family.modulation(6).detach().reshape(-1)[:1], expected[:1])


def test_inverse_cosine_coefficients_take_the_phase_exactly() -> None:
    beta = 1e-8
    alpha = InverseCosine(beta).double().coefficients(4).reshape(-1)
    expected = [math.cos(beta), beta * math.sin(beta), -beta**2 / 2 * math.cos(beta), -beta**3 / 6 * math.sin(beta)]
    np.testing.assert_allclose(alpha.numpy(), expected, rtol=1e-14)


@pytest.mark.parametrize("build, assign, name", [
    (lambda: Diffusion(1.0), 0.0, "gamma"),
    (lambda: RegularisedLaplacian(1.0), 0.0, "sigma"),
    (lambda: PStepRandomWalk(3.0), 1.5, "alpha"),
    (lambda: Diffusion(1.0), -2.0, "gamma"),
])
def test_hyperparameters_on_or_beyond_their_bound_are_rejected(build, assign, name: str) -> None:
    family = build()
    raw_before = getattr(family, f"raw_{name}").detach().clone()
    with pytest.raises(ValueError, match=name):
        setattr(family, name, assign)
    assert torch.equal(getattr(family, f"raw_{name}").detach(), raw_before)  # unchanged
    with pytest.raises(ValueError, match=name):
        type(family)(assign)


def test_zero_gamma_is_rejected_at_construction_with_the_bound_named() -> None:
    with pytest.raises(ValueError, match=r"gamma=0.*bound of its constraint Positive"):
        Diffusion(gamma=0)
    # Too small to be represented above the bound in float32 (rounds to 0).
    with pytest.raises(ValueError, match="gamma"):
        Diffusion().float().gamma = 1e-50


def test_p_step_boundary_alpha_is_accepted_with_finite_raw_value() -> None:
    family = PStepRandomWalk(2.0, 2)
    family.alpha = 2.0
    family.alpha = torch.tensor([2.0])
    assert bool(torch.isfinite(family.raw_alpha).all()) and float(family.alpha) == pytest.approx(2.0, abs=2e-6)


def test_p_step_scale_beyond_the_dtype_is_an_error_not_infinity() -> None:
    family = PStepRandomWalk(1e20, 3).float()  # alpha^3 = 1e60 > sqrt(float32 max)
    for method in (lambda: family.coefficients(5), lambda: family.modulation(5),
                   lambda: family.spectrum(torch.zeros(3))):
        with pytest.raises(ValueError, match=r"alpha=.*steps=3.*float32"):
            method()
    assert bool(torch.isfinite(family.double().coefficients(5)).all())  # fine in float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_grf_gram_with_a_tiny_regulariser_is_the_identity(dtype: torch.dtype) -> None:
    from gp_couple.graphs import grid_graph
    from gp_couple.kernels import GRFKernel

    # The case: an all-NaN Gram in float32. f = (1, 0, 0, ...) keeps only each
    # walker's start node, so the estimate is exactly the identity, like the kernel.
    kernel = GRFKernel(grid_graph(4, 4), 8, 0.5, kernel_family=RegularisedLaplacian(sigma=1e-30), seed=0).to(dtype)
    nodes = torch.arange(16, dtype=dtype).unsqueeze(-1)
    with torch.no_grad():
        gram = kernel(nodes).to_dense()
    torch.testing.assert_close(gram, torch.eye(16, dtype=dtype))


@pytest.mark.parametrize("coefficients, where", [
    ([1.0, -5.0], 1.0),  # g(1) = -4
    ([1.0, 0.0, -1.5], -1.0),  # g(+-1) = -0.5
    ([0.5, 0.0, -3.0, 0.0, 3.0], 0.7071),  # g > 0 at the ends, -0.25 at lambda^2 = 1/2
    ([0.1, 1.2], -1.0),  # bipartite graphs reach lambda = -1
])
def test_power_series_that_is_not_psd_on_the_spectrum_is_refused(coefficients, where: float) -> None:
    with pytest.raises(ValueError, match=rf"coefficients \[.*\] do not give a positive semi-definite kernel: .* at "
                                         rf"lambda = -?{abs(where):.4g}"):
        PowerSeries(coefficients)


@pytest.mark.parametrize("coefficients", [[1.0, 1.0], [1.0, 0.0, -1.0], [1.0, -2.0, 1.0], [0.25, 0.0, 0.0, 0.0, 0.75],
                                          [1.0, 0.4, -0.1, 0.05]])
def test_power_series_touching_zero_or_positive_is_accepted(coefficients) -> None:
    import numpy as np

    family = PowerSeries(coefficients).double()
    spectrum = family.spectrum(torch.linspace(-1, 1, 201, dtype=torch.float64))
    assert float(spectrum.min()) >= -1e-12
    assert np.allclose(family.series_coefficients.tolist(), coefficients)
