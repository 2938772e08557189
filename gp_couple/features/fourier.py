r"""Random Fourier and random Laplace feature maps for the Gaussian kernel (paper, Section 3 "Random
Fourier features and random Laplace features" [sec:rffs_and_rlfs]).

Both maps estimate

.. math::

    k(\boldsymbol x, \boldsymbol y) = \exp(-\|\boldsymbol x - \boldsymbol y\|^2 / 2)
    \approx \phi(\boldsymbol x)^\top \phi(\boldsymbol y)

without bias when every frequency is marginally :math:`\mathcal N(0, \mathbf I_d)`,
however the frequencies are coupled (:mod:`gp_couple.couplings.frequencies`). For a
lengthscale :math:`\ell`, apply the maps to :math:`\boldsymbol x / \ell`.

All functions are torch operations, differentiable in the inputs, the frequencies and
the optional ``lengthscale``, and broadcast over leading batch dimensions: inputs
``(..., n, d)`` and frequencies ``(..., m, d)`` give features ``(..., n, F)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "random_fourier_features",
    "random_laplace_features",
    "softmax_kernel_features",
    "gaussian_kernel",
    "feature_map",
    "num_feature_columns",
    "check_finite_inputs",
    "FEATURE_MAPS",
]


def _check_inputs(x: Tensor, name: str, check_finite: bool = True) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., n, d), got {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if check_finite:
        check_finite_inputs(x, name)


def check_finite_inputs(x: Tensor, name: str) -> None:
    """Raise if ``x`` holds NaN or infinite values (reads one flag back from the device).

    :raises ValueError: Naming ``name``.
    """
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def _check(x: Tensor, frequencies: Tensor, lengthscale: Tensor | float | None,
           name: str = "x", check_finite: bool = True) -> tuple[Tensor, Tensor, Tensor | float | None]:
    _check_inputs(x, name, check_finite)
    if not isinstance(frequencies, Tensor):
        raise TypeError(f"frequencies must be a torch.Tensor, got {type(frequencies).__name__}")
    if frequencies.dim() < 2:
        raise ValueError(f"frequencies must have shape (..., m, d), got {tuple(frequencies.shape)}")
    if x.shape[-1] != frequencies.shape[-1]:
        raise ValueError(f"{name} has {x.shape[-1]} input dimensions but the frequencies have "
                         f"{frequencies.shape[-1]}")
    dtype = torch.promote_types(x.dtype, frequencies.dtype)
    if lengthscale is not None:
        if isinstance(lengthscale, Tensor):
            if lengthscale.dim() >= 1 and lengthscale.shape[-1] not in (1, x.shape[-1]):
                raise ValueError(f"lengthscale has {lengthscale.shape[-1]} entries but the inputs have "
                                 f"{x.shape[-1]} dimensions")
            lengthscale = lengthscale.to(dtype)
        elif not (isinstance(lengthscale, (int, float)) and math.isfinite(lengthscale) and lengthscale > 0):
            raise ValueError(f"lengthscale must be positive and finite, got {lengthscale}")
    return x.to(dtype), frequencies.to(dtype), lengthscale


def _projections(x: Tensor, frequencies: Tensor, lengthscale: Tensor | float | None) -> Tensor:
    # (x / l) w^T = x (w / l)^T: scaling the m x d frequencies is cheaper than the n x d
    # inputs, in the forward and the backward pass.
    scaled = frequencies if lengthscale is None else frequencies / lengthscale
    return x @ scaled.mT


def random_fourier_features(x: Tensor, frequencies: Tensor,
                            lengthscale: Tensor | float | None = None, *, check_finite: bool = True) -> Tensor:
    r"""Random Fourier features (paper, eq. (3), the RFF map, Section 3 [eq:rff_exp]).

    .. math::

        \phi_\mathrm{RFF}(\boldsymbol x) = \sqrt{\tfrac1m}\,
        \big[\sin(\boldsymbol\omega_i^\top \boldsymbol x)\big]_{i=1}^m \odot
        \big[\cos(\boldsymbol\omega_i^\top \boldsymbol x)\big]_{i=1}^m,

    the paper's map with the sines and cosines grouped (the order of features does not
    change :math:`\phi^\top\phi`), so
    :math:`\phi(\boldsymbol x)^\top\phi(\boldsymbol y)
    = \frac1m \sum_i \cos(\boldsymbol\omega_i^\top(\boldsymbol x - \boldsymbol y))`.

    :param x: Inputs ``(..., n, d)``.
    :param frequencies: Frequencies ``(..., m, d)``.
    :param lengthscale: Optional lengthscale: the map is applied to :math:`\boldsymbol x / \ell`.
        A float or a tensor shaped like gpytorch's (``(..., 1, d)`` or ``(..., 1, 1)``).
    :param check_finite: Check that ``x`` is finite (a host synchronisation on an
        accelerator); callers that checked these inputs already pass ``False``.
    :return: Features ``(..., n, 2m)``.
    """
    x, frequencies, lengthscale = _check(x, frequencies, lengthscale, check_finite=check_finite)
    projections = _projections(x, frequencies, lengthscale)
    features = torch.cat([torch.sin(projections), torch.cos(projections)], dim=-1)
    # In place: neither cat nor a scalar product needs this tensor for its backward.
    return features.mul_(1.0 / math.sqrt(frequencies.shape[-2]))


def _positive_features(x: Tensor, frequencies: Tensor, lengthscale: Tensor | float | None,
                       norm_weight: float, check_finite: bool) -> Tensor:
    r""":math:`m^{-1/2}\exp(\boldsymbol\omega^\top\boldsymbol x - c\|\boldsymbol x\|^2)`
    on :math:`\boldsymbol x / \ell`."""
    x, frequencies, lengthscale = _check(x, frequencies, lengthscale, check_finite=check_finite)
    scaled = x if lengthscale is None else x / lengthscale
    # Prefactors folded into the exponent: no overflow of exp(w.x) for large inputs, and
    # no extra n x m product.
    offset = norm_weight * (scaled * scaled).sum(-1, keepdim=True) + 0.5 * math.log(frequencies.shape[-2])
    return torch.exp(_projections(x, frequencies, lengthscale) - offset)


def random_laplace_features(x: Tensor, frequencies: Tensor,
                            lengthscale: Tensor | float | None = None, *, check_finite: bool = True) -> Tensor:
    r"""Random Laplace (positive) features (paper, eq. (4), the RLF map, Section 3 [eq:rlf_exp]).

    .. math::

        \phi_\mathrm{RLF}(\boldsymbol x) = \sqrt{\tfrac1m}\, \exp(-\|\boldsymbol x\|^2)
        \big[\exp(\boldsymbol\omega_i^\top \boldsymbol x)\big]_{i=1}^m,

    unbiased for the Gaussian kernel because
    :math:`\mathbb E\exp(\boldsymbol\omega^\top(\boldsymbol x + \boldsymbol y))
    = \exp(\|\boldsymbol x + \boldsymbol y\|^2/2)`.
    Every estimate is positive.

    :param x: Inputs ``(..., n, d)``.
    :param frequencies: Frequencies ``(..., m, d)``.
    :param lengthscale: Optional lengthscale, as in :func:`random_fourier_features`.
    :param check_finite: As in :func:`random_fourier_features`.
    :return: Features ``(..., n, m)``.
    """
    return _positive_features(x, frequencies, lengthscale, 1.0, check_finite)


def softmax_kernel_features(x: Tensor, frequencies: Tensor,
                            lengthscale: Tensor | float | None = None, *, check_finite: bool = True) -> Tensor:
    r"""Positive random features of the softmax kernel :math:`\exp(\boldsymbol x^\top \boldsymbol y)` (Performers).

    .. math::

        \phi_\mathrm{SM}(\boldsymbol x) = \exp(\|\boldsymbol x\|^2 / 2)\,\phi_\mathrm{RLF}(\boldsymbol x)
        = \sqrt{\tfrac1m}\big[\exp(\boldsymbol\omega_i^\top\boldsymbol x - \|\boldsymbol x\|^2/2)\big]_{i=1}^m,

    the features Appendix B.3 "Norm-coupled RLFs in Performers" [app:performers] uses for attention
    :math:`a_{ij} = k(\boldsymbol x_i, \boldsymbol x_j) / \sum_l k(\boldsymbol x_i, \boldsymbol x_l)`.

    :param x: Queries or keys ``(..., n, d)``.
    :param frequencies: Frequencies ``(..., m, d)``.
    :param lengthscale: Optional lengthscale, as in :func:`random_fourier_features`.
    :param check_finite: As in :func:`random_fourier_features`.
    :return: Features ``(..., n, m)``.
    """
    return _positive_features(x, frequencies, lengthscale, 0.5, check_finite)


def gaussian_kernel(x1: Tensor, x2: Tensor | None = None) -> Tensor:
    r"""Exact Gaussian kernel :math:`\exp(-\|\boldsymbol x - \boldsymbol y\|^2/2)`, the estimators' target.

    :param x1: Inputs ``(..., n, d)``.
    :param x2: Inputs ``(..., p, d)`` (default ``x1``).
    :return: Gram matrix ``(..., n, p)``.
    """
    _check_inputs(x1, "x1")
    if x2 is None:
        x2 = x1
    else:
        _check_inputs(x2, "x2")
        if x1.shape[-1] != x2.shape[-1]:
            raise ValueError(f"x1 and x2 have different input dimensions: {x1.shape[-1]} vs {x2.shape[-1]}")
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    # The direct (not matrix-product) distance keeps k(x, x) = 1 exactly.
    distances = torch.cdist(x1.to(dtype), x2.to(dtype), compute_mode="donot_use_mm_for_euclid_dist")
    return torch.exp(-0.5 * distances.square())


#: Feature maps by name: ``"rff"`` and ``"rlf"``; called as
#: ``fmap(x, frequencies, lengthscale=None, *, check_finite=True)``.
FEATURE_MAPS: dict[str, Callable[..., Tensor]] = {
    "rff": random_fourier_features,
    "rlf": random_laplace_features,
}


def feature_map(name: str) -> Callable[..., Tensor]:
    """The feature map called ``name`` (``"rff"`` or ``"rlf"``)."""
    if not isinstance(name, str):
        raise TypeError(f"feature map name must be a str, got {type(name).__name__}")
    try:
        return FEATURE_MAPS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown feature map {name!r}; choose from {sorted(FEATURE_MAPS)}") from None


def num_feature_columns(name: str, num_frequencies: int) -> int:
    """Number of feature columns of map ``name`` with ``num_frequencies`` frequencies."""
    feature_map(name)
    return 2 * num_frequencies if name.lower() == "rff" else num_frequencies
