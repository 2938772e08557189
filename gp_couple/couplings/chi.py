r"""The :math:`\chi_d` distribution of frequency norms: quantiles and their differentiable versions.

A standard Gaussian frequency :math:`\boldsymbol\omega \in \mathbb R^d` has a
:math:`\chi_d`-distributed norm, so norm couplings (paper, Section 3 "Random Fourier features and
random Laplace features" [sec:rffs_and_rlfs]) push uniforms or Gaussians through the :math:`\chi_d`
quantile function. SciPy evaluates the quantiles of sampled NumPy noise (:func:`chi_ppf`,
:func:`chi_isf`); :func:`chi_quantile`
and :func:`normal_to_chi` evaluate them in torch on the input's device (Newton's method
on the regularised incomplete gamma function), inside a custom autograd function whose
derivative follows from implicit differentiation of the CDF (appendix on Gaussian
copulas), which learnable couplings need.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy import special
from torch import Tensor

from .._checks import check_positive_int

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
    negative-monotone pair :math:`(F^{-1}(u), F^{-1}(1 - u))` of eq. (7), the negative monotone
    coupling, Section 3.1 [eq:negative_monotone_coupling] without rounding :math:`1 - u`.
    """
    return np.sqrt(2.0 * special.gammainccinv(0.5 * dim, np.asarray(q, dtype=np.float64)))


#: Newton steps of :func:`_gamma_quantile`: five reach float64 accuracy from its start
#: for every degree of freedom tested (1 to 1024, normals in [-12, 12]); fixed, so that
#: no step reads a convergence test back from the device.
_NEWTON_STEPS = 8


def _gamma_quantile(log_target: Tensor, lower: Tensor, shape: float, z: Tensor) -> Tensor:
    r"""Solve :math:`\log P(a, x) = \log u` (``lower``) or :math:`\log Q(a, x) = \log q` for :math:`x`.

    :math:`P` and :math:`Q` are the regularised incomplete gamma functions
    (``torch.special.gammainc`` / ``gammaincc``). Newton's method runs on
    :math:`y = \log x`, where both :math:`\log P` and :math:`\log Q` are concave
    (the log-gamma distribution is log-concave), so it converges from any start;
    it starts from the Wilson-Hilferty approximation
    :math:`x \approx a (1 - c + z\sqrt c)^3,\ c = 1/(9a)` with :math:`z` the normal
    quantile of the target, and in the far lower tail from the lower bound
    :math:`x \ge (u\,\Gamma(a + 1))^{1/a}`.

    :param log_target: :math:`\log u` or :math:`\log q` (float64).
    :param lower: Which equation each entry solves.
    :param shape: :math:`a = d / 2`.
    :param z: Standard-normal quantile of :math:`u` (the start).
    :return: :math:`x` (float64).
    """
    c = 1.0 / (9.0 * shape)
    base = 1.0 - c + z * math.sqrt(c)
    y = torch.log(shape * base.clamp_min(0.1) ** 3)
    y = torch.where(lower & (base < 0.5), (log_target + math.lgamma(shape + 1.0)) / shape, y)
    a = torch.full_like(y, shape)
    sign = torch.where(lower, 1.0, -1.0).to(y.dtype)
    log_gamma = math.lgamma(shape)
    for _ in range(_NEWTON_STEPS):
        x = torch.exp(y)
        log_cdf = torch.log(torch.where(lower, torch.special.gammainc(a, x), torch.special.gammaincc(a, x)))
        # d log P / dy = x p(x) / P with the gamma density p(x) = x^(a-1) e^(-x) / Gamma(a).
        slope = sign * torch.exp(shape * y - x - log_gamma - log_cdf)
        y = y - torch.nan_to_num((log_cdf - log_target) / slope, nan=0.0).clamp(-50.0, 50.0)
    return torch.exp(y)


def _chi_log_density(w: Tensor, dim: int) -> Tensor:
    return ((dim - 1) * torch.log(w) - 0.5 * w**2 - (0.5 * dim - 1.0) * math.log(2.0)
            - math.lgamma(0.5 * dim))


class _QuantileFunction(torch.autograd.Function):
    """Scalar quantile map evaluated in torch on the input's device, with its derivative.

    The derivatives come from implicit differentiation of the CDF, so the solver
    itself is not differentiated; double backward is not supported.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, from_normal: bool) -> Tensor:  # type: ignore[override]
        x64 = x.detach().to(torch.float64)
        if from_normal:
            # Upper half through the survival function: Phi(g) rounds to 1 for g > 8.3.
            lower = x64 <= 0
            z = x64
            log_target = torch.special.log_ndtr(torch.where(lower, x64, -x64))
            log_density_in = -0.5 * x64**2 - 0.5 * math.log(2.0 * math.pi)
        else:
            lower = x64 <= 0.5
            z = torch.special.ndtri(x64)
            log_target = torch.where(lower, torch.log(x64), torch.log1p(-x64))
            log_density_in = torch.zeros_like(x64)
        w = torch.sqrt(2.0 * _gamma_quantile(log_target, lower, 0.5 * dim, z))
        slope = torch.exp(log_density_in - _chi_log_density(w, dim))
        ctx.save_for_backward(slope.to(x.dtype))
        return w.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (slope,) = ctx.saved_tensors
        return grad * slope, None, None


def chi_quantile(u: Tensor, dim: int) -> Tensor:
    r"""Differentiable :math:`w = F_{\chi_d}^{-1}(u)` for a tensor of probabilities.

    .. math::

        \frac{\partial w}{\partial u} = \frac{1}{p_{\chi_d}(w)}

    by implicit differentiation of :math:`F_{\chi_d}(w) = u` (paper, Appendix A.5 "Copulas as
    numerical OT solvers" [app:copulas]).

    :param u: Probabilities in ``(0, 1)``.
    :param dim: Degrees of freedom :math:`d`.
    """
    dim = check_positive_int("dim", dim)
    if not isinstance(u, Tensor):
        raise TypeError(f"u must be a torch.Tensor, got {type(u).__name__}")
    return _QuantileFunction.apply(u, dim, False)


def normal_to_chi(g: Tensor, dim: int) -> Tensor:
    r"""Differentiable :math:`w = F_{\chi_d}^{-1}(\Phi(g))`: standard normals to :math:`\chi_d` variables.

    This is the Gaussian-copula push-forward of Appendix A.5 "Copulas as numerical OT solvers"
    [app:copulas]. The derivative is

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
