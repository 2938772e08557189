r"""Posteriors of trained GPs on node indices, solved directly in float64 from the model's own kernel.

:func:`model_posterior` (full covariance) and :func:`model_marginals` (means and
variances at many nodes) read a trained gpytorch ``ExactGP`` (its kernel, prior mean,
training data and Gaussian noise) and condition with the dense solve of
:mod:`gp_couple.evaluation.posterior`: the reference that gpytorch's iterative
inference (:func:`gp_couple.models.predict`) and the approximate kernels are compared with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gpytorch
import numpy as np
import torch
from torch import Tensor

from .._nodes import node_index_array
from ..models import GraphGP
from ._arrays import as_float64
from .posterior import Conditioning, GaussianPosterior, gp_posterior_from_blocks
from .sources import GramSource, gram_source, row_chunks

__all__ = ["model_marginals", "model_posterior"]


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
            inputs = torch.from_numpy(node_index_array(nodes, name, self.source.size,
                                                       gpytorch_inputs=True)).unsqueeze(-1)
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
    conditioning = Conditioning.of(parts.source.block(train, train), parts.targets, parts.noise)
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
