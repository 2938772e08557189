"""Tutorial: fully Bayesian GRF-GP hyperparameters with Pyro NUTS.

Run: ``python tutorials/pyro_nuts.py`` (about a minute; ``--quick`` for a smoke run).

GRFKernel's hyperparameters take gpytorch priors and a batch shape, so the standard
GPyTorch + Pyro recipe works unchanged: ``model.pyro_sample_from_prior()`` inside a Pyro
model, NUTS over the hyperparameters, then ``model.pyro_load_from_samples(...)`` to
predict with every posterior sample at once (a batch of kernels sharing one set of
walks).
"""

# %% Imports
from __future__ import annotations

import argparse

import gpytorch
import numpy as np
import pyro
import torch
from gpytorch.priors import GammaPrior
from pyro.infer.mcmc import MCMC, NUTS

from gp_couple import Diffusion, GraphGP, GRFKernel, grid_graph

parser = argparse.ArgumentParser()
parser.add_argument("--quick", action="store_true", help="a handful of samples (smoke test)")
args = parser.parse_args()
num_samples, warmup = (4, 4) if args.quick else (60, 60)

# %% A small graph with a smooth signal observed at half of its nodes
torch.manual_seed(0)
pyro.set_rng_seed(0)
graph = grid_graph(8, 8)
rows, cols = np.divmod(np.arange(64), 8)
signal = np.sin(rows / 2.5) * np.cos(cols / 3.0)
rng = np.random.default_rng(0)
train = np.sort(rng.choice(64, 32, replace=False))
test = np.setdiff1d(np.arange(64), train)
y = torch.as_tensor(signal[train] + 0.05 * rng.normal(size=train.size), dtype=torch.float32)

# %% Priors on every hyperparameter
# NUTS moves over the priors' whole support: the noise needs a Positive() constraint
# (the default GreaterThan(1e-4) cannot represent sampled values below 1e-4).
likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(1.1, 20.0),
                                                     noise_constraint=gpytorch.constraints.Positive())
kernel = gpytorch.kernels.ScaleKernel(
    GRFKernel(graph, num_walkers=32, p_halt=0.4, coupling="antithetic", seed=0,
              graph_kernel=Diffusion(1.0, gamma_prior=GammaPrior(3.0, 2.0))),
    outputscale_prior=GammaPrior(2.0, 2.0))
model = GraphGP(train, y, likelihood, kernel)


def pyro_model(x: torch.Tensor, targets: torch.Tensor) -> None:
    with gpytorch.settings.fast_computations(False, False, False):
        sampled = model.pyro_sample_from_prior()
        pyro.sample("obs", sampled.likelihood(sampled(x)), obs=targets)


# %% NUTS over (gamma, outputscale, noise)
mcmc = MCMC(NUTS(pyro_model), num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
mcmc.run(model.train_inputs[0], model.train_targets)
samples = mcmc.get_samples()
gamma = samples["covar_module.base_kernel.graph_kernel.gamma_prior"].reshape(-1)
print(f"posterior gamma: {gamma.mean():.3f} ± {gamma.std():.3f} ({gamma.numel()} samples)")

# %% Predict with all samples at once: hyperparameters become a batch
model.pyro_load_from_samples(samples)
model.eval()
test_inputs = model.node_inputs(test).unsqueeze(0).repeat(gamma.numel(), 1, 1)
with torch.no_grad():
    predictive = model.likelihood(model(test_inputs))
mixture_mean = predictive.mean.mean(0)
rmse = torch.sqrt(torch.mean((mixture_mean - torch.as_tensor(signal[test], dtype=torch.float32)) ** 2))
print(f"Bayesian model average on {test.size} held-out nodes: RMSE {rmse:.4f}")
