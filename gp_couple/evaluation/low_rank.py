r"""Random-feature GP posteriors in low-rank form, batched over draws, in torch.

With a low-rank kernel estimate :math:`\widehat K = \Psi\Psi^\top` (random Fourier or
Laplace features; paper, Appendix B.2 "PNC RFFs for Gaussian processes"
[app:are_predictions_improved?]) and :math:`F \ll n` feature columns, the posterior of
:mod:`gp_couple.evaluation.posterior` is computed through the weight space (Woodbury
identity): every quantity costs :math:`O(nF^2 + tF^2)` per draw, plus :math:`O(t^2 F)`
for the KL to the exact posterior, and whole batches of draws are evaluated at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._arrays import as_float64, check_noise_variance
from .posterior import GaussianPosterior, stable_cholesky

__all__ = ["LowRankGaussianPosterior", "low_rank_posterior"]


@dataclass(frozen=True)
class LowRankGaussianPosterior:
    r"""Batched GP posteriors at test points under a low-rank kernel :math:`\widehat K = \Psi\Psi^\top`.

    The covariance is :math:`c\,I + \Psi_p D^{-1} \Psi_p^\top` with the weight-space
    precision :math:`D = I + \Psi_d^\top\Psi_d / \sigma_n^2` (Bayesian linear regression
    on the features), which equals the covariance :math:`C` of eq. (43), the approximate posterior,
    Appendix B.2 [eq:approx_muandc] (appendix on sparse-spectrum GPs) by the Woodbury identity;
    :math:`c` is the noise variance for the predictive posterior, 0 for the latent one, plus any
    jitter.

    :ivar mean: Posterior means ``(*batch, t)``.
    :ivar test_features: :math:`\Psi_p` ``(*batch, t, F)``.
    :ivar weight_precision_factor: Lower Cholesky factor of :math:`D` ``(*batch, F, F)``.
    :ivar diagonal: :math:`c \ge 0`.
    """

    mean: Tensor
    test_features: Tensor
    weight_precision_factor: Tensor
    diagonal: float

    @property
    def covariance(self) -> Tensor:
        """The dense covariances ``(*batch, t, t)`` (for small problems and tests)."""
        half = torch.linalg.solve_triangular(self.weight_precision_factor, self.test_features.mT, upper=False)
        eye = torch.eye(self.mean.shape[-1], dtype=self.mean.dtype, device=self.mean.device)
        return half.mT @ half + self.diagonal * eye

    def kl_from(self, exact: GaussianPosterior) -> Tensor:
        r""":math:`\mathrm{KL}(p_\mathrm{exact} \,\|\, p_\mathrm{approx})` for every batch member, in nats (total).

        With :math:`\Sigma_q = c(I + \Psi_p (cD)^{-1}\Psi_p^\top)` and
        :math:`B = cD + \Psi_p^\top\Psi_p`:

        .. math::

            \Sigma_q^{-1} = c^{-1}(I - \Psi_p B^{-1}\Psi_p^\top), \qquad
            \log\det\Sigma_q = (t - F)\log c + \log\det B - \log\det D,

        so only :math:`F \times F` systems are factorised.

        :param exact: The exact posterior (dense, the same ``include_noise`` choice).
        :raises ValueError: If :math:`c = 0` with more test points than feature columns
            (the approximate covariance is singular and the KL infinite).
        """
        features = self.test_features
        t, width = features.shape[-2], features.shape[-1]
        if exact.mean.shape != (t,):
            raise ValueError(f"exact posterior has {exact.mean.shape[0]} test points, this one {t}")
        c = self.diagonal
        if c <= 0:
            raise ValueError(
                f"the approximate latent covariance has rank <= {width} < {t} test points, so "
                "KL(exact || approximate) is infinite: use the predictive posterior "
                "(include_noise=True) or a positive jitter")
        dtype, device = features.dtype, features.device
        exact_mean = torch.as_tensor(exact.mean, dtype=dtype, device=device)
        exact_cov = torch.as_tensor(exact.covariance, dtype=dtype, device=device)
        exact_factor, _ = stable_cholesky(exact.covariance, "exact covariance")
        logdet_exact = 2.0 * float(np.sum(np.log(np.diag(exact_factor))))

        precision = self.weight_precision_factor @ self.weight_precision_factor.mT
        inner = c * precision + features.mT @ features
        inner_factor = torch.linalg.cholesky(inner)
        logdet_q = ((t - width) * math.log(c) + _logdet_from_factor(inner_factor)
                    - _logdet_from_factor(self.weight_precision_factor))
        projected_cov = features.mT @ (exact_cov @ features)  # Psi_p^T Sigma_p Psi_p
        trace = (torch.diagonal(exact_cov).sum()
                 - torch.cholesky_solve(projected_cov, inner_factor).diagonal(dim1=-2, dim2=-1).sum(-1)) / c
        delta = self.mean - exact_mean
        projected_delta = (features.mT @ delta.unsqueeze(-1))
        mahalanobis = ((delta * delta).sum(-1)
                       - (projected_delta * torch.cholesky_solve(projected_delta, inner_factor)).sum((-2, -1))) / c
        kl = 0.5 * (trace + mahalanobis - t + logdet_q - logdet_exact)
        # Round-off can leave KL(p || p) a hair below zero.
        return kl.clamp_min(0.0)


def _logdet_from_factor(factor: Tensor) -> Tensor:
    return 2.0 * torch.log(torch.diagonal(factor, dim1=-2, dim2=-1)).sum(-1)


def low_rank_posterior(train_features: Tensor, test_features: Tensor, train_targets: Any,
                       noise_variance: float, *, include_noise: bool = True,
                       jitter: float = 0.0) -> LowRankGaussianPosterior:
    r"""Zero-mean GP posterior under :math:`\widehat K = \Psi\Psi^\top`, batched over draws, in low-rank form.

    The same posterior as :func:`gp_posterior_from_blocks` with the blocks
    :math:`\Psi_d\Psi_d^\top, \Psi_p\Psi_d^\top, \Psi_p\Psi_p^\top` (eq. (43), the approximate
    posterior, Appendix B.2 [eq:approx_muandc], appendix on sparse-spectrum GPs), through the weight
    space:

    .. math::

        D = I + \Psi_d^\top\Psi_d/\sigma_n^2, \qquad
        \mu = \Psi_p D^{-1}\Psi_d^\top y / \sigma_n^2, \qquad
        C = \Psi_p D^{-1} \Psi_p^\top,

    in :math:`O(nF^2)` instead of :math:`O(n^3)`.

    :param train_features: :math:`\Psi_d` ``(*batch, n, F)`` (amplitude included:
        :math:`\sigma_v\phi(x)`).
    :param test_features: :math:`\Psi_p` ``(*batch, t, F)``.
    :param train_targets: :math:`y` ``(n,)``.
    :param noise_variance: :math:`\sigma_n^2 > 0`.
    :param include_noise: Predictive posterior of noisy observations (default) or the
        latent posterior.
    :param jitter: Added to the covariance diagonal (e.g. to compare latent posteriors).
    :raises TypeError: If the features are not floating tensors.
    :raises ValueError: For inconsistent shapes, NaN or infinite features or targets,
        non-positive noise or negative jitter.
    """
    for name, value in (("train_features", train_features), ("test_features", test_features)):
        if not isinstance(value, Tensor) or not value.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
    noise = check_noise_variance(noise_variance)
    if not (math.isfinite(jitter) and jitter >= 0):
        raise ValueError(f"jitter must be finite and non-negative, got {jitter}")
    y = torch.as_tensor(as_float64(train_targets, "train_targets").reshape(-1),
                        dtype=train_features.dtype, device=train_features.device)
    if train_features.shape[-2] != y.numel() or train_features.shape[-1] != test_features.shape[-1]:
        raise ValueError(f"inconsistent shapes: train_features {tuple(train_features.shape)}, "
                         f"test_features {tuple(test_features.shape)}, train_targets ({y.numel()},)")
    width = train_features.shape[-1]
    eye = torch.eye(width, dtype=train_features.dtype, device=train_features.device)
    precision = eye + train_features.mT @ train_features / noise
    factor = torch.linalg.cholesky(precision)
    weights = torch.cholesky_solve((train_features.mT @ y.unsqueeze(-1)) / noise, factor)
    mean = (test_features @ weights).squeeze(-1)
    return LowRankGaussianPosterior(mean=mean, test_features=test_features, weight_precision_factor=factor,
                                    diagonal=(noise if include_noise else 0.0) + float(jitter))
