r"""The metrics of one frequency coupling's draws against the exact GP (kernel estimation on UCI data).

Every draw of the coupling gives a random-feature Gram matrix and posterior, compared
with the exact ones (paper, Table 1, Section 3.3 [tab:rff], Table 2, Appendix B.2 [tab:kld] and
Table 3, Appendix B.2 [tab:pred-rmse]). The posteriors are evaluated in low-rank form (Woodbury
identity,
:func:`gp_couple.evaluation.low_rank.low_rank_posterior`), a whole batch of draws at a
time, and the kernel RMSE through
:math:`\|\Phi\Phi^\top - K\|_F^2 = \|\Phi^\top\Phi\|_F^2 - 2\,\mathrm{tr}(\Phi^\top K \Phi) + \|K\|_F^2`,
so no draw builds a dense Gram matrix.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..couplings.frequencies import get_frequency_coupling
from ..evaluation.low_rank import low_rank_posterior
from ..evaluation.posterior import GaussianPosterior
from ..features.fourier import feature_map
from ._exact_gp import GPHyperparameters

__all__ = ["evaluate_coupling"]


@torch.no_grad()
def evaluate_coupling(coupling_name: str, kind: str, scaled: torch.Tensor, exact_gram: torch.Tensor,
                       n_train: int, y_train: np.ndarray, y_test: np.ndarray,
                       hyper: GPHyperparameters, exact_posterior: GaussianPosterior,
                       num_frequencies: int, draws: int, chunk: int, rng: np.random.Generator, *,
                       include_noise: bool = True, jitter: float = 0.0) -> dict[str, float]:
    r"""Kernel RMSE, posterior KL and predictive RMSE of one coupling, averaged over its draws.

    :param coupling_name: Registered frequency coupling (``NAME`` or ``NAME+antithetic``).
    :param kind: Feature map, ``"rff"`` or ``"rlf"``.
    :param scaled: Training then test inputs divided by the lengthscale, ``(n_train + n_test, d)``.
    :param exact_gram: Exact unit-amplitude Gram matrix of ``scaled``.
    :param n_train: Number of training rows of ``scaled``.
    :param y_train: Training targets.
    :param y_test: Test targets.
    :param hyper: The exact GP's hyperparameters.
    :param exact_posterior: The exact posterior over the test points (the KL's reference).
    :param num_frequencies: Frequencies per draw.
    :param draws: Number of draws.
    :param chunk: Draws evaluated together.
    :param rng: Stream of the draws.
    :param include_noise: Predictive (noisy) rather than latent approximate posteriors.
    :param jitter: Added to the approximate posterior covariance's diagonal.
    :return: ``kernel_rmse`` (root of the mean square over draws, test Gram block),
        ``kl_per_test_point`` and ``predictive_rmse`` (means over draws).
    """
    coupling = get_frequency_coupling(coupling_name, dim=scaled.shape[-1])
    fmap = feature_map(kind)
    n_test = len(y_test)
    exact_test = exact_gram[n_train:, n_train:]
    exact_test_norm = float(exact_test.square().sum())
    targets = torch.as_tensor(y_test, dtype=torch.float64)
    amplitude = math.sqrt(hyper.outputscale)
    squared_errors, kls, prediction_errors = [], [], []
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        frequencies = coupling.sample(num_frequencies, scaled.shape[-1], batch_shape=(size,),
                                      seed=rng, dtype=torch.float64)
        features = fmap(scaled, frequencies)
        train_features, test_features = features[..., :n_train, :], features[..., n_train:, :]
        # ||Phi Phi^T - K||_F^2 without forming Phi Phi^T (unit amplitude, test block).
        gram_in_feature_space = test_features.mT @ test_features
        cross = (test_features * (exact_test @ test_features)).sum((-2, -1))
        squared = gram_in_feature_space.square().sum((-2, -1)) - 2.0 * cross + exact_test_norm
        squared_errors.extend((squared.clamp_min(0.0) / n_test**2).tolist())
        approximate = low_rank_posterior(amplitude * train_features, amplitude * test_features, y_train,
                                         hyper.noise, include_noise=include_noise, jitter=jitter)
        kls.extend((approximate.kl_from(exact_posterior) / n_test).tolist())
        prediction_errors.extend((approximate.mean - targets).square().mean(-1).sqrt().tolist())
    return {"kernel_rmse": math.sqrt(float(np.mean(squared_errors))),
            "kl_per_test_point": float(np.mean(kls)),
            "predictive_rmse": float(np.mean(prediction_errors))}
