r"""The :math:`\chi_d` distribution of frequency norms: quantiles and their differentiable versions.

A standard Gaussian frequency :math:`\boldsymbol\omega \in \mathbb R^d` has a
:math:`\chi_d`-distributed norm, so norm couplings (paper, sec:rffs_and_rlfs) push
uniforms or Gaussians through the :math:`\chi_d` quantile function. SciPy evaluates the
quantiles; :func:`chi_quantile` and :func:`normal_to_chi` wrap them in a custom autograd
function whose derivative follows from implicit differentiation of the CDF (appendix on
Gaussian copulas), which learnable couplings need.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy import special
from torch import Tensor

from ._checks import check_positive_int

__all__ = ["chi_ppf", "chi_isf", "chi_quantile", "normal_to_chi"]


def chi_ppf(u: np.ndarray | float, dim: int) -> np.ndarray:
    r"""Quantile function :math:`F_{\chi_d}^{-1}(u)` of the :math:`\chi_d` distribution.

    Equals ``scipy.stats.chi(dim).ppf(u)``, computed as
    :math:`\sqrt{2 P^{-1}(d/2, u)}` with the regularised incomplete gamma inverse, which is
    vectorised C without the per-call overhead of ``scipy.stats``.

    :param u: Probabilities in ``[0, 1]``.
    :param dim: Degrees of freedom :math:`d \ge 1`.
    """
    return np.sqrt(2.0 * special.gammaincinv(0.5 * dim, np.asarray(u, dtype=np.float64)))


def chi_isf(q: np.ndarray | float, dim: int) -> np.ndarray:
    r"""Inverse survival function :math:`F_{\chi_d}^{-1}(1 - q)`, accurate for small ``q``.

    Equals ``scipy.stats.chi(dim).isf(q)``. With :func:`chi_ppf` it gives the
    negative-monotone pair :math:`(F^{-1}(u), F^{-1}(1 - u))` of eq:negative_monotone_coupling
    without rounding :math:`1 - u`.
    """
    return np.sqrt(2.0 * special.gammainccinv(0.5 * dim, np.asarray(q, dtype=np.float64)))


def _chi_logpdf(w: np.ndarray, dim: int) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return ((dim - 1) * np.log(w) - 0.5 * w**2 - (0.5 * dim - 1.0) * math.log(2.0)
                - special.gammaln(0.5 * dim))


def _normal_to_chi_numpy(g: np.ndarray, dim: int) -> np.ndarray:
    # Upper half through the survival function: Phi(g) rounds to 1 for g > 8.3.
    lower = g <= 0
    w = np.empty_like(g)
    w[lower] = chi_ppf(special.ndtr(g[lower]), dim)
    w[~lower] = chi_isf(special.ndtr(-g[~lower]), dim)
    return w


class _QuantileFunction(torch.autograd.Function):
    """Scalar quantile map evaluated by scipy, with a derivative computed alongside it.

    The derivatives come from implicit differentiation of the CDF, so only the forward
    value needs scipy; double backward is not supported.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, from_normal: bool) -> Tensor:  # type: ignore[override]
        x64 = x.detach().cpu().to(torch.float64).numpy()
        if from_normal:
            w = _normal_to_chi_numpy(x64, dim)
            log_density_in = -0.5 * x64**2 - 0.5 * math.log(2.0 * math.pi)
        else:
            w = chi_ppf(x64, dim)
            log_density_in = np.zeros_like(x64)
        with np.errstate(over="ignore"):
            slope = np.exp(log_density_in - _chi_logpdf(w, dim))
        ctx.save_for_backward(torch.from_numpy(slope).to(device=x.device, dtype=x.dtype))
        return torch.from_numpy(w).to(device=x.device, dtype=x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (slope,) = ctx.saved_tensors
        return grad * slope, None, None


def chi_quantile(u: Tensor, dim: int) -> Tensor:
    r"""Differentiable :math:`w = F_{\chi_d}^{-1}(u)` for a tensor of probabilities.

    .. math::

        \frac{\partial w}{\partial u} = \frac{1}{p_{\chi_d}(w)}

    by implicit differentiation of :math:`F_{\chi_d}(w) = u` (paper, app:copulas).

    :param u: Probabilities in ``(0, 1)``.
    :param dim: Degrees of freedom :math:`d`.
    """
    dim = check_positive_int("dim", dim)
    if not isinstance(u, Tensor):
        raise TypeError(f"u must be a torch.Tensor, got {type(u).__name__}")
    return _QuantileFunction.apply(u, dim, False)


def normal_to_chi(g: Tensor, dim: int) -> Tensor:
    r"""Differentiable :math:`w = F_{\chi_d}^{-1}(\Phi(g))`: standard normals to :math:`\chi_d` variables.

    This is the Gaussian-copula push-forward of app:copulas. The derivative is

    .. math::

        \frac{\partial w}{\partial g} = \frac{\varphi(g)}{p_{\chi_d}(w)},

    evaluated as a ratio of log-densities, and the upper tail goes through the survival
    function, so both stay accurate for large :math:`|g|`.

    :param g: Standard-normal variables (any shape).
    :param dim: Degrees of freedom :math:`d`.
    """
    dim = check_positive_int("dim", dim)
    if not isinstance(g, Tensor):
        raise TypeError(f"g must be a torch.Tensor, got {type(g).__name__}")
    return _QuantileFunction.apply(g, dim, True)
