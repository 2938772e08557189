"""Priors must fit their constraints: the documented ValueError (gpytorch issue 2646)."""

from __future__ import annotations

import gpytorch
import pytest
import torch
from gpytorch.constraints import GreaterThan, Interval, Positive
from gpytorch.priors import GammaPrior, LogNormalPrior, NormalPrior, UniformPrior

from gp_couple import Diffusion
from gp_couple.bayes import check_support, prior_sites, run_nuts


def test_default_noise_constraint_with_lognormal_prior_is_refused(graph_model) -> None:
    model = graph_model()
    model.likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=LogNormalPrior(-3.0, 1.0)).double()
    with pytest.raises(ValueError, match=r"noise_prior .*GreaterThan\(1.000E-04\).*issue 2646.*Positive\(\)"):
        run_nuts(model, num_samples=4, warmup_steps=0)


def test_sites_of_a_matching_model(graph_model) -> None:
    sites = prior_sites(graph_model())
    names = {site.name: site for site in sites}
    assert set(names) == {"likelihood.noise_covar.noise_prior", "covar_module.outputscale_prior",
                          "covar_module.base_kernel.kernel_family.gamma_prior"}
    gamma = names["covar_module.base_kernel.kernel_family.gamma_prior"]
    assert isinstance(gamma.constraint, Positive) and gamma.shape == torch.Size([1])
    torch.testing.assert_close(gamma.current_value(), torch.ones(1, dtype=torch.float64))  # float32 round trip


@pytest.mark.parametrize("prior, constraint, fits", [
    (GammaPrior(2.0, 2.0), Positive(), True),
    (LogNormalPrior(0.0, 1.0), GreaterThan(1e-4), False),
    (NormalPrior(0.0, 1.0), Positive(), False),
    (UniformPrior(0.5, 2.0), Interval(0.1, 3.0), True),
    (UniformPrior(0.5, 2.0), Interval(1.0, 3.0), False),
    (GammaPrior(2.0, 2.0), Interval(0.0, 10.0), False),
])
def test_support_against_constraint(prior, constraint, fits: bool) -> None:
    if fits:
        check_support(prior, constraint, "p")
    else:
        with pytest.raises(ValueError, match="p .*support.*constrained to"):
            check_support(prior, constraint, "p")


def test_normal_prior_on_a_positive_gamma_is_refused(grid) -> None:
    from gp_couple import GraphGP, GRFKernel

    kernel = GRFKernel(grid, seed=0, kernel_family=Diffusion(gamma_prior=NormalPrior(1.0, 1.0)))
    model = GraphGP([0, 1, 2], [0.0, 1.0, 0.5], gpytorch.likelihoods.GaussianLikelihood(), kernel)
    with pytest.raises(ValueError, match="gamma_prior .*NormalPrior.*Positive"):
        prior_sites(model)


def test_model_without_priors_is_refused(grid) -> None:
    from gp_couple import GraphGP, GRFKernel

    model = GraphGP([0, 1, 2], [0.0, 1.0, 0.5], gpytorch.likelihoods.GaussianLikelihood(), GRFKernel(grid, seed=0))
    with pytest.raises(ValueError, match="no hyperparameters with priors"):
        prior_sites(model)
