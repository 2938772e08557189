"""Tutorial: a GRF Gaussian process on a mesh, in plain GPyTorch.

Run: ``python tutorials/mesh_interpolation.py`` (about a minute; ``--quick`` for a smoke run).

We interpolate the z-component of face normals over the faces of a mesh, holding out
5 % of the faces, with ``ScaleKernel(GRFKernel(...))`` — a drop-in GPyTorch kernel whose
Gram matrix is a sparse, unbiased random-walk estimate of the diffusion kernel
exp(-gamma^2 L~). Then we swap i.i.d. walkers for sigma-coupled ones and compare
with the exact GP.
"""

# %% Imports
from __future__ import annotations

import argparse

import gpytorch
import numpy as np
import torch

from gp_couple import Diffusion, ExactGraphKernel, GraphGP, GRFKernel, fit_gp, grf_gp_settings, predict
from gp_couple.couplings.sigma_fit import fit_sigma_coupling
from gp_couple.datasets import default_mesh, load_mesh, split_test_nodes
from gp_couple.evaluation import nlpd, rmse

parser = argparse.ArgumentParser()
parser.add_argument("--mesh", default=None, help="a mesh file or a name in $GP_COUPLE_DATA/meshes")
parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
args = parser.parse_args()
iterations = 5 if args.quick else 200

# %% Data: faces are nodes, the target is the z-component of each face normal
mesh = default_mesh() if args.mesh is None else load_mesh(args.mesh)
graph, targets = mesh.graph, mesh.targets
train, test = split_test_nodes(graph.num_nodes, seed=0)
print(f"{mesh.name}: {graph.num_nodes} faces, {train.size} train, {test.size} test")


# %% A GRF-GP is an ordinary GPyTorch ExactGP
def make_model(base_kernel: gpytorch.kernels.Kernel) -> GraphGP:
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    return GraphGP(train, torch.as_tensor(targets[train], dtype=torch.float32), likelihood,
                   gpytorch.kernels.ScaleKernel(base_kernel))


model = make_model(GRFKernel(graph, num_walkers=8, p_halt=0.4, graph_kernel=Diffusion(1.0),
                             nodes=np.concatenate([train, test]), seed=0))
with grf_gp_settings():  # recommended settings, restored on exit
    losses = fit_gp(model, model.likelihood, iterations=iterations, lr=0.05, seed=0)
    mean, variance = predict(model, model.likelihood, test)
kernel = model.covar_module
print(f"trained: loss {losses[0]:.3f} -> {losses[-1]:.3f}, gamma={kernel.base_kernel.graph_kernel.gamma.item():.3f}, "
      f"outputscale={kernel.outputscale.item():.3f}, noise={model.likelihood.noise.item():.4f}")
print(f"GRF-GP (8 iid walkers): RMSE {rmse(mean, targets[test]):.4f}, NLPD {nlpd(mean, variance, targets[test]):.3f}")

# %% The exact GP with the same hyperparameters, for reference (dense: small graphs only)
exact = make_model(ExactGraphKernel(graph, Diffusion()))
exact.load_state_dict(model.state_dict(), strict=False)  # same hyperparameter names
with grf_gp_settings():
    exact_mean, exact_variance = predict(exact, exact.likelihood, test)
print(f"exact GP:               RMSE {rmse(exact_mean, targets[test]):.4f}, "
      f"NLPD {nlpd(exact_mean, exact_variance, targets[test]):.3f}")

# %% Coupled walkers: same hyperparameters, fresh walks, sigma-coupled lengths
sigma = fit_sigma_coupling(kernel.base_kernel.graph_kernel, p_halt=0.4, order=50,
                           samples_per_bin=20 if args.quick else 100, seed=0)
for name, coupling in [("iid", "iid"), ("antithetic", "antithetic"), ("sigma", sigma)]:
    kernel.base_kernel.resample(seed=1, num_walkers=32, coupling=coupling)
    with grf_gp_settings():
        mean, variance = predict(model, model.likelihood, test)
    print(f"32 {name:>10} walkers: RMSE {rmse(mean, targets[test]):.4f}, "
          f"NLPD {nlpd(mean, variance, targets[test]):.3f}")

# %% Saving and reloading: the walks are buffers, so predictions are identical
state = model.state_dict()
fresh = make_model(GRFKernel(graph, num_walkers=8, p_halt=0.4, graph_kernel=Diffusion(),
                             nodes=np.concatenate([train, test])))
fresh.load_state_dict(state)
with grf_gp_settings():
    assert torch.equal(predict(fresh, fresh.likelihood, test)[0], predict(model, model.likelihood, test)[0])
print("reloaded model predicts identically")
