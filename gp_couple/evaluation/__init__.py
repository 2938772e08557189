"""Evaluators: Gram-matrix error, predictive accuracy and divergence to the exact posterior.

They read Gram matrices wherever they live: dense arrays, linear operators, kernels on
node indices or trained models (:mod:`gp_couple.evaluation.sources`).
"""

from .low_rank import LowRankGaussianPosterior, low_rank_posterior
from .metrics import nlpd, relative_frobenius_error, rmse
from .posterior import GaussianPosterior, gaussian_kl, gp_posterior, gp_posterior_from_blocks, posterior_kl
from .sources import gram_source
from .trained_posterior import model_marginals, model_posterior

__all__ = ["relative_frobenius_error", "rmse", "nlpd", "GaussianPosterior", "gp_posterior",
           "gp_posterior_from_blocks", "model_posterior", "model_marginals", "gram_source",
           "LowRankGaussianPosterior", "low_rank_posterior", "gaussian_kl", "posterior_kl"]
