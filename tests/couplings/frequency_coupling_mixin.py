"""Reusable checks for any :class:`~gp_couple.couplings.FrequencyCoupling`.

Subclass :class:`FrequencyCouplingMixin` in a ``Test*`` class and implement
:meth:`~FrequencyCouplingMixin.make_coupling`; the class then checks shapes,
seeding, Gaussian marginals (chi_d norms by KS, isotropic directions by KS) and the
unbiasedness of RFF and RLF kernel estimates.

Marginal tests take frequency ``j`` of many *independent* draws, so each KS sample is
i.i.d. even when a coupling makes the frequencies of one draw dependent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from gp_couple.couplings import FrequencyCoupling
from gp_couple.features.fourier import gaussian_kernel, random_fourier_features, random_laplace_features
from tests.stats import assert_unbiased

#: Family-wise false-alarm rate of each KS test family (Bonferroni over the features).
KS_ALPHA = 1e-3


class FrequencyCouplingMixin:
    """Checks every frequency coupling must pass."""

    #: Input dimension of the checks (odd, so that PNC leaves an unpaired norm).
    dim = 5
    #: Frequencies per draw: more than one ensemble, truncating the second.
    num_features = 7
    #: Independent draws for the marginal tests.
    num_draws = 3000

    def make_coupling(self, dim: int) -> FrequencyCoupling:
        raise NotImplementedError

    def _draws(self, seed: int, num_draws: int | None = None, dim: int | None = None,
               num_features: int | None = None) -> np.ndarray:
        dim = dim or self.dim
        coupling = self.make_coupling(dim)
        with torch.no_grad():
            frequencies = coupling.sample(num_features or self.num_features, dim,
                                          batch_shape=(num_draws or self.num_draws,), seed=seed,
                                          dtype=torch.float64)
        return frequencies.numpy()

    def test_shape_dtype_and_finiteness(self) -> None:
        coupling = self.make_coupling(self.dim)
        for dtype in (torch.float32, torch.float64):
            frequencies = coupling.sample(self.num_features, self.dim, batch_shape=(2, 3), seed=0,
                                          dtype=dtype)
            assert frequencies.shape == (2, 3, self.num_features, self.dim)
            assert frequencies.dtype == dtype
            assert torch.isfinite(frequencies).all()
        assert coupling.sample(1, self.dim, seed=0).shape == (1, self.dim)

    def test_same_seed_same_frequencies(self) -> None:
        coupling = self.make_coupling(self.dim)
        first = coupling.sample(self.num_features, self.dim, batch_shape=(4,), seed=11)
        assert torch.equal(first, coupling.sample(self.num_features, self.dim, batch_shape=(4,), seed=11))
        assert not torch.equal(first, coupling.sample(self.num_features, self.dim, batch_shape=(4,), seed=12))

    def test_noise_round_trip(self) -> None:
        coupling = self.make_coupling(self.dim)
        noise = coupling.draw_noise(self.num_features, self.dim, batch_shape=(3,), seed=5)
        expected = coupling.sample(self.num_features, self.dim, batch_shape=(3,), seed=5)
        assert torch.equal(coupling(noise, self.num_features), expected)
        for tensor in noise.values():
            assert tensor.shape[0] == 3

    def test_norms_are_chi(self) -> None:
        frequencies = self._draws(seed=1)
        norms = np.linalg.norm(frequencies, axis=-1)
        pvalues = [stats.kstest(norms[:, j], stats.chi(self.dim).cdf).pvalue
                   for j in range(self.num_features)]
        assert min(pvalues) * self.num_features > KS_ALPHA, f"KS p-values of the norms: {pvalues}"

    def test_directions_are_isotropic(self) -> None:
        frequencies = self._draws(seed=2)
        directions = frequencies / np.linalg.norm(frequencies, axis=-1, keepdims=True)
        axis = np.random.default_rng(0).standard_normal(self.dim)
        axis /= np.linalg.norm(axis)
        # A uniform unit vector u has (1 + u.a) / 2 ~ Beta((d - 1) / 2, (d - 1) / 2).
        shape = 0.5 * (self.dim - 1)
        projected = 0.5 * (1.0 + directions @ axis)
        pvalues = [stats.kstest(projected[:, j], stats.beta(shape, shape).cdf).pvalue
                   for j in range(self.num_features)]
        assert min(pvalues) * self.num_features > KS_ALPHA, f"KS p-values of the directions: {pvalues}"

    def test_mean_and_covariance_are_standard(self) -> None:
        frequencies = self._draws(seed=3).reshape(-1, self.num_features * self.dim)
        # Each coordinate: mean 0 and variance 1 (within-draw correlations are allowed).
        assert_unbiased(frequencies, 0.0, z=5.0)
        assert_unbiased(frequencies**2, 1.0, z=5.0)

    @pytest.mark.parametrize("kind", ["rff", "rlf"])
    def test_kernel_estimates_are_unbiased(self, kind: str) -> None:
        dim = 3
        rng = np.random.default_rng(7)
        # Small inputs keep the RLF estimator's variance (exp(|x + y|^2)) moderate.
        x = torch.as_tensor(0.35 * rng.standard_normal((5, dim)))
        exact = gaussian_kernel(x).numpy()
        frequencies = torch.as_tensor(self._draws(seed=4, num_draws=4000, dim=dim, num_features=4))
        featurize = random_fourier_features if kind == "rff" else random_laplace_features
        features = featurize(x, frequencies)
        estimates = (features @ features.mT).numpy()
        upper = np.triu_indices(5)
        assert_unbiased(estimates[:, upper[0], upper[1]], exact[upper], z=5.0)

    def test_rejects_bad_sizes(self) -> None:
        coupling = self.make_coupling(self.dim)
        for bad in (0, -2):
            with pytest.raises(ValueError, match="num_features"):
                coupling.sample(bad, self.dim)
        for bad in (2.5, True, "3", None):
            with pytest.raises(TypeError, match="num_features"):
                coupling.sample(bad, self.dim)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="dim"):
            coupling.sample(3, 0)
        with pytest.raises(ValueError, match="batch_shape"):
            coupling.sample(3, self.dim, batch_shape=(-1,))
        with pytest.raises(TypeError, match="dtype"):
            coupling.sample(3, self.dim, dtype=torch.int64)
