r"""Gaussian-process posteriors from Gram matrices (dense, float64 NumPy) and the Gaussian KL divergence.

The paper compares the posterior computed with an estimated Gram matrix
:math:`\widehat K` to the exact one (Appendix B.2 "PNC RFFs for Gaussian processes"
[app:are_predictions_improved?], eq. (43), the approximate posterior, Appendix B.2
[eq:approx_muandc]):

.. math::

    \mu = \widehat K_{pd}(\widehat K_{dd} + \sigma_n^2 I)^{-1} y, \qquad
    C = \widehat K_{pp} - \widehat K_{pd}(\widehat K_{dd} + \sigma_n^2 I)^{-1}\widehat K_{dp},

and reports :math:`\mathrm{KL}(p_\mathrm{exact} \,\|\, p_\mathrm{approx})` over the test
points with full covariances, as a total (not per point), in float64.

Two posteriors, chosen with ``include_noise``:

* the **latent** posterior of :math:`f` at the test points (``include_noise=False``):
  the covariance :math:`C` above, exactly the paper's equation for the approximate mean
  and covariance (appendix on sparse-spectrum GPs, eq. (43), the approximate posterior, Appendix B.2
  [eq:approx_muandc]);
* the **predictive** posterior of noisy test observations (``include_noise=True``, the
  default): :math:`C + \sigma_n^2 I`.

The means agree. With :math:`m` random features the approximate latent covariance has
rank at most :math:`F` (the number of feature columns), so at more than :math:`F`
test points it is singular and :math:`\mathrm{KL}(p_\mathrm{exact} \| p_\mathrm{approx})`
of the latent posteriors is infinite; a finite latent KL needs a stated jitter on both
covariances (``jitter`` of :func:`~gp_couple.evaluation.low_rank.low_rank_posterior`).

The same posteriors for trained models are in :mod:`gp_couple.evaluation.trained_posterior`,
and for random features, in low-rank form, in :mod:`gp_couple.evaluation.low_rank`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla
import torch

from .._nodes import node_index_array
from ._arrays import as_float64, check_noise_variance
from .sources import gram_source

__all__ = ["Conditioning", "GaussianPosterior", "JITTER_LEVELS", "gaussian_kl", "gp_posterior",
           "gp_posterior_from_blocks", "posterior_kl", "stable_cholesky"]

#: Relative jitter levels tried, in order, when a covariance is not numerically PD.
JITTER_LEVELS = (0.0, 1e-12, 1e-10, 1e-8, 1e-6)


@dataclass(frozen=True)
class GaussianPosterior:
    """A multivariate Gaussian over test points."""

    mean: np.ndarray
    covariance: np.ndarray

    @property
    def variance(self) -> np.ndarray:
        """Marginal variances (the covariance diagonal)."""
        return np.diag(self.covariance).copy()


def stable_cholesky(matrix: np.ndarray, name: str = "matrix") -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of a symmetric matrix, adding the least jitter that works.

    :return: The factor and the absolute jitter added to the diagonal (0 if none).
    :raises ValueError: If the matrix has NaN or infinite entries, or is not PD even with
        the largest jitter level.
    """
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} contains NaN or infinite values")
    # torch's LAPACK: OpenBLAS's threaded potrf (scipy, numpy) slows down several times over
    # on cores shared with other work.
    symmetric = torch.from_numpy(0.5 * (matrix + matrix.T))
    scale = float(symmetric.diagonal().abs().mean()) or 1.0
    for level in JITTER_LEVELS:
        jitter = level * scale
        factor, info = torch.linalg.cholesky_ex(symmetric + jitter * torch.eye(len(symmetric), dtype=symmetric.dtype))
        if int(info):
            continue
        factor = factor.numpy()
        if jitter > 0:
            warnings.warn(f"{name} was not numerically positive definite; added jitter {jitter:.3g}",
                          RuntimeWarning, stacklevel=3)
        return factor, jitter
    raise ValueError(f"{name} is not positive definite (even with relative jitter {JITTER_LEVELS[-1]})")


@dataclass(frozen=True)
class Conditioning:
    r"""The training block factored once (:meth:`of`), for the posterior at any test points.

    :math:`L L^\top = K_{dd} + \sigma_n^2 I` and :math:`\alpha = (K_{dd} + \sigma_n^2 I)^{-1} y`.
    """

    factor: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, train_train: np.ndarray, targets: np.ndarray, noise: float) -> Conditioning:
        factor, _ = stable_cholesky(train_train + noise * np.eye(len(targets)), "K_dd + noise I")
        return cls(factor, sla.cho_solve((factor, True), targets))

    def project(self, test_train: np.ndarray) -> np.ndarray:
        r""":math:`L^{-1} K_{dp}`, whose Gram matrix is the variance explained by the data."""
        return sla.solve_triangular(self.factor, test_train.T, lower=True)


def gp_posterior_from_blocks(train_train: Any, test_train: Any, test_test: Any, train_targets: Any,
                             noise_variance: float, *, include_noise: bool = True) -> GaussianPosterior:
    r"""Zero-mean GP posterior at test points from the three Gram blocks.

    :param train_train: :math:`K_{dd}` (n x n).
    :param test_train: :math:`K_{pd}` (t x n).
    :param test_test: :math:`K_{pp}` (t x t).
    :param train_targets: Training targets :math:`y` (n,).
    :param noise_variance: Likelihood noise :math:`\sigma_n^2 > 0`.
    :param include_noise: Add :math:`\sigma_n^2 I` to the covariance (the predictive
        distribution of noisy test observations); ``False`` gives the latent posterior.
    """
    k_dd = as_float64(train_train, "train_train")
    k_pd = as_float64(test_train, "test_train")
    k_pp = as_float64(test_test, "test_test")
    y = as_float64(train_targets, "train_targets").reshape(-1)
    noise = check_noise_variance(noise_variance)
    n, t = len(y), k_pp.shape[0]
    if k_dd.shape != (n, n) or k_pd.shape != (t, n) or k_pp.shape != (t, t):
        raise ValueError(
            f"inconsistent block shapes: train_train {k_dd.shape}, test_train {k_pd.shape}, "
            f"test_test {k_pp.shape}, train_targets ({n},)")
    if not np.all(np.isfinite(y)):
        raise ValueError("train_targets contain NaN or infinite values")
    conditioning = Conditioning.of(k_dd, y, noise)
    projected = conditioning.project(k_pd)
    covariance = k_pp - projected.T @ projected
    if include_noise:
        covariance = covariance + noise * np.eye(t)
    return GaussianPosterior(mean=k_pd @ conditioning.weights, covariance=0.5 * (covariance + covariance.T))


def gp_posterior(gram: Any, train_nodes: Any, test_nodes: Any, train_targets: Any,
                 noise_variance: float, *, include_noise: bool = True) -> GaussianPosterior:
    """Zero-mean GP posterior from a Gram matrix over all points.

    Only the three blocks at the training and test points are read (and made dense),
    so ``gram`` may be a lazy operator or a kernel over a large graph.

    :param gram: Gram matrix over all points (N x N): array, tensor, scipy sparse, a
        linear operator, a gpytorch kernel on node indices or a trained ExactGP (its
        kernel; see :func:`gp_couple.evaluation.sources.gram_source`).
    :param train_nodes: Integer indices of the training points.
    :param test_nodes: Integer indices of the test points.
    :param train_targets: Targets at ``train_nodes``.
    :param noise_variance: Likelihood noise variance.
    :param include_noise: See :func:`gp_posterior_from_blocks`.
    """
    source = gram_source(gram)
    train = node_index_array(train_nodes, "train_nodes", source.size, allow_empty=True)
    test = node_index_array(test_nodes, "test_nodes", source.size, allow_empty=True)
    return gp_posterior_from_blocks(source.block(train, train), source.block(test, train),
                                    source.block(test, test), train_targets, noise_variance,
                                    include_noise=include_noise)


def gaussian_kl(mean_p: Any, cov_p: Any, mean_q: Any, cov_q: Any) -> float:
    r""":math:`\mathrm{KL}(\mathcal N(\mu_p, \Sigma_p) \,\|\, \mathcal N(\mu_q, \Sigma_q))` in float64.

    .. math::

        \tfrac12\left[\mathrm{tr}(\Sigma_q^{-1}\Sigma_p) + (\mu_q - \mu_p)^\top \Sigma_q^{-1}
        (\mu_q - \mu_p) - k + \log\det\Sigma_q - \log\det\Sigma_p\right]

    Computed through Cholesky factors; a covariance that is not numerically positive
    definite gets the smallest jitter that makes it so (with a warning).
    """
    mu_p = as_float64(mean_p, "mean_p").reshape(-1)
    mu_q = as_float64(mean_q, "mean_q").reshape(-1)
    s_p = as_float64(cov_p, "cov_p")
    s_q = as_float64(cov_q, "cov_q")
    k = mu_p.size
    if mu_q.size != k or s_p.shape != (k, k) or s_q.shape != (k, k):
        raise ValueError(f"inconsistent shapes: means {mu_p.shape}, {mu_q.shape}; "
                         f"covariances {s_p.shape}, {s_q.shape}")
    l_p, _ = stable_cholesky(s_p, "cov_p")
    l_q, _ = stable_cholesky(s_q, "cov_q")
    whitened = sla.solve_triangular(l_q, l_p, lower=True)
    trace_term = float(np.sum(whitened**2))
    delta = sla.solve_triangular(l_q, mu_q - mu_p, lower=True)
    logdet_q = 2.0 * float(np.sum(np.log(np.diag(l_q))))
    logdet_p = 2.0 * float(np.sum(np.log(np.diag(l_p))))
    kl = 0.5 * (trace_term + float(delta @ delta) - k + logdet_q - logdet_p)
    if kl < -1e-8 * max(k, 1):
        raise ValueError(f"KL divergence came out negative ({kl:.3g}): covariances are too "
                         "ill-conditioned for a float64 evaluation")
    # Round-off can leave KL(p || p) a hair below zero.
    return max(kl, 0.0)


def posterior_kl(exact: GaussianPosterior, approximate: GaussianPosterior) -> float:
    r""":math:`\mathrm{KL}(p_\mathrm{exact} \,\|\, p_\mathrm{approx})`, the direction the paper reports."""
    return gaussian_kl(exact.mean, exact.covariance, approximate.mean, approximate.covariance)
