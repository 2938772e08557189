"""Frequency couplings: marginals, structure, unbiasedness, variance ordering and copula gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from gp_couple.couplings import (
    FREQUENCY_COUPLING_NAMES,
    AntitheticFrequencyCoupling,
    FrequencyCoupling,
    GaussianCopulaCoupling,
    HaltonCoupling,
    IIDFrequencyCoupling,
    OrthogonalCoupling,
    OrthogonalNormCoupling,
    PairwiseNormCoupling,
    PositiveMonotoneCoupling,
    SobolCoupling,
    chi_isf,
    chi_ppf,
    chi_quantile,
    get_frequency_coupling,
    normal_to_chi,
    random_orthogonal_matrices,
)
from gp_couple.features.fourier import gaussian_kernel, random_fourier_features, random_laplace_features
from tests.couplings.frequency_coupling_mixin import FrequencyCouplingMixin
from tests.stats import mean_and_standard_error


def _random_correlation(dim: int, seed: int) -> np.ndarray:
    factor = np.random.default_rng(seed).standard_normal((dim, dim + 2))
    covariance = factor @ factor.T
    scale = np.sqrt(np.diag(covariance))
    return covariance / np.outer(scale, scale)


# --------------------------------------------------------------------------- every coupling


class TestIID(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return IIDFrequencyCoupling()


class TestHalton(FrequencyCouplingMixin):
    num_draws = 1500

    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return HaltonCoupling()


class TestSobol(FrequencyCouplingMixin):
    num_draws = 1500

    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return SobolCoupling()


class TestOrthogonal(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return OrthogonalCoupling()


class TestPNC(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return PairwiseNormCoupling()


class TestPNCEvenDim(FrequencyCouplingMixin):
    dim = 4

    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return PairwiseNormCoupling()


class TestPositiveMonotone(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return PositiveMonotoneCoupling()


class TestAntitheticPNC(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return AntitheticFrequencyCoupling()


class TestAntitheticIID(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return AntitheticFrequencyCoupling(IIDFrequencyCoupling())


class TestGaussianCopula(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return GaussianCopulaCoupling(dim, correlation=_random_correlation(dim, seed=dim))


class _Mirrored(OrthogonalNormCoupling):
    """The module docstring's example of a user-defined norm coupling."""

    name = "half-mirrored"

    def sample_norms(self, shape: tuple[int, ...], dim: int, rng: np.random.Generator) -> np.ndarray:
        u = rng.random((*shape, 1))
        half = dim // 2
        return np.concatenate([np.repeat(chi_ppf(u, dim), half, -1),
                               np.repeat(chi_isf(u, dim), dim - half, -1)], -1)


class TestUserDefinedCoupling(FrequencyCouplingMixin):
    def make_coupling(self, dim: int) -> FrequencyCoupling:
        return _Mirrored()


# --------------------------------------------------------------------------- structure


def _ensembles(frequencies: torch.Tensor, dim: int) -> torch.Tensor:
    return frequencies.reshape(*frequencies.shape[:-2], -1, dim, dim)


@pytest.mark.parametrize("coupling", [OrthogonalCoupling(), PairwiseNormCoupling(),
                                      PositiveMonotoneCoupling(), GaussianCopulaCoupling(6)],
                         ids=lambda c: c.name)
def test_ensembles_are_exactly_orthogonal(coupling: FrequencyCoupling) -> None:
    frequencies = coupling.sample(12, 6, batch_shape=(5,), seed=0, dtype=torch.float64)
    blocks = _ensembles(frequencies.detach(), 6)
    gram = blocks @ blocks.mT
    off_diagonal = gram - torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))
    assert off_diagonal.abs().max() < 1e-12 * gram.abs().max()
    # Distinct ensembles are independent, so not orthogonal to each other.
    assert (blocks[:, 0] @ blocks[:, 1].mT).abs().max() > 1e-3


def test_random_orthogonal_matrices_are_orthogonal_and_haar() -> None:
    matrices = random_orthogonal_matrices((4000,), 3, np.random.default_rng(0))
    eye = np.broadcast_to(np.eye(3), matrices.shape)
    np.testing.assert_allclose(matrices @ np.swapaxes(matrices, -1, -2), eye, atol=1e-12)
    # Haar: E[Q] = 0 (a QR without the sign fix has a positive-biased diagonal).
    mean, se = mean_and_standard_error(matrices.reshape(4000, -1))
    assert np.all(np.abs(mean) < 5 * se)


@pytest.mark.parametrize("dim", [2, 5, 8])
def test_pnc_pairing_identity(dim: int) -> None:
    frequencies = PairwiseNormCoupling().sample(2 * dim, dim, batch_shape=(50,), seed=dim,
                                                dtype=torch.float64)
    norms = _ensembles(frequencies, dim).norm(dim=-1).numpy()
    cdf = stats.chi(dim).cdf
    pairs = dim // 2
    total = cdf(norms[..., 0:2 * pairs:2]) + cdf(norms[..., 1:2 * pairs:2])
    np.testing.assert_allclose(total, 1.0, atol=1e-12)
    if dim % 2:
        # The unpaired norm is independent of the pairs: its quantile is not tied to them.
        assert np.abs(cdf(norms[..., -1]) + cdf(norms[..., 0]) - 1.0).max() > 0.1


def test_positive_monotone_norms_are_equal_within_an_ensemble() -> None:
    frequencies = PositiveMonotoneCoupling().sample(8, 4, batch_shape=(10,), seed=0, dtype=torch.float64)
    norms = _ensembles(frequencies, 4).norm(dim=-1)
    torch.testing.assert_close(norms, norms[..., :1].expand_as(norms), rtol=1e-12, atol=0)
    assert (norms[:, 0, 0] - norms[:, 1, 0]).abs().max() > 1e-3


def test_antithetic_pairs_are_negatives() -> None:
    frequencies = AntitheticFrequencyCoupling().sample(9, 4, batch_shape=(3,), seed=0, dtype=torch.float64)
    assert frequencies.shape == (3, 9, 4)
    torch.testing.assert_close(frequencies[:, 0:8:2], -frequencies[:, 1:8:2], rtol=0, atol=0)
    # The positive half is a PNC ensemble.
    positive = frequencies[:, 0:8:2]
    cdf = stats.chi(4).cdf
    norms = positive.norm(dim=-1).numpy()
    np.testing.assert_allclose(cdf(norms[:, 0]) + cdf(norms[:, 1]), 1.0, atol=1e-12)


def test_more_features_than_dim_use_independent_ensembles() -> None:
    # Orthogonal ensembles of d: the norms of different ensembles are independent for PM.
    frequencies = PositiveMonotoneCoupling().sample(6, 3, batch_shape=(4000,), seed=0, dtype=torch.float64)
    norms = frequencies.norm(dim=-1).numpy()
    assert abs(stats.pearsonr(norms[:, 0], norms[:, 3]).statistic) < 5 / np.sqrt(4000)
    assert stats.pearsonr(norms[:, 0], norms[:, 2]).statistic > 0.999


def test_chi_quantiles_match_scipy() -> None:
    u = np.linspace(1e-6, 1 - 1e-6, 101)
    for dim in (1, 2, 7, 64):
        np.testing.assert_allclose(chi_ppf(u, dim), stats.chi(dim).ppf(u), rtol=1e-10)
        np.testing.assert_allclose(chi_isf(u, dim), stats.chi(dim).isf(u), rtol=1e-10)


def test_normal_to_chi_is_accurate_in_both_tails() -> None:
    g = torch.tensor([-12.0, -3.0, 0.0, 3.0, 12.0], dtype=torch.float64)
    w = normal_to_chi(g, 4).numpy()
    expected = stats.chi(4).isf(stats.norm.sf(g.numpy()))
    expected[:2] = stats.chi(4).ppf(stats.norm.cdf(g.numpy()[:2]))
    np.testing.assert_allclose(w, expected, rtol=1e-10)
    assert np.all(np.isfinite(w)) and np.all(np.diff(w) > 0)


# --------------------------------------------------------------------------- variance ordering


def _squared_errors(kind: str, frequencies: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    featurize = random_fourier_features if kind == "rff" else random_laplace_features
    points = torch.stack([x, y])
    features = featurize(points, frequencies)
    estimate = (features[:, 0] * features[:, 1]).sum(-1)
    return ((estimate - gaussian_kernel(points)[0, 1]) ** 2).numpy()


# RLF gains from PNC are O(|x + y|^4) at small |x + y| (cost function of eq:cost_functions),
# about 2% of the MSE here: hence more draws than for RFFs.
@pytest.mark.parametrize("kind, draws", [("rff", 40_000), ("rlf", 200_000)])
def test_variance_ordering_pnc_orthogonal_iid(kind: str, draws: int) -> None:
    """PNC < orthogonal < iid for a pair of nearby points (thm:pairwise_ot_solution, corr:norm_coupled_better)."""
    dim, z = 6, 4.0
    rng = np.random.default_rng(3)
    x = torch.as_tensor(0.1 * rng.standard_normal(dim))
    y = x + torch.as_tensor(0.1 * rng.standard_normal(dim))  # |x - y| = 0.40, |x + y| = 0.62
    # PNC against orthogonal with common random numbers: the orthogonal draw reuses the
    # PNC directions and first norm of each pair and draws the second norm
    # independently, which is exactly the orthogonal coupling's law. The paired
    # difference isolates the effect of the norm coupling.
    pnc = PairwiseNormCoupling()
    noise = pnc.draw_noise(dim, dim, batch_shape=(draws,), seed=10, dtype=torch.float64)
    independent = noise["norms"].clone()
    second = independent[..., 1::2]
    independent[..., 1::2] = torch.as_tensor(chi_ppf(np.random.default_rng(11).random(second.shape), dim))
    orthogonal = OrthogonalCoupling()({"directions": noise["directions"], "norms": independent}, dim)
    errors_pnc = _squared_errors(kind, pnc(noise, dim), x, y)
    errors_orthogonal = _squared_errors(kind, orthogonal, x, y)
    gain, gain_se = mean_and_standard_error(errors_pnc - errors_orthogonal)
    assert gain + z * gain_se < 0, f"{kind}: MSE(PNC) - MSE(orthogonal) = {gain:.3g} ± {gain_se:.2g}"
    # Orthogonal against iid: independent samples, the gap is large.
    iid = IIDFrequencyCoupling().sample(dim, dim, batch_shape=(draws,), seed=12, dtype=torch.float64)
    errors_iid = _squared_errors(kind, iid, x, y)
    (m_orth, se_orth), (m_iid, se_iid) = (mean_and_standard_error(errors_orthogonal),
                                          mean_and_standard_error(errors_iid))
    assert m_orth + z * np.hypot(se_orth, se_iid) < m_iid, (
        f"{kind}: MSE orthogonal={m_orth:.4g}±{se_orth:.2g} not below iid={m_iid:.4g}±{se_iid:.2g}")


# --------------------------------------------------------------------------- copula


def test_copula_correlation_has_unit_diagonal_and_round_trips() -> None:
    target = _random_correlation(5, seed=1)
    copula = GaussianCopulaCoupling(5, correlation=target).double()
    # theta was stored in the default dtype (float32) before .double().
    np.testing.assert_allclose(copula.correlation.detach().numpy(), target, atol=1e-6)
    with torch.no_grad():
        copula.theta.normal_()
    corr = copula.correlation.detach()
    torch.testing.assert_close(torch.diagonal(corr), torch.ones(5, dtype=torch.float64))
    assert torch.linalg.eigvalsh(corr).min() > 0


def test_copula_with_zero_theta_is_orthogonal_with_independent_norms() -> None:
    copula = GaussianCopulaCoupling(4)
    assert torch.equal(copula.correlation.detach(), torch.eye(4))
    frequencies = copula.sample(4, 4, batch_shape=(3000,), seed=0, dtype=torch.float64).detach()
    norms = frequencies.norm(dim=-1).numpy()
    assert abs(stats.spearmanr(norms[:, 0], norms[:, 1]).statistic) < 5 / np.sqrt(3000)


def test_copula_with_negative_correlation_approaches_pnc() -> None:
    correlation = np.eye(2)
    correlation[0, 1] = correlation[1, 0] = -0.999999
    copula = GaussianCopulaCoupling(2, correlation=correlation)
    norms = copula.sample(2, 2, batch_shape=(200,), seed=0, dtype=torch.float64).detach().norm(dim=-1).numpy()
    cdf = stats.chi(2).cdf
    np.testing.assert_allclose(cdf(norms[:, 0]) + cdf(norms[:, 1]), 1.0, atol=5e-3)


def test_chi_quantile_gradients_match_finite_differences() -> None:
    u = torch.linspace(0.05, 0.95, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: chi_quantile(t, 3), (u,))
    g = torch.linspace(-4.0, 4.0, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: normal_to_chi(t, 6), (g,))
    # dw/du = 1 / pdf_chi(w), the formula of NOTES.md.
    w = chi_quantile(u, 3)
    (grad,) = torch.autograd.grad(w.sum(), u)
    np.testing.assert_allclose(grad.numpy(), 1.0 / stats.chi(3).pdf(w.detach().numpy()), rtol=1e-10)


def test_copula_frequency_gradients_match_finite_differences() -> None:
    dim = 4
    copula = GaussianCopulaCoupling(dim, correlation=_random_correlation(dim, seed=2)).double()
    noise = copula.draw_noise(6, dim, batch_shape=(2,), seed=0, dtype=torch.float64)
    theta = copula.theta.detach().clone().requires_grad_(True)

    def frequencies(parameters: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(copula, {"theta": parameters}, (noise, 6))

    assert torch.autograd.gradcheck(frequencies, (theta,))


def test_copula_learns_through_kernel_loss() -> None:
    copula = GaussianCopulaCoupling(3).double()
    x = torch.as_tensor(0.4 * np.random.default_rng(0).standard_normal((6, 3)))
    frequencies = copula.sample(3, 3, batch_shape=(16,), seed=0, dtype=torch.float64)
    features = random_fourier_features(x, frequencies)
    loss = ((features @ features.mT - gaussian_kernel(x)) ** 2).mean()
    loss.backward()
    assert copula.theta.grad is not None and torch.isfinite(copula.theta.grad).all()
    assert copula.theta.grad.abs().max() > 0


@pytest.mark.parametrize("correlation, message", [
    (np.eye(3), "shape"),
    (np.full((4, 4), 0.5), "unit diagonal"),
    (np.triu(np.full((4, 4), 0.3), 1) + np.eye(4), "symmetric"),
    (np.ones((4, 4)), "positive definite"),
    (np.where(np.eye(4) > 0, 1.0, np.nan), "NaN"),
])
def test_copula_rejects_bad_correlations(correlation: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GaussianCopulaCoupling(4, correlation=correlation)


def test_copula_rejects_other_dimensions() -> None:
    with pytest.raises(ValueError, match="dim=4"):
        GaussianCopulaCoupling(4).sample(4, 3)


# --------------------------------------------------------------------------- registry and errors


@pytest.mark.parametrize("name", [n for n in FREQUENCY_COUPLING_NAMES] + ["orthogonal+antithetic", "PNC"])
def test_registry_names_resolve(name: str) -> None:
    coupling = get_frequency_coupling(name, dim=3)
    assert isinstance(coupling, FrequencyCoupling)
    assert coupling.sample(5, 3, seed=0).shape == (5, 3)
    expected = {"antithetic": "pnc+antithetic", "PNC": "pnc"}.get(name, name)
    assert coupling.name == expected


def test_registry_errors() -> None:
    with pytest.raises(ValueError, match="unknown frequency coupling"):
        get_frequency_coupling("gaussian")
    with pytest.raises(ValueError, match="needs dim"):
        get_frequency_coupling("copula")
    with pytest.raises(TypeError, match="coupling must be"):
        get_frequency_coupling(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already antithetic"):
        get_frequency_coupling("antithetic+antithetic")


def test_learnable_flag() -> None:
    assert not PairwiseNormCoupling().is_learnable
    assert GaussianCopulaCoupling(3).is_learnable
    assert AntitheticFrequencyCoupling(GaussianCopulaCoupling(3)).is_learnable


def test_forward_rejects_too_few_stored_frequencies() -> None:
    coupling = OrthogonalCoupling()
    noise = coupling.draw_noise(3, 3, seed=0)
    with pytest.raises(ValueError, match="redraw"):
        coupling(noise, 4)


class _MapsNoise(FrequencyCoupling, register=False):
    """A user's coupling whose deterministic map is ``transform(gaussian noise)``."""

    name = "maps-noise"

    def __init__(self, transform) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.transform = transform

    def sample_noise(self, num_features, dim, batch_shape, rng):  # type: ignore[no-untyped-def]
        return {"normals": rng.standard_normal((*batch_shape, num_features, dim))}

    def noise_to_frequencies(self, noise):  # type: ignore[no-untyped-def]
        return self.transform(noise["normals"])


@pytest.mark.parametrize("transform, message", [
    (lambda w: w * float("nan"), r"_MapsNoise.noise_to_frequencies returned NaN or infinite frequencies"),
    (lambda w: w / 0.0, r"NaN or infinite"),
    (lambda w: w[..., :1], r"returned frequencies of shape \(2, 4, 1\); expected \(2, M >= 4, 3\)"),
    (lambda w: torch.cat([w, w, w]), r"returned frequencies of shape \(6, 4, 3\); expected \(2, M >= 4, 3\)"),
    (lambda w: w.numpy(), r"returned ndarray; expected a floating-point tensor"),
    (lambda w: w.long(), r"returned a tensor of dtype torch.int64"),
])
def test_user_couplings_returning_bad_frequencies_name_the_class(transform, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        _MapsNoise(transform).sample(4, 3, batch_shape=(2,), seed=0)


def test_kernels_check_user_couplings_too() -> None:
    from gp_couple.kernels import CoupledRFFKernel

    with pytest.raises(ValueError, match="_MapsNoise.noise_to_frequencies returned NaN"):
        CoupledRFFKernel(4, 3, coupling=_MapsNoise(lambda w: w * float("nan")), seed=0)(torch.rand(5, 3)).to_dense()
