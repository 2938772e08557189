"""The p_halt rule: halting inflation of a kernel's GRFs and the suggested termination probability."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import i0e

from gp_couple.halting import DEFAULT_MAX_INFLATION, halting_inflation, suggest_p_halt
from gp_couple.kernel_families import Diffusion, PowerSeries, PStepRandomWalk, RegularisedLaplacian


def bessel_inflation(gamma: float, p_halt: float) -> float:
    """Closed form for the diffusion kernel: I0(gamma^2 / sqrt(1 - p)) / I0(gamma^2)."""
    big, small = gamma**2 / math.sqrt(1 - p_halt), gamma**2
    return i0e(big) / i0e(small) * math.exp(big - small)


@pytest.mark.parametrize("gamma", [0.7, 2.0, 8.0])
@pytest.mark.parametrize("p_halt", [0.02, 0.1, 0.4])
def test_diffusion_inflation_matches_the_bessel_closed_form(gamma: float, p_halt: float) -> None:
    family = Diffusion(gamma).double()
    # The kernel's own gamma: it was rounded to float32 when built.
    expected = bessel_inflation(family.gamma.item(), p_halt)
    assert halting_inflation(family, p_halt) == pytest.approx(expected, rel=1e-9)


def test_inflation_equals_the_definition_for_a_finite_series() -> None:
    # p-step with an even power has a modulation with finitely many terms: f = (a, 1) for p = 2.
    family = PStepRandomWalk(alpha=3.0, steps=2).double()
    a = family.alpha.item() - 1
    assert np.allclose(family.modulation(4).detach().numpy(), [a, 1.0, 0.0, 0.0])
    p = 0.3
    assert halting_inflation(family, p) == pytest.approx((a**2 + 1.0 / (1 - p)) / (a**2 + 1.0), rel=1e-12)


def test_inflation_is_infinite_when_the_series_diverges() -> None:
    # Regularised Laplacian: f(t)^2 ~ t^(d-2) c^(2t), so the series diverges once (1 - p) <= c^2.
    family = RegularisedLaplacian(sigma=3.0, degree=2).double()
    c = 9.0 / 10.0
    assert math.isfinite(halting_inflation(family, 0.9 * (1 - c**2)))
    assert halting_inflation(family, 1.1 * (1 - c**2)) == math.inf


def test_suggestion_meets_the_budget_exactly_and_is_the_largest_such_p() -> None:
    family = Diffusion(8.0).double()
    p = suggest_p_halt(family)
    assert halting_inflation(family, p) == pytest.approx(DEFAULT_MAX_INFLATION, rel=1e-4)
    assert halting_inflation(family, 1.01 * p) > DEFAULT_MAX_INFLATION
    # Large-gamma asymptote p ~ 2 log(budget) / gamma^2.
    assert p == pytest.approx(2 * math.log(DEFAULT_MAX_INFLATION) / 64.0, rel=0.1)
    assert p == pytest.approx(suggest_p_halt(Diffusion(8.0), p_min=0.01, p_max=0.05), rel=1e-5)


def test_suggestion_shrinks_with_the_kernel_range_and_caps_at_p_max() -> None:
    suggestions = [suggest_p_halt(Diffusion(gamma).double()) for gamma in (1.0, 2.0, 4.0, 8.0)]
    assert suggestions[0] == 0.5
    assert all(later < earlier for earlier, later in zip(suggestions, suggestions[1:]))
    assert suggest_p_halt(Diffusion(1.0).double(), p_max=0.3) == 0.3
    # A larger budget allows cheaper (shorter) walks.
    assert suggest_p_halt(Diffusion(8.0).double(), max_inflation=4.0) > suggestions[-1]


def test_float32_kernels_give_the_float64_answer() -> None:
    assert suggest_p_halt(Diffusion(6.0)) == pytest.approx(suggest_p_halt(Diffusion(6.0).double()), rel=1e-5)


def test_bad_arguments() -> None:
    family = Diffusion(2.0)
    with pytest.raises(TypeError, match="kernel_family"):
        suggest_p_halt("diffusion")
    with pytest.raises(ValueError, match="p_halt"):
        halting_inflation(family, 1.0)
    with pytest.raises(ValueError, match="max_inflation"):
        suggest_p_halt(family, max_inflation=1.0)
    with pytest.raises(ValueError, match="p_min"):
        suggest_p_halt(family, p_min=0.5, p_max=0.2)
    with pytest.raises(ValueError, match="batch_shape"):
        suggest_p_halt(Diffusion(batch_shape=torch.Size([2])))
    with pytest.raises(ValueError, match="decays too slowly"):
        # c = sigma^2 / (1 + sigma^2) = 400 / 401: the series diverges for every p >= 1 - c^2 ~ 0.005.
        suggest_p_halt(RegularisedLaplacian(sigma=20.0), p_min=0.01)


def test_generic_series_uses_the_numerical_square_root() -> None:
    # sqrt(1 + x/2) has f(t) ~ 2^-t, so the inflation is finite for p < 3/4.
    family = PowerSeries([1.0, 0.5]).double()
    f = family.modulation(200).detach().numpy()
    p = 0.5
    expected = np.sum(f**2 / (1 - p) ** np.arange(200)) / np.sum(f**2)
    assert halting_inflation(family, p) == pytest.approx(expected, rel=1e-10)


def test_unreliable_inflation_names_the_inflation_only_beyond_the_warning_bound() -> None:
    from gp_couple.halting import WARNING_INFLATION, unreliable_inflation

    assert unreliable_inflation(Diffusion(1.0), 0.1) is None
    inflation = unreliable_inflation(Diffusion(4.0), 0.5)
    assert inflation == pytest.approx(halting_inflation(Diffusion(4.0), 0.5)) and inflation > WARNING_INFLATION
    assert unreliable_inflation(Diffusion(1e4), 0.03) == math.inf  # the modulation underflows to zero
    batched = Diffusion(batch_shape=torch.Size([2]))
    batched.gamma = torch.tensor([[1.0], [1e4]])
    assert unreliable_inflation(batched, 0.03) is None  # batched entries are not judged
