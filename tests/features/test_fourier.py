"""Random Fourier / Laplace feature maps and the exact Gaussian kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gp_couple.couplings import IIDFrequencyCoupling
from gp_couple.features.fourier import (
    FEATURE_MAPS,
    feature_map,
    gaussian_kernel,
    num_feature_columns,
    random_fourier_features,
    random_laplace_features,
    softmax_kernel_features,
)
from tests.stats import assert_unbiased


def _data(seed: int = 0, n: int = 6, d: int = 3, m: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return (torch.as_tensor(0.5 * rng.standard_normal((n, d))),
            torch.as_tensor(rng.standard_normal((m, d))))


def test_rff_inner_products_are_mean_cosines() -> None:
    x, w = _data()
    features = random_fourier_features(x, w)
    assert features.shape == (6, 10)
    differences = x[:, None, :] - x[None, :, :]
    expected = torch.cos(differences @ w.T).mean(-1)
    torch.testing.assert_close(features @ features.T, expected, rtol=1e-12, atol=1e-12)
    # sin^2 + cos^2 = 1: the diagonal is exact.
    torch.testing.assert_close(torch.diagonal(features @ features.T), torch.ones(6, dtype=torch.float64))


def test_rlf_matches_paper_formula_and_is_positive() -> None:
    x, w = _data()
    features = random_laplace_features(x, w)
    expected = torch.exp(-(x**2).sum(-1, keepdim=True)) * torch.exp(x @ w.T) / math.sqrt(5)
    torch.testing.assert_close(features, expected, rtol=1e-12, atol=0)
    assert (features > 0).all()


def test_rlf_does_not_overflow_for_large_inputs() -> None:
    x = torch.full((2, 3), 30.0, dtype=torch.float64)
    w = torch.full((4, 3), 10.0, dtype=torch.float64)
    # exp(w.x) alone overflows (e^900); the folded exponent is 900 - 2700.
    assert torch.isfinite(random_laplace_features(x, w)).all()


def test_softmax_features_rescale_rlf() -> None:
    x, w = _data()
    scale = torch.exp(0.5 * (x**2).sum(-1, keepdim=True))
    torch.testing.assert_close(softmax_kernel_features(x, w), scale * random_laplace_features(x, w))


def test_softmax_features_estimate_the_softmax_kernel_without_bias() -> None:
    x, _ = _data(n=4)
    x = 0.6 * x
    frequencies = IIDFrequencyCoupling().sample(8, 3, batch_shape=(20_000,), seed=0, dtype=torch.float64)
    features = softmax_kernel_features(x, frequencies)
    estimates = (features @ features.mT).numpy().reshape(20_000, -1)
    assert_unbiased(estimates, torch.exp(x @ x.T).numpy().reshape(-1), z=5.0)


def test_gaussian_kernel_is_exact() -> None:
    x, _ = _data()
    y = x[:4] + 0.3
    kernel = gaussian_kernel(x, y)
    expected = torch.exp(-0.5 * ((x[:, None] - y[None]) ** 2).sum(-1))
    torch.testing.assert_close(kernel, expected, rtol=1e-14, atol=1e-15)
    self_kernel = gaussian_kernel(x + 1e4)
    assert torch.equal(torch.diagonal(self_kernel), torch.ones(6, dtype=torch.float64))
    torch.testing.assert_close(self_kernel, gaussian_kernel(x), rtol=1e-8, atol=1e-10)


def test_batched_frequencies_broadcast_over_inputs() -> None:
    x, _ = _data()
    w = torch.as_tensor(np.random.default_rng(1).standard_normal((2, 4, 5, 3)))
    for fmap, columns in ((random_fourier_features, 10), (random_laplace_features, 5)):
        features = fmap(x, w)
        assert features.shape == (2, 4, 6, columns)
        torch.testing.assert_close(features[1, 2], fmap(x, w[1, 2]))


def test_gradients_flow_to_inputs_and_frequencies() -> None:
    x, w = _data(n=3, m=2)
    x.requires_grad_(True)
    w.requires_grad_(True)
    for fmap in FEATURE_MAPS.values():
        assert torch.autograd.gradcheck(fmap, (x, w))


def test_mixed_precision_promotes() -> None:
    x, w = _data()
    assert random_fourier_features(x.float(), w).dtype == torch.float64


@pytest.mark.parametrize("fmap", [random_fourier_features, random_laplace_features, softmax_kernel_features])
def test_bad_inputs_raise_clear_errors(fmap) -> None:  # type: ignore[no-untyped-def]
    x, w = _data()
    with pytest.raises(ValueError, match="input dimensions"):
        fmap(x[:, :2], w)
    nan = x.clone()
    nan[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fmap(nan, w)
    with pytest.raises(ValueError, match="x must have shape"):
        fmap(x[0], w)
    with pytest.raises(TypeError, match="floating-point"):
        fmap(x.long(), w)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fmap(x.numpy(), w)
    with pytest.raises(ValueError, match="frequencies must have shape"):
        fmap(x, w[0])


def test_gaussian_kernel_rejects_bad_inputs() -> None:
    x, _ = _data()
    with pytest.raises(ValueError, match="different input dimensions"):
        gaussian_kernel(x, x[:, :2])
    with pytest.raises(ValueError, match="x2 contains NaN"):
        gaussian_kernel(x, torch.full((2, 3), float("inf"), dtype=torch.float64))


def test_feature_map_registry() -> None:
    assert feature_map("RFF") is random_fourier_features
    assert feature_map("rlf") is random_laplace_features
    assert num_feature_columns("rff", 7) == 14 and num_feature_columns("rlf", 7) == 7
    with pytest.raises(ValueError, match="unknown feature map"):
        feature_map("orf")
    with pytest.raises(TypeError):
        feature_map(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmap", [random_fourier_features, random_laplace_features, softmax_kernel_features])
def test_lengthscale_argument_equals_scaling_the_inputs(fmap) -> None:  # type: ignore[no-untyped-def]
    x, w = _data()
    ard = torch.tensor([[0.5, 2.0, 1.3]], dtype=torch.float64)
    torch.testing.assert_close(fmap(x, w, ard), fmap(x / ard, w), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(fmap(x, w, 0.7), fmap(x / 0.7, w), rtol=1e-12, atol=1e-14)
    batched = torch.tensor([[[0.5]], [[2.0]]], dtype=torch.float64)
    torch.testing.assert_close(fmap(x, w, batched)[1], fmap(x / 2.0, w), rtol=1e-12, atol=1e-14)
    lengthscale = ard.clone().requires_grad_(True)
    x_small, w_small = x[:3].clone().requires_grad_(True), w[:2].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fmap, (x_small, w_small, lengthscale))
    with pytest.raises(ValueError, match="lengthscale"):
        fmap(x, w, -1.0)
    with pytest.raises(ValueError, match="lengthscale has 2 entries"):
        fmap(x, w, torch.ones(1, 2, dtype=torch.float64))
