"""Fully Bayesian GRF-GP hyperparameters with Pyro NUTS
====================================================

The hyperparameters' posterior with :mod:`gp_couple.bayes`.

Run: ``python tutorials/pyro_nuts.py`` (a few minutes on 2 cores; ``--quick`` for a smoke run).

1. Put gpytorch priors on the hyperparameters to sample (outputscale, the diffusion
   gamma, the noise); each prior's support must fit its parameter's constraint.
2. ``run_nuts`` samples them with NUTS on an exact, deterministic (Cholesky) potential and
   returns the draws with split R-hat, effective sample sizes, divergences and wall time.
3. ``load_samples`` turns the model into a batch of models, one per draw, all sharing the
   kernel's random walks; ``posterior_predictive`` averages their predictions.
4. The same GRF kernel also plugs into ``pyro.contrib.gp`` models (``PyroGRFKernel``).
"""

# %%
# Imports
# -------
from __future__ import annotations

import argparse

import gpytorch
import numpy as np
import pyro
import pyro.contrib.gp as gp
import torch
from gpytorch.constraints import Positive
from gpytorch.priors import GammaPrior, LogNormalPrior

from gp_couple import Diffusion, GraphGP, GRFKernel, fit_gp, grid_graph
from gp_couple.bayes import exact_potential_settings, load_samples, posterior_predictive, run_nuts
from gp_couple.bayes.contrib import PyroGRFKernel
from gp_couple.evaluation import rmse

parser = argparse.ArgumentParser()
parser.add_argument("--quick", action="store_true", help="a handful of draws (smoke test)")
args = parser.parse_args()
nuts_settings = (dict(num_samples=4, warmup_steps=8, max_tree_depth=3) if args.quick
                 else dict(num_samples=100, warmup_steps=100))

# %%
# A small graph with a smooth signal observed at half of its nodes
# ----------------------------------------------------------------
graph = grid_graph(8, 8)
rows, cols = np.divmod(np.arange(64), 8)
signal = np.sin(rows / 2.5) * np.cos(cols / 3.0)
rng = np.random.default_rng(0)
train = np.sort(rng.choice(64, 32, replace=False))
test = np.setdiff1d(np.arange(64), train)
y = signal[train] + 0.05 * rng.normal(size=train.size)

# %%
# Priors on every hyperparameter NUTS should sample
# -------------------------------------------------
#
# NUTS draws values anywhere in a prior's support. A Gamma noise prior lives on (0, inf),
# so the noise needs a Positive() constraint: gpytorch's default GreaterThan(1e-4) cannot
# represent draws below 1e-4, and run_nuts refuses that combination with a ValueError.
likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(1.1, 20.0),
                                                     noise_constraint=Positive())
kernel = gpytorch.kernels.ScaleKernel(
    GRFKernel(graph, num_walkers=32, p_halt=0.4, coupling="antithetic", seed=0, schedule=None,
              kernel_family=Diffusion(1.0, gamma_prior=GammaPrior(3.0, 2.0))),
    outputscale_prior=GammaPrior(2.0, 2.0))
model = GraphGP(train, y, likelihood, kernel).double()

try:
    bad = GraphGP(train, y, gpytorch.likelihoods.GaussianLikelihood(noise_prior=LogNormalPrior(-3.0, 1.0)),
                  gpytorch.kernels.ScaleKernel(GRFKernel(graph, seed=0), outputscale_prior=GammaPrior(2.0, 2.0)))
    run_nuts(bad, num_samples=1, warmup_steps=0)
except ValueError as error:
    print(f"mismatched prior refused: {str(error)[:90]}...")

# %%
# A marginal-likelihood estimate: the point estimate, and where the chain starts
# ------------------------------------------------------------------------------
with exact_potential_settings(train.size):
    fit_gp(model, likelihood, iterations=20 if args.quick else 200, lr=0.05, seed=0)
point = posterior_predictive(model, test)
print(f"point estimate: test RMSE {rmse(point.mean.numpy(), signal[test]):.4f}")

# %%
# NUTS over (outputscale, gamma, noise)
# -------------------------------------
result = run_nuts(model, seed=0, **nuts_settings)
diagnostics = result.diagnostics
for site in diagnostics.sites:
    print(f"{site.name}: {site.mean[0]:.3f} ± {site.std[0]:.3f} (split R-hat {site.r_hat[0]:.3f}, "
          f"ESS {site.ess[0]:.0f})")
gamma = result.samples["covar_module.base_kernel.kernel_family.gamma_prior"].reshape(-1)
print(f"posterior gamma: {gamma.mean():.3f} ± {gamma.std():.3f} ({gamma.numel()} draws, "
      f"{sum(diagnostics.divergences)} divergences, {diagnostics.total_wall_time:.1f} s)")

# %%
# Predict with every draw at once: the hyperparameters become a batch sharing one set of walks
# --------------------------------------------------------------------------------------------
load_samples(model, result)
predictive = posterior_predictive(model, test)
print(f"Bayesian model average on {test.size} held-out nodes: RMSE "
      f"{rmse(predictive.mean.numpy(), signal[test]):.4f}, NLPD {predictive.nlpd(signal[test]):.3f} "
      f"(mixture of {predictive.num_draws} Gaussians)")

# %%
# The same GRF kernel in pyro.contrib.gp: GPRegression with a prior on gamma
# --------------------------------------------------------------------------
pyro.clear_param_store()
pyro_kernel = PyroGRFKernel(graph, num_walkers=32, p_halt=0.4, coupling="antithetic", seed=0)
pyro_kernel.gamma = pyro.nn.PyroSample(pyro.distributions.Gamma(3.0, 2.0))
with torch.random.fork_rng():
    torch.set_default_dtype(torch.float64)
    regression = gp.models.GPRegression(torch.as_tensor(train, dtype=torch.float64),
                                        torch.as_tensor(y), pyro_kernel, noise=torch.tensor(0.05))
    torch.set_default_dtype(torch.float32)
    losses = gp.util.train(regression, num_steps=10 if args.quick else 200)
print(f"pyro.contrib.gp GPRegression (MAP gamma): loss {losses[0]:.2f} -> {losses[-1]:.2f}")
