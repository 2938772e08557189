r"""Chebyshev expansions of graph kernels: coefficients and the truncation bound.

Every kernel family of :mod:`gp_couple.kernel_families` is a function
:math:`g_\theta(\widetilde{\mathbf W})` of the normalised adjacency, whose eigenvalues lie in
:math:`[-1, 1]` (paper, section on graph node kernels, eq. for the normalised Laplacian).
Its Chebyshev expansion

.. math::

    g_\theta(\lambda) \approx \sum_{j=0}^{J} c_j(\theta)\, T_j(\lambda)

has coefficients computed here from :math:`g_\theta` at Chebyshev points (a discrete
cosine transform, differentiable in :math:`\theta`). Because :math:`|T_j(\lambda)| \le 1`
on :math:`[-1, 1]`, dropping the terms :math:`j > J` changes the kernel matrix by at most
:math:`\sum_{j > J}|c_j|` in operator norm; :func:`chebyshev_expansion` chooses the degree
:math:`J` from that bound. Nothing here touches a graph: the recurrences that apply the
expansion are in :mod:`gp_couple.operators.chebyshev_basis`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int
from ..kernel_families import KernelFamily

__all__ = ["ChebyshevExpansion", "DEFAULT_MAX_DEGREE", "DEFAULT_TOLERANCE", "MIN_TOLERANCE", "check_tolerance",
           "chebyshev_coefficients", "chebyshev_expansion", "chebyshev_points"]

#: Default relative truncation tolerance of :func:`chebyshev_expansion`.
DEFAULT_TOLERANCE = 1e-8
#: Default largest Chebyshev degree before :func:`chebyshev_expansion` gives up.
DEFAULT_MAX_DEGREE = 2000
#: Smallest tolerance accepted: float64 coefficients carry rounding noise of about this size.
MIN_TOLERANCE = 1e-14
#: Interpolation points of the first resolution attempt (doubled until resolved).
_FIRST_POINTS = 32


def chebyshev_coefficients(values: Tensor) -> Tensor:
    r"""Chebyshev coefficients of the interpolant through values at the first-kind points.

    For :math:`g_k = g(x_k)`, :math:`x_k = \cos(\pi(k + \tfrac12)/M)`, :math:`k < M`,

    .. math::

        c_j = \frac{2 - \delta_{j0}}{M}\sum_{k=0}^{M-1} g_k \cos\frac{\pi j (k + \frac12)}{M},

    a DCT-II computed with one FFT of length :math:`2M` (differentiable, batched over
    leading dimensions, on any device). Exact for polynomials of degree below :math:`M`.

    :param values: :math:`g(x_0), \dots, g(x_{M-1})` along the last dimension.
    :return: :math:`c_0, \dots, c_{M-1}`, same shape.
    """
    num_points = values.shape[-1]
    spectrum = torch.fft.fft(values, n=2 * num_points, dim=-1)[..., :num_points]
    j = torch.arange(num_points, dtype=values.dtype, device=values.device)
    shift = torch.polar(torch.ones_like(j), -math.pi * j / (2 * num_points))
    weights = torch.full_like(j, 2.0 / num_points)
    weights[0] = 1.0 / num_points
    return (spectrum * shift).real * weights


def chebyshev_points(num_points: int, dtype: torch.dtype = torch.float64,
                     device: torch.device | str | None = None) -> Tensor:
    r"""First-kind Chebyshev points :math:`\cos(\pi(k + \tfrac12)/M)`, :math:`k = 0, \dots, M - 1`."""
    k = torch.arange(num_points, dtype=torch.float64, device=device)
    return torch.cos(math.pi * (k + 0.5) / num_points).to(dtype)


@dataclass(frozen=True)
class ChebyshevExpansion:
    r"""A graph kernel truncated to :math:`\sum_{j \le J} c_j T_j(\widetilde{\mathbf W})`.

    :ivar coefficients: :math:`c_0, \dots, c_J`, shape ``(*batch, J + 1)`` (float64,
        differentiable in the hyperparameters).
    :ivar tail_bound: Per batch entry, a bound on the operator-norm error
        :math:`\|\mathbf K - \mathbf K_J\|_2`: :math:`\sum_{j > J}|c_j|` plus the
        interpolation error of the :math:`M`-point interpolant, estimated as twice the
        mass of its upper half :math:`\sum_{j \ge M/2}|c_j|` (which the resolution check
        keeps below ``tolerance / 8`` of the scale).
    :ivar scale: :math:`\sum_j |c_j|` per batch entry (at least :math:`\|\mathbf K\|_2`).
    :ivar tolerance: The relative tolerance the degree was chosen for.
    """

    coefficients: Tensor
    tail_bound: Tensor
    scale: Tensor
    tolerance: float

    @property
    def degree(self) -> int:
        """The polynomial degree :math:`J`."""
        return self.coefficients.shape[-1] - 1

    @property
    def relative_bound(self) -> Tensor:
        r""":math:`\sum_{j > J}|c_j| / \sum_j |c_j|` per batch entry (at most ``tolerance``)."""
        return self.tail_bound / self.scale

    def to_dict(self) -> dict[str, Any]:
        """Degree and bounds as plain numbers (lists when batched), for reports."""
        def plain(tensor: Tensor) -> Any:
            flat = tensor.detach().reshape(-1).tolist()
            return flat[0] if len(flat) == 1 else flat

        return {"degree": self.degree, "tolerance": self.tolerance,
                "tail_bound": plain(self.tail_bound), "relative_bound": plain(self.relative_bound)}


def check_tolerance(tolerance: Any, max_degree: Any) -> tuple[float, int]:
    """Validate the truncation settings (public edge of the matrix-free kernel)."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.integer, np.floating)):
        raise TypeError(f"tolerance must be a float, got {type(tolerance).__name__}")
    if not MIN_TOLERANCE <= float(tolerance) < 1:
        raise ValueError(f"tolerance must lie in [{MIN_TOLERANCE:g}, 1), got {tolerance}")
    return float(tolerance), check_int("max_degree", max_degree, 1)


def chebyshev_expansion(kernel_family: KernelFamily, tolerance: float = DEFAULT_TOLERANCE,
                        max_degree: int = DEFAULT_MAX_DEGREE) -> ChebyshevExpansion:
    r"""Chebyshev expansion of a graph kernel, truncated at a stated relative tolerance.

    :math:`g_\theta` (:meth:`~gp_couple.kernel_families.KernelFamily.spectrum`) is
    interpolated at :math:`M = 32, 64, \dots` first-kind points until the upper half of
    the coefficients is negligible (below ``tolerance / 8`` of :math:`\sum_j|c_j|`), and
    the degree is the smallest :math:`J` with

    .. math::

        \sum_{j > J} |c_j| + 2\sum_{j \ge M/2}|c_j| \le \mathrm{tol} \sum_j |c_j|,

    the largest over a hyperparameter batch (the second sum estimates the interpolation
    error; the left-hand side is reported as :attr:`ChebyshevExpansion.tail_bound`).
    Polynomial families (p-step random walk, :class:`~gp_couple.kernel_families.PowerSeries`)
    are reproduced exactly at their degree;
    for analytic ones the Chebyshev series converges at least as fast as the Taylor
    series in :math:`\widetilde{\mathbf W}` (the regularised Laplacian needs
    :math:`J \approx \log(1/\mathrm{tol})\,/\,\sqrt{2/\sigma^2}` instead of
    :math:`\log(1/\mathrm{tol})\,\sigma^2`). The degree is chosen without gradients; the
    returned coefficients are differentiable in the hyperparameters.

    :param kernel_family: The kernel family (any batch shape).
    :param tolerance: Relative tolerance in ``[1e-14, 1)``.
    :param max_degree: Largest degree allowed.
    :return: The truncated expansion, float64.
    :raises ValueError: If the kernel needs a degree above ``max_degree`` (e.g. a
        regularised Laplacian with huge :math:`\sigma`, whose spectrum has a pole just
        outside :math:`[-1, 1]`), or its spectrum is not finite.
    """
    if not isinstance(kernel_family, KernelFamily):
        raise TypeError(f"kernel_family must be a KernelFamily, got {type(kernel_family).__name__}")
    tolerance, max_degree = check_tolerance(tolerance, max_degree)
    device = _family_device(kernel_family)
    resolution = max(tolerance / 8, 16 * torch.finfo(torch.float64).eps)
    num_points = _FIRST_POINTS
    while True:
        points = chebyshev_points(num_points, device=device)
        with torch.no_grad():
            values = kernel_family.spectrum(points).to(torch.float64)
            if not bool(torch.isfinite(values).all()):
                raise ValueError(f"{_describe(kernel_family)} has a non-finite spectrum on [-1, 1]")
            magnitudes = chebyshev_coefficients(values).abs()
            scale = magnitudes.sum(-1)
            unresolved = magnitudes[..., num_points // 2:].sum(-1) > resolution * scale
        if not bool(unresolved.any()):
            break
        if num_points // 2 > max_degree:
            raise ValueError(
                f"{_describe(kernel_family)} needs a Chebyshev degree above max_degree={max_degree} to reach "
                f"tolerance={tolerance:g} (its spectrum varies too fast on [-1, 1]); raise max_degree "
                "or the tolerance, or use the dense ExactGraphKernel")
        num_points *= 2
    # tails[..., J] = sum_{j > J} |c_j| + the interpolation error, estimated (for decaying
    # coefficients, generously) by twice the mass of the upper half.
    tails = magnitudes.flip(-1).cumsum(-1).flip(-1).roll(-1, dims=-1)
    tails[..., -1] = 0
    tails = tails + 2 * magnitudes[..., num_points // 2:].sum(-1, keepdim=True)
    enough = (tails <= tolerance * scale.unsqueeze(-1)).reshape(-1, num_points).all(0)
    degree = int(torch.nonzero(enough)[0])
    if degree > max_degree:
        raise ValueError(
            f"{_describe(kernel_family)} needs Chebyshev degree {degree} > max_degree={max_degree} for "
            f"tolerance={tolerance:g}; raise max_degree or the tolerance")
    coefficients = chebyshev_coefficients(kernel_family.spectrum(points).to(torch.float64))[..., :degree + 1]
    return ChebyshevExpansion(coefficients, tails[..., degree], scale, tolerance)


def _describe(kernel_family: KernelFamily) -> str:
    return f"{type(kernel_family).__name__}({kernel_family.extra_repr()})"


def _family_device(kernel_family: KernelFamily) -> torch.device:
    for tensor in list(kernel_family.parameters()) + list(kernel_family.buffers()):
        return tensor.device
    return torch.device("cpu")
