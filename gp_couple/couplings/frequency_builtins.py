r"""The built-in frequency couplings for random Fourier and Laplace features (paper, Section 3
"Random Fourier features and random Laplace features" [sec:rffs_and_rlfs]).

Unstructured ones (i.i.d., scrambled Halton and Sobol' points), orthogonal ensembles
with coupled norms (independent, PNC, PM, Gaussian copula) and the antithetic wrapper
over any of them. Each registers itself in
:data:`~gp_couple.couplings.frequency_interface.FREQUENCY_COUPLINGS` by its ``name``;
:mod:`gp_couple.couplings.frequencies` explains the interface and how to write one.
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from scipy import special
from torch import Tensor

from .._checks import check_positive_int
from ..registry import check_description_fields
from .chi import chi_isf, chi_ppf, normal_to_chi
from .frequency_interface import FREQUENCY_COUPLINGS, FrequencyCoupling
from .frequency_lookup import get_frequency_coupling

if TYPE_CHECKING:
    from scipy.stats import qmc

__all__ = [
    "IIDFrequencyCoupling",
    "HaltonCoupling",
    "SobolCoupling",
    "OrthogonalNormCoupling",
    "OrthogonalCoupling",
    "PairwiseNormCoupling",
    "PositiveMonotoneCoupling",
    "GaussianCopulaCoupling",
    "AntitheticFrequencyCoupling",
    "random_orthogonal_matrices",
    "FREQUENCY_COUPLING_NAMES",
]


def random_orthogonal_matrices(shape: Sequence[int], dim: int,
                               rng: np.random.Generator) -> np.ndarray:
    """Haar-distributed orthogonal matrices of shape ``(*shape, dim, dim)``.

    QR of a Gaussian matrix with the signs of ``R``'s diagonal moved into ``Q``
    (Mezzadri 2007); without the sign fix ``Q`` is not Haar. Rows (and columns) are
    therefore uniformly distributed on the sphere and exactly orthonormal.
    """
    gaussian = rng.standard_normal((*shape, dim, dim))
    q, r = np.linalg.qr(gaussian)
    signs = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    signs[signs == 0] = 1.0
    return q * signs[..., None, :]


# --------------------------------------------------------------------------- unstructured


class IIDFrequencyCoupling(FrequencyCoupling):
    r"""Independent frequencies :math:`\boldsymbol\omega_i \sim \mathcal N(0, \mathbf I_d)` (Rahimi & Recht)."""

    name = "iid"

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"frequencies": rng.standard_normal((*batch_shape, num_features, dim))}

    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        return noise["frequencies"]


class _QMCCoupling(FrequencyCoupling):
    r"""Scrambled low-discrepancy points :math:`u_i \in (0, 1)^d` mapped to :math:`\Phi^{-1}(u_i)`.

    Scrambling makes every point marginally uniform, hence every frequency marginally
    Gaussian; each batch member gets an independent scramble.
    """

    #: Name of the ``scipy.stats.qmc`` engine, imported when sampling: ``scipy.stats`` is slow to
    #: import, and importing it with this module would make every user of the library pay for it.
    engine_name: ClassVar[str]

    @property
    def engine(self) -> type[qmc.QMCEngine]:
        """The ``scipy.stats.qmc`` engine class."""
        from scipy.stats import qmc

        return getattr(qmc, self.engine_name)

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        count = math.prod(batch_shape)
        points = np.empty((count, num_features, dim))
        with warnings.catch_warnings():
            # Sobol' warns unless num_features is a power of two: m = d (the paper's
            # setting) rarely is, and the points stay valid, only less balanced.
            warnings.filterwarnings("ignore", message=".*balance properties of Sobol.*")
            for index in range(count):
                points[index] = self.engine(dim, scramble=True, seed=rng).random(num_features)
        # Scrambled points are never exactly 0 except on a null set, but guard the tails.
        tiny = np.finfo(np.float64).tiny
        points = np.clip(points, tiny, np.nextafter(1.0, 0.0))
        return {"frequencies": special.ndtri(points).reshape(*batch_shape, num_features, dim)}

    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        return noise["frequencies"]


class HaltonCoupling(_QMCCoupling):
    """Scrambled Halton sequence through the Gaussian inverse CDF (``scipy.stats.qmc.Halton``)."""

    name = "halton"
    engine_name = "Halton"


class SobolCoupling(_QMCCoupling):
    """Scrambled Sobol' sequence through the Gaussian inverse CDF (``scipy.stats.qmc.Sobol``)."""

    name = "sobol"
    engine_name = "Sobol"


# --------------------------------------------------------------------------- orthogonal ensembles


class _OrthogonalEnsembleCoupling(FrequencyCoupling):
    """Ensembles of ``dim`` orthogonal directions times norms given by :meth:`norms_from_noise`."""

    def num_ensembles(self, num_features: int, dim: int) -> int:
        """Number of ensembles of ``dim`` frequencies needed for ``num_features``."""
        return -(-num_features // dim)

    @abstractmethod
    def norms_from_noise(self, noise: Mapping[str, Tensor]) -> Tensor:
        """Norms ``(*batch_shape, num_ensembles, dim)`` of the frequencies."""

    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        frequencies = noise["directions"] * self.norms_from_noise(noise).unsqueeze(-1)
        return frequencies.flatten(-3, -2)


class OrthogonalNormCoupling(_OrthogonalEnsembleCoupling):
    r"""Base class: ensembles of :math:`d` orthogonal frequencies with coupled norms.

    Each ensemble takes the :math:`d` rows of a Haar-random orthogonal matrix as
    directions, so every direction is uniform on the sphere and the directions are
    exactly orthogonal; ensembles are independent. Subclasses couple the :math:`d`
    norms of an ensemble in :meth:`sample_norms`, keeping each one :math:`\chi_d`.
    """

    @abstractmethod
    def sample_norms(self, shape: tuple[int, ...], dim: int,
                     rng: np.random.Generator) -> np.ndarray:
        r"""Draw the norms of independent ensembles.

        :param shape: ``(*batch_shape, num_ensembles)``.
        :param dim: Dimension :math:`d` = ensemble size.
        :return: Array of shape ``(*shape, dim)``, each entry :math:`\chi_d`.
        """

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (*batch_shape, self.num_ensembles(num_features, dim))
        directions = random_orthogonal_matrices(shape, dim, rng)
        norms = np.asarray(self.sample_norms(shape, dim, rng), dtype=np.float64)
        if norms.shape != (*shape, dim):
            raise ValueError(f"{type(self).__name__}.sample_norms returned shape {norms.shape}, "
                             f"expected {(*shape, dim)}")
        return {"directions": directions, "norms": norms}

    def norms_from_noise(self, noise: Mapping[str, Tensor]) -> Tensor:
        return noise["norms"]


class OrthogonalCoupling(OrthogonalNormCoupling):
    r"""Orthogonal random features (Yu et al. 2016): orthogonal directions, independent :math:`\chi_d` norms."""

    name = "orthogonal"

    def sample_norms(self, shape: tuple[int, ...], dim: int,
                     rng: np.random.Generator) -> np.ndarray:
        return chi_ppf(rng.random((*shape, dim)), dim)


class PairwiseNormCoupling(OrthogonalNormCoupling):
    r"""Pairwise norm-coupled (PNC) orthogonal frequencies (paper, Definition 3.3, Section 3.1
    [def:coupled_norms_def]).

    Frequencies ``(0, 1), (2, 3), ...`` of each orthogonal ensemble form
    :math:`\lfloor d/2 \rfloor` independent negative-monotone pairs (paper, eq. (7), the negative
    monotone coupling, Section 3.1 [eq:negative_monotone_coupling])

    .. math::

        F_{\chi_d}(\omega_1) + F_{\chi_d}(\omega_2) = 1,

    i.e. :math:`\omega_1 = F^{-1}(u)`, :math:`\omega_2 = F^{-1}(1 - u)` with
    :math:`u \sim U(0, 1)`, which solves the two-marginal OT problem for RLFs and, for
    small :math:`\|x - y\|`, for RFFs (Theorem 3.2, Section 3.1 [thm:pairwise_ot_solution]). For odd
    :math:`d` the last frequency of each ensemble keeps an independent norm.
    """

    name = "pnc"

    def sample_norms(self, shape: tuple[int, ...], dim: int,
                     rng: np.random.Generator) -> np.ndarray:
        pairs = dim // 2
        u = rng.random((*shape, pairs))
        norms = np.empty((*shape, dim))
        norms[..., 0:2 * pairs:2] = chi_ppf(u, dim)
        norms[..., 1:2 * pairs:2] = chi_isf(u, dim)
        if dim % 2:
            norms[..., -1] = chi_ppf(rng.random(shape), dim)
        return norms


class PositiveMonotoneCoupling(OrthogonalNormCoupling):
    r"""Positive monotone (PM) coupling: all norms of an orthogonal ensemble are equal (Appendix B.3
    "Norm-coupled RLFs in Performers" [app:performers]).

    It *maximises* the pointwise kernel-estimator variance but also the covariance
    between estimates, which lowers the error of row-normalised attention.
    """

    name = "pm"

    def sample_norms(self, shape: tuple[int, ...], dim: int,
                     rng: np.random.Generator) -> np.ndarray:
        return np.repeat(chi_ppf(rng.random((*shape, 1)), dim), dim, axis=-1)


class GaussianCopulaCoupling(_OrthogonalEnsembleCoupling):
    r"""Orthogonal ensembles with norms from a learnable Gaussian copula (paper, Appendix A.5
    "Copulas as numerical OT solvers" [app:copulas]).

    The :math:`d` norms of an ensemble are

    .. math::

        \omega_i = F_{\chi_d}^{-1}(\Phi(g_i)), \qquad
        \boldsymbol g = \mathbf L_{\boldsymbol\theta} \boldsymbol z,\;
        \boldsymbol z \sim \mathcal N(0, \mathbf I_d),

    so :math:`\boldsymbol g \sim \mathcal N(0, \boldsymbol\Sigma)` with the correlation
    matrix :math:`\boldsymbol\Sigma = \mathbf L_{\boldsymbol\theta}\mathbf L_{\boldsymbol\theta}^\top`
    and every norm is :math:`\chi_d` whatever :math:`\boldsymbol\theta`. The Cholesky
    factor is parametrised by the unconstrained strictly-lower-triangular
    :math:`\boldsymbol\theta \in \mathbb R^{d(d-1)/2}` with :math:`\theta_{ii} = 1`:

    .. math::

        L_{ij} = \theta_{ij} / s_i \;(j \le i), \qquad s_i = \Big(\sum_{j \le i} \theta_{ij}^2\Big)^{1/2},

    whose rows have unit norm, so :math:`\boldsymbol\Sigma` has a unit diagonal. The
    noise :math:`\boldsymbol z` is stored; the frequencies are differentiable in
    :math:`\boldsymbol\theta` through :func:`normal_to_chi`. :math:`\boldsymbol\theta = 0`
    (the default) gives independent norms, i.e. :class:`OrthogonalCoupling`; PNC is the
    limit of pairwise correlations :math:`\to -1`.

    Fit :math:`\boldsymbol\theta` with
    :func:`gp_couple.kernels.random_features.fit_coupling` (eq. (35), the copula's RMSE loss,
    Appendix A.5 [eq:rmseloss]).

    :param dim: Ensemble size = input dimension :math:`d` (the copula is :math:`d \times d`).
    :param correlation: Optional initial correlation matrix :math:`\boldsymbol\Sigma`
        (symmetric positive definite with unit diagonal).
    :param theta: Optional initial parameters :math:`\boldsymbol\theta` (length
        :math:`d(d-1)/2`, row-major strictly lower triangle), as saved by :meth:`params`;
        exclusive with ``correlation``.
    """

    name = "copula"

    def __init__(self, dim: int, correlation: Tensor | np.ndarray | None = None, *,
                 theta: Sequence[float] | Tensor | None = None) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        rows, cols = torch.tril_indices(self.dim, self.dim, offset=-1)
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)
        initial = torch.zeros(rows.numel(), dtype=torch.get_default_dtype())
        if correlation is not None and theta is not None:
            raise ValueError("pass correlation or theta, not both")
        if correlation is not None:
            initial = self._theta_from_correlation(correlation).to(initial.dtype)
        if theta is not None:
            given = torch.as_tensor(theta.detach().cpu() if isinstance(theta, Tensor)
                                    else np.asarray(theta, dtype=np.float64), dtype=initial.dtype)
            if given.shape != initial.shape or not torch.isfinite(given).all():
                raise ValueError(f"theta must hold {initial.numel()} finite values for dim={self.dim}, "
                                 f"got shape {tuple(given.shape)}")
            initial = given
        self.theta = torch.nn.Parameter(initial)

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "theta": self.theta.detach().cpu().tolist()}

    def _theta_from_correlation(self, correlation: Tensor | np.ndarray) -> Tensor:
        matrix = torch.as_tensor(np.asarray(correlation, dtype=np.float64)
                                 if not isinstance(correlation, Tensor)
                                 else correlation.detach().to(device="cpu", dtype=torch.float64))
        if matrix.shape != (self.dim, self.dim):
            raise ValueError(f"correlation must have shape ({self.dim}, {self.dim}), "
                             f"got {tuple(matrix.shape)}")
        if not torch.isfinite(matrix).all():
            raise ValueError("correlation contains NaN or infinite values")
        if not torch.allclose(matrix, matrix.T, atol=1e-10):
            raise ValueError("correlation must be symmetric")
        if not torch.allclose(torch.diagonal(matrix), torch.ones(self.dim, dtype=matrix.dtype),
                              atol=1e-8):
            raise ValueError("correlation must have a unit diagonal")
        factor, info = torch.linalg.cholesky_ex(matrix)
        if int(info) != 0:
            raise ValueError("correlation must be positive definite")
        return (factor / torch.diagonal(factor).unsqueeze(-1))[self._rows, self._cols]

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    @property
    def cholesky_factor(self) -> Tensor:
        r"""The lower-triangular :math:`\mathbf L_{\boldsymbol\theta}` (differentiable in :math:`\boldsymbol\theta`)."""
        eye = torch.eye(self.dim, dtype=self.theta.dtype, device=self.theta.device)
        unnormalised = eye.index_put((self._rows, self._cols), self.theta)
        return unnormalised / unnormalised.norm(dim=-1, keepdim=True)

    @property
    def correlation(self) -> Tensor:
        r"""The copula correlation matrix :math:`\boldsymbol\Sigma = \mathbf L \mathbf L^\top`."""
        factor = self.cholesky_factor
        return factor @ factor.T

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        if dim != self.dim:
            raise ValueError(f"this copula couples ensembles of dim={self.dim} norms, "
                             f"but frequencies of dimension {dim} were requested")
        shape = (*batch_shape, self.num_ensembles(num_features, dim))
        return {"directions": random_orthogonal_matrices(shape, dim, rng),
                "normals": rng.standard_normal((*shape, dim))}

    def norms_from_noise(self, noise: Mapping[str, Tensor]) -> Tensor:
        normals = noise["normals"]
        factor = self.cholesky_factor.to(normals.dtype)
        return normal_to_chi(normals @ factor.T, self.dim)


# --------------------------------------------------------------------------- antithetic


class AntitheticFrequencyCoupling(FrequencyCoupling, register=False):
    r"""Antithetic frequencies :math:`\{\pm\boldsymbol\omega_i\}` over a base coupling (paper,
    Theorem 3.5, Section 3.1 [thm:antithetic]).

    Draws :math:`\lceil m/2 \rceil` frequencies from ``base`` and returns them
    interleaved with their negatives, :math:`(\boldsymbol\omega_1, -\boldsymbol\omega_1,
    \boldsymbol\omega_2, -\boldsymbol\omega_2, \dots)`, so truncating to an even ``m``
    keeps every pair. With PNC as the base (the default) an RLF ensemble of :math:`2d`
    is the paper's "PNC + antithetic". For RFFs a frequency and its negative give the
    same kernel estimate, so antithetic pairs only duplicate features there.

    :param base: Coupling of the positive half (default :class:`PairwiseNormCoupling`).
    """

    def __init__(self, base: FrequencyCoupling | str | None = None) -> None:
        super().__init__()
        base = PairwiseNormCoupling() if base is None else get_frequency_coupling(base)
        if isinstance(base, AntitheticFrequencyCoupling):
            raise ValueError("base is already antithetic")
        self.base = base

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.base.name}+antithetic"

    def params(self) -> dict[str, Any]:
        return {"base": self.base.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AntitheticFrequencyCoupling:
        """Rebuild from :meth:`to_dict` output (the base from its own description).

        :raises ValueError: For a field other than ``type`` and ``base``.
        """
        check_description_fields(data, ("base",), "antithetic frequency coupling")
        return cls(FREQUENCY_COUPLINGS.from_dict(data["base"]) if "base" in data else None)

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.base.sample_noise(-(-num_features // 2), dim, batch_shape, rng)

    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        half = self.base.noise_to_frequencies(noise)
        return torch.stack([half, -half], dim=-2).flatten(-3, -2)


# Its instance name depends on the base ("pnc+antithetic"), so it registers explicitly.
FREQUENCY_COUPLINGS.register(AntitheticFrequencyCoupling, name="antithetic")

#: The built-in names (a snapshot; ``FREQUENCY_COUPLINGS.names()`` also lists couplings
#: registered later, e.g. by users). Any of them may take the suffix ``+antithetic``.
FREQUENCY_COUPLING_NAMES: tuple[str, ...] = FREQUENCY_COUPLINGS.names()
