r"""The posterior predictive of a GP whose hyperparameters are a batch of posterior draws.

After :func:`~gp_couple.bayes.nuts.load_samples` the model predicts with every draw
:math:`\theta_s` at once (one batch entry each). Averaging over the draws gives the
Bayesian model average, a Gaussian mixture per test point,

.. math::

    p(y_* \mid \mathbf y) \approx \frac1S \sum_{s=1}^S \mathcal N(y_*; \mu_s, v_s), \qquad
    \bar\mu = \frac1S \sum_s \mu_s, \qquad
    \bar v = \frac1S \sum_s v_s + \frac1S \sum_s (\mu_s - \bar\mu)^2 ,

whose log density (not the Gaussian with moments :math:`\bar\mu, \bar v`) is what the
negative log predictive density uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gpytorch
import numpy as np
import torch
from gpytorch.models import ExactGP
from torch import Tensor

from ..models import GraphGP, predict
from .potential import exact_potential_settings

__all__ = ["PosteriorPredictive", "posterior_predictive"]


@dataclass(frozen=True)
class PosteriorPredictive:
    """Per-draw Gaussian predictions and their mixture.

    :ivar means: Predictive means ``(num_draws, n)``.
    :ivar variances: Predictive variances ``(num_draws, n)``.
    """

    means: Tensor
    variances: Tensor

    @property
    def num_draws(self) -> int:
        """Number of hyperparameter draws :math:`S`."""
        return int(self.means.shape[0])

    @property
    def mean(self) -> Tensor:
        r"""Mixture mean :math:`\bar\mu`, shape ``(n,)``."""
        return self.means.mean(0)

    @property
    def variance(self) -> Tensor:
        r"""Mixture variance :math:`\bar v` (law of total variance), shape ``(n,)``."""
        return self.variances.mean(0) + self.means.var(0, unbiased=False)

    def log_density(self, targets: Any) -> Tensor:
        r"""Log mixture density :math:`\log \frac1S\sum_s \mathcal N(y_i; \mu_{s,i}, v_{s,i})` per point.

        :param targets: Observed values, shape ``(n,)``.
        :raises ValueError: If the shape does not match.
        """
        if isinstance(targets, Tensor):
            y = targets.detach().to(device=self.means.device, dtype=torch.float64)
        else:
            y = torch.as_tensor(np.asarray(targets, dtype=np.float64), device=self.means.device)
        if y.shape != self.means.shape[-1:]:
            raise ValueError(f"targets must have shape ({self.means.shape[-1]},), got {tuple(y.shape)}")
        means, variances = self.means.double(), self.variances.double()
        log_normal = -0.5 * (torch.log(2 * math.pi * variances) + (y - means) ** 2 / variances)
        return torch.logsumexp(log_normal, dim=0) - math.log(self.num_draws)

    def nlpd(self, targets: Any) -> float:
        """Mean negative log predictive density of ``targets`` under the mixture."""
        return float(-self.log_density(targets).mean())

    def rescaled(self, shift: float, scale: float) -> PosteriorPredictive:
        """Predictions of ``shift + scale * y`` (e.g. back from standardised targets)."""
        return PosteriorPredictive(self.means * scale + shift, self.variances * scale**2)


def posterior_predictive(model: ExactGP, inputs: Any, *, noise: bool = True) -> PosteriorPredictive:
    """Predict with every hyperparameter draw loaded in ``model`` (exact Cholesky algebra).

    :param model: An ExactGP after :func:`~gp_couple.bayes.nuts.load_samples` (an
        unbatched model counts as one draw).
    :param inputs: Node indices ``(n,)`` for a :class:`~gp_couple.models.GraphGP`
        (through :func:`gp_couple.models.predict`), else a tensor of inputs ``(n, d)``.
    :param noise: Predict noisy observations (default; what NLPD needs) or the latent function.
    :return: The per-draw predictions and their mixture.
    :raises TypeError: If ``model`` is not an ExactGP or ``inputs`` has the wrong type.
    """
    if not isinstance(model, ExactGP):
        raise TypeError(f"model must be a gpytorch ExactGP, got {type(model).__name__}")
    num_train = int(model.train_targets.shape[-1])
    if isinstance(model, GraphGP):
        num_test = int(np.asarray(inputs.detach().cpu() if isinstance(inputs, Tensor) else inputs).reshape(-1).size)
        with exact_potential_settings(num_train + num_test):
            mean, variance = predict(model, model.likelihood, inputs, noise=noise)
    else:
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a tensor for a {type(model).__name__}, got {type(inputs).__name__}")
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), gpytorch.settings.fast_pred_var(False), \
                    exact_potential_settings(num_train + inputs.shape[-2 if inputs.dim() > 1 else -1]):
                output = model(inputs)
                output = model.likelihood(output) if noise else output
                mean, variance = output.mean, output.variance
        finally:
            model.train(was_training)
    if mean.dim() == 1:
        mean, variance = mean.unsqueeze(0), variance.unsqueeze(0)
    return PosteriorPredictive(mean.reshape(-1, mean.shape[-1]), variance.reshape(-1, variance.shape[-1]))
