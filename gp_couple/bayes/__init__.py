"""Fully Bayesian GP hyperparameters with Pyro: NUTS for gpytorch models, pyro.contrib.gp adapters.

* :mod:`~gp_couple.bayes.priors`: the hyperparameters with priors, checked against their constraints;
* :mod:`~gp_couple.bayes.potential`: the Pyro model, with a deterministic (Cholesky) potential;
* :mod:`~gp_couple.bayes.nuts`: :func:`run_nuts` and :func:`load_samples`;
* :mod:`~gp_couple.bayes.diagnostics`: split R-hat and effective sample sizes;
* :mod:`~gp_couple.bayes.predictive`: the posterior-predictive mixture over the draws;
* :mod:`~gp_couple.bayes.contrib`: gp_couple kernels as :mod:`pyro.contrib.gp` kernels.
"""

from __future__ import annotations

from .diagnostics import MCMCDiagnostics, SiteSummary
from .nuts import NUTSResult, load_samples, run_nuts
from .potential import MAX_NUTS_TRAIN_SIZE, HyperparameterModel, exact_potential_settings
from .predictive import PosteriorPredictive, posterior_predictive
from .priors import PriorSite, check_support, prior_sites

__all__ = [
    "run_nuts",
    "load_samples",
    "NUTSResult",
    "MCMCDiagnostics",
    "SiteSummary",
    "posterior_predictive",
    "PosteriorPredictive",
    "HyperparameterModel",
    "exact_potential_settings",
    "MAX_NUTS_TRAIN_SIZE",
    "prior_sites",
    "PriorSite",
    "check_support",
]
