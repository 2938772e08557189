r"""Gaussian-process posteriors from Gram matrices and the Gaussian KL divergence.

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
covariances (``jitter`` of :func:`low_rank_posterior`).

Random-feature posteriors (:func:`low_rank_posterior`) are kept in low-rank form
(Woodbury identity): with :math:`\widehat K = \Psi\Psi^\top` and :math:`F \ll n`,
every quantity costs :math:`O(nF^2 + tF^2)` per draw, plus :math:`O(t^2 F)` for the KL,
and whole batches of draws are evaluated at once in torch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gpytorch
import numpy as np
import scipy.linalg as sla
import torch
from torch import Tensor

from ..models import GraphGP, node_index_array
from ._arrays import as_float64
from .sources import GramSource, gram_source, node_index, row_chunks

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
    :raises ValueError: If the matrix is not PD even with the largest jitter level.
    """
    symmetric = 0.5 * (matrix + matrix.T)
    scale = float(np.mean(np.abs(np.diag(symmetric)))) or 1.0
    for level in JITTER_LEVELS:
        jitter = level * scale
        try:
            factor = sla.cholesky(symmetric + jitter * np.eye(len(symmetric)), lower=True)
        except np.linalg.LinAlgError:
            continue
        if jitter > 0:
            warnings.warn(f"{name} was not numerically positive definite; added jitter {jitter:.3g}",
                          RuntimeWarning, stacklevel=3)
        return factor, jitter
    raise ValueError(f"{name} is not positive definite (even with relative jitter {JITTER_LEVELS[-1]})")


def _check_noise(noise_variance: float) -> float:
    value = float(noise_variance)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"noise_variance must be positive and finite, got {noise_variance}")
    return value


@dataclass(frozen=True)
class _Conditioning:
    r"""The training block factored once.

    :math:`L L^\top = K_{dd} + \sigma_n^2 I` and :math:`\alpha = (K_{dd} + \sigma_n^2 I)^{-1} y`.
    """

    factor: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, train_train: np.ndarray, targets: np.ndarray, noise: float) -> _Conditioning:
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
    noise = _check_noise(noise_variance)
    n, t = len(y), k_pp.shape[0]
    if k_dd.shape != (n, n) or k_pd.shape != (t, n) or k_pp.shape != (t, t):
        raise ValueError(
            f"inconsistent block shapes: train_train {k_dd.shape}, test_train {k_pd.shape}, "
            f"test_test {k_pp.shape}, train_targets ({n},)")
    if not np.all(np.isfinite(y)):
        raise ValueError("train_targets contain NaN or infinite values")
    conditioning = _Conditioning.of(k_dd, y, noise)
    projected = conditioning.project(k_pd)
    covariance = k_pp - projected.T @ projected
    if include_noise:
        covariance = covariance + noise * np.eye(t)
    return GaussianPosterior(mean=k_pd @ conditioning.weights, covariance=0.5 * (covariance + covariance.T))


def gp_posterior(gram: Any, train_index: Any, test_index: Any, train_targets: Any,
                 noise_variance: float, *, include_noise: bool = True) -> GaussianPosterior:
    """Zero-mean GP posterior from a Gram matrix over all points.

    Only the three blocks at the training and test points are read (and made dense),
    so ``gram`` may be a lazy operator or a kernel over a large graph.

    :param gram: Gram matrix over all points (N x N): array, tensor, scipy sparse, a
        linear operator, a gpytorch kernel on node indices or a trained ExactGP (its
        kernel; see :func:`gp_couple.evaluation.sources.gram_source`).
    :param train_index: Integer indices of the training points.
    :param test_index: Integer indices of the test points.
    :param train_targets: Targets at ``train_index``.
    :param noise_variance: Likelihood noise variance.
    :param include_noise: See :func:`gp_posterior_from_blocks`.
    """
    source = gram_source(gram)
    train = node_index(train_index, "train_index", source.size)
    test = node_index(test_index, "test_index", source.size)
    return gp_posterior_from_blocks(source.block(train, train), source.block(test, train),
                                    source.block(test, test), train_targets, noise_variance,
                                    include_noise=include_noise)


# --------------------------------------------------------------------------- trained models


@dataclass(frozen=True)
class _ModelParts:
    """What a trained ExactGP on node indices conditions on, read once."""

    source: GramSource
    train: np.ndarray
    targets: np.ndarray
    noise: float
    model: gpytorch.models.ExactGP

    @classmethod
    def of(cls, model: Any) -> _ModelParts:
        if not isinstance(model, gpytorch.models.ExactGP):
            raise TypeError(f"model must be a gpytorch ExactGP, got {type(model).__name__}")
        if not isinstance(model.likelihood, gpytorch.likelihoods.GaussianLikelihood):
            raise TypeError("model must have a gpytorch GaussianLikelihood (one noise variance), got "
                            f"{type(model.likelihood).__name__}")
        if model.train_inputs is None or model.train_targets is None:
            raise ValueError("model has no training data")
        inputs = model.train_inputs[0]
        if inputs.ndim != 2 or inputs.shape[-1] != 1:
            raise ValueError("model must be a GP on node indices (training inputs of shape (n, 1)), "
                             f"got training inputs of shape {tuple(inputs.shape)}")
        noise = model.likelihood.noise.detach()
        if noise.numel() != 1:
            raise ValueError(f"model's likelihood has {noise.numel()} noise values; the evaluators need one")
        train = inputs[:, 0].detach().cpu().to(torch.int64).numpy()
        source = gram_source(model.covar_module, "model.covar_module")
        residual = as_float64(model.train_targets, "model.train_targets") - _mean_at(model, inputs)
        return cls(source, train, residual, float(noise.reshape(())), model)

    def nodes(self, nodes: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Validated node indices and the model's prior mean there."""
        if isinstance(self.model, GraphGP):
            inputs = self.model.node_inputs(nodes, name)
        else:
            inputs = torch.from_numpy(node_index_array(nodes, name, self.source.size)).unsqueeze(-1)
        device = self.model.train_inputs[0].device
        inputs = inputs.to(device=device, dtype=self.model.train_inputs[0].dtype)
        return inputs[:, 0].cpu().to(torch.int64).numpy(), _mean_at(self.model, inputs)


def _mean_at(model: gpytorch.models.ExactGP, inputs: Tensor) -> np.ndarray:
    with torch.no_grad():
        return as_float64(model.mean_module(inputs), "mean").reshape(-1)


def model_posterior(model: gpytorch.models.ExactGP, test_nodes: Any, *,
                    include_noise: bool = True) -> GaussianPosterior:
    r"""The posterior of a trained GP on node indices at ``test_nodes``, with full covariance, in float64.

    Reads the model's own kernel (e.g. the features a
    :class:`~gp_couple.kernels.GRFKernel` holds now, after any ``resample()``), its
    prior mean, training data and Gaussian noise, and solves with them in float64
    (eq. (43), the approximate posterior, Appendix B.2 [eq:approx_muandc], appendix on
    sparse-spectrum GPs, plus the prior mean):

    .. math::

        \mu = m_p + K_{pd}(K_{dd} + \sigma_n^2 I)^{-1}(y - m_d), \qquad
        C = K_{pp} - K_{pd}(K_{dd} + \sigma_n^2 I)^{-1}K_{dp}\ (+\ \sigma_n^2 I).

    Unlike :func:`gp_couple.models.predict` (gpytorch's inference, CG/Lanczos on large
    problems), this is a direct solve: the reference the evaluators compare with. The
    kernel is evaluated in the model's dtype (``model.double()`` for float64 entries).

    :param model: A :class:`gp_couple.models.GraphGP` (or any ExactGP whose inputs are
        node indices of shape ``(n, 1)``) with a :class:`~gpytorch.likelihoods.GaussianLikelihood`.
    :param test_nodes: Node indices to predict at.
    :param include_noise: The predictive posterior of noisy observations (default) or the
        latent one (see :func:`gp_posterior_from_blocks`).
    :raises TypeError: If ``model`` is not an ExactGP with a Gaussian likelihood.
    :raises ValueError: For bad node indices (the model's own checks) or a model that is
        not on node indices.
    """
    parts = _ModelParts.of(model)
    test, test_mean = parts.nodes(test_nodes, "test_nodes")
    train = parts.train
    posterior = gp_posterior_from_blocks(
        parts.source.block(train, train), parts.source.block(test, train), parts.source.block(test, test),
        parts.targets, parts.noise, include_noise=include_noise)
    return GaussianPosterior(posterior.mean + test_mean, posterior.covariance)


def model_marginals(model: gpytorch.models.ExactGP, nodes: Any, *,
                    include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    r"""Posterior means and marginal variances of a trained GP at many nodes, in float64.

    The same solve as :func:`model_posterior`, keeping only the diagonal of the
    covariance, :math:`v_i = K_{ii} - K_{id}(K_{dd} + \sigma_n^2 I)^{-1}K_{di}`
    (plus :math:`\sigma_n^2` with ``include_noise``), so memory stays at the training
    block plus one block of nodes whatever their number (e.g. every node of a mesh).

    :param model: As for :func:`model_posterior`.
    :param nodes: Node indices.
    :param include_noise: Variances of noisy observations (default) or of the latent function.
    :return: ``(mean, variance)``, each ``(len(nodes),)``.
    """
    parts = _ModelParts.of(model)
    index, prior_mean = parts.nodes(nodes, "nodes")
    train = parts.train
    conditioning = _Conditioning.of(parts.source.block(train, train), parts.targets, parts.noise)
    mean = np.empty(index.size)
    variance = np.empty(index.size)
    for start, stop in row_chunks(index.size, train.size):
        rows = index[start:stop]
        test_train = parts.source.block(rows, train)
        mean[start:stop] = test_train @ conditioning.weights
        explained = np.sum(conditioning.project(test_train) ** 2, axis=0)
        variance[start:stop] = parts.source.diagonal(rows) - explained
    # Rounding can leave tiny negatives where a node is fully determined by the data.
    variance = np.maximum(variance, 0.0) + (parts.noise if include_noise else 0.0)
    return mean + prior_mean, variance


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


# --------------------------------------------------------------------------- low rank


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
    noise = _check_noise(noise_variance)
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
