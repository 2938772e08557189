"""Evaluators: Gram-matrix error, predictive accuracy and divergence to the exact posterior."""

from .metrics import nlpd, relative_frobenius_error, rmse
from .posterior import (
    GaussianPosterior,
    LowRankGaussianPosterior,
    gaussian_kl,
    gp_posterior,
    gp_posterior_from_blocks,
    low_rank_posterior,
    posterior_kl,
)

__all__ = ["relative_frobenius_error", "rmse", "nlpd", "GaussianPosterior", "gp_posterior",
           "gp_posterior_from_blocks", "LowRankGaussianPosterior", "low_rank_posterior",
           "gaussian_kl", "posterior_kl"]
