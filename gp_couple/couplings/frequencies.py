r"""Frequency couplings for random Fourier and Laplace features (paper, sec:rffs_and_rlfs).

Random Fourier features (RFFs) and random Laplace features (RLFs) estimate the Gaussian
kernel without bias whenever every frequency is *marginally* standard Gaussian,
:math:`\boldsymbol\omega_i \sim \mathcal N(0, \mathbf I_d)`. Independence is not
needed: any joint law (a *coupling*) with these marginals keeps the estimator
unbiased, and a good one lowers its variance. Writing
:math:`\boldsymbol\omega = \omega\,\widehat{\boldsymbol\omega}`, the marginal condition
is: the direction :math:`\widehat{\boldsymbol\omega}` is uniform on the sphere and the
norm :math:`\omega` is :math:`\chi_d`-distributed, independent of it.

Built-in couplings (registered names, accepted by :func:`get_frequency_coupling`, in brackets):

* :class:`IIDFrequencyCoupling` (``iid``): independent Gaussian frequencies.
* :class:`HaltonCoupling` (``halton``), :class:`SobolCoupling` (``sobol``): scrambled
  quasi-Monte Carlo points pushed through the Gaussian inverse CDF coordinate-wise.
* :class:`OrthogonalCoupling` (``orthogonal``): ensembles of :math:`d` exactly
  orthogonal directions under a Haar-random rotation, independent :math:`\chi_d` norms.
* :class:`PairwiseNormCoupling` (``pnc``): orthogonal ensembles whose norms form
  :math:`\lfloor d/2 \rfloor` negative-monotone pairs,
  :math:`F_{\chi_d}(\omega_1) + F_{\chi_d}(\omega_2) = 1` (def:coupled_norms_def).
* :class:`PositiveMonotoneCoupling` (``pm``): orthogonal ensembles whose norms are all
  equal (app:performers).
* :class:`GaussianCopulaCoupling` (``copula``): orthogonal ensembles whose norms follow
  a Gaussian copula with a learnable correlation matrix (app:copulas).
* :class:`AntitheticFrequencyCoupling` (``antithetic`` = ``pnc+antithetic``, or
  ``<base>+antithetic``): every frequency of a base coupling together with its negative
  (thm:antithetic).

When more frequencies than :math:`d` are requested, orthogonal couplings draw
independent ensembles of :math:`d` and keep the first ``num_features`` frequencies.

The interface
-------------
A coupling separates *randomness* from a *deterministic map*:

* :meth:`FrequencyCoupling.sample_noise` draws everything random (rotations, norms,
  standard normals, ...) as numpy arrays from a numpy generator;
* :meth:`FrequencyCoupling.noise_to_frequencies` maps that noise to frequencies with
  torch operations, differentiably in the coupling's parameters.

Kernels store the noise in buffers and call the coupling (``coupling(noise,
num_features)``) in every forward pass, so a learnable coupling (a torch module with
parameters, like the copula) receives gradients, and a saved model reloads exactly.
:meth:`FrequencyCoupling.sample` draws frequencies in one call.

Writing your own coupling
-------------------------
Couplings of orthogonal ensembles only choose how the :math:`d` norms of an ensemble
are coupled: subclass :class:`OrthogonalNormCoupling` and implement
:meth:`~OrthogonalNormCoupling.sample_norms`. For example, norms that mirror the
quantile of the first norm of each ensemble around ``1/2`` for half of it::

    import numpy as np
    from gp_couple.couplings import OrthogonalNormCoupling, chi_ppf, chi_isf

    class HalfMirrored(OrthogonalNormCoupling):
        name = "half-mirrored"

        def sample_norms(self, shape, dim, rng):
            u = rng.random((*shape, 1))
            half = dim // 2
            return np.concatenate([np.repeat(chi_ppf(u, dim), half, -1),
                                   np.repeat(chi_isf(u, dim), dim - half, -1)], -1)

Each norm is :math:`\chi_d` (``1 - u`` is uniform), so estimates stay unbiased.
Setting ``name`` registers the class in :data:`FREQUENCY_COUPLINGS` (see
:mod:`gp_couple.registry`), so it plugs in anywhere a built-in coupling does, by
instance or by name, e.g.
``CoupledRFFKernel(num_features=16, num_dims=8, coupling="half-mirrored")``, and its
``to_dict()`` / :func:`frequency_coupling_from_dict` round-trip through JSON (a coupling
with constructor arguments returns them from ``params()``).
Couplings that also couple directions subclass :class:`FrequencyCoupling` directly.
``tests/couplings/frequency_coupling_mixin.py`` checks the marginals and the
unbiasedness of any coupling.
"""

from __future__ import annotations

import inspect
import math
import warnings
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from scipy import special
from scipy.stats import qmc
from torch import Tensor

from .._deprecation import deprecated_aliases
from .._random import SeedLike, as_numpy_generator
from ..registry import Registered, Registry
from ._checks import check_batch_shape, check_positive_int
from .chi import chi_isf, chi_ppf, chi_quantile, normal_to_chi

__all__ = [
    "FREQUENCY_COUPLINGS",
    "FrequencyCoupling",
    "IIDFrequencyCoupling",
    "HaltonCoupling",
    "SobolCoupling",
    "OrthogonalNormCoupling",
    "OrthogonalCoupling",
    "PairwiseNormCoupling",
    "PositiveMonotoneCoupling",
    "GaussianCopulaCoupling",
    "AntitheticFrequencyCoupling",
    "chi_ppf",
    "chi_isf",
    "chi_quantile",
    "normal_to_chi",
    "random_orthogonal_matrices",
    "get_frequency_coupling",
    "frequency_coupling_from_dict",
    "FREQUENCY_COUPLING_NAMES",
]

Noise = dict[str, Tensor]


# --------------------------------------------------------------------------- orthogonal directions


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


# --------------------------------------------------------------------------- interface


#: Registry of frequency couplings: every subclass with a ``name`` joins it.
FREQUENCY_COUPLINGS: Registry[FrequencyCoupling] = Registry("frequency coupling")


class FrequencyCoupling(torch.nn.Module, Registered, ABC, registry=FREQUENCY_COUPLINGS):
    r"""Interface: a joint law of ``num_features`` frequencies in :math:`\mathbb R^d`.

    Subclasses must keep every frequency marginally :math:`\mathcal N(0, \mathbf I_d)`
    (see the module docstring) and may couple the frequencies of one draw in any way.
    Different draws (batch members) must be independent.

    Implement :meth:`sample_noise` (numpy, all the randomness) and
    :meth:`noise_to_frequencies` (torch, deterministic). A coupling with parameters
    registers them as usual on this :class:`torch.nn.Module`. A subclass that sets
    ``name`` is registered in :data:`FREQUENCY_COUPLINGS`; one with constructor
    arguments returns them from :meth:`params`.
    """

    #: Short name used in reports, JSON and the command line.
    name: ClassVar[str] = "coupling"

    @abstractmethod
    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw the randomness for ``batch_shape`` independent sets of frequencies.

        :param num_features: Number of frequencies :math:`m` per set (validated, >= 1).
        :param dim: Input dimension :math:`d` (validated, >= 1).
        :param batch_shape: Shape of independent draws; every array must lead with it.
        :param rng: Generator to draw from.
        :return: Named float arrays; their shapes must not depend on anything but the
            arguments.
        """

    @abstractmethod
    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        """Map noise from :meth:`sample_noise` (as tensors) to frequencies.

        :return: Tensor of shape ``(*batch_shape, M, dim)`` with ``M >= num_features``;
            only the first ``num_features`` rows are used.
        """

    @property
    def is_learnable(self) -> bool:
        """Whether the frequencies depend on parameters that require gradients."""
        return any(parameter.requires_grad for parameter in self.parameters())

    def draw_noise(self, num_features: int, dim: int, *, batch_shape: Sequence[int] = (),
                   seed: SeedLike = None, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> Noise:
        """Draw noise as tensors (the form kernels keep in buffers).

        :param num_features: Number of frequencies :math:`m \\ge 1`.
        :param dim: Input dimension :math:`d \\ge 1`.
        :param batch_shape: Shape of independent draws.
        :param seed: Seed or generator; the same int seed gives identical noise.
        :param dtype: Floating dtype of the tensors (default: torch's default dtype).
        :param device: Device of the tensors.
        """
        num_features = check_positive_int("num_features", num_features)
        dim = check_positive_int("dim", dim)
        shape = check_batch_shape(batch_shape)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        arrays = self.sample_noise(num_features, dim, shape, as_numpy_generator(seed))
        noise: Noise = {}
        for key, array in arrays.items():
            if not key.isidentifier():
                raise ValueError(f"{type(self).__name__}.sample_noise returned a key {key!r} "
                                 "that is not a valid identifier")
            tensor = torch.as_tensor(np.asarray(array), dtype=dtype, device=device)
            if tuple(tensor.shape[:len(shape)]) != shape:
                raise ValueError(f"{type(self).__name__}.sample_noise returned {key!r} of shape "
                                 f"{tuple(tensor.shape)}, which does not lead with batch_shape {shape}")
            noise[key] = tensor
        return noise

    def forward(self, noise: Mapping[str, Tensor], num_features: int) -> Tensor:
        """Frequencies ``(*batch_shape, num_features, dim)`` from stored noise.

        :param noise: Output of :meth:`draw_noise` (or buffers holding it).
        :param num_features: Number of frequencies to keep.
        """
        num_features = check_positive_int("num_features", num_features)
        frequencies = self.noise_to_frequencies(noise)
        if frequencies.shape[-2] < num_features:
            raise ValueError(f"the noise holds {frequencies.shape[-2]} frequencies but "
                             f"num_features={num_features} were requested: redraw it")
        return frequencies[..., :num_features, :]

    def sample(self, num_features: int, dim: int, *, batch_shape: Sequence[int] = (),
               seed: SeedLike = None, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None) -> Tensor:
        """Draw frequencies of shape ``(*batch_shape, num_features, dim)``.

        Arguments as in :meth:`draw_noise`.
        """
        noise = self.draw_noise(num_features, dim, batch_shape=batch_shape, seed=seed,
                                dtype=dtype, device=device)
        return self(noise, num_features)


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

    engine: ClassVar[type[qmc.QMCEngine]]

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
    engine = qmc.Halton


class SobolCoupling(_QMCCoupling):
    """Scrambled Sobol' sequence through the Gaussian inverse CDF (``scipy.stats.qmc.Sobol``)."""

    name = "sobol"
    engine = qmc.Sobol


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
    r"""Pairwise norm-coupled (PNC) orthogonal frequencies (paper, def:coupled_norms_def).

    Frequencies ``(0, 1), (2, 3), ...`` of each orthogonal ensemble form
    :math:`\lfloor d/2 \rfloor` independent negative-monotone pairs

    .. math::

        F_{\chi_d}(\omega_1) + F_{\chi_d}(\omega_2) = 1
        \quad(\text{eq:negative\_monotone\_coupling}),

    i.e. :math:`\omega_1 = F^{-1}(u)`, :math:`\omega_2 = F^{-1}(1 - u)` with
    :math:`u \sim U(0, 1)`, which solves the two-marginal OT problem for RLFs and, for
    small :math:`\|x - y\|`, for RFFs (thm:pairwise_ot_solution). For odd :math:`d`
    the last frequency of each ensemble keeps an independent norm.
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
    r"""Positive monotone (PM) coupling: all norms of an orthogonal ensemble are equal (app:performers).

    It *maximises* the pointwise kernel-estimator variance but also the covariance
    between estimates, which lowers the error of row-normalised attention.
    """

    name = "pm"

    def sample_norms(self, shape: tuple[int, ...], dim: int,
                     rng: np.random.Generator) -> np.ndarray:
        return np.repeat(chi_ppf(rng.random((*shape, 1)), dim), dim, axis=-1)


class GaussianCopulaCoupling(_OrthogonalEnsembleCoupling):
    r"""Orthogonal ensembles with norms from a learnable Gaussian copula (paper, app:copulas).

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
    :func:`gp_couple.kernels.random_features.fit_coupling` (eq:rmseloss).

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
            given = torch.as_tensor(theta.detach() if isinstance(theta, Tensor) else np.asarray(theta, dtype=np.float64),
                                    dtype=initial.dtype)
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
                                 else correlation.detach().to(torch.float64))
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
    r"""Antithetic frequencies :math:`\{\pm\boldsymbol\omega_i\}` over a base coupling (paper, thm:antithetic).

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
        """Rebuild from :meth:`to_dict` output (the base from its own description)."""
        return cls(FREQUENCY_COUPLINGS.from_dict(data["base"]) if "base" in data else None)

    def sample_noise(self, num_features: int, dim: int, batch_shape: tuple[int, ...],
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.base.sample_noise(-(-num_features // 2), dim, batch_shape, rng)

    def noise_to_frequencies(self, noise: Mapping[str, Tensor]) -> Tensor:
        half = self.base.noise_to_frequencies(noise)
        return torch.stack([half, -half], dim=-2).flatten(-3, -2)


# --------------------------------------------------------------------------- registry

# Its instance name depends on the base ("pnc+antithetic"), so it registers explicitly.
FREQUENCY_COUPLINGS.register(AntitheticFrequencyCoupling, name="antithetic")

_ANTITHETIC_SUFFIX = "+antithetic"

#: The built-in names (a snapshot; ``FREQUENCY_COUPLINGS.names()`` also lists couplings
#: registered later, e.g. by users). Any of them may take the suffix ``+antithetic``.
FREQUENCY_COUPLING_NAMES: tuple[str, ...] = FREQUENCY_COUPLINGS.names()


def get_frequency_coupling(coupling: str | FrequencyCoupling, *,
                           dim: int | None = None) -> FrequencyCoupling:
    """Resolve a registered coupling name (or an instance) to a coupling instance.

    Names: those of :data:`FREQUENCY_COUPLINGS` (built in: ``iid``, ``halton``,
    ``sobol``, ``orthogonal``, ``pnc``, ``pm``, ``copula`` (needs ``dim``),
    ``antithetic`` (= ``pnc+antithetic``)), case-insensitively for the built-in ones,
    and ``<name>+antithetic``.

    :param coupling: Name or instance (returned as is).
    :param dim: Input dimension, passed to couplings whose constructor takes ``dim``
        (``copula``).
    :raises ValueError: For an unknown name (listing the known ones) or a missing ``dim``.
    :raises TypeError: If ``coupling`` is neither a str nor a coupling.
    """
    if isinstance(coupling, FrequencyCoupling):
        return coupling
    if not isinstance(coupling, str):
        raise TypeError(f"coupling must be a str or FrequencyCoupling, got {type(coupling).__name__}")
    spec = coupling.strip()
    if spec not in FREQUENCY_COUPLINGS:
        spec = spec.lower()
    if spec.endswith(_ANTITHETIC_SUFFIX) and spec not in FREQUENCY_COUPLINGS:
        return AntitheticFrequencyCoupling(get_frequency_coupling(spec[: -len(_ANTITHETIC_SUFFIX)], dim=dim))
    if spec not in FREQUENCY_COUPLINGS:
        raise ValueError(f"unknown frequency coupling {coupling!r}; choose from "
                         f"{list(FREQUENCY_COUPLINGS.names())} (optionally with '+antithetic') "
                         "or pass a FrequencyCoupling")
    cls = FREQUENCY_COUPLINGS.get(spec)
    if "dim" in inspect.signature(cls).parameters:
        if dim is None:
            raise ValueError(f"the {spec} coupling needs dim (the input dimension)")
        return cls(dim=dim)  # type: ignore[call-arg]
    return cls()


def frequency_coupling_from_dict(data: dict[str, Any]) -> FrequencyCoupling:
    """Inverse of :meth:`FrequencyCoupling.to_dict` for every registered coupling."""
    return FREQUENCY_COUPLINGS.from_dict(data)


__getattr__ = deprecated_aliases(__name__, {
    "IIDCoupling": ("IIDFrequencyCoupling", lambda: IIDFrequencyCoupling),
    "AntitheticCoupling": ("AntitheticFrequencyCoupling", lambda: AntitheticFrequencyCoupling),
})
